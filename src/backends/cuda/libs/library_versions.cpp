// The versions of the CUDA libraries this build compiled against and of the ones loaded.
//
// Headers and libraries may come from different places (the CUDA toolkit, the NVIDIA wheels
// PyTorch installs), and a process loads one copy of each soname, whichever comes first. So
// the import compares what the headers declared with what is actually loaded (kiln/__init__.py).
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <nvrtc.h>

#include <string>
#include <vector>

#include "kiln/backend.h"

namespace kiln::cuda {

namespace {

// The file of the shared object that holds `symbol` (an address taken in this library).
std::string file_of(const void* symbol) {
  Dl_info info{};
  if (dladdr(symbol, &info) == 0 || !info.dli_fname) return {};
  return info.dli_fname;
}

}  // namespace

std::vector<LibraryVersion> library_versions() {
  std::vector<LibraryVersion> out;
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
  out.push_back({"cudart", CUDART_VERSION, runtime, file_of(reinterpret_cast<const void*>(&cudaRuntimeGetVersion))});
  out.push_back({"cublasLt", CUBLAS_VERSION, int(cublasLtGetVersion()),
                 file_of(reinterpret_cast<const void*>(&cublasLtGetVersion))});
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) major = minor = 0;
  // nvrtc.h declares no version of its own: it ships with the runtime headers, so it is theirs.
  out.push_back(
      {"nvrtc", CUDART_VERSION, major * 1000 + minor * 10, file_of(reinterpret_cast<const void*>(&nvrtcVersion))});
  out.push_back(
      {"cudnn", CUDNN_VERSION, int(cudnnGetVersion()), file_of(reinterpret_cast<const void*>(&cudnnGetVersion))});
  return out;
}

}  // namespace kiln::cuda
