// The CUDA conv family: conv and conv_transpose (1-D as 2-D with H = 1) through cuDNN's graph
// API, with the epilogue act(conv(x, w) + bias + residual) fused into the same cuDNN graph.
//
// Build: the operation graph of conv_graph.h (fused), cuDNN's heuristics (mode A, then the
// fallback list) propose engine configs; the first few that finalize into a plan whose
// workspace fits are timed on scratch buffers (tactics.h) and the fastest is kept, in the
// timing cache and in state(). When no engine runs the fused graph, the graph is the conv alone
// and a generated NVRTC kernel applies bias / residual / activation in place afterwards
// (describe() says so). A hardswish / hardsigmoid epilogue is a chain of cuDNN pointwise ops,
// whose fused plans are timed against the conv alone + the generated epilogue. Load: state()
// names the engine (global index + knobs) and whether the graph was fused; the plan is rebuilt
// from it without heuristics or timing.
//
// Depthwise convs (nhwc, groups == C == O; depthwise.h) have a second tactic: a generated NVRTC
// kernel, built and timed against the cuDNN plans (the fused graph's, for these often a slow
// grouped direct kernel, and the conv alone's with the generated epilogue); the fastest is
// kept, in the timing cache and in state() (ConvChoice::tactic, with the generated kernel's
// cubin), so that loading remakes it without compiling. At optimization
// level 0 the generated kernel is taken untimed: cuDNN and the timing cache are not asked, and
// the untimed choice is not recorded there.
//
// A conv that is one GEMM (gemm_conv: channels-last, groups 1, a 1x1 kernel without padding or
// dilation, stride 1 or a 1x1 image) has another tactic: the linear family's cuBLASLt GEMM
// (matmul.cpp) over the conv's own buffers, x [N, H, W, C] as [N*H*W, C] and the weight
// [O, 1, 1, C] as [O, C], with bias / residual / activation in its epilogue. cuDNN pads channel
// counts that are not multiples of 8 and transforms such weights on every run, while its fused
// kernels win on some small images; the build times both and keeps the faster (ConvChoice::tactic
// kGemm, saved with the GEMM kernel's own state).
//
// Run: one cuDNN handle per device, used under its lock (cudnnSetStream + cudnnBackendExecute).
// Variant packs (the data pointers) are cached per kernel for the last few pointer sets, so a
// steady-state run builds none. Everything run() enqueues is capturable into a CUDA graph.
#include <algorithm>
#include <array>
#include <memory>
#include <mutex>

#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/kernels.h"
#include "src/backends/cuda/kernels/conv_tactic.h"
#include "src/backends/cuda/kernels/depthwise.h"
#include "src/backends/cuda/libs/cublaslt.h"
#include "src/backends/cuda/tuning/tactics.h"
#include "src/ops/epilogue.h"

namespace kiln::cuda {

namespace {

struct Epilogue {
  std::shared_ptr<const Module> module;
  cudaKernel_t fn = nullptr;
  cudaKernel_t vec = nullptr;  // channels-last, 16-byte vectors of channels (null: not eligible)
  unsigned vec_grid = 1;
  int64_t n = 0, inner = 1, channels = 1;
  unsigned grid = 1;
};

class ConvKernel final : public Kernel {
 public:
  ConvKernel(ConvGeom q, ConvOpGraph og, Desc plan, ConvChoice choice, Epilogue epi, std::string desc)
      : q_(std::move(q)),
        og_(std::move(og)),
        runner_(std::move(plan), og_.uids),
        choice_(std::move(choice)),
        epi_(std::move(epi)),
        desc_(std::move(desc)) {}

