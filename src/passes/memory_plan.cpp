// plan_memory: places every intermediate value (a node output that is not a graph output) at
// an offset in one activation arena, letting values whose lifetimes do not overlap share bytes.
//
// A value lives from the index of the node that produces it to the index of its last user
// (inclusive on both ends; a value nobody reads lives only at its producer, which still writes
// it). Because both ends are inclusive, a node's outputs are live together with its inputs and
// never alias them. Placement is greedy by size: largest first, each at the lowest aligned
// offset that does not overlap a placed value whose lifetime intersects its own. Ties break by
// producer index then id, so a plan is deterministic.
//
// Does: sizes rounded up to `alignment`, offsets multiples of it; zero-byte values get offset 0
// and take no space; naive_bytes is the sum of the rounded sizes (the arena without reuse).
// Does not: plan graph inputs, outputs or constants (offset -1; the caller binds those), plan
// the values inside a fused node's body (the fused kernel keeps them in registers), or reuse an
// input's buffer in place for an output.
#include <algorithm>

#include "kiln/errors.h"
#include "kiln/passes.h"

namespace kiln {

namespace {

struct Block {
  ValueId id;
  size_t size;   // rounded to the alignment
  int first, last;  // lifetime in node indices, inclusive
  int64_t offset = -1;
};

bool lifetimes_overlap(const Block& a, const Block& b) { return a.first <= b.last && b.first <= a.last; }

}  // namespace

MemoryPlan plan_memory(const Graph& g, size_t alignment) {
  KILN_CHECK(alignment > 0, kInvalidArgument, "plan_memory: alignment must be positive, got 0");
  MemoryPlan plan;
  plan.alignment = alignment;
  plan.offsets.assign(size_t(g.num_values()), -1);

  std::vector<char> is_output(size_t(g.num_values()), 0);
  for (ValueId o : g.outputs()) is_output[size_t(o)] = 1;
  std::vector<int> last_use(size_t(g.num_values()), -1);
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (ValueId in : g.nodes()[i]->inputs)
      if (in != kNoValue) last_use[size_t(in)] = int(i);

  std::vector<Block> blocks;
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (ValueId v : g.nodes()[i]->outputs) {
      if (is_output[size_t(v)] || g.value(v).is_constant()) continue;
      const size_t bytes = g.type(v).nbytes();
      if (bytes == 0) {
        plan.offsets[size_t(v)] = 0;
        continue;
      }
      const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
      blocks.push_back({v, rounded, int(i), std::max(int(i), last_use[size_t(v)])});
      plan.naive_bytes += rounded;
    }

  std::vector<size_t> order(blocks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Block &x = blocks[a], &y = blocks[b];
    if (x.size != y.size) return x.size > y.size;
    if (x.first != y.first) return x.first < y.first;
    return x.id < y.id;
  });

  std::vector<size_t> placed;  // indices into blocks
  std::vector<std::pair<size_t, size_t>> busy;  // [begin, end) of conflicting placed blocks
  for (size_t bi : order) {
    Block& b = blocks[bi];
    busy.clear();
    for (size_t pi : placed)
      if (lifetimes_overlap(b, blocks[pi]))
        busy.emplace_back(size_t(blocks[pi].offset), size_t(blocks[pi].offset) + blocks[pi].size);
    std::sort(busy.begin(), busy.end());
    size_t offset = 0;
    for (const auto& [begin, end] : busy) {
      if (offset + b.size <= begin) break;  // fits in the gap before this range
      offset = std::max(offset, end);
    }
    b.offset = int64_t(offset);
    plan.offsets[size_t(b.id)] = b.offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + b.size);
    placed.push_back(bi);
  }
  return plan;
}

}  // namespace kiln
