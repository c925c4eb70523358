// CPU kernels of softmax and log_softmax over one axis, numerically stable: the row maximum
// is subtracted before exp, and log_softmax is (x - max) - log(sum(exp(x - max))).
//
// x is viewed as [outer, R, inner] around the axis. With inner == 1 (the common last-axis
// case, e.g. attention scores) each row is contiguous and runs as vectorized passes (max,
// exp, sum with several accumulator lanes, scale); f16 / bf16 rows are widened into per-part
// f32 scratch from the workspace. Otherwise tiles of up to kTile columns are processed
// together, vectorized along the columns. exp is the exp op's own array loop (pw::unary_array).
// NaN anywhere in a row makes the row NaN, as in PyTorch.
#include <algorithm>
#include <cmath>
#include <memory>

#include "src/backends/cpu/kernels.h"
#include "src/ops/pointwise.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kTile = 128;
constexpr int64_t kWork = 16384;  // elements per parallel part, at least
constexpr int kLanes = 16;

template <typename T>
T max_of(T a, T v) {
  return (v > a || pw::is_nan(v)) ? v : a;
}

// y[i] = exp(y[i]) with the exp op's own array loop (vectorized, same values as the exp op).
template <typename T>
void exp_in_place(T* y, int64_t n) {
  pw::unary_array(OpKind::kExp, pw::UnaryParams{}, y, y, n);
}

// One contiguous row; y must not alias x.
template <typename T>
void row(const T* x, T* y, int64_t n, bool log) {
  const T m = pw::max_array(x, n);
  int64_t i;
  for (i = 0; i < n; ++i) y[i] = x[i] - m;
  exp_in_place(y, n);
  T lanes[kLanes] = {};
  T s = 0;
  for (i = 0; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lanes[j] += y[i + j];
  for (; i < n; ++i) s += y[i];
  for (T l : lanes) s += l;

  if (log) {  // (x - m) is exact near the maximum; adding log(s) to m first would round it away
    const T ls = std::log(s);
    for (i = 0; i < n; ++i) y[i] = (x[i] - m) - ls;
  } else {
    const T inv = T(1) / s;
    for (i = 0; i < n; ++i) y[i] *= inv;
  }
}

// Columns [j0, j0 + len) of one [R, inner] slab, vectorized along the columns.
template <DType D>
void tile(const typename pw::Elem<D>::S* x, typename pw::Elem<D>::S* y, int64_t R, int64_t inner, int64_t len,
          bool log) {
  using E = pw::Elem<D>;
  using C = typename E::C;
  C m[kTile], s[kTile], t[kTile];
  for (int64_t j = 0; j < len; ++j) m[j] = -std::numeric_limits<C>::infinity(), s[j] = 0;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < len; ++j) m[j] = max_of(m[j], E::load(x[r * inner + j]));
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < len; ++j) t[j] = E::load(x[r * inner + j]) - m[j];
    exp_in_place(t, len);
    for (int64_t j = 0; j < len; ++j) s[j] += t[j];
  }
  if (log) {
    for (int64_t j = 0; j < len; ++j) s[j] = std::log(s[j]);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < len; ++j) y[r * inner + j] = E::store((E::load(x[r * inner + j]) - m[j]) - s[j]);
  } else {
    for (int64_t j = 0; j < len; ++j) s[j] = C(1) / s[j];
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t j = 0; j < len; ++j) t[j] = E::load(x[r * inner + j]) - m[j];
      exp_in_place(t, len);
      for (int64_t j = 0; j < len; ++j) y[r * inner + j] = E::store(t[j] * s[j]);
    }
  }
}

struct Shape3 {
  int64_t outer, R, inner;
  int64_t parts;  // parallel parts, each with its own scratch row when rows need widening
};

template <DType D>
KernelFn make_typed(Shape3 sh, bool log) {
  using S = typename pw::Elem<D>::S;
  constexpr bool widen = D == DType::kF16 || D == DType::kBF16;
  const size_t ws = widen && sh.inner == 1 ? size_t(sh.parts * 2 * sh.R) * sizeof(float) : 0;
  return [=](const void* const* in, void* const* out, const RunContext& ctx) {
    KILN_CHECK(ws == 0 || (ctx.workspace && ctx.workspace_size >= ws), kInternal, "softmax: workspace of ",
               ctx.workspace_size, " bytes, kernel needs ", ws);
    const S* x = static_cast<const S*>(in[0]);
    S* y = static_cast<S*>(out[0]);
    const int64_t tiles = (sh.inner + kTile - 1) / kTile;
    const int64_t tasks = sh.inner == 1 ? sh.outer : sh.outer * tiles;
    parallel_for(sh.parts, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        for (int64_t t = tasks * p / sh.parts; t < tasks * (p + 1) / sh.parts; ++t) {
          if (sh.inner == 1) {
            if constexpr (widen) {
              float* xs = static_cast<float*>(ctx.workspace) + p * 2 * sh.R;
              float* ys = xs + sh.R;
              to_f32(x + t * sh.R, D, xs, sh.R);
              row(xs, ys, sh.R, log);
              from_f32(ys, D, y + t * sh.R, sh.R);
            } else {
              row(x + t * sh.R, y + t * sh.R, sh.R, log);
            }
          } else {
            const int64_t o = t / tiles, j0 = (t % tiles) * kTile;
            const int64_t off = o * sh.R * sh.inner + j0;
            tile<D>(x + off, y + off, sh.R, sh.inner, std::min(kTile, sh.inner - j0), log);
          }
        }
      }
    });
  };
}

}  // namespace

std::unique_ptr<Kernel> make_softmax_kernel(const Node& n, const Graph& g) {
  const TensorType& xt = g.type(n.inputs[0]);
  const std::vector<int64_t> shape = xt.shape();
  const auto axis = static_cast<size_t>(n.attrs.get_int("axis"));
  Shape3 sh{1, shape.at(axis), 1, 1};
  for (size_t d = 0; d < axis; ++d) sh.outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) sh.inner *= shape[d];
  const int64_t numel = xt.numel();
  const int64_t tasks = sh.inner == 1 ? sh.outer : sh.outer * ((sh.inner + kTile - 1) / kTile);
  sh.parts = std::max<int64_t>(1, std::min({tasks, int64_t(num_threads()) * 4, numel / kWork}));
  const bool log = n.op == OpKind::kLogSoftmax;
  const bool widen = xt.dtype == DType::kF16 || xt.dtype == DType::kBF16;
  const size_t ws = widen && sh.inner == 1 ? size_t(sh.parts * 2 * sh.R) * sizeof(float) : 0;
  KernelFn fn;
  switch (xt.dtype) {
    case DType::kF32: fn = make_typed<DType::kF32>(sh, log); break;
    case DType::kF64: fn = make_typed<DType::kF64>(sh, log); break;
    case DType::kF16: fn = make_typed<DType::kF16>(sh, log); break;
    case DType::kBF16: fn = make_typed<DType::kBF16>(sh, log); break;
    default: KILN_FAIL(kUnsupported, op_name(n.op), ": x must be floating, got ", xt.to_string());
  }
  return make_fn_kernel(std::move(fn),
                        std::string("cpu ") + op_name(n.op) + " " + xt.to_string() +
                            (sh.inner == 1 ? " (contiguous rows)" : " (column tiles)"),
                        ws);
}

}  // namespace kiln::cpu
