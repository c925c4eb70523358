// fuse_sibling_linears: runs the q, k and v projections of an attention block (and other linears
// of one input, such as SwiGLU's gate and up) as one GEMM.
//
// A transformer's self-attention computes q = linear(x, Wq, bq), k = linear(x, Wk, bk),
// v = linear(x, Wv, bv) and splits each into heads (reshape, permute) for sdpa. At small batch
// each of those GEMMs is launch and latency bound; one GEMM over the concatenated weight does the
// same work in one launch with a wider N. Rewrite, for a group of such siblings:
//
//   wcat = concat(Wq, Wk, Wv) {axis 0}     bcat = concat(bq, bk, bv) {axis 0}
//   y    = linear(x, wcat, bcat)
//   q'   = slice(y, last axis, 0, Nq)      k' = slice(y, Nq, Nq + Nk)    v' = ...
//
// and the readers of q, k, v read q', k', v'. The concatenations are nodes on constants: the
// fold_constants that follows makes them constants, and that fold is what records how to
// derive them from the weights again (refit; src/passes/refit_record.h).
//
// A group is two or more linears that read the same x (hence the same K and dtype), whose
// weights are constants, that all have a constant bias or all have none, that carry no
// epilogue (no activation, no residual; the pass runs before fuse_epilogue) and whose
// attributes are equal. Every output of the group must reach only readers that read its slice
// where it lies: sdpa q / k / v operands, through reshape and permute nodes, of sdpa nodes that
// the filter accepts (the one fold_attention_layout is given; by default fused_attention_shape:
// f16 / bf16, head dim 32, 64, 96 or 128; on CUDA strided_attention_shape), which
// fold_attention_layout reads as strided views of y; and, when pointwise fusion follows
// (`pointwise_views`) and shapes are static, pointwise ops and concats (Llama's rotary embedding
// of q and k, SwiGLU's silu(gate) * up), which fold_input_views makes read views, also through
// expand, slice and split (grouped-query attention's repeated k / v, which fold_attention_layout
// reads with stride 0; rotate_half's halves). An output with any other reader (a graph output,
// a mask, a GEMM), or feeding an sdpa that fold_attention_layout leaves with dense operands,
// keeps its own linear: its slice would stay a copy, which costs about what the saved launch
// does.
//
// Does not: fuse linears over different inputs, look through casts or other ops between x and
// the linears, or fuse matmul / conv siblings.
#include <algorithm>
#include <string>
#include <vector>

#include "kiln/errors.h"
#include "kiln/passes.h"
#include "src/ops/epilogue.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

// Whether every reader of v, followed through reshape and permute nodes (and expand, slice and
// split nodes, with `views`), reads a slice of the fused output where it lies: an sdpa that takes
// it as q, k or v and that `foldable` accepts, or, with `views`, a pointwise op or a concat
// (fold_input_views makes fused kernels and concats read views; rotate_half's slices and concat
// become a gathered leaf of the rotary kernel). v and the values on the way are no graph
// outputs, and v has a reader.
bool reads_slices_in_place(const Graph& g, const std::vector<std::vector<int>>& users, ValueId v,
                           const AttentionFilter& foldable, bool views, int depth = 0) {
  constexpr int kMaxDepth = 16;  // a head split is two or three views
  if (depth > kMaxDepth || passes::is_graph_output(g, v) || users[size_t(v)].empty()) return false;
  for (int u : users[size_t(v)]) {
    const Node& r = *g.nodes()[size_t(u)];
    const bool chain = r.op == OpKind::kReshape || r.op == OpKind::kPermute ||
                       (views && (r.op == OpKind::kExpand || r.op == OpKind::kSlice || r.op == OpKind::kSplit));
    if (chain) {
      for (ValueId o : r.outputs)
        if (!reads_slices_in_place(g, users, o, foldable, views, depth + 1)) return false;
    } else if (r.op == OpKind::kSdpa) {
      if (!foldable(g, r)) return false;
      for (size_t i = 3; i < r.inputs.size(); ++i)
        if (r.inputs[i] == v) return false;  // the mask
    } else if (!views || !(r.op == OpKind::kConcat || (op_info(r.op).pointwise() && r.outputs.size() == 1))) {
      return false;
    }
  }
  return true;
}

