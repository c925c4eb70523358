// The cuDNN backend-API layer of cudnn_graph.h: descriptor ownership, error messages, the
// per-device handles, and reading / rebuilding engine configurations.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <future>
#include <map>
#include <memory>
#include <mutex>

#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/libs/cudnn_graph.h"
#include "src/backends/cuda/tuning/build_turn.h"

namespace kiln::cuda {

cudnnDataType_t cudnn_dtype(DType t) {
  switch (t) {
    case DType::kF32: return CUDNN_DATA_FLOAT;
    case DType::kF16: return CUDNN_DATA_HALF;
    case DType::kBF16: return CUDNN_DATA_BFLOAT16;
    default: KILN_FAIL(kUnsupported, "cuDNN: dtype ", dtype_name(t), " (f32, f16 or bf16 only)");
  }
}

Desc tensor_desc(int64_t uid, cudnnDataType_t dt, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                 bool is_virtual, const std::string& what) {
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
  t.set_i64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
      .set_dtype(CUDNN_ATTR_TENSOR_DATA_TYPE, dt)
      .set_i64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16)
      .set_i64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
      .set_i64s(CUDNN_ATTR_TENSOR_STRIDES, strides)
      .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual)
      .finalize();
  return t;
}

Desc scalar_desc(int64_t uid, const std::string& what) {
  const bool by_value = true;
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
  t.set_i64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
      .set_dtype(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_DATA_FLOAT)
      .set_i64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 4)
      .set_i64s(CUDNN_ATTR_TENSOR_DIMENSIONS, {1, 1, 1, 1})
      .set_i64s(CUDNN_ATTR_TENSOR_STRIDES, {1, 1, 1, 1})
      .set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value)
      .finalize();
  return t;
}

const Desc& pointwise_op(std::deque<Desc>& parts, cudnnPointwiseMode_t mode, const Desc& x, const Desc* b,
                         const Desc& y, const std::string& what, double relu_upper_clip) {
  Desc& pd = parts.emplace_back(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what + " (pointwise descriptor)");
  pd.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .set_dtype(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_FLOAT);
  if (mode == CUDNN_POINTWISE_SWISH_FWD) {
    const float one = 1.0f;
    pd.set(CUDNN_ATTR_POINTWISE_SWISH_BETA, CUDNN_TYPE_FLOAT, 1, &one);
  }
  if (mode == CUDNN_POINTWISE_RELU_FWD && relu_upper_clip > 0) {
    const double lower = 0.0;
    pd.set(CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP, CUDNN_TYPE_DOUBLE, 1, &lower)
        .set(CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP, CUDNN_TYPE_DOUBLE, 1, &relu_upper_clip);
  }
  pd.finalize();
  Desc& op = parts.emplace_back(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what);
  op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pd)
      .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x)
      .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
  op.finalize();
  return op;
}

std::string cudnn_last_error() {
  std::array<char, 1024> buf{};
  cudnnGetLastErrorString(buf.data(), buf.size());
  return std::string(buf.data());
}

void fail_cudnn(cudnnStatus_t status, const char* expr, const char* file, int line) {
  const std::string last = cudnn_last_error();
  const std::string msg = detail::concat(expr, " failed: ", cudnnGetErrorString(status), " (", int(status), ")",
                                         last.empty() ? "" : ": ", last, " at ", file, ":", line);
  if (status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
    throw Error(ErrorCode::kInvalidArgument, "out of device memory: " + msg);
  if (CUDNN_STATUS_CATEGORY(status) == CUDNN_STATUS_NOT_SUPPORTED) throw Error(ErrorCode::kUnsupported, msg);
  throw Error(ErrorCode::kInternal, msg);
}

Desc::Desc(cudnnBackendDescriptorType_t type, std::string what) : what_(std::move(what)) {
  const cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d_);
  if (st != CUDNN_STATUS_SUCCESS) {
    d_ = nullptr;
    fail_cudnn(st, ("cudnnBackendCreateDescriptor for " + what_).c_str(), __FILE__, __LINE__);
  }
}

