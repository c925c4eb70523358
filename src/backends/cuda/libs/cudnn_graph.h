// A thin RAII layer over the cuDNN v9 backend (graph) API, which the conv family and cuDNN's
// fused attention build their operation graphs with: descriptors that destroy themselves,
// setters that name the attribute in their error, the pointwise operation both use, the
// per-device cuDNN handle, and the identity of an engine configuration
// (engine global index + knob choices) that the timing cache and engine files store so that a
// plan can be rebuilt exactly, without heuristics or timing.
//
// Named cudnn_graph.h (not cudnn_graph.h) so that it never shadows cuDNN's own header.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/errors.h"

namespace kiln::cuda {

[[noreturn]] void fail_cudnn(cudnnStatus_t status, const char* expr, const char* file, int line);

#define KILN_CUDNN_CHECK(expr)                                                                           \
  do {                                                                                                   \
    cudnnStatus_t kiln_st_ = (expr);                                                                     \
    if (kiln_st_ != CUDNN_STATUS_SUCCESS) ::kiln::cuda::fail_cudnn(kiln_st_, #expr, __FILE__, __LINE__); \
  } while (0)

// One backend descriptor. Setters and finalize throw kiln::Error naming `what` (the thing
// being built, e.g. "conv 'layer1.0.conv1': tensor x") and cuDNN's last error message.
class Desc {
 public:
  Desc() = default;
  Desc(cudnnBackendDescriptorType_t type, std::string what);
  ~Desc() { reset(); }
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)), what_(std::move(o.what_)) {}
  Desc& operator=(Desc&& o) noexcept;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  explicit operator bool() const { return d_ != nullptr; }
  const std::string& what() const { return what_; }

  Desc& set(cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type, int64_t count, const void* values);
  Desc& set_i64(cudnnBackendAttributeName_t attr, int64_t v) { return set(attr, CUDNN_TYPE_INT64, 1, &v); }
  Desc& set_i64s(cudnnBackendAttributeName_t attr, const std::vector<int64_t>& v) {
    return set(attr, CUDNN_TYPE_INT64, int64_t(v.size()), v.data());
  }
  Desc& set_desc(cudnnBackendAttributeName_t attr, const Desc& d) {
    cudnnBackendDescriptor_t p = d.get();
    return set(attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p);
  }
  Desc& set_descs(cudnnBackendAttributeName_t attr, const std::vector<const Desc*>& ds);
  Desc& set_dtype(cudnnBackendAttributeName_t attr, cudnnDataType_t t) {
    return set(attr, CUDNN_TYPE_DATA_TYPE, 1, &t);
  }
  // Throws on failure.
  Desc& finalize();
  // Returns the status instead (for probing: an engine config that does not fit the graph).
  cudnnStatus_t try_finalize();
  int64_t get_i64(cudnnBackendAttributeName_t attr) const;

 private:
  void reset();
  cudnnBackendDescriptor_t d_ = nullptr;
  std::string what_;
};

// cuDNN's data type of f32, f16 and bf16 (kUnsupported for any other).
cudnnDataType_t cudnn_dtype(DType t);
// A finalized tensor descriptor of 16-byte aligned data.
Desc tensor_desc(int64_t uid, cudnnDataType_t dt, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                 bool is_virtual, const std::string& what);
// A finalized by-value f32 scalar [1, 1, 1, 1]: its variant-pack pointer is a host float, which
// cuDNN copies into each launch (captured CUDA graphs included).
Desc scalar_desc(int64_t uid, const std::string& what);

// One pointwise operation y = mode(x, b) (b: nullptr for a unary mode), computed in f32: its
// pointwise descriptor and its operation descriptor, both finalized and kept in `parts` (a
// deque, so that references to them stay valid while more are added); returns the operation,
// which the caller lists in its operation graph. SWISH_FWD gets beta 1 (silu); RELU_FWD gets
// the clip [0, relu_upper_clip] when relu_upper_clip > 0 (none otherwise). `what` names the
// operation in errors (e.g. "conv 'layer1.0.conv1': bias").
const Desc& pointwise_op(std::deque<Desc>& parts, cudnnPointwiseMode_t mode, const Desc& x, const Desc* b,
                         const Desc& y, const std::string& what, double relu_upper_clip = 0);

// cuDNN's last error message (empty when none), for messages that explain a refusal.
std::string cudnn_last_error();

// A cuDNN handle of the current device, created on first use. cuDNN handles must not be used
// by two threads at once: every use (building graphs and plans, setting the stream, executing)
// holds the handle's lock. Lane 0 is the handle everything executes with; make_plans finalizes
// on lanes 1 to kPlanLanes (their plans execute on lane 0's handle like any other).
struct HandleLock {
  cudnnHandle_t handle;
  std::unique_lock<std::recursive_mutex> lock;
};
HandleLock lock_handle(int lane = 0);

// What identifies an engine configuration across processes (same cuDNN version and GPU).
struct EngineId {
  int64_t engine = -1;
  std::vector<std::pair<int32_t, int64_t>> knobs;  // (cudnnBackendKnobType_t, value)
  std::string to_string() const;                   // "engine 12 {3=1,5=0}"
  bool operator==(const EngineId& o) const { return engine == o.engine && knobs == o.knobs; }
};

