// interleave_concats: a permute that moves the part axis of a concat's output becomes a concat
// that writes the parts interleaved.
//
// ShuffleNet's channel shuffle is cat([a, b], C) -> view [.., 2, C/2] -> transpose -> view
// back: on channels-last tensors (to_channels_last), a concat into [N, H, W, C], a reshape to
// [N, H, W, 2, C/2] and a permute to [N, H, W, C/2, 2], two kernels and a pass over the result
// between them. When the reshape only splits the concat axis into (parts, part size) and the
// permute only moves that parts dim (the other dims keep their order), the result is a concat of
// the parts, each reshaped to a dim of 1 where the parts dim lands, along that dim:
//
//   permute(reshape(concat(p_0 .. p_m-1) {axis k}), P) -> concat(reshape(p_0) .. reshape(p_m-1)) {axis j}
//
// with j the position of the parts dim in P. The reshapes are free, the concat copies each part
// once into its interleaved places. Does not: take parts of unequal extents, a concat or reshape
// that something else reads too, or a permute that also reorders other dims.
#include <vector>

#include "kiln/passes.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

bool rewrite(Graph& g, size_t pos) {
  const Node& n = *g.nodes()[pos];
  // (A permute nothing reads is the one an earlier rewrite replaced.)
  if (n.op != OpKind::kPermute || (g.num_uses(n.outputs[0]) == 0 && !passes::is_graph_output(g, n.outputs[0])))
    return false;
  const Node* r = g.value(n.inputs[0]).producer;
  if (r == nullptr || r->op != OpKind::kReshape || !passes::read_once(g, r->outputs[0])) return false;
  const Node* c = g.value(r->inputs[0]).producer;
  if (c == nullptr || c->op != OpKind::kConcat || c->inputs.size() < 2 || !passes::read_once(g, c->outputs[0]))
    return false;
  const TensorType& ct = g.type(c->outputs[0]);
  const TensorType& rt = g.type(r->outputs[0]);
  if (!passes::all_static(ct)) return false;
  const auto k = size_t(c->attrs.get_int("axis"));
  const auto parts = int64_t(c->inputs.size());
  const int64_t part = g.type(c->inputs[0]).dims[k].extent;
  for (ValueId in : c->inputs)
    if (g.type(in).dims[k].extent != part) return false;
  // The reshape splits axis k into [parts, part] and keeps every other dim.
  std::vector<int64_t> split = ct.shape();
  split[k] = part;
  split.insert(split.begin() + int64_t(k), parts);
  if (rt.shape() != split) return false;
  // The permute moves the parts dim only.
  const passes::Perm p = passes::perm_of(n);
  size_t j = 0;
  int64_t last = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == int64_t(k)) {
      j = i;
      continue;
    }
    if (p[i] < last) return false;
    last = p[i];
  }
  std::vector<int64_t> piece = g.type(n.outputs[0]).shape();
  piece[j] = 1;
  const std::vector<ValueId> ins = c->inputs;
  const ValueId out = n.outputs[0];
  passes::NodeInserter at{g, pos, n.name};
  std::vector<ValueId> pieces;
  for (ValueId in : ins) pieces.push_back(at.reshape(in, piece));
  Attrs a;
  a.set("axis", int64_t(j));
  g.replace_all_uses(out, at.node(OpKind::kConcat, pieces, a));
  return true;
}

}  // namespace

bool interleave_concats(Graph& g) { return passes::rewrite_each(g, rewrite); }

}  // namespace kiln
