// gather_concats: a concat of slices of one tensor becomes one index_select of it.
//
// RoPE's rotate_half, cat(-x[..., d/2:], x[..., :d/2]), reaches the IR as two slices, a neg and
// a concat: four kernels, each a pass over the data, in every attention block. Rewrite, for a
// concat along axis A whose every input is slice(X) {axis A} or neg(slice(X) {axis A}) of one X
// (slices of slices of X along A are read through to X):
//
//   concat(...) -> index_select(X, idx) {axis A}             with idx the positions read
//               -> mul(index_select(X, idx), sign)           when some input is negated
//
// sign holds -1 where a negated slice lands and 1 elsewhere, shaped to broadcast along A. The
// index and the sign are constants, so fuse_pointwise makes the index_select a gathered leaf of
// the kernel that reads it (the rotary multiply-add): the four kernels become none. A concat that
// reads X whole and in order, unnegated, is X itself.
//
// Does not: take negated slices of a non-floating dtype, or a concat with a single input.
#include <string>
#include <vector>

#include "kiln/passes.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

// Where the part `v` of a concat along `axis` reads: its source X (through slices along the
// axis), the positions along the axis it reads in order, and whether it is negated. False when
// it is no such part.
bool read_positions(const Graph& g, ValueId v, int64_t axis, ValueId* source, std::vector<int64_t>* positions,
                    bool* negated) {
  const Node* p = g.value(v).producer;
  *negated = p != nullptr && p->op == OpKind::kNeg;
  if (*negated) p = g.value(p->inputs[0]).producer;
  if (p == nullptr || p->op != OpKind::kSlice || p->attrs.get_int("axis") != axis) return false;
  // Compose the slices along the axis, innermost last: position k of the outer slice is
  // start + k * step of the one it reads.
  const int64_t n = g.type(v).dims[size_t(axis)].extent;
  positions->resize(size_t(n));
  for (int64_t k = 0; k < n; ++k) (*positions)[size_t(k)] = k;
  ValueId x = v;
  while (p != nullptr && p->op == OpKind::kSlice && p->attrs.get_int("axis") == axis) {
    const int64_t start = p->attrs.get_int("start"), step = p->attrs.get_int("step");
    for (int64_t& k : *positions) k = start + k * step;
    x = p->inputs[0];
    p = g.value(x).producer;
  }
  *source = x;
  return true;
}

bool rewrite(Graph& g, size_t pos) {
  const Node& c = *g.nodes()[pos];
  if (c.op != OpKind::kConcat || c.inputs.size() < 2 || g.num_uses(c.outputs[0]) == 0) return false;
  const int64_t axis = c.attrs.get_int("axis");
  ValueId x = kNoValue;
  std::vector<int64_t> index;
  std::vector<bool> negated;
  for (ValueId part : c.inputs) {
    ValueId source = kNoValue;
    std::vector<int64_t> at;
    bool neg = false;
    if (!read_positions(g, part, axis, &source, &at, &neg) || (x != kNoValue && source != x)) return false;
    x = source;
    index.insert(index.end(), at.begin(), at.end());
    negated.insert(negated.end(), at.size(), neg);
  }
  const ValueId out = c.outputs[0];
  const DType dt = g.type(out).dtype;
  if (g.type(x).dtype != dt) return false;
  bool any_negated = false, whole = g.type(x).dims[size_t(axis)].extent == int64_t(index.size());
  for (size_t k = 0; k < index.size(); ++k) {
    any_negated = any_negated || negated[k];
    whole = whole && index[k] == int64_t(k);
  }
  if (any_negated && !is_floating(dt)) return false;  // the sign is a multiply by -1.0
  if (whole && !any_negated) {
    if (passes::is_graph_output(g, out)) return false;
    g.replace_all_uses(out, x);
    return true;
  }
  const std::string name = c.name;
  passes::NodeInserter at{g, pos, name};
  const ValueId idx = g.add_constant(passes::derived_constant_name(g, "gather_concats.index"),
                                     TensorType(DType::kI64, {int64_t(index.size())}), index.data(),
                                     index.size() * sizeof(int64_t), false);
  Attrs a;
  a.set("axis", axis);
  ValueId y = at.node(OpKind::kIndexSelect, {x, idx}, a);
  if (any_negated) {
    std::vector<double> sign(index.size());
    for (size_t k = 0; k < sign.size(); ++k) sign[k] = negated[k] ? -1.0 : 1.0;
    std::vector<int64_t> shape(size_t(g.type(out).rank()), 1);
    shape[size_t(axis)] = int64_t(sign.size());
    const ValueId s = g.add_constant(passes::derived_constant_name(g, "gather_concats.sign"), TensorType(dt, shape),
                                     passes::bytes_from_doubles(dt, sign));
    y = at.node(OpKind::kMul, {y, s});
  }
  g.replace_all_uses(out, y);
  return true;
}

}  // namespace

bool gather_concats(Graph& g) { return passes::rewrite_each(g, rewrite); }

}  // namespace kiln