// Facts read from a finalized engine config.
struct EngineInfo {
  EngineId id;
  std::vector<cudnnBackendNumericalNote_t> numerical;
  std::vector<cudnnBackendBehaviorNote_t> behavior;
  bool has_numerical(cudnnBackendNumericalNote_t n) const;
};
EngineInfo engine_info(const Desc& engine_config);

// The engine configs that cuDNN's heuristics propose for a finalized operation graph, in
// order: mode A first, then the fallback list (duplicates dropped). Failures of a mode are
// skipped (the graph may only have fallback engines); `log` collects what happened.
std::vector<Desc> heuristic_configs(const Desc& op_graph, std::string* log);

// The finalized engine config `id` of `op_graph` (throws kUnsupported when cuDNN refuses it,
// e.g. a config saved by another cuDNN version).
Desc make_engine_config(const Desc& op_graph, const EngineId& id);

// A finalized execution plan of `config`, or an empty Desc (and *why set) when cuDNN refuses it,
// or when `config` is a runtime-compiled engine's (behavior note RUNTIME_COMPILATION: finalizing
// compiles a kernel) while KILN_CUDA_NO_COMPILE is set (compiling_forbidden(), nvrtc.h).
// `handle` null: the plan is finalized on the current device's properties descriptor (cuDNN 9.8
// and later), with no handle of its own, and executes on any handle of that device.
Desc make_plan(cudnnHandle_t handle, const Desc& config, std::string* why);
// The plan's serialized form (CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION), or "" where cuDNN
// does not serialize it. cuDNN serializes the plans of runtime-fusion engines, the ones whose
// finalization compiles a kernel (up to seconds); plan_from_json makes the plan again from the
// text on `handle` without compiling (so also with KILN_CUDA_NO_COMPILE set), or returns an
// empty Desc when cuDNN refuses it (another cuDNN version or GPU).
std::string plan_json(const Desc& plan);
Desc plan_from_json(cudnnHandle_t handle, const std::string& json);
// make_plan for each config, at once on threads of their own sharing kPlanLanes lanes (each
// takes a lane no other thread holds, where there is one), off the caller's build turn
// (build_turn.h): finalizing a runtime-fusion engine's plan compiles its kernel, up to a second
// each. The caller must hold no handle lock. With cuDNN 9.8 and later the lanes only bound how
// many plans finalize at once: each plan is finalized on the device's properties, handle-free.
// Before 9.8 each lane has a handle of its own, which lives for the process (its device memory
// is not given back by cudnnDestroy anyway), since a plan must not outlive the handle it
// was finalized on and the plan kept cannot move to lane 0 (with cuDNN 9.19, finalizing a
// runtime-fusion engine config into a second plan failed to compile).
// (*why)[i] says why plans[i] is empty.
inline constexpr int kPlanLanes = 8;
std::vector<Desc> make_plans(const std::vector<const Desc*>& configs, std::vector<std::string>* why);

// A finalized variant pack: `ptrs` in the order of `uids`.
Desc make_variant_pack(const std::vector<int64_t>& uids, const std::vector<void*>& ptrs, void* workspace);
// cudnnSetStream + cudnnBackendExecute under the handle's lock.
void execute(const Desc& plan, const Desc& vp, cudaStream_t stream);

// The empty kernel PlanRunner launches in front of a direct cuDNN launch (below), compiled on
// first use (the backend's warm-up asks for it ahead of the first build).
cudaKernel_t launch_fence_kernel();

// An execution plan and its tensors' uids, run with data pointers given in uid order. The
// variant packs of the last few pointer sets are kept, so a steady-state run (and a CUDA graph
// capture) builds none. Thread-safe.
//
// cuDNN launches some of its kernels for programmatic dependent launch, and its runtime-fusion
// conv + residual kernel reads the residual before waiting for the kernel that writes it (run
// without graphs, a residual block then reads a stale residual on some calls). So a plan
// launched directly (not into a graph being recorded) whose launches start early gets the launch
// fence in front of it: an empty kernel launched the ordinary way, which starts only once
// everything before it has finished, so the early start has nothing left to overtake. Whether a
// plan starts early is read once, from a recording of the fence and the plan (starts_early in
// cuda_util.h); the other plans launch without the fence's extra launch. A recorded graph
// needs no fence: record_graph makes those programmatic edges full dependencies.
class PlanRunner {
 public:
  PlanRunner(Desc plan, std::vector<int64_t> uids);
  ~PlanRunner();
  PlanRunner(const PlanRunner&) = delete;
  PlanRunner& operator=(const PlanRunner&) = delete;

  // ptrs: one per uid, in uid order.
  void run(void* const* ptrs, void* workspace, cudaStream_t stream) const;
  size_t workspace_size() const { return ws_; }

 private:
  static constexpr size_t kMaxPacks = 8;
  Desc plan_;
  std::vector<int64_t> uids_;
  size_t ws_ = 0;
  mutable std::mutex mu_;
  mutable std::vector<std::pair<std::vector<void*>, Desc>> packs_;  // key: pointers, then the workspace
  // Whether the plan's launches start early; -1: not read yet. Set once, under mu_; read before
  // it, so that a direct run of a plan that does not start early skips the fence kernel's lookup.
  mutable std::atomic<int> starts_early_{-1};
};

}  // namespace kiln::cuda
