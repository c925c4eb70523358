// CUDA kernel of sdpa: a fused flash-attention kernel where it serves (f16/bf16, head dim 32,
// 64, 96 or 128 for q, k and v; flash_attention_source.cpp), else the fallback:
//   scores[f32] = scale * q k^T     cuBLASLt strided batched GEMM (f32 output)
//   probs[T]    = masked softmax    generated kernel (gemm_sources.h), causal / bool / additive
//   out         = probs v           cuBLASLt strided batched GEMM
// The fallback keeps the scores in the workspace, a chunk of batch matrices at a time so that
// long sequences stay within the workspace limit; batch dims broadcast through
// plan_strided_batches on the geometry's strides, and the GEMMs' leading dims are the operands'
// row strides, so layout "bshd" ([B, S, H, D]) runs without copies on either path. Batches that
// no single stride reaches (the heads of a [B, S, H, D] view at B > 1: b and h strides) run in
// one pass when their scores fit: the GEMMs take cuBLASLt's pointer arrays, which a generated
// kernel (kiln_sdpa_ptrs) writes into the workspace from the operands' batch strides each run,
// instead of one launch of each GEMM and the softmax per stride group.
// Where cuDNN's fused attention also serves (no mask or an additive one, not causal:
// attention_cudnn.h),
// the build times its plans against the generated flash kernel and keeps the fastest (timing
// cache key "sdpa|..."; optimization level 0 takes the generated kernel untimed;
// BuildPolicy::attention_tactic generated | cudnn takes that one untimed, bypassing the cache).
// The fallback's f32 GEMMs use TF32 when BuildPolicy::allow_tf32.
// describe() names the path and, for the fallback, why the fused kernel could not serve.
//
// State: pack_state(cubin of the generated kernel, params): params are a path tag, then for the
// fallback (strided or pointer-array batches: two tags) the chunk size and both GEMMs' saved
// algorithms, for cuDNN the engine config.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "src/backends/cuda/codegen/gemm_sources.h"
#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/kernels.h"
#include "src/backends/cuda/kernels/attention_cudnn.h"
#include "src/backends/cuda/kernels/attention_fused.h"
#include "src/backends/cuda/libs/cublaslt.h"
#include "src/backends/cuda/tuning/tactics.h"

namespace kiln::cuda {

namespace {

constexpr size_t kGemmWorkspace = size_t(32) << 20;
constexpr size_t kScoresBudget = size_t(512) << 20;
constexpr uint8_t kFallbackTag = 1;
constexpr uint8_t kFallbackPointersTag = 4;  // 2: the fused kernel, 3: cuDNN (their files)

size_t round_up(size_t x) { return (x + 255) / 256 * 256; }

class FallbackKernel final : public Kernel {
 public:
  AttentionGeometry geo;
  BatchPlan batches;  // operands: 0 = k, 1 = q, 2 = v, 3 = out
  int64_t chunk = 1;
  bool pointers = false;  // one pass over every batch through pointer arrays (chunk = all of them)
  std::unique_ptr<LtPlan> qk, pv;
  std::shared_ptr<const Module> module;
  cudaKernel_t softmax = nullptr, fill_pointers = nullptr;
  size_t gemm_ws = 0, scores_bytes = 0, probs_bytes = 0, pointer_bytes = 0;
  std::string desc;

  void run_softmax(const float* scores, void* probs, const void* mask, long long rows, long long row0,
                   cudaStream_t stream) const {
    long long mrs = geo.mask_row_stride, mcs = geo.mask_col_stride;
    int L = int(geo.L), S = int(geo.S), brank = geo.batch_rank, causal = geo.causal ? 1 : 0;
    KilnDims md = geo.mask_dims;
    void* args[] = {&scores, &probs, &mask, &rows, &L, &S, &row0, &brank, &md, &mrs, &mcs, &causal};
    constexpr long long kRowsPerBlock = 4;  // one warp per row, 128 threads
    const long long blocks =
        std::min<long long>((rows + kRowsPerBlock - 1) / kRowsPerBlock, int64_t(current_device().sm_count) * 16);
    launch(softmax, dim3(unsigned(blocks)), dim3(32 * kRowsPerBlock), args, 0, stream);
  }

