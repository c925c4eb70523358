// fuse_pointwise: groups connected pointwise ops (unary, binary, where, cast) of one shape into
// fused_pointwise nodes, so that a chain like add -> mul -> gelu reads its inputs once and
// writes its results once instead of materializing every intermediate.
//
// A nearest or bilinear upsample (index_select by a constant index, then a few pointwise ops)
// or a lookup of a position-bias table joins the group of the ops that read it the same way:
// the index_select is a member that starts a group (it never joins its data's producer).
//
// Grouping is greedy in topological order. A pointwise node joins (and merges) the groups of
// its pointwise producers that have its output shape, provided no member of those groups has a
// user outside the group that comes before the node: the fused node takes the position of its
// last member, so every outside user of a member must come after it. This keeps the plan
// topologically ordered without any reordering. A producer group of a smaller shape that
// broadcasts to the node's (a per-channel gate scaling a feature map: hardsigmoid(s) * x) joins
// too when it has at most kMaxRecomputed ops, all read only inside the new group: the fused
// kernel recomputes those few ops for every element, which costs less than a launch of their own.
//
// The fused node's contract (what the fused kernels rely on):
//   - body inputs map one to one to the node's inputs, with the same types (or, once
//     fold_input_views gave the node a view of an input, "view<i>", the view's type); body
//     outputs map one to one to the node's outputs;
//   - body nodes are only unary / binary / where / cast, and index_select nodes whose data and
//     index are both body inputs (the index a constant 1-D integer tensor of the graph: a
//     gathered leaf, read element by element from the data at the kernel's own positions),
//     each possibly read by one reshape alone (the gather seen in that shape);
//     every body node's output has a shape that broadcasts to the group shape, and every body
//     output has the group shape; an input read by pointwise ops may have any shape that
//     broadcasts to it, one read only by index_select any shape;
//   - scalar constants (one element, not weights) are copied into the body; any other constant
//     is an input;
//   - a member whose value is used outside the group, or is a graph output, is a body output;
//   - after fuse_pointwise_concats (pointwise_concats.cpp), a body's one output may be a concat
//     of parts, each computed from its own inputs in the part's shape (pw::concat_body).
//
// Does not: fuse a group of a single op (nothing to save), fuse across shapes beyond the
// recomputed gates above (a [C] chain that is also read elsewhere, or longer than
// kMaxRecomputed, stays a group of its own), fuse reductions or other non-pointwise epilogues,
// or look inside existing fused nodes.
#include <algorithm>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "kiln/errors.h"
#include "kiln/passes.h"
#include "src/ops/shape_rules.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

// Disjoint sets over node indices, each set one candidate group.
struct Groups {
  std::vector<int> parent;
  explicit Groups(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  int find(int i) {
    while (parent[size_t(i)] != i) i = parent[size_t(i)] = parent[size_t(parent[size_t(i)])];
    return i;
  }
};

using passes::is_graph_output;

constexpr size_t kMaxRecomputed = 4;

// Whether a group of another shape than node `i`'s (`shape`) can join it, recomputed for every
// element of `shape`: a few ops whose outputs broadcast to `shape`, are read only by the group
// itself or by node i, and are no graph output.
bool recomputable(const Graph& g, const std::vector<std::vector<int>>& users, const std::vector<int>& group, int i,
                  const std::vector<int64_t>& shape) {
  if (group.size() > kMaxRecomputed) return false;
  for (int m : group)
    for (ValueId out : g.nodes()[size_t(m)]->outputs) {
      if (!broadcasts_to(g.type(out).shape(), shape) || is_graph_output(g, out)) return false;
      for (int u : users[size_t(out)])
        if (u != i && std::find(group.begin(), group.end(), u) == group.end()) return false;
    }
  return true;
}

// An index_select by a constant 1-D index: a fused kernel reads its elements straight from the
// data tensor (a gathered leaf), so upsampling and table lookups need no tensor of their own.
bool gathered_leaf(const Graph& g, const Node& n) {
  if (n.op != OpKind::kIndexSelect || n.inputs.size() != 2) return false;
  const Value& index = g.value(n.inputs[1]);
  return index.is_constant() && index.type.rank() == 1 &&
         (index.type.dtype == DType::kI64 || index.type.dtype == DType::kI32);
}

// A reshape that alone reads a gathered leaf (an upsample of flattened H * W, viewed as [H, W]):
// the fused kernel reads the gather in the reshape's shape, the same elements in the same order.
bool reshaped_gather(const Graph& g, const Node& n) {
  if (n.op != OpKind::kReshape) return false;
  const Node* p = g.value(n.inputs[0]).producer;
  return p != nullptr && gathered_leaf(g, *p) && g.num_uses(n.inputs[0]) == 1;
}

// Whether a member of `a` is an index_select whose data a member of `b` produces.
bool gathers_from(const Graph& g, const std::unordered_map<const Node*, int>& index, const std::vector<int>& a,
                  const std::vector<int>& b) {
  for (int m : a) {
    const Node& n = *g.nodes()[size_t(m)];
    if (n.op != OpKind::kIndexSelect || g.value(n.inputs[0]).producer == nullptr) continue;
    const int p = index.at(g.value(n.inputs[0]).producer);
    if (std::find(b.begin(), b.end(), p) != b.end()) return true;
  }
  return false;
}

// Node indices of each group with at least two members, in topological order.
std::vector<std::vector<int>> find_groups(const Graph& g) {
  const auto& nodes = g.nodes();
  const auto users = g.users();
  std::unordered_map<const Node*, int> index;
  for (size_t i = 0; i < nodes.size(); ++i) index[nodes[i].get()] = int(i);

  Groups sets(nodes.size());
  std::vector<std::vector<int>> members(nodes.size());  // valid at each set's root
  std::vector<char> pointwise(nodes.size(), 0);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = *nodes[i];
    pointwise[i] = op_info(n.op).pointwise() || gathered_leaf(g, n) || reshaped_gather(g, n);
    if (!pointwise[i]) continue;
    members[i] = {int(i)};
    const std::vector<int64_t> shape = g.type(n.outputs[0]).shape();
    if (n.op == OpKind::kIndexSelect) continue;  // reads its data whole: it joins no producer's group
    if (n.op == OpKind::kReshape) {  // joins the gather it reshapes, and nothing else
      const int root = sets.find(index.at(g.value(n.inputs[0]).producer));
      members[i].insert(members[i].end(), members[size_t(root)].begin(), members[size_t(root)].end());
      members[size_t(root)].clear();
      sets.parent[size_t(root)] = int(i);
      std::sort(members[i].begin(), members[i].end());
      continue;
    }

    std::vector<int> join;  // roots of the groups this node merges with
    for (ValueId in : n.inputs) {
      if (in == kNoValue || g.value(in).producer == nullptr) continue;
      const int p = index.at(g.value(in).producer);
      if (!pointwise[size_t(p)]) continue;
      const int root = sets.find(p);
      if (std::find(join.begin(), join.end(), root) != join.end()) continue;
      if (g.type(in).shape() != shape && !recomputable(g, users, members[size_t(root)], int(i), shape)) continue;
      // Every user of a member that is neither a member nor this node must come after it.
      bool ok = true;
      for (int m : members[size_t(root)]) {
        for (ValueId out : nodes[size_t(m)]->outputs)
          for (int u : users[size_t(out)]) ok = ok && (u >= int(i) || sets.find(u) == root);
        if (!ok) break;
      }
      // A gathered leaf reads its data from outside the kernel: never with that data's producer.
      std::vector<int> joined = {int(i)};
      for (int r : join) joined.insert(joined.end(), members[size_t(r)].begin(), members[size_t(r)].end());
      ok = ok && !gathers_from(g, index, joined, members[size_t(root)]) &&
           !gathers_from(g, index, members[size_t(root)], joined);
      if (ok) join.push_back(root);
    }
    for (int root : join) {
      auto& mine = members[i];
      mine.insert(mine.end(), members[size_t(root)].begin(), members[size_t(root)].end());
      members[size_t(root)].clear();
      sets.parent[size_t(root)] = int(i);
    }
    std::sort(members[i].begin(), members[i].end());
  }

