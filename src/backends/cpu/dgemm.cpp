// The f64 GEMM of the CPU backend and the f64 kernels of linear and matmul on top of it.
//
// f64 operands compute in double (docs/architecture.md): the f32 kernels in matmul.cpp would
// convert them to f32 and lose everything past about seven digits. dgemm is a plain cache-blocked
// loop nest, correctness first: columns in kDNC blocks -> depth in kDKC blocks (B's block is
// packed row-major into scratch, so the inner loop reads it contiguously whatever B's strides)
// -> rows, split over threads -> for each row an axpy of B's packed rows into C's row, which the
// compiler vectorizes. Every C element is a sum in double over the depth in order.
//
// What it does not do: register blocking or A packing (f64 models are rare and small on this
// path); conv and attention still compute f64 in f32 (their kernels stage operands as f32).
#include <algorithm>
#include <cstring>

#include "src/backends/cpu/gemm.h"
#include "src/ops/epilogue.h"
#include "src/ops/pointwise.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kDKC = 256;  // depth per block: a packed block of B is kDKC x kDNC doubles (1 MiB)
constexpr int64_t kDNC = 512;
constexpr int64_t kRowGrain = 8;

// Workspace bytes dgemm needs for a B of k x n (one packed block).
size_t dgemm_workspace(int64_t n, int64_t k) {
  Carver c;
  c.take(2 * std::min(kDKC, k) * std::min(kDNC, n));  // doubles, as pairs of floats
  return c.used();
}

}  // namespace

void dgemm(const DgemmArgs& g, double* scratch) {
  const int64_t m = g.m, n = g.n, k = g.k;
  if (m <= 0 || n <= 0) return;
  for (int64_t i = 0; i < m; ++i) std::fill(g.c + i * g.ldc, g.c + i * g.ldc + n, 0.0);
  for (int64_t j0 = 0; j0 < n; j0 += kDNC) {
    const int64_t nc = std::min(kDNC, n - j0);
    for (int64_t p0 = 0; p0 < k; p0 += kDKC) {
      const int64_t kc = std::min(kDKC, k - p0);
      double* bp = scratch;  // bp[p * nc + j] = B(p0 + p, j0 + j)
      if (g.b_cs == 1) {
        for (int64_t p = 0; p < kc; ++p) std::memcpy(bp + p * nc, g.b + (p0 + p) * g.b_rs + j0, size_t(nc) * sizeof(double));
      } else {  // along depth in the inner loop: a transposed B reads contiguously
        for (int64_t j = 0; j < nc; ++j)
          for (int64_t p = 0; p < kc; ++p) bp[p * nc + j] = g.b[(p0 + p) * g.b_rs + (j0 + j) * g.b_cs];
      }
      parallel_for(m, kRowGrain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          double* __restrict crow = g.c + i * g.ldc + j0;
          const double* arow = g.a + i * g.a_rs + p0 * g.a_cs;
          for (int64_t p = 0; p < kc; ++p) {
            const double a = arow[p * g.a_cs];
            const double* __restrict brow = bp + p * nc;
            for (int64_t j = 0; j < nc; ++j) crow[j] += a * brow[j];
          }
        }
      });
    }
  }
}

namespace {

// The bias / residual / activation of a linear node, in double, over y[rows, cols].
class EpilogueF64 {
 public:
  EpilogueF64(const Node& n, const Graph& g)
      : has_bias_(n.inputs.size() > 2 && n.inputs[2] != kNoValue),
        has_residual_(n.inputs.size() > 3 && n.inputs[3] != kNoValue),
        act_(pw::parse_activation(n.op, n.attrs)),
        numel_(g.type(n.outputs[0]).numel()) {
    if (has_residual_) plan_ = pw::plan_broadcast(g.type(n.outputs[0]).shape(), {g.type(n.inputs[3]).shape()});
  }

  void apply(double* y, int64_t cols, const double* bias, const double* residual) const {
    if (numel_ == 0) return;
    if (has_bias_)
      parallel_for(numel_ / cols, kRowGrain, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t j = 0; j < cols; ++j) y[r * cols + j] += bias[j];
      });
    if (has_residual_) {
      const int64_t rs = plan_.inner_stride(0);
      parallel_for(numel_, kGrain, [&](int64_t b, int64_t e) {
        plan_.for_each_run(b, e, [&](const int64_t* off, int64_t o, int64_t len) {
          pw::binary_array(OpKind::kAdd, y + o, 1, residual + off[0], rs, y + o, len);
        });
      });
    }
    if (!act_.none)
      parallel_for(numel_, kGrain, [&](int64_t b, int64_t e) { pw::unary_array(act_.op, act_.params, y + b, y + b, e - b); });
  }

  std::string describe() const {
    return std::string(has_bias_ ? " + bias" : "") + (has_residual_ ? " + residual" : "") +
           (act_.none ? "" : " + " + act_.name);
  }

 private:
  static constexpr int64_t kGrain = 16384;
  bool has_bias_, has_residual_;
  pw::Activation act_;
  pw::BroadcastPlan plan_;
  int64_t numel_;
};

