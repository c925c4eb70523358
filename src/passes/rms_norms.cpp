// form_rms_norms: RMSNorm written out as ops becomes one layer_norm {rms} node, whose kernel
// keeps each row in registers: one read of x and one write, where the ops cost a reduction
// kernel and a pointwise kernel that reads x again (two launches per norm; Llama, Qwen2, Mistral
// and T5 have two norms a layer). Rewrites
//
//   y = x * rsqrt(reduce_mean(x^2) {axes: the last k dims, keepdim} + eps)
//   [z = y * w, w of those k dims (leading 1s allowed), of x's dtype or f32, y read only here]
//
// into layer_norm(x[, w]) {normalized_rank: k, eps, rms: true}, where x^2 is mul(x, x) or the
// reduction's {square} (square_into_reductions), eps a one-element floating constant >= 0, and
// every mul / add takes its operands in either order. The statistic is computed in f32 (f64 for
// f64) and not rounded to x's dtype before the rsqrt, as the ops would round it.
//
// Does not: match a division by sqrt, a mean over other axes, casts between the steps (run it
// after lower_precision, which drops an f16 model's casts to f32 and back), or a weight that
// broadcasts along the normalized dims.
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "kiln/passes.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

// x and k where `m` = reduce_mean(x^2) over the last k dims of x with keepdim; k = 0 if not.
std::pair<ValueId, int64_t> mean_square_of(const Graph& g, ValueId m) {
  const Node* r = passes::made_by(g, m, OpKind::kReduceMean);
  if (r == nullptr || !r->attrs.get_bool("keepdim", false)) return {kNoValue, 0};
  ValueId x = r->inputs[0];
  if (!r->attrs.get_bool("square", false)) {
    const Node* sq = passes::made_by(g, x, OpKind::kMul);
    if (sq == nullptr || sq->inputs[0] != sq->inputs[1]) return {kNoValue, 0};
    x = sq->inputs[0];
  }
  const int64_t rank = g.type(x).rank();
  std::vector<int64_t> axes = r->attrs.get_ints("axes");  // non-negative (the shape rule)
  std::sort(axes.begin(), axes.end());
  const auto k = int64_t(axes.size());
  for (int64_t i = 0; i < k; ++i)
    if (axes[size_t(i)] != rank - k + i) return {kNoValue, 0};
  return {x, k};
}

// Whether w can be the norm's weight for x normalized over its last k dims: those dims' extents
// after any leading 1s, and x's dtype or f32.
bool weight_for(const Graph& g, ValueId w, ValueId x, int64_t k) {
  const TensorType& wt = g.type(w);
  const TensorType& xt = g.type(x);
  if (wt.dtype != xt.dtype && wt.dtype != DType::kF32) return false;
  if (wt.rank() < k) return false;
  for (int64_t i = 0; i < wt.rank(); ++i) {
    const Dim& d = wt.dims[size_t(i)];
    const int64_t from_end = wt.rank() - i;
    if (from_end > k ? d.extent != 1 : !(d.is_static() && d == xt.dims[size_t(xt.rank() - from_end)])) return false;
  }
  return true;
}

}  // namespace

bool form_rms_norms(Graph& g) {
  return passes::rewrite_each(g, [](Graph& graph, size_t pos) {
    const Node& n = *graph.nodes()[pos];
    if (n.op != OpKind::kMul || !is_floating(graph.type(n.outputs[0]).dtype)) return false;
    for (int i = 0; i < 2; ++i) {
      const ValueId x = n.inputs[size_t(i)];
      const Node* rs = passes::made_by(graph, n.inputs[size_t(1 - i)], OpKind::kRsqrt);
      const Node* sum = rs ? passes::made_by(graph, rs->inputs[0], OpKind::kAdd) : nullptr;
      if (sum == nullptr || graph.type(x) != graph.type(n.outputs[0])) continue;
      for (int j = 0; j < 2; ++j) {
        const auto [base, k] = mean_square_of(graph, sum->inputs[size_t(j)]);
        const std::optional<double> eps = passes::floating_scalar(graph, sum->inputs[size_t(1 - j)]);
        if (base != x || k == 0 || !eps || *eps < 0) continue;
        Attrs a;
        a.set("normalized_rank", k);
        a.set("eps", *eps);
        a.set("rms", true);
        // y * w (either order) with y read only there takes w as the norm's weight.
        const ValueId y = n.outputs[0];
        if (passes::read_once(graph, y)) {
          const size_t at = size_t(graph.users()[size_t(y)][0]);
          const Node& m = *graph.nodes()[at];
          const ValueId w = m.op != OpKind::kMul ? kNoValue : m.inputs[0] == y ? m.inputs[1] : m.inputs[0];
          if (w != kNoValue && w != y && graph.type(m.outputs[0]) == graph.type(y) && weight_for(graph, w, x, k)) {
            const std::vector<int64_t> shape = graph.type(x).shape();
            const std::vector<int64_t> tail(shape.end() - k, shape.end());
            passes::NodeInserter ins{graph, at, m.name};
            const ValueId weight = ins.reshape(w, tail);
            passes::replace_node(graph, ins.pos, OpKind::kLayerNorm, {x, weight}, a);
            return true;
          }
        }
        passes::replace_node(graph, pos, OpKind::kLayerNorm, {x}, a);
        return true;
      }
    }
    return false;
  });
}

}  // namespace kiln
