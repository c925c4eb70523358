#include <algorithm>
#include <optional>
#include <utility>

#include "kiln/errors.h"
#include "src/passes/pass_util.h"
#include "src/passes/row_gathers.h"
#include "src/passes/sink_permutes.h"

namespace kiln::passes {

namespace {

using Shape = std::vector<int64_t>;

// The permute producing v, unless it permutes a constant (fold_constants turns that one into a
// constant, so moving it would only move work that costs nothing).
const Node* movable_permute(const Graph& g, ValueId v) {
  const Node* p = permute_of(g, v);
  return p != nullptr && !g.value(p->inputs[0]).is_constant() ? p : nullptr;
}

// A permute(v, p) among the first `before` nodes of g that something reads, if any: reading it
// too costs nothing more. (One that nothing reads is left over from an earlier rewrite; taking
// it would undo that rewrite.)
ValueId existing_permute(const Graph& g, ValueId v, const Perm& p, size_t before) {
  const Node* n = permute_before(g, v, p, before);
  return n != nullptr && g.num_uses(n->outputs[0]) > 0 ? n->outputs[0] : kNoValue;
}

Perm inverse(const Perm& p) {
  Perm inv(p.size());
  for (size_t i = 0; i < p.size(); ++i) inv[size_t(p[i])] = int64_t(i);
  return inv;
}

// The groups that reshape(permute(v, P), S) merges and splits: runs of the permuted tensor's
// dims of extent > 1 (as v dims, in the permuted order) whose product is that of a run of S's
// dims of extent > 1. None when the extents do not line up.
struct ReshapeGroup {
  std::vector<int64_t> in;  // v dims
  std::vector<size_t> out;  // S dims
};
std::optional<std::vector<ReshapeGroup>> reshape_groups(const Shape& vs, const Perm& p, const Shape& s) {
  std::vector<int64_t> a;  // the permuted tensor's dims > 1, as v dims
  for (int64_t d : p)
    if (vs[size_t(d)] != 1) a.push_back(d);
  std::vector<size_t> sdims;  // S's dims > 1
  for (size_t j = 0; j < s.size(); ++j)
    if (s[j] != 1) sdims.push_back(j);
  std::vector<ReshapeGroup> groups;
  size_t i = 0, j = 0;
  while (i < a.size() || j < sdims.size()) {
    if (i >= a.size() || j >= sdims.size()) return std::nullopt;
    ReshapeGroup grp{{a[i]}, {sdims[j]}};
    int64_t pa = vs[size_t(a[i++])], ps = s[sdims[j++]];
    while (pa != ps) {
      if (pa < ps) {
        if (i >= a.size()) return std::nullopt;
        pa *= vs[size_t(a[i])];
        grp.in.push_back(a[i++]);
      } else {
        if (j >= sdims.size()) return std::nullopt;
        ps *= s[sdims[j]];
        grp.out.push_back(sdims[j++]);
      }
    }
    groups.push_back(std::move(grp));
  }
  return groups;
}

// The v dims of extent > 1 from `from` up to `to` (exclusive), in order.
std::vector<int64_t> dims_between(const Shape& vs, int64_t from, int64_t to) {
  std::vector<int64_t> dims;
  for (int64_t d = from; d < to; ++d)
    if (vs[size_t(d)] != 1) dims.push_back(d);
  return dims;
}

// reshape(permute(v, P), S) as permute(reshape(v, S2), P2): the reshape of the permuted tensor
// merges and splits groups of its dims; each group of dims of extent > 1 must be adjacent and
// in order in v, so that it is one block of v that the same split can cut. Dims of extent 1
// go anywhere: S's leading ones (a batch of 1) lead S2, its others are placed last.
std::optional<std::pair<Shape, Perm>> reshape_through(const Shape& vs, const Perm& p, const Shape& s) {
  const auto groups = reshape_groups(vs, p, s);
  if (!groups) return std::nullopt;
  for (const ReshapeGroup& grp : *groups)
    if (dims_between(vs, grp.in.front(), grp.in.back() + 1) != grp.in) return std::nullopt;
  std::vector<size_t> order(groups->size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(),
            [&](size_t x, size_t y) { return (*groups)[x].in.front() < (*groups)[y].in.front(); });
  Shape s2;
  Perm p2(s.size(), -1);
  size_t lead = 0;
  while (lead < s.size() && s[lead] == 1) {
    p2[lead] = int64_t(lead);
    s2.push_back(1);
    ++lead;
  }
  for (size_t k : order)
    for (size_t o : (*groups)[k].out) {
      p2[o] = int64_t(s2.size());
      s2.push_back(s[o]);
    }
  for (size_t o = lead; o < s.size(); ++o)
    if (s[o] == 1) {
      p2[o] = int64_t(s2.size());
      s2.push_back(1);
    }
  return std::make_pair(s2, p2);
}

// Where reshape_through fails only because a group's dims lie in one block of v but in
// another order (a channel shuffle: [.., g, c] read as [.., c, g] and merged), the permute of
// v that reorders each such block in place, which reshape_through then takes. None otherwise.
std::optional<Perm> reorder_blocks(const Shape& vs, const Perm& p, const Shape& s) {
  const auto groups = reshape_groups(vs, p, s);
  if (!groups) return std::nullopt;
  Perm q(vs.size());
  for (size_t d = 0; d < q.size(); ++d) q[d] = int64_t(d);
  bool moved = false;
  for (const ReshapeGroup& grp : *groups) {
    const auto [lo, hi] = std::minmax_element(grp.in.begin(), grp.in.end());
    const std::vector<int64_t> block = dims_between(vs, *lo, *hi + 1);
    if (block.size() != grp.in.size()) return std::nullopt;  // not one block of v
    for (size_t k = 0; k < block.size(); ++k) {
      q[size_t(block[k])] = grp.in[k];
      moved |= block[k] != grp.in[k];
    }
  }
  if (!moved) return std::nullopt;
  return q;
}

// Binary and where: every operand in v's order, or false.
bool sink_elementwise(Graph& g, size_t pos, bool all_rules) {
  const Node& n = *g.nodes()[pos];
  const int64_t rank = g.type(n.outputs[0]).rank();
  const Node* first = nullptr;
  for (ValueId in : n.inputs)
    if (const Node* q = movable_permute(g, in); q && g.type(in).rank() == rank) {
      first = q;
      break;
    }
  if (first == nullptr) return false;
  const Perm p = perm_of(*first), inv = inverse(p);
  const std::string name = n.name;
  // Decide every operand first: nothing is inserted unless the rewrite happens.
  enum class How { kSource, kAsIs, kReshape, kPermute, kExisting };
  std::vector<How> how;
  for (ValueId in : n.inputs) {
    const Node* q = movable_permute(g, in);
    const TensorType& t = g.type(in);
    if (q && t.rank() == rank && perm_of(*q) == p) {
      how.push_back(How::kSource);
    } else if (t.numel() == 1) {
      how.push_back(How::kAsIs);
    } else if (all_rules && t.rank() == rank && existing_permute(g, in, inv, pos) != kNoValue) {
      how.push_back(How::kExisting);
    } else if (!all_rules || t.rank() > rank) {
      return false;
    } else {
      Shape padded(size_t(rank - t.rank()), 1);
      for (const Dim& d : t.dims) padded.push_back(d.extent);
      if (keeps_order(padded, inv)) how.push_back(How::kReshape);
      else if (g.value(in).is_constant()) how.push_back(How::kPermute);
      else return false;
    }
  }
  passes::NodeInserter at{g, pos, name};
  std::vector<ValueId> ins;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const ValueId in = g.nodes()[at.pos]->inputs[k];
    const TensorType t = g.type(in);
    Shape padded(size_t(rank - std::min(rank, t.rank())), 1);
    for (const Dim& d : t.dims) padded.push_back(d.extent);
    Shape target(static_cast<size_t>(rank));
    for (int64_t i = 0; i < rank; ++i) target[size_t(i)] = padded[size_t(inv[size_t(i)])];
    switch (how[k]) {
      case How::kSource: ins.push_back(permute_of(g, in)->inputs[0]); break;
      case How::kAsIs: ins.push_back(in); break;
      case How::kExisting: ins.push_back(existing_permute(g, in, inv, at.pos)); break;
      case How::kReshape: ins.push_back(at.reshape(in, target)); break;
      case How::kPermute: {
        Attrs a;
        a.set("perm", inv);
        ins.push_back(at.node(OpKind::kPermute, {at.reshape(in, padded)}, a));
        break;
      }
    }
  }
  const Node& m = *g.nodes()[at.pos];
  replace_permuted(g, at.pos, m.op, ins, Attrs(m.attrs), {p});
  return true;
}

// Concat: every operand permuted by the same P, or already permuted the other way by a node
// before it (a DenseNet's block input, also read by the block's first conv).
bool sink_concat(Graph& g, size_t pos) {
  const Node& n = *g.nodes()[pos];
  const Node* first = nullptr;
  for (ValueId in : n.inputs)
    if ((first = movable_permute(g, in)) != nullptr) break;
  if (first == nullptr) return false;
  const Perm p = perm_of(*first), inv = inverse(p);
  std::vector<ValueId> ins;
  for (ValueId in : n.inputs) {
    const Node* q = movable_permute(g, in);
    ins.push_back(q != nullptr && perm_of(*q) == p ? q->inputs[0] : existing_permute(g, in, inv, pos));
    if (ins.back() == kNoValue) return false;
  }
  Attrs a = n.attrs;
  a.set("axis", p[size_t(n.attrs.get_int("axis"))]);
  size_t at = pos;
  replace_permuted(g, at, n.op, ins, a, {p});
  return true;
}

}  // namespace

