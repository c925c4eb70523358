// CPU kernels of the reduce family: reduce_sum / _mean / _max / _min / _var over any set of
// axes, and argmax over one.
//
// The factory collapses x's dims (dropping extent-1 dims, merging neighbours that are both
// reduced or both kept) so every reduction is one of two shapes:
//   A. the innermost run is reduced (e.g. mean over the last dim, or over H and W): each output
//      folds contiguous runs, with several accumulator lanes so the loop vectorizes;
//   B. the innermost run is kept (e.g. sum over the batch): each output row accumulates whole
//      rows of x into a tile of accumulators, vectorized along the row.
// Reduced dims outside the run are walked with an odometer. Floating sums accumulate in
// double; integer sums in 64 bits, wrapping like PyTorch; max / min propagate NaN. reduce_var
// is two-pass (mean, then squared deviations) for accuracy. Outputs split over threads.
#include <algorithm>
#include <limits>
#include <memory>

#include "src/backends/cpu/kernels.h"
#include "src/ops/pointwise.h"
#include "src/ops/access.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kTile = 256;      // case B: accumulators per tile
constexpr int64_t kWork = 32768;    // elements per parallel chunk, at least

using Layout = ReduceLayout;

// Calls fn(offset) for every index of shape (once, with 0, when shape is empty).
template <typename F>
void for_each_offset(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride, F&& fn) {
  int64_t idx[16] = {};
  int64_t off = 0;
  const size_t r = shape.size();
  while (true) {
    fn(off);
    size_t d = r;
    while (d > 0) {
      --d;
      off += stride[d];
      if (++idx[d] < shape[d]) break;
      off -= stride[d] * shape[d];
      idx[d] = 0;
      if (d == 0) return;
    }
    if (r == 0) return;
  }
}

enum class Red { kSum, kMax, kMin };

template <Red R, typename A>
struct Acc {
  static A init() {
    if constexpr (R == Red::kSum) return A(0);
    else if constexpr (std::numeric_limits<A>::has_infinity)
      return R == Red::kMax ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::infinity();
    else return R == Red::kMax ? std::numeric_limits<A>::lowest() : std::numeric_limits<A>::max();
  }
  static A add(A a, A v) {
    if constexpr (R == Red::kSum) return a + v;
    else if constexpr (R == Red::kMax) return (pw::is_nan(v) || v > a) ? v : a;
    else return (pw::is_nan(v) || v < a) ? v : a;
  }
};

// Reduces x (dtype D) with accumulator A. `mode`: 0 plain, 1 mean, 2 variance (sum pass then
// squared-deviation pass, divided by count - correction). `square`: each element is squared
// in A as it is loaded (a sum or mean of squares).
template <DType D, Red R, typename A>
struct Reducer {
  using S = typename pw::Elem<D>::S;
  using C = typename pw::Elem<D>::C;
  using Ac = Acc<R, A>;
  std::shared_ptr<const Layout> layout;
  int mode = 0;
  double correction = 0;
  bool square = false;

  A load(S s) const {
    const A v = static_cast<A>(pw::Elem<D>::load(s));
    return square ? v * v : v;
  }