Desc& Desc::operator=(Desc&& o) noexcept {
  if (this != &o) {
    reset();
    d_ = std::exchange(o.d_, nullptr);
    what_ = std::move(o.what_);
  }
  return *this;
}

void Desc::reset() {
  if (d_) cudnnBackendDestroyDescriptor(d_);
  d_ = nullptr;
}

Desc& Desc::set(cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type, int64_t count, const void* values) {
  KILN_CHECK(d_ != nullptr, kInternal, "cuDNN: setting attribute ", int(attr), " of an empty descriptor (", what_, ")");
  const cudnnStatus_t st = cudnnBackendSetAttribute(d_, attr, type, count, values);
  if (st != CUDNN_STATUS_SUCCESS)
    fail_cudnn(st, detail::concat("cudnnBackendSetAttribute(", what_, ", attribute ", int(attr), ")").c_str(), __FILE__,
               __LINE__);
  return *this;
}

Desc& Desc::set_descs(cudnnBackendAttributeName_t attr, const std::vector<const Desc*>& ds) {
  std::vector<cudnnBackendDescriptor_t> raw;
  for (const Desc* d : ds) raw.push_back(d->get());
  return set(attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(raw.size()), raw.data());
}

cudnnStatus_t Desc::try_finalize() { return d_ ? cudnnBackendFinalize(d_) : CUDNN_STATUS_BAD_PARAM_NULL_POINTER; }

Desc& Desc::finalize() {
  const cudnnStatus_t st = try_finalize();
  if (st != CUDNN_STATUS_SUCCESS) fail_cudnn(st, ("cudnnBackendFinalize(" + what_ + ")").c_str(), __FILE__, __LINE__);
  return *this;
}

int64_t Desc::get_i64(cudnnBackendAttributeName_t attr) const {
  int64_t v = 0, n = 0;
  KILN_CUDNN_CHECK(cudnnBackendGetAttribute(d_, attr, CUDNN_TYPE_INT64, 1, &n, &v));
  return v;
}

namespace {

struct Slot {
  std::recursive_mutex mu;
  cudnnHandle_t handle = nullptr;
};
std::mutex table_mu;
std::map<std::pair<int, int>, std::unique_ptr<Slot>> table;  // (device, lane); slots live for the process

Slot& slot_of(int lane) {
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> g(table_mu);
  auto& s = table[{device, lane}];
  if (!s) s = std::make_unique<Slot>();
  return *s;
}

HandleLock locked(Slot& slot, std::unique_lock<std::recursive_mutex> lock, bool with_handle = true) {
  if (with_handle && !slot.handle) KILN_CUDNN_CHECK(cudnnCreate(&slot.handle));
  return HandleLock{with_handle ? slot.handle : nullptr, std::move(lock)};
}

// The device-properties descriptor of each device, made on first use; null where cuDNN has
// none (before 9.8). Read-only once finalized, so threads share it.
const Desc* device_props() {
#if CUDNN_VERSION >= 90800
  if (cudnnGetVersion() < 90800) return nullptr;
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mu;
  static std::map<int, Desc> props;
  std::lock_guard<std::mutex> g(mu);
  auto it = props.find(device);
  if (it == props.end()) {
    Desc d(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "device properties of device " + std::to_string(device));
    const int32_t id = device;
    d.set(CUDNN_ATTR_DEVICEPROP_DEVICE_ID, CUDNN_TYPE_INT32, 1, &id).finalize();
    it = props.emplace(device, std::move(d)).first;
  }
  return &it->second;
#else
  return nullptr;
#endif
}

// A plan lane for the i-th config of a make_plans call: the first one from 1 + i % kPlanLanes
// on that no thread holds (concurrent builds share the lanes, build_turn.h), else that one.
// Its handle is null where plans finalize on the device's properties instead.
HandleLock lock_plan_lane(size_t i) {
  const bool with_handle = device_props() == nullptr;
  for (int k = 0; k < kPlanLanes; ++k) {
    Slot& slot = slot_of(1 + int((i + size_t(k)) % kPlanLanes));
    std::unique_lock<std::recursive_mutex> lock(slot.mu, std::try_to_lock);
    if (lock.owns_lock()) return locked(slot, std::move(lock), with_handle);
  }
  Slot& slot = slot_of(1 + int(i % kPlanLanes));
  return locked(slot, std::unique_lock<std::recursive_mutex>(slot.mu), with_handle);
}

}  // namespace

