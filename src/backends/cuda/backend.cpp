// The CUDA backend: one object per device, dispatching nodes to the kernel families of
// kernels.h, and owning device memory, copies, synchronization and CUDA graph capture.
//
// Device selection: make_kernel and allocate (and the allocation's deleter) make the backend's
// device current for their duration and restore the caller's. Kernel::run() does not: it
// launches on the stream it is given, which belongs to the engine's device, and the caller
// (ExecutionContext::execute on the caller's thread) must have that device current, as
// PyTorch's does for its current stream; the Python front end sets it before executing.
//
// capture() records what the launches enqueue on `stream` (record_graph in cuda_util, which
// also makes the libraries' programmatic, early-launch edges full dependencies) and
// instantiates a CUDA graph; it runs nothing. A recording that depends on host memory
// (a library's copy from a host buffer it reuses) is refused: the engine then runs its
// launches directly. The legacy default stream (null, PyTorch's default current stream) cannot
// be captured, so for it the launches are recorded on a stream of the backend's own: a graph
// replays on any stream of its device, the legacy one included.
//
// synchronize(nullptr) waits for the whole device (a refit must not write constants that a
// forward on some other stream is still reading); build_finished() writes the timing cache;
// warm_up() sets up cuBLASLt and compiles the support kernels for the device on another thread,
// once per process.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "kiln/backend.h"
#include "kiln/errors.h"
#include "src/backends/cuda/device/checksum.h"
#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/device/upload.h"
#include "src/backends/cuda/kernels.h"
#include "src/backends/cuda/libs/cublaslt.h"
#include "src/backends/cuda/libs/cudnn_graph.h"
#include "src/backends/cuda/tuning/build_turn.h"
#include "src/backends/cuda/tuning/tactics.h"
#include "src/common/run_parts.h"
#include "src/common/stopwatch.h"

namespace kiln {

namespace cuda {

bool supports_node(const Node& n, const Graph& g, std::string* why) {
  switch (op_info(n.op).family) {
    case OpFamily::kUnary:
    case OpFamily::kBinary:
    case OpFamily::kWhere:
    case OpFamily::kCast:
    case OpFamily::kFused: return supports_pointwise(n, g, why);
    case OpFamily::kReduce: return supports_reduce(n, g, why);
    case OpFamily::kSoftmax: return supports_softmax(n, g, why);
    case OpFamily::kNorm: return supports_norm(n, g, why);
    case OpFamily::kMatmul: return supports_matmul(n, g, why);
    case OpFamily::kConv: return supports_conv(n, g, why);
    case OpFamily::kPool: return supports_pool(n, g, why);
    case OpFamily::kShape: return supports_shape(n, g, why);
    case OpFamily::kGather: return supports_gather(n, g, why);
    case OpFamily::kAttention: return supports_attention(n, g, why);
    case OpFamily::kGenerator: return supports_generator(n, g, why);
  }
  if (why) *why = std::string("no CUDA kernel family for ") + op_name(n.op);
  return false;
}

namespace {

// Threads a build makes its kernels on: $KILN_BUILD_THREADS (1 makes them one by one), by
// default half the host's cores, at most 8 (the cuDNN plan lanes, cudnn_graph.h).
size_t build_workers() {
  const char* env = std::getenv("KILN_BUILD_THREADS");
  if (env && *env) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    KILN_CHECK(*end == '\0' && v >= 1 && v <= 256, kInvalidArgument,
               "KILN_BUILD_THREADS must be a whole number from 1 to 256, not '", env, "'");
    return size_t(v);
  }
  return std::clamp<size_t>(std::thread::hardware_concurrency() / 2, 1, kPlanLanes);
}

class GraphExec final : public CapturedGraph {
 public:
  explicit GraphExec(cudaGraphExec_t exec) : exec_(exec) {}
  ~GraphExec() override { (void)cudaGraphExecDestroy(exec_); }
  void replay(void* stream) override { KILN_CUDA_CHECK(cudaGraphLaunch(exec_, static_cast<cudaStream_t>(stream))); }

 private:
  cudaGraphExec_t exec_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int index) : index_(index) {
    DeviceGuard guard(index_);
    name_ = current_device().name;
  }