  void run(const void* const* in, void* const* out, const RunContext& rc) const override {
    const size_t es = dtype_size(geo.dtype);
    auto* ws = static_cast<uint8_t*>(rc.workspace);
    RunContext gemm_rc = rc;
    gemm_rc.workspace_size = gemm_ws;
    float* scores = reinterpret_cast<float*>(ws + gemm_ws);
    void* probs = probs_bytes ? static_cast<void*>(ws + gemm_ws + scores_bytes) : static_cast<void*>(scores);
    const auto* q = static_cast<const uint8_t*>(in[0]) + size_t(geo.q_off) * es;
    const auto* k = static_cast<const uint8_t*>(in[1]) + size_t(geo.k_off) * es;
    const auto* v = static_cast<const uint8_t*>(in[2]) + size_t(geo.v_off) * es;
    const void* mask = geo.mask_kind ? in[3] : nullptr;
    auto* o = static_cast<uint8_t*>(out[0]) + size_t(geo.o_off) * es;
    if (pointers) {
      // Six arrays of nb pointers (k, q, v, out, scores, probs) after the probs.
      auto** arr = reinterpret_cast<void**>(ws + gemm_ws + scores_bytes + probs_bytes);
      long long nb = geo.batch_count, score_bytes = geo.L * geo.S * 4,
                prob_bytes = probs_bytes ? geo.L * geo.S * (long long)es : score_bytes, esl = (long long)es;
      int brank = geo.batch_rank;
      KilnDims kd = geo.k_dims, qd = geo.q_dims, vd = geo.v_dims, od = geo.o_dims;
      void* args[] = {&nb, &brank, &kd,     &qd,    &vd,  &od,          &k,          &q,
                      &v,  &o,     &scores, &probs, &esl, &score_bytes, &prob_bytes, &arr};
      launch(fill_pointers, dim3(unsigned((nb + 127) / 128)), dim3(128), args, 0, stream_of(rc));
      const size_t n = size_t(nb);
      const uintptr_t bits = uintptr_t(q) | uintptr_t(k) | uintptr_t(v) | uintptr_t(o);
      qk->run_pointers(arr, arr + n, nullptr, arr + 4 * n, bits, gemm_rc);
      run_softmax(scores, probs, mask, nb * geo.L, 0, stream_of(rc));
      pv->run_pointers(arr + 2 * n, arr + 5 * n, nullptr, arr + 3 * n, bits, gemm_rc);
      return;
    }
    for (size_t g = 0; g < batches.outer(); ++g) {
      for (int64_t c0 = 0; c0 < batches.inner; c0 += chunk) {
        auto at = [&](int t) {
          return size_t(batches.outer_offset[size_t(t)][g] + c0 * batches.inner_stride[size_t(t)]) * es;
        };
        qk->run(k + at(0), q + at(1), nullptr, scores, nullptr, gemm_rc);
        run_softmax(scores, probs, mask, chunk * geo.L, (int64_t(g) * batches.inner + c0) * geo.L, stream_of(rc));
        pv->run(v + at(2), probs, nullptr, o + at(3), nullptr, gemm_rc);
      }
    }
  }
  size_t workspace_size() const override { return gemm_ws + scores_bytes + probs_bytes + pointer_bytes; }
  std::string describe() const override { return desc; }
  Bytes state() const override {
    Bytes params{pointers ? kFallbackPointersTag : kFallbackTag};
    params.resize(1 + 8);
    std::memcpy(params.data() + 1, &chunk, 8);
    for (const LtPlan* p : {qk.get(), pv.get()}) {
      const Bytes b = p->save();
      params.insert(params.end(), b.begin(), b.end());
    }
    return pack_state(module->cubin(), params);
  }
};

// allow_pointers: a build may batch through pointer arrays where one stride does not reach
// every batch (the caller retries without when cuBLASLt has no such algorithm).
std::unique_ptr<Kernel> make_fallback(const Node& n, const AttentionGeometry& geo, const KernelOptions& options,
                                      const CompiledState* saved, const std::string& why_not_fused,
                                      bool allow_pointers = true) {
  auto k = std::make_unique<FallbackKernel>();
  k->geo = geo;
  const int64_t L = geo.L, S = geo.S, E = geo.E, Ev = geo.Ev;
  const DType dt = geo.dtype;
  const size_t es = dtype_size(dt);
  auto strides = [&](const KilnDims& d) { return std::vector<int64_t>(d.stride, d.stride + geo.batch_rank); };
  k->batches = plan_strided_batches(
      geo.out_batch, {strides(geo.k_dims), strides(geo.q_dims), strides(geo.v_dims), strides(geo.o_dims)});
  const BatchPlan& bp = k->batches;
  const int64_t nb = geo.batch_count;
  k->gemm_ws = std::min(kGemmWorkspace, options.workspace_limit / 2) / 256 * 256;  // keeps what follows aligned
  const size_t per_batch = size_t(L * S) * (4 + (dt == DType::kF32 ? 0 : es));
  const size_t budget = std::min(kScoresBudget, options.workspace_limit - k->gemm_ws);
  const size_t pointer_bytes = round_up(6 * size_t(nb) * sizeof(void*));
  if (saved) {
    KILN_CHECK(saved->params.size() == 1 + 8 + 2 * LtPlan::kSavedBytes &&
                   (saved->params[0] == kFallbackTag || saved->params[0] == kFallbackPointersTag),
               kCorrupted, "sdpa state of node '", n.name, "' is malformed");
    k->pointers = saved->params[0] == kFallbackPointersTag;
    std::memcpy(&k->chunk, saved->params.data() + 1, 8);
    KILN_CHECK(k->chunk >= 1 && (k->pointers ? k->chunk == nb : bp.inner % k->chunk == 0), kCorrupted,
               "sdpa state of node '", n.name, "': chunk ", k->chunk, " does not fit ", nb, " batches");
  } else if (allow_pointers && bp.outer() > 1 && size_t(nb) * per_batch + pointer_bytes <= budget && nb <= INT32_MAX) {
    k->pointers = true;
    k->chunk = nb;
  } else {
    k->chunk = 0;
    for (int64_t c = bp.inner; c >= 1 && !k->chunk; --c)
      if (bp.inner % c == 0 && size_t(c) * per_batch <= budget) k->chunk = c;
    KILN_CHECK(k->chunk > 0, kUnsupported, "sdpa: the scores of one batch matrix (", L, " x ", S,
               ") do not fit in the workspace limit");
  }
  k->scores_bytes = round_up(size_t(k->chunk * L * S) * 4);
  k->probs_bytes = dt == DType::kF32 ? 0 : round_up(size_t(k->chunk * L * S) * es);
  k->pointer_bytes = k->pointers ? pointer_bytes : 0;

  GemmShape qk;  // scores^T[S, L] = k (E x S)^T * q (E x L)
  qk.ab_type = dt, qk.cd_type = DType::kF32, qk.tf32 = dt == DType::kF32 && options.policy.allow_tf32;
  qk.m = S, qk.n = L, qk.k = E, qk.trans_a = true, qk.lda = geo.k_row, qk.ldb = geo.q_row, qk.ldc = S;
  qk.alpha = geo.scale;
  GemmShape pv;  // out^T[Ev, L] = v (Ev x S) * probs (S x L)
  pv.ab_type = pv.cd_type = dt, pv.tf32 = qk.tf32;
  pv.m = Ev, pv.n = L, pv.k = S, pv.lda = geo.v_row, pv.ldb = S, pv.ldc = geo.o_row;
  // Every matrix's offset (elements) per operand, for the pointer-array GEMMs' timing.
  BatchOffsets qk_at, pv_at;
  if (k->pointers) {
    qk.batch = pv.batch = int32_t(nb);
    qk.pointer_array = pv.pointer_array = true;
    for (size_t g = 0; g < bp.outer(); ++g)
      for (int64_t i = 0; i < bp.inner; ++i) {
        auto at = [&](int t) { return bp.outer_offset[size_t(t)][g] + i * bp.inner_stride[size_t(t)]; };
        const int64_t b = int64_t(g) * bp.inner + i;
        qk_at.a.push_back(at(0)), qk_at.b.push_back(at(1)), qk_at.c.push_back(b * L * S);
        pv_at.a.push_back(at(2)), pv_at.b.push_back(b * L * S), pv_at.c.push_back(at(3));
      }
  } else if (k->chunk > 1) {
    qk.batch = pv.batch = int32_t(k->chunk);
    qk.stride_a = bp.inner_stride[0], qk.stride_b = bp.inner_stride[1], qk.stride_c = L * S;
    pv.stride_a = bp.inner_stride[2], pv.stride_b = L * S, pv.stride_c = bp.inner_stride[3];
  }
  int64_t gq = 16, gp = 16;
  for (size_t t = 0; t < 4; ++t) {
    int64_t& gg = t == 0 || t == 1 ? gq : gp;
    for (int64_t off : bp.outer_offset[t]) gg = std::gcd(gg, off * int64_t(es));
    gg = std::gcd(gg, bp.inner_stride[t] * int64_t(es));
  }
  gq = std::gcd(gq, std::gcd(std::gcd(geo.q_row, geo.k_row), std::gcd(geo.q_off, geo.k_off)) * int64_t(es));
  gp = std::gcd(gp, std::gcd(std::gcd(geo.v_row, geo.o_row), std::gcd(geo.v_off, geo.o_off)) * int64_t(es));
  if (k->pointers) {  // the scores / probs matrices the GEMMs write and read
    gq = std::gcd(gq, L * S * 4);
    gp = std::gcd(gp, L * S * int64_t(k->probs_bytes ? es : 4));
  }
  qk.align = uint32_t(gq ? gq : 16), pv.align = uint32_t(gp ? gp : 16);
  if (saved) {
    const Bytes a(saved->params.begin() + 9, saved->params.begin() + 9 + LtPlan::kSavedBytes);
    const Bytes b(saved->params.begin() + 9 + LtPlan::kSavedBytes, saved->params.end());
    k->qk = std::make_unique<LtPlan>(qk, k->gemm_ws, a);
    k->pv = std::make_unique<LtPlan>(pv, k->gemm_ws, b);
    k->module = Module::load(saved->cubin);
  } else {
    const TacticBudget budget = options.budget();
    k->qk = std::make_unique<LtPlan>(qk, k->gemm_ws, budget, "sdpa_qk", k->pointers ? &qk_at : nullptr);
    k->pv = std::make_unique<LtPlan>(pv, k->gemm_ws, budget, "sdpa_pv", k->pointers ? &pv_at : nullptr);
    k->module = Module::compile(sdpa_softmax_source(dt, geo.mask_kind), "sdpa softmax of node '" + n.name + "'");
  }
  k->softmax = k->module->kernel("kiln_sdpa_softmax_w");  // an older engine's cubin lacks it: a load error
  if (k->pointers) k->fill_pointers = k->module->kernel("kiln_sdpa_ptrs");
  const std::string batching = k->pointers ? "one pass over " + std::to_string(nb) + " batches through pointer arrays"
                                           : std::to_string(bp.outer()) + " x " + std::to_string(bp.inner / k->chunk) +
                                                 " chunks of " + std::to_string(k->chunk) + " batches";
  k->desc = "sdpa fallback (cuBLASLt q k^T, generated softmax, cuBLASLt p v; " + batching + ")" +
            (why_not_fused.empty() ? "" : ", not fused: " + why_not_fused) + "; q k^T: " + k->qk->how() +
            "; p v: " + k->pv->how();
  return k;
}

// A kernel whose description says how the build chose it.
class NotedKernel final : public Kernel {
 public:
  NotedKernel(std::unique_ptr<Kernel> k, std::string note) : k_(std::move(k)), note_(std::move(note)) {}
  void run(const void* const* in, void* const* out, const RunContext& rc) const override { k_->run(in, out, rc); }
  size_t workspace_size() const override { return k_->workspace_size(); }
  bool bakes_constants() const override { return k_->bakes_constants(); }
  std::string describe() const override { return k_->describe() + "; " + note_; }
  Bytes state() const override { return k_->state(); }