  // Folds a contiguous run into acc, applying f to each element; lanes let it vectorize.
  template <typename F>
  A run(const S* p, int64_t n, A acc, F f) const {
    if constexpr (R != Red::kSum && std::is_same_v<S, A> && std::is_floating_point_v<A>)  // f: identity
      return Ac::add(acc, R == Red::kMax ? pw::max_array(p, n) : pw::min_array(p, n));
    constexpr int kLanes = 8;
    A lanes[kLanes];
    for (A& l : lanes) l = Ac::init();
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) lanes[j] = Ac::add(lanes[j], f(load(p[i + j])));
    for (; i < n; ++i) acc = Ac::add(acc, f(load(p[i])));
    for (A l : lanes) acc = Ac::add(acc, l);
    return acc;
  }

  S finish(A acc, A sq) const {
    const Layout& L = *layout;
    if (mode == 1) return pw::Elem<D>::store(static_cast<C>(static_cast<double>(acc) / double(L.count)));
    if (mode == 2) return pw::Elem<D>::store(static_cast<C>(static_cast<double>(sq) / (double(L.count) - correction)));
    return pw::Elem<D>::store(static_cast<C>(acc));
  }

  void case_a(const S* x, S* y, int64_t o0, int64_t o1) const {
    const Layout& L = *layout;
    for (int64_t o = o0; o < o1; ++o) {
      const S* base = x + strided_offset(o, L.kept_shape, L.kept_stride);
      A acc = Ac::init(), sq = A(0);
      auto id = [](A v) { return v; };
      for_each_offset(L.red_shape, L.red_stride, [&](int64_t r) { acc = run(base + r, L.inner, acc, id); });
      if (mode == 2) {
        const A mean = static_cast<A>(static_cast<double>(acc) / double(L.count));
        auto dev = [mean](A v) { return (v - mean) * (v - mean); };
        for_each_offset(L.red_shape, L.red_stride, [&](int64_t r) { sq = run(base + r, L.inner, sq, dev); });
      }
      y[o] = finish(acc, sq);
    }
  }

  // Tasks are (output row, tile of the row).
  void case_b(const S* x, S* y, int64_t t0, int64_t t1) const {
    const Layout& L = *layout;
    const int64_t tiles = (L.inner + kTile - 1) / kTile;
    A acc[kTile], sq[kTile];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t row = t / tiles, j0 = (t % tiles) * kTile, len = std::min(kTile, L.inner - j0);
      const S* base = x + strided_offset(row, L.kept_shape, L.kept_stride) + j0;
      for (int64_t j = 0; j < len; ++j) acc[j] = Ac::init(), sq[j] = A(0);
      for_each_offset(L.red_shape, L.red_stride, [&](int64_t r) {
        const S* p = base + r;
        for (int64_t j = 0; j < len; ++j) acc[j] = Ac::add(acc[j], load(p[j]));
      });
      if (mode == 2) {
        for (int64_t j = 0; j < len; ++j) acc[j] = static_cast<A>(static_cast<double>(acc[j]) / double(L.count));
        for_each_offset(L.red_shape, L.red_stride, [&](int64_t r) {
          const S* p = base + r;
          for (int64_t j = 0; j < len; ++j) sq[j] += (load(p[j]) - acc[j]) * (load(p[j]) - acc[j]);
        });
      }
      S* out = y + row * L.inner + j0;
      for (int64_t j = 0; j < len; ++j) out[j] = finish(acc[j], sq[j]);
    }
  }

  KernelFn fn() const {
    return [self = *this](const void* const* in, void* const* out, const RunContext&) {
      const Layout& L = *self.layout;
      const S* x = static_cast<const S*>(in[0]);
      S* y = static_cast<S*>(out[0]);
      if (L.inner_reduced) {
        parallel_for(L.outputs, std::max<int64_t>(1, kWork / L.count),
                     [&](int64_t b, int64_t e) { self.case_a(x, y, b, e); });
      } else {
        const int64_t tiles = (L.inner + kTile - 1) / kTile, rows = L.outputs / L.inner;
        parallel_for(rows * tiles, std::max<int64_t>(1, kWork / (L.count * std::min(kTile, L.inner))),
                     [&](int64_t b, int64_t e) { self.case_b(x, y, b, e); });
      }
    };
  }
};

template <DType D>
KernelFn make_typed(OpKind op, std::shared_ptr<const Layout> L, double correction, bool square) {
  using C = typename pw::Elem<D>::C;
  using Sum = std::conditional_t<std::is_floating_point_v<C>, double, uint64_t>;  // integers wrap
  switch (op) {
    case OpKind::kReduceSum: return Reducer<D, Red::kSum, Sum>{L, 0, 0, square}.fn();
    case OpKind::kReduceMean: return Reducer<D, Red::kSum, double>{L, 1, 0, square}.fn();
    case OpKind::kReduceVar: return Reducer<D, Red::kSum, double>{L, 2, correction}.fn();
    case OpKind::kReduceMax: return Reducer<D, Red::kMax, C>{L, 0, 0}.fn();
    case OpKind::kReduceMin: return Reducer<D, Red::kMin, C>{L, 0, 0}.fn();
    default: KILN_FAIL(kInternal, op_name(op), " is not a reduction");
  }
}

