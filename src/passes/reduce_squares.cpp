// square_into_reductions: a sum or mean of x * x reads x once.
//
// RMSNorm (x * rsqrt(mean(x^2) + eps)), T5's layer norm and an L2 normalization (x / ||x||)
// square x into a tensor of x's size that only the reduction reads: a kernel and a round trip
// through memory of the whole tensor. reduce_sum and reduce_mean take {square: true} and square
// each element as they load it (in their f32 / f64 accumulator), so
//
//   reduce_mean(mul(x, x)) {axes}  ->  reduce_mean(x) {axes, square}
//
// where the mul's two operands are the same value (pow(x, 2) reaches the IR as that mul). Every
// reduction of the square reads x; the mul stays only for its other readers (a square that
// eliminate_common_subexpressions shared between two norms goes with its last reduction).
//
// Does not: look through casts between the mul and the reduction, or take other prologues
// (abs, a difference of two tensors).
#include "kiln/passes.h"
#include "src/passes/pass_util.h"

namespace kiln {

bool square_into_reductions(Graph& g) {
  bool changed = false;
  for (const auto& node : g.nodes()) {
    Node& n = *node;
    if ((n.op != OpKind::kReduceSum && n.op != OpKind::kReduceMean) || n.attrs.get_bool("square", false)) continue;
    const ValueId sq = n.inputs[0];
    const Node* m = g.value(sq).producer;
    if (m == nullptr || m->op != OpKind::kMul || m->inputs[0] != m->inputs[1] || !is_floating(g.type(sq).dtype) ||
        g.type(m->inputs[0]) != g.type(sq))
      continue;
    n.inputs[0] = m->inputs[0];
    n.attrs.set("square", true);
    changed = true;
  }
  if (changed) eliminate_dead_code(g);
  return changed;
}

}  // namespace kiln