HandleLock lock_handle(int lane) {
  Slot& slot = slot_of(lane);
  return locked(slot, std::unique_lock<std::recursive_mutex>(slot.mu));
}

std::string EngineId::to_string() const {
  std::string s = "engine ";
  s += std::to_string(engine);
  s += " {";
  for (size_t i = 0; i < knobs.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(knobs[i].first);
    s += '=';
    s += std::to_string(knobs[i].second);
  }
  return s + "}";
}

bool EngineInfo::has_numerical(cudnnBackendNumericalNote_t n) const {
  for (auto v : numerical)
    if (v == n) return true;
  return false;
}

EngineInfo engine_info(const Desc& cfg) {
  EngineInfo info;
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR, std::string("engine of ") + cfg.what());
  cudnnBackendDescriptor_t e = engine.get();
  int64_t n = 0;
  KILN_CUDNN_CHECK(
      cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e));
  info.id.engine = engine.get_i64(CUDNN_ATTR_ENGINE_GLOBAL_INDEX);

  std::vector<Desc> choices;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int i = 0; i < CUDNN_KNOB_TYPE_COUNTS; ++i) {
    choices.emplace_back(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, "knob choice");
    raw.push_back(choices.back().get());
  }
  KILN_CUDNN_CHECK(cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                            int64_t(raw.size()), &n, raw.data()));
  for (int64_t i = 0; i < n && i < int64_t(raw.size()); ++i) {
    cudnnBackendKnobType_t type{};
    int64_t value = 0, c = 0;
    KILN_CUDNN_CHECK(
        cudnnBackendGetAttribute(raw[size_t(i)], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &c, &type));
    KILN_CUDNN_CHECK(
        cudnnBackendGetAttribute(raw[size_t(i)], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &c, &value));
    info.id.knobs.emplace_back(int32_t(type), value);
  }

  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, int64_t(notes.size()),
                               &n, notes.data()) == CUDNN_STATUS_SUCCESS)
    info.numerical.assign(notes.begin(), notes.begin() + std::min<int64_t>(n, int64_t(notes.size())));
  std::array<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT> behavior{};
  if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE, int64_t(behavior.size()),
                               &n, behavior.data()) == CUDNN_STATUS_SUCCESS)
    info.behavior.assign(behavior.begin(), behavior.begin() + std::min<int64_t>(n, int64_t(behavior.size())));
  return info;
}

namespace {

void append_mode(const Desc& graph, cudnnBackendHeurMode_t mode, const char* name, std::vector<Desc>& out,
                 std::vector<EngineId>& seen, std::string* log) {
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, std::string("heuristics ") + name);
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (cudnnStatus_t st = heur.try_finalize(); st != CUDNN_STATUS_SUCCESS) {
    if (log) *log += detail::concat("heuristics ", name, ": ", cudnnGetErrorString(st), " ", cudnn_last_error(), "; ");
    return;
  }
  int64_t count = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS)
    count = 0;
  std::vector<Desc> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, std::string("engine config (") + name + ")");
    raw.push_back(cfgs.back().get());
  }
  int64_t got = 0;
  if (count > 0)
    KILN_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                              count, &got, raw.data()));
  if (log) *log += detail::concat("heuristics ", name, ": ", got, " configs; ");
  for (int64_t i = 0; i < got && i < count; ++i) {
    EngineId id;
    try {
      id = engine_info(cfgs[size_t(i)]).id;
    } catch (const Error&) {
      continue;
    }
    bool dup = false;
    for (const auto& s : seen) dup = dup || s == id;
    if (dup) continue;
    seen.push_back(id);
    out.push_back(std::move(cfgs[size_t(i)]));
  }
}

}  // namespace

