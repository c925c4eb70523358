// eliminate_common_subexpressions: a node that repeats an earlier one (the same op, the same
// input values and the same attributes) is dropped, and what read its outputs reads the earlier
// node's. Kiln ops have no side effects and depend only on their inputs and attributes, so the
// two compute the same values. Why: models recompute shared subexpressions per layer (a
// diffusion UNet's SiLU of the timestep embedding in every residual block, views of one
// tensor taken again by each reader), each a kernel of its own once built.
//
// Does: one sweep in topological order, so a chain of repeats (silu(t) then linear of it)
// collapses node by node; compacts the graph when anything merged.
// Does not: merge fused nodes (their bodies are not compared), merge a node one of whose
// outputs is a graph output (two outputs would become one value), or compare constants by
// their bytes (equal constants that are separate values keep their readers apart).
#include <map>
#include <utility>
#include <vector>

#include "kiln/passes.h"
#include "src/passes/pass_util.h"

namespace kiln {

bool eliminate_common_subexpressions(Graph& g) {
  std::map<std::pair<OpKind, std::vector<ValueId>>, std::vector<const Node*>> seen;
  bool changed = false;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
    const Node& n = *g.nodes()[pos];
    if (op_info(n.op).family == OpFamily::kFused) continue;
    std::vector<const Node*>& same = seen[{n.op, n.inputs}];
    const Node* earlier = nullptr;
    for (const Node* m : same)
      if (m->attrs == n.attrs && m->outputs.size() == n.outputs.size()) {
        earlier = m;
        break;
      }
    bool output = false;
    for (ValueId v : n.outputs) output = output || passes::is_graph_output(g, v);
    if (earlier == nullptr || output) {
      same.push_back(&n);
      continue;
    }
    for (size_t i = 0; i < n.outputs.size(); ++i) g.replace_all_uses(n.outputs[i], earlier->outputs[i]);
    g.erase_node(pos--);
    changed = true;
  }
  if (changed) g.compact();
  return changed;
}

}  // namespace kiln