  const char* name() const override { return "cuda"; }
  Device device() const override { return Device{DeviceType::kCUDA, index_}; }
  std::string device_name() const override { return name_; }
  size_t alignment() const override { return 256; }
  void build_finished() override { timing_cache_flush(); }

  std::future<std::string> warm_up() override {
    if (warmed_.exchange(true)) return {};
    const int index = index_;
    Uploader* uploader = &uploader_;  // the backend lives as long as the process
    try {
      return std::async(std::launch::async, [index, uploader]() -> std::string {
        // A failure is only reported here: the upload, checksum or GEMM that needs the piece
        // sets it up again and reports its own error.
        std::string report;
        try {
          DeviceGuard guard(index);
          const Stopwatch watch;
          uploader->prepare();
          (void)checksum_kernel();
          (void)launch_fence_kernel();
          (void)fill_kernel();
          report = detail::concat("upload lanes, support kernels ", int(watch.ms() + 0.5), " ms");
        } catch (const std::exception& e) {
          report = detail::concat("upload lanes, support kernels failed (", e.what(), ")");
        }
        try {
          DeviceGuard guard(index);
          return report + ", " + lt_warm_up();
        } catch (const std::exception& e) {
          return report + ", cuBLASLt failed (" + e.what() + ")";
        }
      });
    } catch (const std::system_error&) {  // no thread to spare: the kernels set the library up
      return {};
    }
  }

  bool supports(const Node& n, const Graph& g, std::string* why) const override { return supports_node(n, g, why); }

  std::unique_ptr<Kernel> make_kernel(const Node& n, const Graph& g, const KernelOptions& o,
                                      const Bytes* state) override {
    DeviceGuard guard(index_);
    switch (op_info(n.op).family) {
      case OpFamily::kUnary:
      case OpFamily::kBinary:
      case OpFamily::kWhere:
      case OpFamily::kCast:
      case OpFamily::kFused: return make_pointwise_kernel(n, g, o, state);
      case OpFamily::kReduce: return make_reduce_kernel(n, g, o, state);
      case OpFamily::kSoftmax: return make_softmax_kernel(n, g, o, state);
      case OpFamily::kNorm: return make_norm_kernel(n, g, o, state);
      case OpFamily::kMatmul: return make_matmul_kernel(n, g, o, state);
      case OpFamily::kConv: return make_conv_kernel(n, g, o, state);
      case OpFamily::kPool: return make_pool_kernel(n, g, o, state);
      case OpFamily::kShape: return make_shape_kernel(n, g, o, state);
      case OpFamily::kGather: return make_gather_kernel(n, g, o, state);
      case OpFamily::kAttention: return make_attention_kernel(n, g, o, state);
      case OpFamily::kGenerator: return make_generator_kernel(n, g, o, state);
    }
    KILN_FAIL(kInternal, "no CUDA kernel family for ", op_name(n.op));
  }

  // A build makes its kernels on up to build_workers() threads at once (one: the calling thread),
  // each node under the build turn, which a worker gives up while it compiles (build_turn.h). A
  // load has nothing to compile (its kernels' states hold the cubins and cuDNN plans) and makes
  // them in order.
  std::vector<std::unique_ptr<Kernel>> make_kernels(const Graph& g, const KernelOptions& o,
                                                    const std::vector<Bytes>* states,
                                                    std::vector<double>* ms) override {
    const size_t n = g.nodes().size(), workers = std::clamp<size_t>(build_workers(), 1, std::max<size_t>(n, 1));
    if (states) return Backend::make_kernels(g, o, states, ms);
    std::vector<std::unique_ptr<Kernel>> kernels(n);
    ms->assign(n, 0.0);
    std::vector<std::exception_ptr> errors(n);
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    run_parts(workers, [&](size_t) {
      // Nodes are taken in order, so the first failure in node order is always reached.
      for (size_t i; !failed && (i = next++) < n;) {
        try {
          const BuildTurn turn(o.background ? TurnPriority::kBackground : TurnPriority::kForeground);
          const Stopwatch watch;  // from the turn on: the wait for it is another node's time
          kernels[i] = make_kernel(*g.nodes()[i], g, o, nullptr);
          (*ms)[i] = watch.ms();
        } catch (...) {
          errors[i] = std::current_exception();
          failed = true;
        }
      }
    });
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
    return kernels;
  }