std::vector<Desc> heuristic_configs(const Desc& graph, std::string* log) {
  std::vector<Desc> out;
  std::vector<EngineId> seen;
  append_mode(graph, CUDNN_HEUR_MODE_A, "A", out, seen, log);
  append_mode(graph, CUDNN_HEUR_MODE_FALLBACK, "fallback", out, seen, log);
  return out;
}

Desc make_engine_config(const Desc& graph, const EngineId& id) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR, std::string("engine ") + std::to_string(id.engine));
  engine.set_desc(CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph).set_i64(CUDNN_ATTR_ENGINE_GLOBAL_INDEX, id.engine);
  engine.finalize();
  std::vector<Desc> knobs;
  std::vector<const Desc*> ptrs;
  for (const auto& [type, value] : id.knobs) {
    knobs.emplace_back(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, std::string("knob choice ") + std::to_string(type));
    auto t = static_cast<cudnnBackendKnobType_t>(type);
    knobs.back().set(CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &t);
    knobs.back().set_i64(CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, value).finalize();
  }
  for (const auto& k : knobs) ptrs.push_back(&k);
  Desc cfg(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config " + id.to_string());
  cfg.set_desc(CUDNN_ATTR_ENGINECFG_ENGINE, engine);
  if (!ptrs.empty()) cfg.set_descs(CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, ptrs);
  cfg.finalize();
  return cfg;
}

Desc make_plan(cudnnHandle_t handle, const Desc& config, std::string* why) {
  if (compiling_forbidden()) {
    const std::vector<cudnnBackendBehaviorNote_t> notes = engine_info(config).behavior;
    if (std::find(notes.begin(), notes.end(), CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) != notes.end()) {
      if (why)
        *why =
            "KILN_CUDA_NO_COMPILE is set, yet this engine config compiles a kernel when finalized (a "
            "runtime-compiled cuDNN engine)";
      return Desc();
    }
  }
  Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, std::string("execution plan of ") + config.what());
  if (handle) {
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  } else {
    const Desc* props = device_props();
    if (!props)
      KILN_FAIL(kInternal, "make_plan: no cuDNN handle, and cuDNN ", cudnnGetVersion(),
                " cannot finalize a plan on device properties (9.8 or later)");
#if CUDNN_VERSION >= 90800
    plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, *props);
#endif
  }
  plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
  if (cudnnStatus_t st = plan.try_finalize(); st != CUDNN_STATUS_SUCCESS) {
    if (why) *why = detail::concat(cudnnGetErrorString(st), " ", cudnn_last_error());
    return Desc();
  }
  return plan;
}

std::string plan_json(const Desc& plan) {
  int64_t n = 0;
  if (!plan ||
      cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &n,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      n <= 0)
    return {};
  std::string text(size_t(n), '\0');
  if (cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, n, &n,
                               text.data()) != CUDNN_STATUS_SUCCESS)
    return {};
  text.resize(std::min(text.size(), size_t(std::max<int64_t>(n, 0))));
  while (!text.empty() && text.back() == '\0') text.pop_back();
  return text;
}

Desc plan_from_json(cudnnHandle_t handle, const std::string& json) {
  Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan (serialized)");
  cudnnStatus_t st =
      cudnnBackendSetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                                  int64_t(json.size()), json.data());
  if (st == CUDNN_STATUS_SUCCESS) st = plan.try_finalize();
  return st == CUDNN_STATUS_SUCCESS ? std::move(plan) : Desc();
}

