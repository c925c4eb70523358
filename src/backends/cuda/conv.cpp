// The CUDA conv family: conv and conv_transpose (1-D as 2-D with H = 1) through cuDNN's graph
// API, with the epilogue act(conv(x, w) + bias + residual) fused into the same cuDNN graph.
//
// Build: the operation graph of conv_graph.h (fused), cuDNN's heuristics (mode A, then the
// fallback list) propose engine configs; the first few that finalize into a plan whose
// workspace fits are timed on scratch buffers (tactics.h) and the fastest is kept, in the
// timing cache and in state(). When no engine runs the fused graph, the graph is the conv alone
// and a generated NVRTC kernel applies bias / residual / activation in place afterwards
// (describe() says so). Load: state() names the engine (global index + knobs) and whether the
// graph was fused; the plan is rebuilt from it without heuristics or timing.
//
// Run: one cuDNN handle per device, used under its lock (cudnnSetStream + cudnnBackendExecute).
// Variant packs (the data pointers) are cached per kernel for the last few pointer sets, so a
// steady-state run builds none. Everything run() enqueues is capturable into a CUDA graph.
#include <algorithm>
#include <array>
#include <memory>
#include <mutex>

#include "src/backends/cuda/conv_tactic.h"
#include "src/backends/cuda/cuda_util.h"
#include "src/backends/cuda/kernels.h"
#include "src/backends/cuda/nvrtc.h"
#include "src/backends/cuda/tactics.h"

namespace kiln::cuda {

namespace {

struct Epilogue {
  std::shared_ptr<const Module> module;
  cudaKernel_t fn = nullptr;
  int64_t n = 0, inner = 1, channels = 1;
  unsigned grid = 1;
};

class ConvKernel final : public Kernel {
 public:
  ConvKernel(ConvGeom q, ConvOpGraph og, Desc plan, ConvChoice choice, Epilogue epi, std::string desc)
      : q_(std::move(q)), og_(std::move(og)), plan_(std::move(plan)), choice_(std::move(choice)),
        epi_(std::move(epi)), desc_(std::move(desc)) {
    ws_ = size_t(plan_.get_i64(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE));
  }
  ~ConvKernel() override {
    std::lock_guard<std::mutex> g(mu_);
    packs_.clear();
  }

  void run(const void* const* in, void* const* out, const RunContext& rc) const override {
    const cudaStream_t stream = stream_of(rc);
    KILN_CHECK(rc.workspace_size >= ws_, kInvalidArgument, "conv: workspace of ", rc.workspace_size,
               " bytes, the cuDNN plan needs ", ws_);
    Key key{};
    size_t k = 0;
    uintptr_t align = 0;
    for (int64_t uid : og_.uids) {
      void* p = uid == kUidY ? out[0] : const_cast<void*>(in[uid == kUidX ? 0 : uid == kUidW ? 1 : uid == kUidBias ? 2 : 3]);
      key[k++] = p;
      align |= reinterpret_cast<uintptr_t>(p);
    }
    key[kMaxPtrs] = ws_ ? rc.workspace : nullptr;
    KILN_CHECK(align % 16 == 0, kInvalidArgument, "conv: cuDNN plans assume 16-byte aligned tensors");
    {
      std::lock_guard<std::mutex> g(mu_);
      const Desc* vp = nullptr;
      for (auto& e : packs_)
        if (e.key == key) vp = &e.pack;
      if (!vp) {
        if (packs_.size() >= 8) packs_.erase(packs_.begin());
        std::vector<void*> ptrs(key.begin(), key.begin() + og_.uids.size());
        packs_.push_back({key, make_variant_pack(og_.uids, ptrs, key[kMaxPtrs])});
        vp = &packs_.back().pack;
      }
      execute(plan_, *vp, stream);
    }
    if (epi_.fn) {
      void* y = out[0];
      const void* bias = q_.bias ? in[2] : nullptr;
      const void* res = q_.residual ? in[3] : nullptr;
      int64_t n = epi_.n, inner = epi_.inner, channels = epi_.channels;
      void* args[] = {&y, &bias, &res, &n, &inner, &channels};
      launch(epi_.fn, dim3(epi_.grid), dim3(256), args, 0, stream);
    }
  }

  size_t workspace_size() const override { return ws_; }
  std::string describe() const override { return desc_; }
  Bytes state() const override {
    return pack_state(epi_.module ? epi_.module->cubin() : Bytes{}, encode_conv_choice(choice_));
  }