 private:
  std::unique_ptr<Kernel> k_;
  std::string note_;
};

// The generated flash kernel against cuDNN's fused attention plans, timed on scratch buffers;
// the choice goes to the timing cache (one byte 0 for the generated kernel, else the cuDNN
// state's params, whose serialized plan lets a hit rebuild a masked plan without compiling).
// A policy tactic other than auto restricts the choice to that one, untimed and without the cache.
// Timing is reached only with the auto tactic, so at an optimization level above 0.
std::unique_ptr<Kernel> choose_fused(const Node& n, const AttentionGeometry& geo, const KernelOptions& options) {
  std::vector<std::string> parts = {dtype_name(geo.dtype), detail::concat("L=", geo.L, " S=", geo.S, " E=", geo.E)};
  for (const KilnDims* d : {&geo.q_dims, &geo.k_dims, &geo.v_dims, &geo.o_dims}) {
    std::string p = "b";
    for (int i = 0; i < geo.batch_rank; ++i) p += detail::concat(":", d->size[i], "/", d->stride[i]);
    parts.push_back(p);
  }
  parts.push_back(detail::concat("rows=", geo.q_row, ",", geo.k_row, ",", geo.v_row, ",", geo.o_row));
  if (geo.causal) parts.push_back("causal");
  if (geo.mask_kind) {
    std::string m = detail::concat("mask", geo.mask_kind, "=", geo.mask_row_stride, ",", geo.mask_col_stride);
    for (int i = 0; i < geo.batch_rank; ++i) m += detail::concat(":", geo.mask_dims.stride[i]);
    parts.push_back(m);
  }
  parts.push_back(detail::concat("ws<=", options.workspace_limit));
  const std::string key = timing_key("sdpa", parts);
  const AttentionTactic only = options.policy.attention_tactic;
  const TacticBudget budget = options.budget();
  const TimingClaim claim(key);
  if (auto cached = only == AttentionTactic::kAuto ? timing_cache_find(key) : std::nullopt) {
    try {
      if (cached->size() == 1 && (*cached)[0] == 0) return make_fused_attention(n, geo, nullptr);
      return make_cudnn_attention(n, geo, decode_cudnn_attention(*cached), "timing cache");
    } catch (const Error&) {
      // a damaged or outdated entry: choose again and overwrite it
    }
  }
  std::vector<std::unique_ptr<Kernel>> cands;
  cands.push_back(make_fused_attention(n, geo, nullptr));
  std::string log;
  // The masked graph's plans are runtime-compiled (a second or so each while cuDNN's kernel
  // cache is cold): fewer of them below the exhaustive level.
  const size_t cudnn_plans = geo.mask_kind ? budget.cudnn_masked_attention_plans : budget.cudnn_attention_plans;
  if (only != AttentionTactic::kGenerated)
    for (auto& k : cudnn_attention_candidates(n, geo, cudnn_plans, options.workspace_limit, &log))
      cands.push_back(std::move(k));
  if (only == AttentionTactic::kCudnn) {
    KILN_CHECK(cands.size() > 1, kUnsupported, "sdpa '", n.name,
               "': the build policy's attention_tactic is cudnn, but cuDNN offered no plan: ", log);
    cands.erase(cands.begin());
    return std::make_unique<NotedKernel>(std::move(cands[0]), "attention_tactic=cudnn (build policy)");
  }
  size_t best = 0;
  std::string report;
  if (cands.size() > 1) {
    size_t ws = 0;
    for (const auto& k : cands) ws = std::max(ws, k->workspace_size());
    ScratchBuffer q(attention_operand_bytes(geo, 0)), k(attention_operand_bytes(geo, 1)),
        v(attention_operand_bytes(geo, 2)), o(attention_operand_bytes(geo, 3)),
        mask(geo.mask_kind ? attention_operand_bytes(geo, 4) : 0), wsb(ws);
    const void* ins[4] = {q.get(), k.get(), v.get(), geo.mask_kind ? mask.get() : nullptr};
    void* outs[1] = {o.get()};
    std::vector<Candidate> fns;
    for (const auto& c : cands) fns.push_back(kernel_candidate(*c, ins, outs, wsb.get(), ws));
    best = time_candidates(fns, budget.timed_candidates, &report);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    report = "cuDNN offered no plan: " + log;
  }
  if (only == AttentionTactic::kAuto)
    timing_cache_insert(key, best == 0 ? Bytes{0} : unpack_state(cands[best]->state()).params);
  if (report.size() > 600) report = report.substr(0, 600) + "...";
  const std::string note = "generated #0 vs cuDNN plans: " + report;
  return std::make_unique<NotedKernel>(std::move(cands[best]), note);
}

class EmptyKernel final : public Kernel {
 public:
  void run(const void* const*, void* const*, const RunContext&) const override {}
  std::string describe() const override { return "empty output: nothing to run"; }
};

}  // namespace

bool supports_attention(const Node& n, const Graph& g, std::string* why) {
  auto no = [&](const std::string& r) {
    if (why) *why = r;
    return false;
  };
  if (n.op != OpKind::kSdpa) return no(std::string(op_name(n.op)) + " is not sdpa");
  const DType dt = g.type(n.inputs[0]).dtype;
  if (dt != DType::kF32 && dt != DType::kF16 && dt != DType::kBF16)
    return no(std::string("sdpa on CUDA takes f32, f16 or bf16, not ") + dtype_name(dt));
  const AttentionGeometry geo = attention_geometry(n, g);
  if (geo.batch_rank > kKilnMaxDims) return no("more than 8 batch dims");
  if (geo.L > INT32_MAX || geo.S > INT32_MAX) return no("sequence longer than 2^31");
  if (g.type(n.outputs[0]).numel() > 0 && (geo.E == 0 || geo.S == 0)) return no("an empty key sequence or head dim");
  return true;
}

std::unique_ptr<Kernel> make_attention_kernel(const Node& n, const Graph& g, const KernelOptions& options,
                                              const Bytes* state) {
  std::string why;
  KILN_CHECK(supports_attention(n, g, &why), kUnsupported, "CUDA sdpa: ", why);
  if (g.type(n.outputs[0]).numel() == 0) return std::make_unique<EmptyKernel>();
  const AttentionGeometry geo = attention_geometry(n, g);
  std::optional<CompiledState> saved;
  if (state) saved = unpack_state(*state);
  const uint8_t saved_tag = saved && !saved->params.empty() ? saved->params[0] : 0;
  if (saved_tag == kCudnnAttentionTag)
    return make_cudnn_attention(n, geo, decode_cudnn_attention(saved->params), "saved tactic");
  std::string why_not;
  if (saved && saved_tag != kFallbackTag && saved_tag != kFallbackPointersTag)
    return make_fused_attention(n, geo, &*saved);
  if (!saved && fused_attention_serves(geo, &why_not)) {
    if ((options.budget().timed || options.policy.attention_tactic != AttentionTactic::kAuto) &&
        cudnn_attention_serves(geo, nullptr))
      return choose_fused(n, geo, options);
    return make_fused_attention(n, geo, nullptr);
  }
  if (saved) return make_fallback(n, geo, options, &*saved, why_not);
  try {
    return make_fallback(n, geo, options, nullptr, why_not);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kUnsupported) throw;
    return make_fallback(n, geo, options, nullptr, why_not, false);  // no pointer-array algorithm
  }
}

}  // namespace kiln::cuda
