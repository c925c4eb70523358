// Run-time compiled CUDA C++: kernels Kiln generates at build time (pointwise fusion groups,
// reductions, normalizations, pooling, data movement) are compiled by NVRTC for the device's
// architecture into a cubin, which the engine file stores so that loading never recompiles.
//
// Generated sources start with prelude.h's prelude, declare their kernels `extern "C"`
// (so names are not mangled) and take every size as a kernel argument, so one source serves
// every node of the same kind and dtypes: Module::compile keeps an in-process cache keyed by
// the source text, and a model with fifty identical layer norms compiles one kernel.
//
// Modules are loaded with the runtime's library API (cudaLibraryLoadData), which needs no
// driver-API linking; a loaded module is immutable and safe to launch from any thread.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "kiln/ir.h"

namespace kiln::cuda {

class Module {
 public:
  // Compiles `source` for the current device (-arch=sm_XX from current_device()), with
  // -O3 / --use_fast_math off / -default-device; throws kInternal with the NVRTC log and
  // `what` (e.g. "fused_pointwise node 'add_3'") when it does not compile.
  static std::shared_ptr<const Module> compile(const std::string& source, const std::string& what);
  // The kernel `name` of `source`, one of Kiln's own that no engine holds (the weights'
  // checksum, the launch fence), compiled once per process and architecture and kept loaded.
  // Unlike compile(), allowed with KILN_CUDA_NO_COMPILE set, which is about loading engines.
  // Holds no lock while compiling (build_turn.h), so build workers may ask for it.
  static cudaKernel_t support_kernel(const std::string& source, const char* name, const std::string& what);
  // Loads a cubin written by cubin() (kCorrupted when the driver rejects it).
  static std::shared_ptr<const Module> load(Bytes cubin);

  ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const Bytes& cubin() const { return cubin_; }
  // The kernel named `name` (an extern "C" function of the source); kInternal when absent.
  cudaKernel_t kernel(const char* name) const;

 private:
  explicit Module(Bytes cubin);
  Bytes cubin_;
  cudaLibrary_t library_ = nullptr;
};

// Whether KILN_CUDA_NO_COMPILE is set (not empty, not "0"): a test or a deployment checking
// that loading an engine compiles nothing. Then compile_to_cubin (so Module::compile) throws,
// and make_plan (cudnn_graph.h) refuses the cuDNN engine configs whose plans compile a kernel
// when finalized (runtime-compiled engines); plans rebuilt from their serialized form compile
// nothing and stay allowed.
bool compiling_forbidden();

// Compiles `source` with NVRTC into a cubin for sm_<arch> (e.g. 90), with the options
// Module::compile uses; needs no GPU, so generated sources can be checked on any machine.
// Results are cached in-process by (source, arch). Throws kInternal with the log and `what`
// (and when compiling_forbidden()).
Bytes compile_to_cubin(const std::string& source, const std::string& what, int arch);

// cudaLaunchKernel on a module's kernel, then checks the launch error.
void launch(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared_bytes, cudaStream_t stream);

// A generated kernel's saved state (Kernel::state()): its cubin plus the family's own
// parameters (the variant chosen, block sizes). unpack_state throws kCorrupted when malformed.
struct CompiledState {
  Bytes cubin;
  Bytes params;
};
Bytes pack_state(const Bytes& cubin, const Bytes& params);
CompiledState unpack_state(const Bytes& state);

}  // namespace kiln::cuda