  std::shared_ptr<void> allocate(size_t bytes) override {
    DeviceGuard guard(index_);
    void* p = nullptr;
    KILN_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
    const int index = index_;
    return std::shared_ptr<void>(p, [index](void* q) {
      // A deleter must not throw; a failure here (e.g. at process exit) leaks the block.
      int previous = 0;
      if (cudaGetDevice(&previous) != cudaSuccess) return;
      if (previous != index) (void)cudaSetDevice(index);
      (void)cudaFree(q);
      if (previous != index) (void)cudaSetDevice(previous);
    });
  }

  void copy_from_host(void* dst, const void* src, size_t bytes, void* stream) override {
    if (!bytes) return;
    DeviceGuard guard(index_);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));  // the host buffer may be reused on return
  }

  void copy_to_host(void* dst, const void* src, size_t bytes, void* stream) override {
    if (!bytes) return;
    DeviceGuard guard(index_);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
    KILN_CUDA_CHECK(cudaStreamSynchronize(s));  // the host buffer is filled on return
  }

  void copy_on_device(void* dst, const void* src, size_t bytes, void* stream) override {
    if (!bytes || dst == src) return;
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)));
  }

  void upload(const std::vector<HostCopy>& copies) override {
    DeviceGuard guard(index_);
    if (!uploader_.upload(copies)) Backend::upload(copies);  // the driver stages each copy
  }

  uint64_t checksum(const std::vector<Span>& buffers, void* stream) override {
    DeviceGuard guard(index_);
    return word_checksum_on_device(buffers, static_cast<cudaStream_t>(stream));
  }

  void synchronize(void* stream) override {
    DeviceGuard guard(index_);
    // No stream: the whole device (work on non-blocking streams included).
    if (stream == nullptr) {
      const DeviceTurn turn;  // not while another thread records a graph
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
    } else {
      KILN_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    }
  }

  std::unique_ptr<CapturedGraph> capture(const std::function<void(void* stream)>& launches, void* stream,
                                         std::string* why) override {
    const cudaStream_t s = stream ? static_cast<cudaStream_t>(stream) : capture_stream();
    const GraphPtr graph = record_graph(s, [&](cudaStream_t rs) { launches(rs); });
    dump_graph_if_asked(graph.get());
    if (const std::string host = graph_host_dependencies(graph.get()); !host.empty()) {
      if (why) *why = "the recorded launches hold " + host + ", which a replay would read stale";
      return nullptr;
    }
    cudaGraphExec_t exec = nullptr;
    KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph.get(), 0));
    return std::make_unique<GraphExec>(exec);
  }

 private:
  // The stream that graphs for the legacy default stream are recorded on (made on first use).
  cudaStream_t capture_stream() {
    std::lock_guard<std::mutex> lock(capture_mutex_);
    if (!capture_stream_) {
      DeviceGuard guard(index_);
      cudaStream_t s = nullptr;
      KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      capture_stream_.reset(s);
    }
    return capture_stream_.get();
  }

  struct StreamDeleter {
    void operator()(cudaStream_t s) const { (void)cudaStreamDestroy(s); }
  };
  int index_;
  Uploader uploader_{index_};
  std::string name_;
  std::atomic<bool> warmed_{false};
  std::mutex capture_mutex_;
  std::unique_ptr<CUstream_st, StreamDeleter> capture_stream_;
};

int device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // no driver or no device: not an error, just no CUDA
      return 0;
    }
    return n;
  }();
  return count;
}

}  // namespace
}  // namespace cuda

bool cuda_device_present() { return cuda::device_count() > 0; }

Backend& cuda_backend(int index) {
  const int count = cuda::device_count();
  KILN_CHECK(index >= 0 && index < count, kUnsupported, "no CUDA device cuda:", index, " (", count,
             " present)");
  static std::mutex mu;
  static std::map<int, std::unique_ptr<cuda::CudaBackend>> backends;  // live for the process
  std::lock_guard<std::mutex> lock(mu);
  auto& b = backends[index];
  if (!b) b = std::make_unique<cuda::CudaBackend>(index);
  return *b;
}

}  // namespace kiln