  std::vector<std::vector<int>> groups;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (pointwise[i] && sets.find(int(i)) == int(i) && members[i].size() >= 2) groups.push_back(members[i]);
  return groups;
}

// Replaces the group (nodes given by pointer, in topological order) by one fused node.
void fuse(Graph& g, const std::vector<const Node*>& group) {
  std::unordered_set<const Node*> in_group(group.begin(), group.end());
  auto body = std::make_shared<Graph>();
  std::unordered_map<ValueId, ValueId> to_body;
  std::vector<ValueId> node_inputs;
  std::string name;

  for (const Node* n : group) {
    std::vector<ValueId> ins;
    for (ValueId in : n->inputs) {
      auto it = to_body.find(in);
      if (it != to_body.end()) {
        ins.push_back(it->second);
        continue;
      }
      const Value& v = g.value(in);
      ValueId b;
      if (v.is_constant() && !v.is_weight && v.type.numel() == 1 && n->op != OpKind::kIndexSelect) {
        b = body->add_constant("", v.type, v.data);
      } else {
        b = body->add_input("in" + std::to_string(node_inputs.size()), v.type);
        node_inputs.push_back(in);
      }
      to_body[in] = b;
      ins.push_back(b);
    }
    auto outs = body->add_node(n->op, ins, n->attrs, n->name);
    for (size_t k = 0; k < outs.size(); ++k) to_body[n->outputs[k]] = outs[k];
    if (!n->name.empty()) name += (name.empty() ? "" : "+") + n->name;
  }

  // Body outputs: member values read outside the group or returned by the graph.
  std::vector<ValueId> escaping;
  const auto users = g.users();
  for (const Node* n : group)
    for (ValueId out : n->outputs) {
      bool outside = is_graph_output(g, out);
      for (int u : users[size_t(out)]) outside |= in_group.count(g.nodes()[size_t(u)].get()) == 0;
      if (outside) escaping.push_back(out);
    }
  if (escaping.empty()) return;  // a dead group: left to eliminate_dead_code
  for (size_t k = 0; k < escaping.size(); ++k) body->mark_output(to_body.at(escaping[k]), "out" + std::to_string(k));

  size_t last = 0;
  while (last < g.nodes().size() && g.nodes()[last].get() != group.back()) ++last;
  KILN_CHECK(last < g.nodes().size(), kInternal, "fuse_pointwise: a group's last node is not in the graph");
  const std::vector<ValueId> fused = g.insert_fused(last + 1, node_inputs, std::move(body), name);
  for (size_t k = 0; k < escaping.size(); ++k) g.replace_all_uses(escaping[k], fused[k]);
  for (size_t i = last + 1; i-- > 0;)
    if (in_group.count(g.nodes()[i].get())) g.erase_node(i);
}

}  // namespace

bool fuse_pointwise(Graph& g) {
  const auto groups = find_groups(g);
  if (groups.empty()) return false;
  // Resolve indices to nodes first: each rewrite shifts the indices of the nodes after it.
  std::vector<std::vector<const Node*>> by_node;
  for (const auto& grp : groups) {
    by_node.emplace_back();
    for (int i : grp) by_node.back().push_back(g.nodes()[size_t(i)].get());
  }
  for (const auto& grp : by_node) fuse(g, grp);
  g.compact();
  return true;
}

}  // namespace kiln
