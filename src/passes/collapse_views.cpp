// collapse_view_chains: a permute that, with the reshapes and permutes before it, reads the
// value it starts from in order becomes a reshape of that value.
//
// Kiln's IR is dense, so each permute is a copy. A chain such as y = permute(x, [0, 3, 1, 2]),
// reshape(y, [N, C, H*W]), permute(., [0, 2, 1]) (a vision transformer's tokens from a
// channels-last patch embedding) moves every element back where it was: the composite is
// reshape(x, [N, H*W, C]), which the memory planner makes free. strided_view_of (view_chain.h)
// finds the chain; the permutes it passed through lose their uses and go with
// eliminate_dead_code.
//
// Does not: collapse a permute whose output has symbolic dims (a reshape states concrete ones).
// Run it after the layout passes (to_channels_last, fold_attention_layout), which place the
// permutes it looks through.
#include "kiln/passes.h"
#include "src/passes/pass_util.h"
#include "src/passes/view_chain.h"

namespace kiln {

bool collapse_view_chains(Graph& g) {
  bool changed = false;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
    const Node& n = *g.nodes()[pos];
    if (n.op != OpKind::kPermute || !passes::all_static(g.type(n.outputs[0]))) continue;
    const passes::ValueView view = passes::strided_view_of(g, n.outputs[0]);
    if (view.base == n.outputs[0] || !view.whole_base(g)) continue;
    Attrs a;
    a.set("shape", g.type(n.outputs[0]).shape());
    passes::replace_node(g, pos, OpKind::kReshape, {view.base}, a);
    changed = true;
  }
  if (changed) eliminate_dead_code(g);
  return changed;
}

}  // namespace kiln