// A linear that may join a group: plain (no activation, no residual), constant weight and bias.
bool plain_constant_linear(const Graph& g, const Node& n) {
  if (n.op != OpKind::kLinear || !pw::parse_activation(n.op, n.attrs).none) return false;
  if (passes::input_or_none(n, 3) != kNoValue) return false;
  const ValueId w = n.inputs[1], b = passes::input_or_none(n, 2);
  return g.value(w).is_constant() && (b == kNoValue || g.value(b).is_constant());
}

struct Group {
  ValueId x;
  bool biased;
  const Attrs* attrs;
  std::vector<Node*> members;  // in topological order
};

size_t position_of(const Graph& g, const Node* n) {
  for (size_t p = 0; p < g.nodes().size(); ++p)
    if (g.nodes()[p].get() == n) return p;
  KILN_FAIL(kInternal, "fuse_sibling_linears: a grouped linear ('", n->name, "') is not in the graph");
}

std::string group_name(const Group& grp) {
  const std::string& first = grp.members.front()->name;
  return (first.empty() ? std::string("linear") : first) + "+siblings";
}

// Replaces the group's linears by one linear over the concatenated weights and a slice of its
// output per member. The new nodes go where the first member was: x and the constants are
// defined there, and every reader of a member comes after it.
void fuse(Graph& g, const Group& grp) {
  const std::string name = group_name(grp);
  const Node& first = *grp.members.front();
  const Attrs attrs = first.attrs;
  std::vector<ValueId> ws, bs, outs;
  std::vector<std::string> names;
  for (const Node* m : grp.members) {
    ws.push_back(m->inputs[1]);
    if (grp.biased) bs.push_back(m->inputs[2]);
    outs.push_back(m->outputs[0]);
    names.push_back(m->name);
  }
  size_t pos = position_of(g, &first);
  Attrs rows;
  rows.set("axis", int64_t{0});
  std::vector<ValueId> ins = {grp.x, g.insert_node(pos++, OpKind::kConcat, ws, rows, name)[0]};
  if (grp.biased) ins.push_back(g.insert_node(pos++, OpKind::kConcat, bs, rows, name)[0]);
  const ValueId y = g.insert_node(pos++, OpKind::kLinear, ins, attrs, name)[0];
  const int64_t axis = g.type(y).rank() - 1;
  int64_t start = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const int64_t n = g.type(ws[i]).dims[0].extent;
    g.replace_all_uses(
        outs[i], g.insert_node(pos++, OpKind::kSlice, {y}, passes::slice_attrs(axis, start, start + n), names[i])[0]);
    start += n;
  }
  std::vector<size_t> old;
  for (const Node* m : grp.members) old.push_back(position_of(g, m));
  std::sort(old.rbegin(), old.rend());
  for (size_t p : old) g.erase_node(p);
}

}  // namespace

bool fuse_sibling_linears(Graph& g, const AttentionFilter& foldable, bool pointwise_views) {
  const std::vector<std::vector<int>> users = g.users();
  std::vector<Group> groups;
  for (const auto& node : g.nodes()) {
    Node& n = *node;
    if (!plain_constant_linear(g, n)) continue;
    // Views of a slice are static (fold_input_views, fold_attention_layout's grouped rewrite).
    const bool views = pointwise_views && passes::all_static(g.type(n.outputs[0]));
    if (!reads_slices_in_place(g, users, n.outputs[0], foldable, views)) continue;
    const ValueId x = n.inputs[0];
    const bool biased = passes::input_or_none(n, 2) != kNoValue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& grp) {
      return grp.x == x && grp.biased == biased && *grp.attrs == n.attrs;
    });
    if (it == groups.end()) {
      groups.push_back(Group{x, biased, &n.attrs, {&n}});
    } else {
      it->members.push_back(&n);
    }
  }
  bool changed = false;
  for (const Group& grp : groups) {
    if (grp.members.size() < 2) continue;
    fuse(g, grp);
    changed = true;
  }
  if (changed) g.compact();
  return changed;
}

}  // namespace kiln
