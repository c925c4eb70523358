// CUDA kernel of sdpa: a fused flash-attention kernel where it serves (f16/bf16, head dim 64
// or 128 for q, k and v; flash_codegen.cpp), else the fallback:
//   scores[f32] = scale * q k^T     cuBLASLt strided batched GEMM (f32 output)
//   probs[T]    = masked softmax    generated kernel (gemm_codegen.h), causal / bool / additive
//   out         = probs v           cuBLASLt strided batched GEMM
// The fallback keeps the scores in the workspace, a chunk of batch matrices at a time so that
// long sequences stay within the workspace limit; batch dims broadcast through
// plan_strided_batches on the geometry's strides, and the GEMMs' leading dims are the operands'
// row strides, so layout "bshd" ([B, S, H, D]) runs without copies on either path.
// describe() names the path and, for the fallback, why the fused kernel could not serve.
//
// State: pack_state(cubin of the generated kernel, params): params are a path tag, then for the
// fallback the chunk size and both GEMMs' saved algorithms.
#include <cmath>
#include <cstring>
#include <numeric>

#include "src/backends/cuda/attention_fused.h"
#include "src/backends/cuda/cublaslt_util.h"
#include "src/backends/cuda/gemm_codegen.h"
#include "src/backends/cuda/kernels.h"
#include "src/backends/cuda/nvrtc.h"

namespace kiln::cuda {

namespace {

constexpr size_t kGemmWorkspace = size_t(32) << 20;
constexpr size_t kScoresBudget = size_t(512) << 20;
constexpr uint8_t kFallbackTag = 1;

size_t round_up(size_t x) { return (x + 255) / 256 * 256; }

class FallbackKernel final : public Kernel {
 public:
  AttentionGeometry geo;
  BatchPlan batches;  // operands: 0 = k, 1 = q, 2 = v, 3 = out
  int64_t chunk = 1;
  std::unique_ptr<LtPlan> qk, pv;
  std::shared_ptr<const Module> module;
  cudaKernel_t softmax = nullptr;
  size_t gemm_ws = 0, scores_bytes = 0, probs_bytes = 0;
  std::string desc;