  void run(const void* const* in, void* const* out, const RunContext& rc) const override {
    const cudaStream_t stream = stream_of(rc);
    KILN_CHECK(rc.workspace_size >= runner_.workspace_size(), kInvalidArgument, "conv: workspace of ",
               rc.workspace_size, " bytes, the cuDNN plan needs ", runner_.workspace_size());
    std::array<void*, kMaxPtrs> ptrs{};
    size_t k = 0;
    uintptr_t align = 0;
    void* bias = q_.bias ? const_cast<void*>(in[2]) : nullptr;
    void* res = q_.residual ? const_cast<void*>(in[3]) : nullptr;
    for (int64_t uid : og_.uids) {
      void* p = conv_data_ptr(uid, const_cast<void*>(in[0]), const_cast<void*>(in[1]), bias, res, out[0]);
      ptrs[k++] = p;
      if (uid != kUidThree && uid != kUidSixth) align |= reinterpret_cast<uintptr_t>(p);
    }
    KILN_CHECK(align % 16 == 0, kInvalidArgument, "conv: cuDNN plans assume 16-byte aligned tensors");
    runner_.run(ptrs.data(), rc.workspace, stream);
    if (epi_.fn) {
      void* y = out[0];
      int64_t n = epi_.n, inner = epi_.inner, channels = epi_.channels;
      if (epi_.vec && (uintptr_t(y) | uintptr_t(bias) | uintptr_t(res)) % 16 == 0) {
        int64_t nvec = n / int64_t(16 / dtype_size(q_.dtype));
        void* args[] = {&y, &bias, &res, &nvec, &channels};
        launch(epi_.vec, dim3(epi_.vec_grid), dim3(256), args, 0, stream);
      } else {
        void* args[] = {&y, &bias, &res, &n, &inner, &channels};
        launch(epi_.fn, dim3(epi_.grid), dim3(256), args, 0, stream);
      }
    }
  }

  size_t workspace_size() const override { return runner_.workspace_size(); }
  bool bakes_constants() const override { return false; }  // weights and bias by pointer
  // The residual (input 3) may share the output's bytes when the fused plan gives the same
  // result in place; a separate epilogue reads the residual after the conv has written the
  // output, so it may not. Checked once per kernel, on the device it was made for; a check that
  // cannot run (no memory for its scratch buffers) answers no.
  bool writes_over_input(size_t input) const override {
    if (input != 3 || !q_.residual || epi_.fn) return false;
    std::call_once(in_place_checked_, [this] {
      try {
        DeviceGuard guard(device_);
        in_place_ = runs_in_place(q_, *this);
      } catch (const Error&) {
        in_place_ = false;
        (void)cudaGetLastError();  // an allocation failure is not sticky: clear it for the next call
      }
    });
    return in_place_;
  }
  std::string describe() const override { return desc_; }
  void add_note(const std::string& note) { desc_ += "; " + note; }
  Bytes state() const override {
    return pack_state(epi_.module ? epi_.module->cubin() : Bytes{}, encode_conv_choice(choice_));
  }

 private:
  static constexpr size_t kMaxPtrs = 7;  // x, w, bias, residual, two scalars, y
  int device_ = current_device().index;  // the device the kernel was made for
  mutable std::once_flag in_place_checked_;
  mutable bool in_place_ = false;
  ConvGeom q_;
  ConvOpGraph og_;  // the plan was made from these descriptors: they live as long as it does
  PlanRunner runner_;
  ConvChoice choice_;
  Epilogue epi_;
  std::string desc_;
};

Epilogue make_epilogue(const ConvGeom& q, std::shared_ptr<const Module> module) {
  Epilogue e;
  e.module = std::move(module);
  e.fn = e.module->kernel("kiln_conv_epilogue");
  e.n = q.y_numel();
  e.inner = q.nhwc ? 1 : q.OD * q.OH * q.OW;
  e.channels = q.O;
  const int64_t cap = int64_t(current_device().sm_count) * 8;
  auto grid = [cap](int64_t n) { return unsigned(std::max<int64_t>(1, std::min((n + 255) / 256, cap))); };
  e.grid = grid(e.n);
  const int64_t per = int64_t(16 / dtype_size(q.dtype));
  if (q.nhwc && q.O % per == 0) {
    e.vec = e.module->kernel("kiln_conv_epilogue_vec");
    e.vec_grid = grid(e.n / per);
  }
  return e;
}

// A gemm_conv run as the linear family's GEMM kernel, which reads the conv's inputs in the same
// order (x, weight, bias, residual) and writes its output.
class ConvGemmKernel final : public Kernel {
 public:
  ConvGemmKernel(std::unique_ptr<Kernel> gemm, bool residual, uint64_t sig, std::string note)
      : gemm_(std::move(gemm)), residual_(residual), note_(std::move(note)) {
    choice_.tactic = ConvTactic::kGemm;
    choice_.signature = sig;
  }
  void run(const void* const* in, void* const* out, const RunContext& rc) const override { gemm_->run(in, out, rc); }
  size_t workspace_size() const override { return gemm_->workspace_size(); }
  bool bakes_constants() const override { return false; }  // operands by pointer
  // A conv's residual has the output's shape, so the GEMM reads it as cuBLASLt's C operand, and
  // cuBLASLt documents in-place GEMMs (C == D with the same layout).
  bool writes_over_input(size_t input) const override { return residual_ && input == 3; }
  std::string describe() const override { return "1x1 conv as a GEMM: " + gemm_->describe() + ", " + note_; }
  Bytes state() const override { return pack_state(gemm_->state(), encode_conv_choice(choice_)); }
  const ConvChoice& choice() const { return choice_; }