std::vector<Desc> make_plans(const std::vector<const Desc*>& configs, std::vector<std::string>* why) {
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  why->assign(configs.size(), std::string());
  const OffTurn off;  // host work on configs of the caller's own (build_turn.h)
  std::vector<std::future<Desc>> done;
  for (size_t i = 0; i < configs.size(); ++i)
    done.push_back(std::async(std::launch::async, [&, i] {
      KILN_CUDA_CHECK(cudaSetDevice(device));
      HandleLock h = lock_plan_lane(i);
      return make_plan(h.handle, *configs[i], &(*why)[i]);
    }));
  std::vector<Desc> plans;
  for (size_t i = 0; i < done.size(); ++i) {
    try {
      plans.push_back(done[i].get());
    } catch (const Error& e) {
      plans.emplace_back();
      (*why)[i] = e.what();
    }
  }
  return plans;
}

Desc make_variant_pack(const std::vector<int64_t>& uids, const std::vector<void*>& ptrs, void* workspace) {
  Desc vp(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
  vp.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(ptrs.size()), ptrs.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace)
      .finalize();
  return vp;
}

cudaKernel_t launch_fence_kernel() {
  return Module::support_kernel("extern \"C\" __global__ void kiln_fence() {}", "kiln_fence", "the launch fence");
}

void execute(const Desc& plan, const Desc& vp, cudaStream_t stream) {
  HandleLock h = lock_handle();
  KILN_CUDNN_CHECK(cudnnSetStream(h.handle, stream));
  KILN_CUDNN_CHECK(cudnnBackendExecute(h.handle, plan.get(), vp.get()));
}

PlanRunner::PlanRunner(Desc plan, std::vector<int64_t> uids) : plan_(std::move(plan)), uids_(std::move(uids)) {
  ws_ = size_t(plan_.get_i64(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE));
}

PlanRunner::~PlanRunner() {
  std::lock_guard<std::mutex> g(mu_);
  packs_.clear();
}

void PlanRunner::run(void* const* ptrs, void* workspace, cudaStream_t stream) const {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  const bool direct = capturing == cudaStreamCaptureStatusNone;
  // Asked for before the lock: compiling the fence (when the warm-up has not) gives up the
  // build's turn, which no lock may be held across (build_turn.h). Not once the plan is known
  // not to start early (starts_early_ only ever moves from -1).
  const cudaKernel_t fence = direct && starts_early_.load() != 0 ? launch_fence_kernel() : nullptr;
  void* const ws = ws_ ? workspace : nullptr;
  const size_t n = uids_.size();
  std::lock_guard<std::mutex> g(mu_);
  const Desc* vp = nullptr;
  for (const auto& e : packs_)
    if (e.first.back() == ws && std::equal(ptrs, ptrs + n, e.first.begin())) vp = &e.second;
  if (!vp) {
    if (packs_.size() >= kMaxPacks) packs_.erase(packs_.begin());
    std::vector<void*> key(ptrs, ptrs + n);
    Desc pack = make_variant_pack(uids_, key, ws);
    key.push_back(ws);
    packs_.emplace_back(std::move(key), std::move(pack));
    vp = &packs_.back().second;
  }
  if (direct) {
    if (starts_early_.load() < 0) {
      // The execution handle stays held while the probe's capture is open, so that no other thread
      // sets its stream meanwhile (a first call beside background builds once failed there with
      // CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH). execute() takes the same (recursive) lock again.
      const HandleLock held = lock_handle();
      bool early = true;  // a plan that cannot be recorded keeps the fence
      try {
        early = starts_early([&](cudaStream_t s) {
          launch(fence, dim3(1), dim3(1), nullptr, 0, s);
          execute(plan_, *vp, s);
        });
      } catch (const Error&) {
      }
      starts_early_.store(early ? 1 : 0);
    }
    if (starts_early_.load() > 0) launch(fence, dim3(1), dim3(1), nullptr, 0, stream);
  }
  execute(plan_, *vp, stream);
}

}  // namespace kiln::cuda