  void run(const void* const* in, void* const* out, const RunContext& rc) const override {
    const size_t es = dtype_size(geo.dtype);
    auto* ws = static_cast<uint8_t*>(rc.workspace);
    RunContext gemm_rc = rc;
    gemm_rc.workspace_size = gemm_ws;
    float* scores = reinterpret_cast<float*>(ws + gemm_ws);
    void* probs = probs_bytes ? static_cast<void*>(ws + gemm_ws + scores_bytes) : static_cast<void*>(scores);
    const auto* q = static_cast<const uint8_t*>(in[0]);
    const auto* k = static_cast<const uint8_t*>(in[1]);
    const auto* v = static_cast<const uint8_t*>(in[2]);
    const void* mask = geo.mask_kind ? in[3] : nullptr;
    auto* o = static_cast<uint8_t*>(out[0]);
    const int sms = current_device().sm_count;
    for (size_t g = 0; g < batches.outer(); ++g) {
      for (int64_t c0 = 0; c0 < batches.inner; c0 += chunk) {
        auto at = [&](int t) { return size_t(batches.outer_offset[size_t(t)][g] + c0 * batches.inner_stride[size_t(t)]) * es; };
        qk->run(k + at(0), q + at(1), nullptr, scores, nullptr, gemm_rc);
        long long rows = chunk * geo.L, row0 = (int64_t(g) * batches.inner + c0) * geo.L, mrs = geo.mask_row_stride,
                  mcs = geo.mask_col_stride;
        int L = int(geo.L), S = int(geo.S), brank = geo.batch_rank, causal = geo.causal ? 1 : 0;
        KilnDims md = geo.mask_dims;
        const float* sc = scores;
        void* args[] = {&sc, &probs, &mask, &rows, &L, &S, &row0, &brank, &md, &mrs, &mcs, &causal};
        launch(softmax, dim3(unsigned(std::min<long long>(rows, int64_t(sms) * 16))), dim3(128), args, 0,
               stream_of(rc));
        pv->run(v + at(2), probs, nullptr, o + at(3), nullptr, gemm_rc);
      }
    }
  }
  size_t workspace_size() const override { return gemm_ws + scores_bytes + probs_bytes; }
  std::string describe() const override { return desc; }
  Bytes state() const override {
    Bytes params{kFallbackTag};
    params.resize(1 + 8);
    std::memcpy(params.data() + 1, &chunk, 8);
    for (const LtPlan* p : {qk.get(), pv.get()}) {
      const Bytes b = p->save();
      params.insert(params.end(), b.begin(), b.end());
    }
    return pack_state(module->cubin(), params);
  }
};

std::unique_ptr<Kernel> make_fallback(const Node& n, const AttentionGeometry& geo, const KernelOptions& options,
                                      const CompiledState* saved, const std::string& why_not_fused) {
  auto k = std::make_unique<FallbackKernel>();
  k->geo = geo;
  const int64_t L = geo.L, S = geo.S, E = geo.E, Ev = geo.Ev;
  const DType dt = geo.dtype;
  const size_t es = dtype_size(dt);
  auto strides = [&](const KilnDims& d) { return std::vector<int64_t>(d.stride, d.stride + geo.batch_rank); };
  k->batches = plan_strided_batches(geo.out_batch,
                                    {strides(geo.k_dims), strides(geo.q_dims), strides(geo.v_dims), strides(geo.o_dims)});
  const BatchPlan& bp = k->batches;
  k->gemm_ws = std::min(kGemmWorkspace, options.workspace_limit / 2);
  const size_t per_batch = size_t(L * S) * (4 + (dt == DType::kF32 ? 0 : es));
  const size_t budget = std::min(kScoresBudget, options.workspace_limit - k->gemm_ws);
  if (saved) {
    KILN_CHECK(saved->params.size() == 1 + 8 + 2 * LtPlan::kSavedBytes && saved->params[0] == kFallbackTag,
               kCorrupted, "sdpa state of node '", n.name, "' is malformed");
    std::memcpy(&k->chunk, saved->params.data() + 1, 8);
    KILN_CHECK(k->chunk >= 1 && bp.inner % k->chunk == 0, kCorrupted, "sdpa state of node '", n.name,
               "': chunk ", k->chunk, " does not divide ", bp.inner);
  } else {
    k->chunk = 0;
    for (int64_t c = bp.inner; c >= 1 && !k->chunk; --c)
      if (bp.inner % c == 0 && size_t(c) * per_batch <= budget) k->chunk = c;
    KILN_CHECK(k->chunk > 0, kUnsupported, "sdpa: the scores of one batch matrix (", L, " x ", S,
               ") do not fit in the workspace limit");
  }
  k->scores_bytes = round_up(size_t(k->chunk * L * S) * 4);
  k->probs_bytes = dt == DType::kF32 ? 0 : round_up(size_t(k->chunk * L * S) * es);

  GemmShape qk;  // scores^T[S, L] = k (E x S)^T * q (E x L)
  qk.ab_type = dt, qk.cd_type = DType::kF32, qk.tf32 = dt == DType::kF32 && tf32_allowed();
  qk.m = S, qk.n = L, qk.k = E, qk.trans_a = true, qk.lda = geo.k_row, qk.ldb = geo.q_row, qk.ldc = S;
  qk.alpha = geo.scale;
  GemmShape pv;  // out^T[Ev, L] = v (Ev x S) * probs (S x L)
  pv.ab_type = pv.cd_type = dt, pv.tf32 = qk.tf32;
  pv.m = Ev, pv.n = L, pv.k = S, pv.lda = geo.v_row, pv.ldb = S, pv.ldc = geo.o_row;
  if (k->chunk > 1) {
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
  gq = std::gcd(gq, std::gcd(geo.q_row, geo.k_row) * int64_t(es));
  gp = std::gcd(gp, std::gcd(geo.v_row, geo.o_row) * int64_t(es));
  qk.align = uint32_t(gq ? gq : 16), pv.align = uint32_t(gp ? gp : 16);
  if (saved) {
    const Bytes a(saved->params.begin() + 9, saved->params.begin() + 9 + LtPlan::kSavedBytes);
    const Bytes b(saved->params.begin() + 9 + LtPlan::kSavedBytes, saved->params.end());
    k->qk = std::make_unique<LtPlan>(qk, k->gemm_ws, a);
    k->pv = std::make_unique<LtPlan>(pv, k->gemm_ws, b);
    k->module = Module::load(saved->cubin);
  } else {
    k->qk = std::make_unique<LtPlan>(qk, k->gemm_ws, options.optimization_level, "sdpa_qk");
    k->pv = std::make_unique<LtPlan>(pv, k->gemm_ws, options.optimization_level, "sdpa_pv");
    k->module = Module::compile(sdpa_softmax_source(dt, geo.mask_kind), "sdpa softmax of node '" + n.name + "'");
  }
  k->softmax = k->module->kernel("kiln_sdpa_softmax");
  k->desc = "sdpa fallback (cuBLASLt q k^T, generated softmax, cuBLASLt p v; " + std::to_string(bp.outer()) + " x " +
            std::to_string(bp.inner / k->chunk) + " chunks of " + std::to_string(k->chunk) + " batches)" +
            (why_not_fused.empty() ? "" : ", not fused: " + why_not_fused) + "; q k^T: " + k->qk->how() +
            "; p v: " + k->pv->how();
  return k;
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
  if (g.type(n.outputs[0]).numel() > 0 && (geo.E == 0 || geo.S == 0))
    return no("an empty key sequence or head dim");
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
  const bool saved_fused = saved && !saved->params.empty() && saved->params[0] != kFallbackTag;
  std::string why_not;
  if (saved_fused || (!saved && fused_attention_serves(geo, &why_not)))
    return make_fused_attention(n, geo, saved ? &*saved : nullptr);
  return make_fallback(n, geo, options, saved ? &*saved : nullptr, why_not);
}

}  // namespace kiln::cuda
