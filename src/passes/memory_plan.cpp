// STUB: memory planner (to be written). Gives every intermediate its own range.
#include "kiln/passes.h"

namespace kiln {

MemoryPlan plan_memory(const Graph& g, size_t alignment) {
  MemoryPlan p;
  p.alignment = alignment;
  p.offsets.assign(size_t(g.num_values()), -1);
  for (const auto& n : g.nodes())
    for (ValueId v : n->outputs) {
      bool is_out = false;
      for (ValueId o : g.outputs()) is_out |= (o == v);
      if (is_out) continue;
      p.offsets[v] = int64_t(p.arena_bytes);
      p.arena_bytes += (g.type(v).nbytes() + alignment - 1) / alignment * alignment;
    }
  p.naive_bytes = p.arena_bytes;
  return p;
}

}  // namespace kiln