void check_f64(const Node& n, const Graph& g) {
  for (ValueId v : n.inputs)
    KILN_CHECK(v == kNoValue || g.type(v).dtype == DType::kF64, kUnsupported, op_name(n.op),
               ": an f64 product needs every operand in f64, got ", dtype_name(g.type(v).dtype));
}

}  // namespace

std::unique_ptr<Kernel> make_linear_f64(const Node& n, const Graph& g) {
  check_f64(n, g);
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& wt = g.type(n.inputs[1]);
  const int64_t K = wt.dims[1].extent, N = wt.dims[0].extent;
  int64_t M = 1;
  for (size_t i = 0; i + 1 < xt.dims.size(); ++i) M *= xt.dims[i].extent;
  const size_t n_inputs = n.inputs.size();
  const EpilogueF64 epi(n, g);
  const size_t ws_total = dgemm_workspace(N, K);
  auto fn = [=](const void* const* in, void* const* out, const RunContext& ctx) {
    check_workspace(ctx, ws_total, "linear (f64)");
    DgemmArgs d;
    d.m = M, d.n = N, d.k = K;
    d.a = static_cast<const double*>(in[0]), d.a_rs = K, d.a_cs = 1;
    d.b = static_cast<const double*>(in[1]), d.b_rs = 1, d.b_cs = K;  // w[N, K] is B transposed
    d.c = static_cast<double*>(out[0]), d.ldc = N;
    dgemm(d, static_cast<double*>(ctx.workspace));
    epi.apply(d.c, N, n_inputs > 2 ? static_cast<const double*>(in[2]) : nullptr,
              n_inputs > 3 ? static_cast<const double*>(in[3]) : nullptr);
  };
  return make_fn_kernel(fn, "cpu dgemm linear " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                                std::to_string(K) + epi.describe(),
                        ws_total);
}

std::unique_ptr<Kernel> make_matmul_f64(const Node& n, const Graph& g) {
  check_f64(n, g);
  const MatmulLayout views = matmul_layout({&g.type(n.inputs[0]), &g.type(n.inputs[1])}, n.attrs);
  const auto as = views.a.logical.shape(), bs = views.b.logical.shape();
  const auto ys = views.y.logical.shape();  // the output's logical dims (out_perm places them)
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  std::vector<int64_t> out_batch(ys.begin(), ys.end() - 2);
  auto a_op = std::make_shared<const StridedOperand>(strided_operand(out_batch, views.a));
  auto b_op = std::make_shared<const StridedOperand>(strided_operand(out_batch, views.b));
  auto y_op = std::make_shared<const StridedOperand>(strided_operand(out_batch, views.y));
  const double alpha = matmul_alpha(n.attrs);
  const size_t ws_total = dgemm_workspace(N, K);
  auto fn = [=](const void* const* in, void* const* out, const RunContext& ctx) {
    check_workspace(ctx, ws_total, "matmul (f64)");
    const auto* A = static_cast<const double*>(in[0]);
    const auto* B = static_cast<const double*>(in[1]);
    auto* Y = static_cast<double*>(out[0]);
    for (size_t b = 0; b < a_op->offsets.size(); ++b) {
      DgemmArgs d;
      d.m = M, d.n = N, d.k = K;
      d.a = A + a_op->offsets[b], d.a_rs = a_op->rs, d.a_cs = a_op->cs;
      d.b = B + b_op->offsets[b], d.b_rs = b_op->rs, d.b_cs = b_op->cs;
      d.c = Y + y_op->offsets[b], d.ldc = y_op->rs;
      dgemm(d, static_cast<double*>(ctx.workspace));
    }
    if (alpha != 1.0)
      for (int64_t i = 0, total = int64_t(a_op->offsets.size()) * M * N; i < total; ++i) Y[i] *= alpha;
  };
  return make_fn_kernel(fn,
                        "cpu dgemm matmul " + std::to_string(a_op->offsets.size()) + " x " + std::to_string(M) + "x" +
                            std::to_string(N) + "x" + std::to_string(K),
                        ws_total);
}

}  // namespace kiln::cpu
