// plan_memory: places every intermediate value (a node output that is not a graph output) at
// an offset in one activation arena, letting values whose lifetimes do not overlap share bytes.
//
// A value lives from the index of the node that produces it to the index of its last user
// (inclusive on both ends; a value nobody reads lives only at its producer, which still writes
// it). Because both ends are inclusive, a node's outputs are live together with its inputs and
// never overlap them, with one exception, the alias rule below. Placement is greedy by size:
// largest first, each at the lowest aligned offset that does not overlap a placed block whose
// lifetime intersects its own. Ties break by producer index then id, so a plan is deterministic.
//
// Alias rule (when `alias_views` is on, the default): a reshape or copy (or a permute, expand or
// slice that reads its input in order, src/ops/access.h: a permute moving only size-1 dims)
// whose input and output are both arena values (intermediates with at least one byte) and
// have the same dtype and byte count puts its output on its input's bytes: same offset, no
// byte moves (every tensor is dense and row-major, so a reshape is a new shape over the same
// bytes, and a copy keeps the type).
// Such values form an alias group rooted at the first value that is not an alias (chains of
// reshapes and several reshapes of one value included); the group is one block whose lifetime
// runs from the root's producer to the last use of any member. So no node writes the group's
// bytes while a member can still be read, and nothing else is written there: values are never
// updated in place, and the only nodes producing a member are the aliasing ones themselves,
// whose kernels do nothing when their input and output pointers are equal (cpu/shape.cpp,
// cuda/kernels/shape.cpp). A reshape or copy from a graph input or constant, or into a graph output,
// still copies: those are not in the arena.
//
// In-place rule (for the (node, input) pairs `in_place` accepts, whose kernels give the same
// result when their output 0 is written over that input's bytes): the output joins the block of
// the node's first such input that is an arena value of the output's dtype and byte count, whose
// block's lifetime (every member's last use) ends at this node, and beside which no other input
// of the node lies in the block. So the bytes are overwritten only by the node that reads them
// last, and only where its kernel promised the result does not change (a residual conv reading
// each residual element before it writes the output element at the same position).
//
// Does: sizes rounded up to `alignment`, offsets multiples of it; zero-byte values get offset 0
// and take no space; naive_bytes is the sum of every intermediate's rounded size, aliases
// included (the arena with neither reuse nor aliasing), so arena_bytes <= naive_bytes.
// Does not: plan graph inputs, outputs or constants (offset -1; the caller binds those), plan
// the values inside a fused node's body (the fused kernel keeps them in registers), alias any
// other op, or write over an input that a node's kernel did not name.
#include <algorithm>

#include "kiln/errors.h"
#include "kiln/passes.h"
#include "src/ops/access.h"

namespace kiln {

namespace {

struct Block {
  ValueId id;       // the alias group's root
  size_t size;      // rounded to the alignment
  int first, last;  // lifetime in node indices, inclusive, over every member of the group
  int64_t offset = -1;
};

bool lifetimes_overlap(const Block& a, const Block& b) { return a.first <= b.last && b.first <= a.last; }

}  // namespace

bool output_reinterprets_input(const Node& n, const Graph& g) {
  if (n.inputs.size() != 1 || n.outputs.size() != 1 || n.inputs[0] == kNoValue) return false;
  const TensorType &x = g.type(n.inputs[0]), &y = g.type(n.outputs[0]);
  return x.dtype == y.dtype && x.nbytes() == y.nbytes() && reads_input_in_order(n, g);
}

MemoryPlan plan_memory(const Graph& g, size_t alignment, bool alias_views, const InPlace& in_place) {
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
  std::vector<int> block_of(size_t(g.num_values()), -1);  // index into blocks, -1: not in a block
  // The block node i's output v (0) may take by the in-place rule (its first input that
  // qualifies), or -1.
  auto in_place_block = [&](const Node& n, size_t i, ValueId v, size_t rounded) {
    if (!in_place || n.outputs.empty() || v != n.outputs[0]) return -1;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const ValueId in = n.inputs[k];
      const int b = in == kNoValue ? -1 : block_of[size_t(in)];
      if (b < 0 || blocks[size_t(b)].last != int(i) || blocks[size_t(b)].size != rounded ||
          g.type(in).dtype != g.type(v).dtype || g.type(in).nbytes() != g.type(v).nbytes())
        continue;
      bool alone = true;  // no other input of the node in the block
      for (size_t j = 0; j < n.inputs.size() && alone; ++j)
        alone = j == k || n.inputs[j] == kNoValue || block_of[size_t(n.inputs[j])] != b;
      if (alone && in_place(i, k)) return b;
    }
    return -1;
  };
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = *g.nodes()[i];
    for (ValueId v : n.outputs) {
      if (is_output[size_t(v)] || g.value(v).is_constant()) continue;
      const size_t bytes = g.type(v).nbytes();
      if (bytes == 0) {
        plan.offsets[size_t(v)] = 0;
        continue;
      }
      const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
      plan.naive_bytes += rounded;
      const int last = std::max(int(i), last_use[size_t(v)]);
      if (alias_views && output_reinterprets_input(n, g) && block_of[size_t(n.inputs[0])] >= 0) {
        const int b = block_of[size_t(n.inputs[0])];
        KILN_CHECK(blocks[size_t(b)].size == rounded, kInternal, "plan_memory: alias %", v, " of ",
                   rounded, " bytes on a block of ", blocks[size_t(b)].size);
        block_of[size_t(v)] = b;
        blocks[size_t(b)].last = std::max(blocks[size_t(b)].last, last);
        ++plan.aliased_values;
        continue;
      }
      if (const int b = in_place_block(n, i, v, rounded); b >= 0) {
        block_of[size_t(v)] = b;
        blocks[size_t(b)].last = std::max(blocks[size_t(b)].last, last);
        ++plan.in_place_values;
        continue;
      }
      block_of[size_t(v)] = int(blocks.size());
      blocks.push_back({v, rounded, int(i), last});
    }
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
    plan.arena_bytes = std::max(plan.arena_bytes, offset + b.size);
    placed.push_back(bi);
  }
  for (size_t v = 0; v < block_of.size(); ++v)
    if (block_of[v] >= 0) plan.offsets[v] = blocks[size_t(block_of[v])].offset;
  return plan;
}

}  // namespace kiln
