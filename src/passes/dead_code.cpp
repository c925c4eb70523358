// eliminate_dead_code: removes every node none of whose outputs reaches a graph output, then
// compacts the graph (drops values nothing produces or uses, renumbers ids densely).
//
// Does: a single backward sweep (nodes are in topological order, so a node's users come after
// it); a node with several outputs stays when any one of them is needed. Unused constants and
// weights disappear with compact(); graph inputs always stay, used or not.
// Does not: look inside fused bodies (their outputs all map to the fused node's outputs), merge
// duplicate nodes (no CSE), or treat any op as having side effects (Kiln ops have none).
#include "kiln/passes.h"

namespace kiln {

bool eliminate_dead_code(Graph& g) {
  const size_t nodes_before = g.nodes().size();
  const int32_t values_before = g.num_values();

  std::vector<char> needed(size_t(g.num_values()), 0);
  for (ValueId o : g.outputs()) needed[size_t(o)] = 1;
  std::vector<char> live(g.nodes().size(), 0);
  for (size_t i = g.nodes().size(); i-- > 0;) {
    const Node& n = *g.nodes()[i];
    for (ValueId out : n.outputs) live[i] |= needed[size_t(out)];
    if (!live[i]) continue;
    for (ValueId in : n.inputs)
      if (in != kNoValue) needed[size_t(in)] = 1;
  }
  // Erase from the back so the indices still to visit stay valid.
  for (size_t i = live.size(); i-- > 0;)
    if (!live[i]) g.erase_node(i);

  g.compact();
  return g.nodes().size() != nodes_before || g.num_values() != values_before;
}

}  // namespace kiln
