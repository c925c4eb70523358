// CPU kernels of the matmul family on top of sgemm (gemm.h).
//
// linear: x[..., K] is one [rows, K] matrix; w[N, K] is B transposed; bias (and relu alone)
// ride in the GEMM epilogue, a fused residual and other activations in the Epilogue
// (epilogue.h) right after it. matmul: one GEMM per output batch index, with per-batch offsets
// into a and b precomputed from the broadcast (so broadcast operands are never copied). When b
// is shared by every batch and a is dense, the batch folds into the rows: one large GEMM. Many small
// GEMMs run in parallel over batches (each on one thread, with its own packing scratch);
// few large ones run one after another, each split over threads.
//
// Constant B operands (weights) are also packed once, at build time, into sgemm's panel
// layout, so a call never repacks them (repacking a transposed weight costs more than the
// product for a few rows). Problems of at most kFewRows rows read B in place instead.
//
// Other non-f32 inputs are converted to f32 in the workspace (constants once, at build time)
// and the f32 result converted back; f64 computes in double instead (dgemm.cpp).
#include "src/backends/cpu/epilogue.h"
#include "src/backends/cpu/gemm.h"

namespace kiln::cpu {

namespace {

// `count` constant k x n matrices (B of sgemm; given as [n, k] when trans) packed one after
// another, sgemm_packed_b_floats(n, k) floats each.
// The buffer is left uninitialized before packing (sgemm_pack_b writes every float, padding
// included): zeroing it first would be one more pass over every weight when an engine is made.
std::shared_ptr<const float[]> pack_constant_b(const Graph& g, ValueId id, int64_t count, int64_t k, int64_t n,
                                               bool trans, DerivedConstants* derived) {
  const Value& v = g.value(id);
  if (derived) {  // the engine's instances share what its kernels packed
    const std::string what =
        detail::concat("sgemm b ", dtype_name(v.type.dtype), " ", count, "x", k, "x", n, trans ? " t" : "");
    return std::static_pointer_cast<const float[]>(
        derived->get(v.data, what, [&] { return pack_constant_b(g, id, count, k, n, trans, nullptr); }));
  }
  const int64_t numel = v.type.numel();
  std::vector<float> converted;
  const float* src = reinterpret_cast<const float*>(v.data->data());
  if (v.type.dtype != DType::kF32) {
    converted.resize(size_t(numel));
    to_f32(v.data->data(), v.type.dtype, converted.data(), numel);
    src = converted.data();
  }
  const int64_t per = sgemm_packed_b_floats(n, k);
  std::shared_ptr<float[]> packed(new float[size_t(per * count)]);
  for (int64_t c = 0; c < count; ++c)
    sgemm_pack_b_parallel(n, k, src + c * k * n, trans ? 1 : n, trans ? k : 1, packed.get() + c * per);
  return packed;
}

std::unique_ptr<Kernel> make_linear(const Node& n, const Graph& g, DerivedConstants* derived) {
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& wt = g.type(n.inputs[1]);
  const TensorType& yt = g.type(n.outputs[0]);
  const DType dt = xt.dtype;
  const int64_t K = wt.dims[1].extent, N = wt.dims[0].extent;
  int64_t M = 1;
  for (size_t i = 0; i + 1 < xt.dims.size(); ++i) M *= xt.dims[i].extent;
  ValueId bias_id = n.inputs.size() > 2 ? n.inputs[2] : kNoValue;
  const size_t n_inputs = n.inputs.size();
  F32Input x(g, n.inputs[0]), w(g, n.inputs[1]), bias(g, bias_id);
  const Epilogue epi(n, g);
  const int threads = num_threads();
  std::shared_ptr<const float[]> packed;
  if (g.value(n.inputs[1]).is_constant() && M > kFewRows)
    packed = pack_constant_b(g, n.inputs[1], 1, K, N, true, derived);

  Carver sizes;
  sizes.take(x.scratch_floats());
  sizes.take(w.scratch_floats());
  sizes.take(bias.scratch_floats());
  sizes.take(dt == DType::kF32 ? 0 : yt.numel());
  sizes.take(sgemm_scratch_floats(M, N, K, threads));
  sizes.take(epi.scratch_floats());
  const size_t ws = sizes.used();

  auto fn = [=](const void* const* in, void* const* out, const RunContext& ctx) {
    check_workspace(ctx, ws, "linear");
    Carver c(ctx.workspace);
    float* xs = c.take(x.scratch_floats());
    float* wsc = c.take(w.scratch_floats());
    float* bs = c.take(bias.scratch_floats());
    float* ys = c.take(dt == DType::kF32 ? 0 : M * N);
    float* gs = c.take(sgemm_scratch_floats(M, N, K, threads));
    float* y = dt == DType::kF32 ? static_cast<float*>(out[0]) : ys;
    GemmArgs ga = gemm_rowmajor(M, N, K, x.get(in[0], xs), K, w.get(in[1], wsc), K, true, y, N);
    ga.bias = bias.present() ? bias.get(in[2], bs) : nullptr;
    ga.packed_b = packed ? packed.get() : nullptr;
    ga.relu = epi.gemm_relu();
    sgemm(ga, gs, threads);
    epi.apply(y, n_inputs > 3 ? in[3] : nullptr, c.take(epi.scratch_floats()), ga.relu);
    if (dt != DType::kF32) from_f32_parallel(y, dt, out[0], M * N);
  };
  return make_fn_kernel(fn, "cpu sgemm linear " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                                std::to_string(K) + epi.describe() + (packed ? " (prepacked weight)" : ""),
                        ws);
}

std::unique_ptr<Kernel> make_batched_matmul(const Node& n, const Graph& g, DerivedConstants* derived) {
  const MatmulLayout views = matmul_layout({&g.type(n.inputs[0]), &g.type(n.inputs[1])}, n.attrs);
  const float alpha = float(matmul_alpha(n.attrs));
  const auto as = views.a.logical.shape(), bs = views.b.logical.shape();
  const auto ys = views.y.logical.shape();  // the output's logical dims (out_perm places them)
  const DType dt = g.type(n.inputs[0]).dtype;
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  std::vector<int64_t> out_batch(ys.begin(), ys.end() - 2);
  auto a_op = std::make_shared<const StridedOperand>(strided_operand(out_batch, views.a));
  auto b_op = std::make_shared<const StridedOperand>(strided_operand(out_batch, views.b));
  auto y_op = std::make_shared<const StridedOperand>(strided_operand(out_batch, views.y));
  const int64_t batches = static_cast<int64_t>(a_op->offsets.size());

  // b shared by all batches and a and y dense in batch order: fold the batch into the rows.
  bool fold = batches > 1 && a_op->cs == 1 && (M == 1 || a_op->rs == K) && views.y.dense();
  for (int64_t b = 0; fold && b < batches; ++b)
    fold = b_op->offsets[size_t(b)] == b_op->offsets[0] && a_op->offsets[size_t(b)] == a_op->offsets[0] + b * M * K;
  const int64_t gm = fold ? batches * M : M, gbatches = fold ? 1 : batches;
  const int threads = num_threads();
  // Parallel over batches when they spread evenly, else split each GEMM over threads.
  const bool over_batches = threads > 1 && gbatches >= threads && (gbatches % threads == 0 || gbatches >= 4 * threads);
  const int parts = over_batches ? threads : 1;
  const int gemm_parts = over_batches ? 1 : threads;
  const int64_t per_part = sgemm_scratch_floats(gm, N, K, gemm_parts);

  F32Input a(g, n.inputs[0]), bmat(g, n.inputs[1]);
  std::shared_ptr<const float[]> packed;
  const int64_t packed_per = sgemm_packed_b_floats(N, K);
  if (g.value(n.inputs[1]).is_constant() && views.b.dense() && gm > kFewRows && K * N > 0)
    packed = pack_constant_b(g, n.inputs[1], g.type(n.inputs[1]).numel() / (K * N), K, N, false, derived);
  Carver sizes;
  sizes.take(a.scratch_floats());
  sizes.take(bmat.scratch_floats());
  sizes.take(dt == DType::kF32 ? 0 : batches * M * N);
  sizes.take(per_part * parts);
  const size_t ws = sizes.used();

  auto fn = [=](const void* const* in, void* const* out, const RunContext& ctx) {
    check_workspace(ctx, ws, "matmul");
    Carver c(ctx.workspace);
    float* as_ = c.take(a.scratch_floats());
    float* bs_ = c.take(bmat.scratch_floats());
    float* ys_ = c.take(dt == DType::kF32 ? 0 : batches * M * N);
    float* gs = c.take(per_part * parts);
    const float* A = a.get(in[0], as_);
    const float* B = bmat.get(in[1], bs_);
    float* Y = dt == DType::kF32 ? static_cast<float*>(out[0]) : ys_;
    auto one = [&](int64_t b, float* scratch, int gp) {
      GemmArgs ga;
      ga.m = gm, ga.n = N, ga.k = K;
      ga.a = A + a_op->offsets[size_t(b)], ga.a_rs = fold ? K : a_op->rs, ga.a_cs = a_op->cs;
      ga.b = B + b_op->offsets[size_t(b)], ga.b_rs = b_op->rs, ga.b_cs = b_op->cs;
      ga.c = Y + y_op->offsets[size_t(b)], ga.ldc = fold ? N : y_op->rs;
      ga.alpha = alpha;
      if (packed) ga.packed_b = packed.get() + b_op->offsets[size_t(b)] / (K * N) * packed_per;
      sgemm(ga, scratch, gp);
    };
    if (over_batches) {
      for_parts(parts, [&](int p) {
        for (int64_t b = gbatches * p / parts; b < gbatches * (p + 1) / parts; ++b) one(b, gs + p * per_part, 1);
      });
    } else {
      for (int64_t b = 0; b < gbatches; ++b) one(b, gs, gemm_parts);
    }
    if (dt != DType::kF32) from_f32_parallel(Y, dt, out[0], batches * M * N);
  };
  std::string desc = "cpu sgemm matmul " + std::to_string(gbatches) + " x " + std::to_string(gm) + "x" +
                     std::to_string(N) + "x" + std::to_string(K) + (over_batches ? " (parallel over batches)" : "") +
                     (packed ? " (prepacked b)" : "") +
                     (views.a.dense() && views.b.dense() && views.y.dense() ? "" : " (strided operands)") +
                     (alpha == 1.0f ? "" : " (alpha " + std::to_string(alpha) + ")");
  return make_fn_kernel(fn, desc, ws);
}

}  // namespace

std::unique_ptr<Kernel> make_matmul_kernel(const Node& n, const Graph& g, DerivedConstants* derived) {
  if (g.type(n.inputs[0]).dtype == DType::kF64) {  // in double, not through sgemm (dgemm.cpp)
    if (n.op == OpKind::kLinear) return make_linear_f64(n, g);
    if (n.op == OpKind::kMatmul) return make_matmul_f64(n, g);
  }
  switch (n.op) {
    case OpKind::kLinear: return make_linear(n, g, derived);
    case OpKind::kMatmul: return make_batched_matmul(n, g, derived);
    default: KILN_FAIL(kInternal, op_name(n.op), " is not in the matmul family");
  }
}

}  // namespace kiln::cpu