 private:
  static constexpr size_t kMaxPtrs = 5;
  using Key = std::array<void*, kMaxPtrs + 1>;  // tensor pointers in uid order, then the workspace
  struct Pack {
    Key key;
    Desc pack;
  };
  ConvGeom q_;
  ConvOpGraph og_;
  Desc plan_;
  ConvChoice choice_;
  Epilogue epi_;
  std::string desc_;
  size_t ws_ = 0;
  mutable std::mutex mu_;
  mutable std::vector<Pack> packs_;
};

Epilogue make_epilogue(const ConvGeom& q, std::shared_ptr<const Module> module) {
  Epilogue e;
  e.module = std::move(module);
  e.fn = e.module->kernel("kiln_conv_epilogue");
  e.n = q.y_numel();
  e.inner = q.nhwc ? 1 : q.OH * q.OW;
  e.channels = q.O;
  const int64_t blocks = (e.n + 255) / 256, cap = int64_t(current_device().sm_count) * 8;
  e.grid = unsigned(std::max<int64_t>(1, std::min(blocks, cap)));
  return e;
}

}  // namespace

bool supports_conv(const Node& n, const Graph& g, std::string* why) {
  try {
    const ConvGeom q = conv_geometry(n, g);
    if (q.dtype != DType::kF32 && q.dtype != DType::kF16 && q.dtype != DType::kBF16) {
      if (why) *why = std::string(op_name(n.op)) + " on CUDA runs f32, f16 and bf16, got " + dtype_name(q.dtype);
      return false;
    }
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

std::unique_ptr<Kernel> make_conv_kernel(const Node& n, const Graph& g, const KernelOptions& options,
                                         const Bytes* state) {
  const ConvGeom q = conv_geometry(n, g);
  const std::string what = std::string(op_name(n.op)) + " '" + n.name + "'";
  const std::vector<std::string> parts = conv_key_parts(q);
  const uint64_t sig = conv_signature(parts);
  ConvPlan b;
  Bytes cubin;
  if (state) {  // load: decode everything before touching the device
    CompiledState cs = unpack_state(*state);
    const ConvChoice c = decode_conv_choice(cs.params);
    KILN_CHECK(c.signature == sig, kCorrupted, what, ": the saved conv tactic was made for another conv");
    const bool needs_epilogue = !c.fused && q.has_epilogue();
    KILN_CHECK(needs_epilogue == !cs.cubin.empty(), kCorrupted, what, ": saved conv state ",
               needs_epilogue ? "lacks the epilogue's cubin" : "has an unexpected cubin");
    HandleLock hl = lock_handle();
    std::string why;
    KILN_CHECK(rebuild_conv_plan(q, hl.handle, c, what, b, &why), kUnsupported, what,
               ": cuDNN cannot rebuild the saved plan (", EngineId{c.engine, c.knobs}.to_string(),
               "; another cuDNN version or GPU?): ", why);
    b.note = "saved tactic";
    cubin = std::move(cs.cubin);
  } else {
    std::vector<std::string> key_parts = parts;
    key_parts.push_back(strict_f32(q.dtype) ? "strict-f32" : "tf32-ok");
    key_parts.push_back(std::string("ws<=") + std::to_string(options.workspace_limit));
    const std::string key = timing_key("conv", key_parts);
    bool have = false;
    if (auto cached = timing_cache_find(key)) {
      try {
        const ConvChoice c = decode_conv_choice(*cached);
        HandleLock hl = lock_handle();
        std::string why;
        have = c.signature == sig && rebuild_conv_plan(q, hl.handle, c, what, b, &why);
        if (have) b.note = "timing cache";
      } catch (const Error&) {
        have = false;  // a damaged entry: choose again and overwrite it
      }
    }
    if (!have) {
      b = search_conv_plan(q, options, what, sig);
      timing_cache_insert(key, encode_conv_choice(b.choice));
    }
  }

  Epilogue epi;
  const bool separate = !b.choice.fused && q.has_epilogue();
  if (separate)
    epi = make_epilogue(q, state ? Module::load(std::move(cubin)) : Module::compile(conv_epilogue_source(q), what));
  std::string desc = "cudnn " + b.og.ops + " [" + EngineId{b.choice.engine, b.choice.knobs}.to_string() + "]";
  if (separate) desc += " + generated epilogue (cuDNN could not fuse it)";
  desc += ", " + b.note;
  if (desc.size() > 800) desc = desc.substr(0, 800) + "...";
  return std::make_unique<ConvKernel>(q, std::move(b.og), std::move(b.plan), b.choice, std::move(epi), desc);
}

}  // namespace kiln::cuda
