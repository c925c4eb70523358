// Error reporting for CUDA runtime calls and the cached properties of each device.
//
// fail_cuda turns a failed call into a kiln::Error: out of memory is the caller's problem
// (kInvalidArgument: a smaller batch or workspace may fit), anything else is kInternal. The
// device properties are read once per device index (cudaGetDeviceProperties is slow enough
// to matter when every make_kernel asks) and kept for the life of the process.
#include "src/backends/cuda/cuda_util.h"

#include <map>
#include <memory>
#include <mutex>

namespace kiln::cuda {

void fail_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  // Clear a non-sticky error so that the next unrelated check does not report it again.
  (void)cudaGetLastError();
  const std::string where = std::string(file) + ":" + std::to_string(line);
  if (err == cudaErrorMemoryAllocation) {
    KILN_FAIL(kInvalidArgument, "out of device memory in ", expr, " (", cudaGetErrorName(err), ": ",
              cudaGetErrorString(err), ") at ", where);
  }
  KILN_FAIL(kInternal, "CUDA call ", expr, " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err),
            " at ", where);
}

const DeviceInfo& current_device() {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<DeviceInfo>> cache;  // entries are never removed
  int index = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&index));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(index);
  if (it != cache.end()) return *it->second;
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  auto info = std::make_unique<DeviceInfo>();
  info->index = index;
  info->arch = prop.major * 10 + prop.minor;
  info->sm_count = prop.multiProcessorCount;
  info->l2_bytes = size_t(prop.l2CacheSize);
  info->shared_per_block_optin = prop.sharedMemPerBlockOptin;
  info->name = prop.name;
  const DeviceInfo& ref = *info;
  cache.emplace(index, std::move(info));
  return ref;
}

}  // namespace kiln::cuda
