// fold_input_views: fused pointwise kernels and concats read a permuted, sliced, split or
// expanded input where the value it comes from lies, instead of a copy made for them.
//
// Kiln's IR is dense, so the head split in front of RoPE (q = linear(x).view(b, s, h, d)
// .transpose(1, 2), then q * cos + rotate_half(q) * sin) writes q out before the rotary kernel
// reads it, and GPT-NeoX's partial rotary adds a split of that copy, slices of it, and a concat
// of the rotated slice with the one that passes. A fused_pointwise kernel indexes each input
// through element strides anyway (broadcasts are stride 0), and a concat copies each part into
// its columns, so the chain's composite map is just other strides: input i becomes the chain's
// start value, read through the node's attribute "view<i>" (offset, then size and stride per dim
// of what the node saw, src/ops/shape_rules.h input_view). A gathered leaf (rotate_half) maps
// its positions through its data's view; a viewed concat part is a strided copy of its own.
//
// An input is rewritten when the chain of permute / slice / split / expand / reshape nodes in
// front of it (view_chain.h) composes into one strided view with one stride per dim and that
// view is no reshape of the start value (which costs nothing already); a single pointwise op
// (unary, binary, where, cast) with such an input becomes a fused node of one op first. The
// innermost dim must stay contiguous (or broadcast): a transposed read would leave a pointwise
// kernel's loads uncoalesced, where the copy's tiled transpose is not. Static shapes only. The
// chains left without readers are removed, and a split left with parts nothing reads becomes a
// slice per part still read (a split copies every part). Run it after fuse_pointwise.
#include <algorithm>

#include "kiln/passes.h"
#include "src/ops/shape_rules.h"
#include "src/passes/pass_util.h"
#include "src/passes/view_chain.h"

namespace kiln {

namespace {

using passes::AtomView;

// A view a fused kernel reads well: one stride per dim, the innermost dim contiguous or one
// element or broadcast.
bool pointwise_readable(const AtomView& v) {
  for (const auto& d : v.dims)
    if (d.size() > 1) return false;
  if (v.dims.empty() || v.dims.back().empty()) return true;
  const int64_t inner = v.dims.back()[0].stride;
  return inner == 1 || inner == 0;
}

// The "view<i>" attribute of `v` read as AtomView `a` (one atom or none per dim).
std::vector<int64_t> view_attr(const Graph& g, ValueId v, const AtomView& a) {
  std::vector<int64_t> strides;
  for (const auto& d : a.dims) strides.push_back(d.empty() ? 0 : d[0].stride);
  return passes::view_attribute(a.offset, g.type(v).shape(), strides);
}

// Each input of n (a fused node, or a pointwise op) that a view chain made, with the view of the
// chain's start value that would replace it; empty where none folds.
std::vector<std::pair<size_t, AtomView>> foldable_inputs(const Graph& g, const Node& n) {
  std::vector<std::pair<size_t, AtomView>> out;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const ValueId v = n.inputs[i];
    if (v == kNoValue || n.attrs.has(input_view_key(i)) || !passes::all_static(g.type(v))) continue;
    AtomView a = passes::atom_view_of(g, v, true, pointwise_readable);
    if (a.base != v && !a.in_order(g) && passes::all_static(g.type(a.base))) out.emplace_back(i, std::move(a));
  }
  return out;
}

// A single pointwise op as a fused node of one op, which can then read views.
void fuse_alone(Graph& g, size_t pos) {
  const Node& n = *g.nodes()[pos];
  auto body = std::make_shared<Graph>();
  std::vector<ValueId> ins;
  for (size_t i = 0; i < n.inputs.size(); ++i)
    ins.push_back(body->add_input("in" + std::to_string(i), g.type(n.inputs[i])));
  body->mark_output(body->add_node1(n.op, ins, n.attrs, n.name), "out0");
  const ValueId old = n.outputs[0];
  const ValueId y = g.insert_fused(pos, n.inputs, body, n.name)[0];
  g.replace_all_uses(old, y);
  g.erase_node(pos + 1);
}

// A split some of whose parts nothing reads: one slice per part that is read.
bool slice_read_parts(Graph& g, size_t pos) {
  const Node& n = *g.nodes()[pos];
  if (n.op != OpKind::kSplit) return false;
  auto read = [&](ValueId v) { return g.num_uses(v) > 0 || passes::is_graph_output(g, v); };
  const int64_t axis = n.attrs.get_int("axis");
  if (std::all_of(n.outputs.begin(), n.outputs.end(), read) ||
      !std::all_of(n.outputs.begin(), n.outputs.end(),
                   [&](ValueId v) { return g.type(v).dims[size_t(axis)].is_static(); }))
    return false;
  const std::vector<ValueId> outs = n.outputs;
  const ValueId x = n.inputs[0];
  passes::NodeInserter at{g, pos, n.name};
  int64_t start = 0;
  for (ValueId out : outs) {
    const int64_t size = g.type(out).dims[size_t(axis)].extent;
    if (read(out))
      g.replace_all_uses(out, at.node(OpKind::kSlice, {x}, passes::slice_attrs(axis, start, start + size)));
    start += size;
  }
  return true;
}

}  // namespace

bool fold_input_views(Graph& g) {
  bool changed = false;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
    const Node& at = *g.nodes()[pos];
    const bool single = op_info(at.op).pointwise() && at.outputs.size() == 1 &&
                        std::find(at.inputs.begin(), at.inputs.end(), kNoValue) == at.inputs.end();
    if (at.op != OpKind::kFusedPointwise && at.op != OpKind::kConcat && !single) continue;
    const auto folds = foldable_inputs(g, at);
    if (folds.empty()) continue;
    if (single) fuse_alone(g, pos);
    Node& n = *g.nodes()[pos];
    for (const auto& [i, a] : folds) {
      n.attrs.set(input_view_key(i), view_attr(g, n.inputs[i], a));
      n.inputs[i] = a.base;
    }
    changed = true;
  }
  if (!changed) return false;
  eliminate_dead_code(g);
  passes::rewrite_each(g, slice_read_parts);
  return true;
}

}  // namespace kiln