void replace_permuted(Graph& g, size_t& at, OpKind op, const std::vector<ValueId>& ins, const Attrs& attrs,
                      const std::vector<Perm>& perms) {
  const std::string name = g.nodes()[at]->name;
  const std::vector<ValueId> old = g.nodes()[at]->outputs;
  const std::vector<ValueId> outs = g.insert_node(at++, op, ins, attrs, name);
  std::vector<ValueId> moved;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (is_identity(perms[k])) {
      moved.push_back(outs[k]);
      continue;
    }
    Attrs a;
    a.set("perm", perms[k]);
    moved.push_back(g.insert_node(at++, OpKind::kPermute, {outs[k]}, a, name)[0]);
  }
  for (size_t k = 0; k < old.size(); ++k) g.replace_all_uses(old[k], moved[k]);
  g.erase_node(at);
}

bool sink_permute(Graph& g, size_t pos, bool all_rules, bool row_gathers) {
  const Node& n = *g.nodes()[pos];
  const OpFamily family = op_info(n.op).family;
  if (family == OpFamily::kBinary || family == OpFamily::kWhere) return sink_elementwise(g, pos, all_rules);
  if (n.op == OpKind::kConcat) return all_rules && sink_concat(g, pos);
  if (n.inputs.empty() || n.inputs[0] == kNoValue) return false;
  const Node* q = movable_permute(g, n.inputs[0]);
  if (q == nullptr) return false;
  const Perm p = perm_of(*q);
  const ValueId v = q->inputs[0];
  size_t at = pos;
  if (family == OpFamily::kUnary || family == OpFamily::kCast) {
    replace_permuted(g, at, n.op, {v}, n.attrs, {p});
    return true;
  }
  if (!all_rules) return false;
  Attrs a = n.attrs;
  switch (n.op) {
    case OpKind::kSlice:
    case OpKind::kSplit:
    case OpKind::kIndexSelect: {
      a.set("axis", p[size_t(n.attrs.get_int("axis"))]);
      std::vector<ValueId> ins = n.inputs;
      ins[0] = v;
      replace_permuted(g, at, n.op, ins, a, std::vector<Perm>(n.outputs.size(), p));
      return true;
    }
    case OpKind::kPad: {
      if (n.attrs.has("input_perm")) return false;
      const auto& pads = n.attrs.get_ints("pads");
      std::vector<int64_t> moved(pads.size());
      for (size_t i = 0; i < p.size(); ++i) {
        moved[2 * size_t(p[i])] = pads[2 * i];
        moved[2 * size_t(p[i]) + 1] = pads[2 * i + 1];
      }
      a.set("pads", moved);
      replace_permuted(g, at, n.op, {v}, a, {p});
      return true;
    }
    case OpKind::kExpand: {
      const auto& shape = n.attrs.get_ints("shape");
      Shape moved(shape.size());
      for (size_t i = 0; i < p.size(); ++i) moved[size_t(p[i])] = shape[i];
      a.set("shape", moved);
      replace_permuted(g, at, n.op, {v}, a, {p});
      return true;
    }
    case OpKind::kReshape: {
      const Shape vs = g.type(v).shape(), s = g.type(n.outputs[0]).shape();
      if (const auto r = reshape_through(vs, p, s)) {
        a.set("shape", r->first);
        replace_permuted(g, at, n.op, {v}, a, {r->second});
        return true;
      }
      // The block reorder is a copy in place of the permute, which must then go: only for a
      // permute read by this reshape alone, of a v no permute makes (else they would fold), and
      // that does more than the reorder (else it is the reorder already).
      const auto q = reorder_blocks(vs, p, s);
      if (!q || *q == p || g.num_uses(n.inputs[0]) != 1 || permute_of(g, v) != nullptr) {
        // Rows of v that the permute and the reshape keep whole: one gather of them, and a
        // permute that moves on (read by this reshape alone, so that the permute goes).
        const bool one_reader = g.num_uses(n.inputs[0]) == 1, fixed = all_static(g.type(v));
        const auto rows = row_gathers && one_reader && fixed ? rows_through(vs, p, s, g.type(v).dtype) : std::nullopt;
        if (!rows) return false;
        const ValueId z = insert_row_gather(g, at, v, rows->gather, n.name);
        a.set("shape", rows->z);
        replace_permuted(g, at, OpKind::kReshape, {z}, a, {rows->perm});
        return true;
      }
      Shape ws(vs.size());
      Perm rest(p.size()), inv_q = inverse(*q);
      for (size_t d = 0; d < vs.size(); ++d) ws[d] = vs[size_t((*q)[d])];
      for (size_t i = 0; i < p.size(); ++i) rest[i] = inv_q[size_t(p[i])];
      const auto r = reshape_through(ws, rest, s);
      KILN_CHECK(r.has_value(), kInternal, "reorder_blocks left a reshape that cannot move past its permute");
      Attrs reorder;
      reorder.set("perm", *q);
      const ValueId w = g.insert_node(at++, OpKind::kPermute, {v}, reorder, n.name)[0];
      a.set("shape", r->first);
      replace_permuted(g, at, OpKind::kReshape, {w}, a, {r->second});
      return true;
    }
    case OpKind::kReduceSum:
    case OpKind::kReduceMean:
    case OpKind::kReduceMax:
    case OpKind::kReduceMin:
    case OpKind::kReduceVar: {
      const std::vector<int64_t> axes = n.attrs.get_ints("axes", {});
      if (axes.empty()) return false;  // every dim: the result has no order to keep
      std::vector<char> reduced(p.size(), 0);
      std::vector<int64_t> moved;
      for (int64_t x : axes) {
        moved.push_back(p[size_t(x)]);
        reduced[size_t(p[size_t(x)])] = 1;
      }
      std::sort(moved.begin(), moved.end());
      a.set("axes", moved);
      Perm out = p;
      if (!n.attrs.get_bool("keepdim", false)) {
        std::vector<int64_t> rank_of(p.size(), -1);  // kept v dim -> its dim in the result
        int64_t k = 0;
        for (size_t d = 0; d < p.size(); ++d)
          if (!reduced[d]) rank_of[d] = k++;
        out.clear();
        for (int64_t d : p)
          if (!reduced[size_t(d)]) out.push_back(rank_of[size_t(d)]);
      }
      replace_permuted(g, at, n.op, {v}, a, {out});
      return true;
    }
    default: return false;
  }
}

bool permute_to_reshape(Graph& g, size_t pos) {
  const Node& n = *g.nodes()[pos];
  if (n.op != OpKind::kPermute || is_graph_output(g, n.outputs[0])) return false;
  if (!keeps_order(g.type(n.inputs[0]).shape(), perm_of(n))) return false;
  Attrs a;
  a.set("shape", g.type(n.outputs[0]).shape());
  replace_node(g, pos, OpKind::kReshape, {n.inputs[0]}, a);
  return true;
}

int64_t moved_bytes(const Graph& g) {
  int64_t bytes = 0;
  for (const auto& n : g.nodes())
    if ((n->op == OpKind::kPermute || n->op == OpKind::kIndexSelect) && !g.value(n->inputs[0]).is_constant())
      bytes += int64_t(g.type(n->outputs[0]).nbytes());
  return bytes;
}

}  // namespace kiln::passes