 private:
  std::unique_ptr<Kernel> gemm_;
  bool residual_;
  ConvChoice choice_;
  std::string note_;
};

}  // namespace

bool supports_conv(const Node& n, const Graph& g, std::string* why) {
  const std::string refusal = conv_refusal(n, g);
  if (!refusal.empty() && why) *why = refusal;
  return refusal.empty();
}

namespace {

// The cuDNN kernel of plan `b`; `cubin` is the saved epilogue's (load) or null (build: compile).
std::unique_ptr<ConvKernel> cudnn_kernel(const ConvGeom& q, ConvPlan b, const Bytes* cubin, const std::string& what) {
  Epilogue epi;
  const bool separate = !b.choice.fused && q.has_epilogue();
  if (separate) epi = make_epilogue(q, cubin ? Module::load(*cubin) : Module::compile(conv_epilogue_source(q), what));
  std::string desc = "cudnn " + b.og.ops + " [" + EngineId{b.choice.engine, b.choice.knobs}.to_string() + "]";
  if (separate) desc += " + generated epilogue (cuDNN could not fuse it)";
  desc += ", " + b.note;
  if (desc.size() > 800) desc = desc.substr(0, 800) + "...";
  return std::make_unique<ConvKernel>(q, std::move(b.og), std::move(b.plan), b.choice, std::move(epi), desc);
}

// The linear family's kernel for gemm_conv node `n`: a linear node over the conv's inputs in a
// graph of its own, x and the output as they are and the weight [O, 1, 1, C] read as [O, C]
// (the same bytes). `state`: the saved GEMM kernel's.
std::unique_ptr<Kernel> make_gemm(const Node& n, const Graph& g, const KernelOptions& options, const Bytes* state) {
  Graph lg;
  std::vector<ValueId> ins = {lg.add_input("x", g.type(n.inputs[0]))};
  const TensorType& w = g.type(n.inputs[1]);
  ins.push_back(lg.add_input("weight", TensorType(w.dtype, {w.dims[0].extent, w.dims[3].extent})));
  for (size_t i = 2; i < n.inputs.size(); ++i)
    ins.push_back(n.inputs[i] == kNoValue ? kNoValue : lg.add_input(i == 2 ? "bias" : "residual", g.type(n.inputs[i])));
  Attrs a;
  pw::copy_activation(n.attrs, a);
  lg.add_node(OpKind::kLinear, ins, a, n.name);
  return make_matmul_kernel(*lg.nodes().front(), lg, options, state);
}

// Load: the kernel a saved state names, decoded and checked before any device call.
std::unique_ptr<Kernel> load_conv(const Node& n, const Graph& g, const KernelOptions& options, const ConvGeom& q,
                                  uint64_t sig, const Bytes& state, const std::string& what) {
  CompiledState cs = unpack_state(state);
  const ConvChoice c = decode_conv_choice(cs.params);
  KILN_CHECK(c.signature == sig, kCorrupted, what, ": the saved conv tactic was made for another conv");
  if (c.tactic == ConvTactic::kGemm) {
    KILN_CHECK(gemm_conv(q), kCorrupted, what, ": saved state names the GEMM tactic, which runs 1x1 convs only");
    return std::make_unique<ConvGemmKernel>(make_gemm(n, g, options, &cs.cubin), q.residual, sig, "saved tactic");
  }
  if (c.tactic == ConvTactic::kDepthwise) {
    std::string why;
    KILN_CHECK(depthwise_eligible(q, &why), kCorrupted, what,
               ": saved state names the generated depthwise kernel, but ", why);
    const DepthwiseSource src = generate_depthwise(q);
    KILN_CHECK(c.kernel_hash == src.hash, kCorrupted, what,
               ": the saved depthwise kernel was generated from another source (another Kiln version?)");
    KILN_CHECK(!cs.cubin.empty(), kCorrupted, what, ": saved depthwise state lacks its cubin");
    return make_depthwise_kernel(q, src, Module::load(std::move(cs.cubin)), sig, "saved tactic");
  }
  const bool needs_epilogue = !c.fused && q.has_epilogue();
  KILN_CHECK(needs_epilogue == !cs.cubin.empty(), kCorrupted, what, ": saved conv state ",
             needs_epilogue ? "lacks the epilogue's cubin" : "has an unexpected cubin");
  ConvPlan b;
  {
    HandleLock hl = lock_handle();
    std::string why;
    KILN_CHECK(rebuild_conv_plan(q, hl.handle, c, what, b, &why), kUnsupported, what,
               ": cuDNN cannot rebuild the saved plan (", EngineId{c.engine, c.knobs}.to_string(),
               "; another cuDNN version or GPU?): ", why);
  }
  b.note = "saved tactic";
  return cudnn_kernel(q, std::move(b), needs_epilogue ? &cs.cubin : nullptr, what);
}

// Times `kernels` (kernels of conv `q`) on scratch buffers: the fastest one's index (the first
// on a tie). Every contender is timed whatever the optimization level (there are at most three).
size_t fastest_conv_kernel(const ConvGeom& q, const std::vector<const Kernel*>& kernels, std::string* report) {
  const size_t es = dtype_size(q.dtype);
  size_t ws = 0;
  for (const Kernel* k : kernels) ws = std::max(ws, k->workspace_size());
  ScratchBuffer x(size_t(q.x_numel()) * es), w(size_t(q.w_numel()) * es), bias(size_t(q.O) * es),
      res(size_t(q.y_numel()) * es), y(size_t(q.y_numel()) * es), wsb(ws);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  const void* ins[4] = {x.get(), w.get(), q.bias ? bias.get() : nullptr, q.residual ? res.get() : nullptr};
  void* outs[1] = {y.get()};
  std::vector<Candidate> candidates;
  for (const Kernel* k : kernels) candidates.push_back(kernel_candidate(*k, ins, outs, wsb.get(), ws));
  const size_t best = time_candidates(candidates, TacticBudget::kAll, report);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  return best;
}

// cuDNN's contenders for conv `q`: the fused graph's best plan (searched with `fused`) and,
// when that graph holds the epilogue, the conv alone's best (searched with `alone`) followed by
// the generated epilogue. Refusals go to *note.
struct CudnnContenders {
  std::vector<std::unique_ptr<ConvKernel>> kernels;
  std::vector<ConvChoice> choices;
};
CudnnContenders cudnn_contenders(const ConvGeom& q, uint64_t sig, const ConvSearch& fused, const ConvSearch& alone,
                                 const std::string& what, std::string* note, bool with_alone = true) {
  CudnnContenders c;
  for (const bool conv_only : {false, true}) {
    if (conv_only && (!with_alone || !q.has_epilogue() || c.choices.empty() || !c.choices[0].fused)) break;
    try {
      ConvPlan b = search_conv_plan(q, conv_only ? alone : fused, what, sig, conv_only);
      c.choices.push_back(b.choice);
      c.kernels.push_back(cudnn_kernel(q, std::move(b), nullptr, what));
    } catch (const Error& e) {
      *note += std::string("cuDNN refused ") + (conv_only ? "the conv alone: " : "it: ") + e.what() + "; ";
    }
  }
  return c;
}

// A tactic note cut to a length a build log line can hold.
void clip_note(std::string& note) {
  if (note.size() > 600) note = note.substr(0, 600) + "...";
}

// Times Kiln's own kernel for conv `q` (#0, named `name`: "generated", "GEMM") against cuDNN's
// contenders (at least one) and appends the outcome to *note: 0 when `own` is fastest, else
// i > 0 for cudnn.kernels[i - 1].
size_t race_cudnn(const ConvGeom& q, const Kernel& own, const char* name, const CudnnContenders& cudnn,
                  std::string* note) {
  std::vector<const Kernel*> contenders = {&own};
  for (const auto& k : cudnn.kernels) contenders.push_back(k.get());
  std::string report;
  const size_t best = fastest_conv_kernel(q, contenders, &report);
  *note += std::string(best == 0 ? "chosen over" : "lost to") + " the cuDNN plan (" + name + " #0 vs cuDNN #1" +
           (contenders.size() > 2 ? ", #2" : "") + ": " + report + ")";
  return best;
}

// An image_input conv with an epilogue. cuDNN has kernels for an image's first layer that it
// offers for the conv alone, not for the fused graph, so the conv alone with a generated
// epilogue may beat every fused plan (a network's stem conv).
bool image_entry(const ConvGeom& q) { return image_input(q) && q.has_epilogue(); }

// A grouped conv (1 < groups) with an epilogue; depthwise ones that the generated kernel
// serves are chosen by choose_depthwise before this is asked. cuDNN's fused graphs may offer
// only a direct kernel launched once per group, while the conv alone gets implicit-GEMM
// kernels over all groups at once (RegNet's and ResNeXt's 3x3 convs of 24-128 channels a group).
bool grouped_entry(const ConvGeom& q) { return !q.transpose && q.groups > 1 && q.has_epilogue(); }

// Build, conv whose fused graph may lose to the conv alone followed by the generated epilogue:
// a hardswish / hardsigmoid chain (cuDNN runs those only with runtime-compiled plans, searched
// with `fused`: ConvSearch's compiled budget), an image_entry or a grouped_entry conv. The two
// are timed against each other.
std::unique_ptr<Kernel> choose_chain(const ConvGeom& q, uint64_t sig, const ConvSearch& fused, const ConvSearch& alone,
                                     const std::string& key, const std::string& what) {
  std::string note;
  CudnnContenders c = cudnn_contenders(q, sig, fused, alone, what, &note);
  KILN_CHECK(!c.kernels.empty(), kUnsupported, what, ": cuDNN has no engine for it: ", note);
  size_t best = 0;
  if (c.kernels.size() > 1) {
    std::string report;
    best = fastest_conv_kernel(q, {c.kernels[0].get(), c.kernels[1].get()}, &report);
    note += "fused #0 vs conv alone + generated epilogue #1: " + report;
  }
  timing_cache_insert(key, encode_conv_choice(c.choices[best]));
  clip_note(note);
  if (!note.empty()) c.kernels[best]->add_note(note);
  return std::move(c.kernels[best]);
}

// Build, depthwise conv: the generated kernel against cuDNN's contenders, when cuDNN has them.
// Which wins depends on the epilogue: cuDNN's fused relu graphs run a grouped direct kernel well
// behind the generated one (its conv alone runs a specialized depthwise kernel close to it),
// while its hardswish chains get a runtime-compiled kernel that can beat the generated one.
// cuDNN's plans are searched with the budget of runtime-compiled plans.
std::unique_ptr<Kernel> choose_depthwise(const ConvGeom& q, uint64_t sig, const KernelOptions& options,
                                         const std::string& key, const std::string& what) {
  const DepthwiseSource src = generate_depthwise(q);
  CudnnContenders cudnn;
  std::string note;
  const bool untimed = !options.budget().timed;
  if (!untimed) {
    const ConvSearch compiled = conv_search(q, options, true);
    cudnn = cudnn_contenders(q, sig, compiled, compiled, what, &note);
  } else {
    note = "optimization level 0, untimed";
  }
  std::shared_ptr<const Module> module = Module::compile(src.source, what);
  const size_t best = cudnn.kernels.empty() ? 0
                                            : race_cudnn(q, *make_depthwise_kernel(q, src, module, sig, "timing"),
                                                         "generated", cudnn, &note);
  if (!untimed)
    timing_cache_insert(key, encode_conv_choice(best == 0 ? depthwise_choice(src, sig) : cudnn.choices[best - 1]));
  clip_note(note);
  if (best > 0) {
    cudnn.kernels[best - 1]->add_note("the generated depthwise kernel " + note);
    return std::move(cudnn.kernels[best - 1]);
  }
  return make_depthwise_kernel(q, src, std::move(module), sig, note);
}

// Build, gemm_conv: the GEMM against cuDNN's fused plan, and against the conv alone with the
// generated epilogue where choose_chain would time that too (a hardswish / hardsigmoid chain, an
// image's conv).
std::unique_ptr<Kernel> choose_gemm(const Node& n, const Graph& g, const ConvGeom& q, uint64_t sig,
                                    const KernelOptions& options, const std::string& key, const std::string& what) {
  std::unique_ptr<Kernel> gemm = make_gemm(n, g, options, nullptr);
  const bool chain = hard_activation(q.act);
  const ConvSearch search = conv_search(q, options, false);
  std::string note;
  CudnnContenders cudnn = cudnn_contenders(q, sig, chain ? conv_search(q, options, true) : search, search, what, &note,
                                           chain || image_entry(q));
  const size_t best = cudnn.kernels.empty() ? 0 : race_cudnn(q, *gemm, "GEMM", cudnn, &note);
  clip_note(note);
  if (best > 0) {
    timing_cache_insert(key, encode_conv_choice(cudnn.choices[best - 1]));
    cudnn.kernels[best - 1]->add_note("the GEMM " + note);
    return std::move(cudnn.kernels[best - 1]);
  }
  auto k = std::make_unique<ConvGemmKernel>(std::move(gemm), q.residual, sig, note);
  timing_cache_insert(key, encode_conv_choice(k->choice()));
  return k;
}

}  // namespace

std::unique_ptr<Kernel> make_conv_kernel(const Node& n, const Graph& g, const KernelOptions& options,
                                         const Bytes* state) {
  const ConvGeom q = conv_geometry(n, g);
  const std::string what = std::string(op_name(n.op)) + " '" + n.name + "'";
  const std::vector<std::string> parts = conv_key_parts(q);
  const uint64_t sig = conv_signature(parts);
  if (state) return load_conv(n, g, options, q, sig, *state, what);

  std::vector<std::string> key_parts = parts;
  key_parts.push_back(strict_f32(q.dtype, options.policy) ? "strict-f32" : "tf32-ok");
  key_parts.push_back(std::string("ws<=") + std::to_string(options.workspace_limit));
  key_parts.push_back("verified");  // choices made before candidates were checked on random data are not reused
  // Choices made before cuDNN was given the hardswish / hardsigmoid chains are not reused.
  if (hard_activation(q.act)) key_parts.push_back("chain");
  // Choices made before an image's conv could take the conv alone and reduced-precision sums are not reused.
  if (image_input(q)) key_parts.push_back("image");
  // Likewise choices made before a grouped conv's fused plans were timed against the conv alone.
  if (grouped_entry(q)) key_parts.push_back("grouped");
  const bool depthwise = depthwise_eligible(q);
  const bool gemm = gemm_conv(q) && !depthwise;
  // And choices made before a 1x1 conv could run as a GEMM.
  if (gemm) key_parts.push_back("gemm");
  const std::string key = timing_key("conv", key_parts);
  const bool timed = options.budget().timed;
  if (depthwise && !timed) return choose_depthwise(q, sig, options, key, what);
  // Untimed, a 1x1 conv takes the GEMM (cuBLASLt's heuristic algorithm), not recorded in the timing cache.
  if (gemm && !timed)
    return std::make_unique<ConvGemmKernel>(make_gemm(n, g, options, nullptr), q.residual, sig,
                                            "optimization level 0, untimed");
  const TimingClaim claim(key);
  // A choice from the timing cache may be a runtime-compiled plan: not for precompiled_only.
  if (auto cached = options.precompiled_only ? std::nullopt : timing_cache_find(key)) {
    try {
      const ConvChoice c = decode_conv_choice(*cached);
      if (c.signature == sig && c.tactic == ConvTactic::kGemm && gemm) {
        return std::make_unique<ConvGemmKernel>(make_gemm(n, g, options, nullptr), q.residual, sig, "timing cache");
      } else if (c.signature == sig && c.tactic == ConvTactic::kDepthwise && depthwise) {
        const DepthwiseSource src = generate_depthwise(q);
        if (c.kernel_hash == src.hash)
          return make_depthwise_kernel(q, src, Module::compile(src.source, what), sig, "timing cache");
      } else if (c.signature == sig && c.tactic == ConvTactic::kCudnn) {
        ConvPlan b;
        HandleLock hl = lock_handle();
        std::string why;
        if (rebuild_conv_plan(q, hl.handle, c, what, b, &why)) {
          hl.lock.unlock();
          b.note = "timing cache";
          return cudnn_kernel(q, std::move(b), nullptr, what);
        }
      }
    } catch (const Error&) {
      // a damaged or outdated entry: choose again and overwrite it
    }
  }
  if (depthwise) return choose_depthwise(q, sig, options, key, what);
  if (gemm) return choose_gemm(n, g, q, sig, options, key, what);
  const ConvSearch search = conv_search(q, options, false);
  if (timed) {
    if (hard_activation(q.act)) return choose_chain(q, sig, conv_search(q, options, true), search, key, what);
    if (image_entry(q) || grouped_entry(q)) return choose_chain(q, sig, search, search, key, what);
  }
  ConvPlan b = search_conv_plan(q, search, what, sig);
  if (timed)  // an untimed choice is not recorded (as for depthwise convs)
    timing_cache_insert(key, encode_conv_choice(b.choice));
  return cudnn_kernel(q, std::move(b), nullptr, what);
}

}  // namespace kiln::cuda
