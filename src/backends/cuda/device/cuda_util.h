// Shared pieces of the CUDA backend: error checking for every CUDA library Kiln calls, the
// device's properties, and the stream of a call.
//
// Every CUDA, cuBLASLt, cuDNN and NVRTC call goes through one of the KILN_*_CHECK macros, which
// turn a failure into a kiln::Error naming the call, the library's message and the source
// line. Out-of-memory is kInvalidArgument ("out of device memory ..."), anything else kInternal.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>

#include "kiln/backend.h"
#include "kiln/errors.h"

namespace kiln::cuda {

[[noreturn]] void fail_cuda(cudaError_t err, const char* expr, const char* file, int line);

#define KILN_CUDA_CHECK(expr)                                                                    \
  do {                                                                                           \
    cudaError_t kiln_err_ = (expr);                                                              \
    if (kiln_err_ != cudaSuccess) ::kiln::cuda::fail_cuda(kiln_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: the launch's own error (bad configuration, missing kernel).
#define KILN_CUDA_CHECK_LAUNCH() KILN_CUDA_CHECK(cudaGetLastError())

struct DeviceInfo {
  int index = 0;
  int arch = 0;                      // major * 10 + minor, e.g. 90
  int sm_count = 0;
  size_t l2_bytes = 0;
  size_t shared_per_block_optin = 0;  // the most dynamic shared memory a block may opt in to
  std::string name;                   // e.g. "NVIDIA H100 80GB HBM3"
};

// Makes `device` current for its lifetime and restores the previous one (a failure to set it
// throws; restoring does not).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    KILN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) KILN_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    if (previous_ != device_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0, device_ = 0;
};

// The properties of the device that is current on this thread (read once per device).
const DeviceInfo& current_device();

// What a captured graph's replay depends on outside the device, in words ("" when nothing):
// copies from or to host memory and host callbacks. Kiln's own launches add none (its host
// copies synchronize, which capture refuses); a library call that did would, on replay, read
// whatever that host memory holds by then. Child graphs are searched too.
std::string graph_host_dependencies(cudaGraph_t graph);

struct GraphDeleter {
  void operator()(cudaGraph_t g) const { (void)cudaGraphDestroy(g); }
};
using GraphPtr = std::unique_ptr<CUgraph_st, GraphDeleter>;

// Records what `launches` enqueues on `stream` into a graph (thread-local capture mode, so other
// threads' CUDA calls are unaffected) and returns it; it runs nothing. An exception thrown by
// `launches` ends the capture, leaving the stream usable, and is rethrown. It records under the
// build turn (DeviceTurn, build_turn.h): a build on another thread synchronizes the whole device
// when it times kernels, which would end the capture with an error.
//
// Library kernels launched for programmatic dependent launch record "programmatic" edges, which
// let a kernel start before its predecessor has finished; every such edge becomes a full
// dependency. (cuDNN's runtime-fusion conv + residual kernel, recorded after the conv that
// produces its residual, reads that residual early, so a replay gives wrong values that differ
// from replay to replay. Full edges everywhere are right whatever a library kernel reads early,
// and keeping the other programmatic edges buys no measurable time.)
//
// A memset node of at most kMaxFillBytes becomes a kernel node (small_memsets_as_kernels).
GraphPtr record_graph(cudaStream_t stream, const std::function<void(cudaStream_t)>& launches);

// Replaces every memset node of `graph` that sets at most kMaxFillBytes with a launch of
// fill_kernel() in the same place (same dependencies, same bytes written); larger memsets stay.
// A replay pays host time for every memset node, and almost none for a kernel in a chain, while
// cuDNN's flash attention for sm90 sets a 4-byte counter before every run: a transformer's graph
// would carry one memset node per attention. Needs a graph whose edges are all full.
inline constexpr size_t kMaxFillBytes = 64 << 10;
void small_memsets_as_kernels(cudaGraph_t graph);

// The kernel that does a memset node's work in a graph: kiln_fill(dst, pitch, value,
// element_size, width, width * height), element sizes 1, 2 and 4, one thread per element.
// Compiled once per process (the warm-up does it ahead of the first capture).
cudaKernel_t fill_kernel();

// Whether what `launches` enqueues (recorded on a stream of its own, run nothing) holds a
// programmatic edge: a kernel that may start before the one in front of it has finished. An
// exception thrown by `launches`, or a recording the runtime refuses, is rethrown.
bool starts_early(const std::function<void(cudaStream_t)>& launches);

// With $KILN_CUDA_GRAPH_DUMP set to a folder, writes `graph` there as Graphviz
// (<folder>/engine-<n>.dot, every node's parameters included); nothing otherwise.
void dump_graph_if_asked(cudaGraph_t graph);

inline cudaStream_t stream_of(const RunContext& rc) { return static_cast<cudaStream_t>(rc.stream); }

}  // namespace kiln::cuda