// argmax over one axis of x viewed as [outer, R, inner]: the first index of the largest value
// (a NaN counts as largest, as in PyTorch).
template <DType D>
KernelFn make_argmax(int64_t outer, int64_t R, int64_t inner) {
  using S = typename pw::Elem<D>::S;
  using C = typename pw::Elem<D>::C;
  return [=](const void* const* in, void* const* out, const RunContext&) {
    const S* x = static_cast<const S*>(in[0]);
    int64_t* y = static_cast<int64_t*>(out[0]);
    if constexpr (std::is_floating_point_v<S>) {
      if (inner == 1) {  // contiguous rows: a vectorized max, then the first element equal to it
        parallel_for(outer, std::max<int64_t>(1, kWork / R), [&](int64_t b, int64_t e) {
          for (int64_t o = b; o < e; ++o) {
            const S* p = x + o * R;
            const S m = pw::max_array(p, R);
            int64_t r = 0;
            while (r < R - 1 && !(p[r] == m || (pw::is_nan(m) && pw::is_nan(p[r])))) ++r;
            y[o] = r;
          }
        });
        return;
      }
    }
    const int64_t tiles = (inner + kTile - 1) / kTile;
    parallel_for(outer * tiles, std::max<int64_t>(1, kWork / (R * std::min(kTile, inner))), [&](int64_t b, int64_t e) {
      C best[kTile];
      for (int64_t t = b; t < e; ++t) {
        const int64_t o = t / tiles, j0 = (t % tiles) * kTile, len = std::min(kTile, inner - j0);
        const S* p = x + o * R * inner + j0;
        int64_t* idx = y + o * inner + j0;
        for (int64_t j = 0; j < len; ++j) best[j] = pw::Elem<D>::load(p[j]), idx[j] = 0;
        for (int64_t r = 1; r < R; ++r)
          for (int64_t j = 0; j < len; ++j) {
            const C v = pw::Elem<D>::load(p[r * inner + j]);
            if (v > best[j] || (pw::is_nan(v) && !pw::is_nan(best[j]))) best[j] = v, idx[j] = r;
          }
      }
    });
  };
}

}  // namespace

std::unique_ptr<Kernel> make_reduce_kernel(const Node& n, const Graph& g) {
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& yt = g.type(n.outputs[0]);
  const std::vector<int64_t> shape = xt.shape();
  const std::string desc = std::string("cpu ") + op_name(n.op) + " " + xt.to_string();
  if (n.op == OpKind::kArgmax) {
    const int64_t axis = n.attrs.get_int("axis");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= shape[size_t(d)];
    for (size_t d = size_t(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
    KernelFn fn = pw::visit_dtype(xt.dtype, [&](auto t) { return make_argmax<decltype(t)::value>(outer, shape[size_t(axis)], inner); });
    return make_fn_kernel(std::move(fn), desc);
  }

  std::vector<int64_t> axes = n.attrs.get_ints("axes", {});
  std::vector<char> reduced(shape.size(), axes.empty() ? 1 : 0);
  for (int64_t a : axes) reduced[size_t(a)] = 1;
  const double correction = n.attrs.get_float("correction", 1.0);
  const bool square = n.attrs.get_bool("square", false);

  int64_t count = 1;
  for (size_t d = 0; d < shape.size(); ++d) count *= reduced[d] ? shape[d] : 1;
  if (yt.numel() == 0) return make_fn_kernel([](const void* const*, void* const*, const RunContext&) {}, desc);
  if (count == 0) {  // an empty reduction: sum 0; mean and var NaN
    const double fill = n.op == OpKind::kReduceSum ? 0.0 : std::numeric_limits<double>::quiet_NaN();
    const DType dt = yt.dtype;
    const int64_t numel = yt.numel();
    return make_fn_kernel(
        [=](const void* const*, void* const* out, const RunContext&) {
          for (int64_t i = 0; i < numel; ++i) store_double(out[0], dt, i, fill);
        },
        desc + " (empty)");
  }
  auto layout = std::make_shared<const Layout>(collapse_reduction(shape, reduced));
  KILN_CHECK(layout->kept_shape.size() <= 16 && layout->red_shape.size() <= 16, kUnsupported, op_name(n.op),
             ": more than 16 alternating reduced and kept dims");
  KernelFn fn = pw::visit_dtype(
      xt.dtype, [&](auto t) { return make_typed<decltype(t)::value>(n.op, layout, correction, square); });
  return make_fn_kernel(std::move(fn), desc + (square ? " of squares" : "") +
                                           (layout->inner_reduced ? " (inner runs of " : " (rows of ") +
                                           std::to_string(layout->inner) + ")");
}

}  // namespace kiln::cpu
