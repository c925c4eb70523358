// form_attention: attention written out as ops becomes one sdpa node, so that every model's
// attention takes the same path (fused kernels, operand views, masks) as
// scaled_dot_product_attention does.
//
//   matmul(softmax(chain(matmul(q', k_t)), last axis), v)  ->  sdpa(q, k, v, bias) {scale}
//
// where the chain between the scores and the softmax is any sequence of
//   - add(x, b): an additive bias (relative positions in Swin and MaxViT, T5's position bias, a
//     shifted window's mask); several are summed;
//   - mul / div of x by a single-element constant: folded into the scale; mul by a value whose
//     last two dims are 1 (Swin V2's per-head logit scale): q is multiplied by it instead;
//   - a reshape that keeps the last two dims (Swin splits the batch into windows to add the
//     shift mask and merges it again): the bias so far is expanded to the scores' shape and
//     reshaped the same way (Value::sized where the scores are), q and k are reshaped to the
//     final batch dims.
// q' = mul(q, c) with a single-element constant c (Swin scales q before the product) is q with c
// in the scale, also through the reshapes and permutes after the mul, and so is such a scale of k
// (MaxViT scales k after its head split). k_t is k with its last two dims swapped: the input of
// such a permute, else a permute of k_t is inserted (fold_attention_layout can then read it as a
// view).
//
// Does: rewrite when every value of the chain, the scores and the softmax has no other use and
// is no graph output, q, k and v have the scores' rank, the bias has q's dtype and broadcasts to
// the scores. Does not: match a softmax over another axis, a chain with other ops (a dropout, a
// cast to f32 and back), or scores read twice; change the order in which the bias terms are
// added (they are summed first, then added to the scaled scores, exactly once each).
#include <algorithm>

#include "kiln/errors.h"
#include "kiln/passes.h"
#include "src/ops/shape_rules.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

using passes::Perm;
using Shape = std::vector<int64_t>;
constexpr size_t kMaxChain = 8;

const Node* producer(const Graph& g, ValueId v) { return v == kNoValue ? nullptr : g.value(v).producer; }

bool one_element_constant(const Graph& g, ValueId v) { return passes::floating_scalar(g, v).has_value(); }

double constant_value(const Graph& g, ValueId v) { return passes::constant_as_doubles(g, v)[0]; }

bool same_last_two(const Shape& a, const Shape& b) {
  return a.size() >= 2 && b.size() >= 2 && a[a.size() - 1] == b[b.size() - 1] && a[a.size() - 2] == b[b.size() - 2];
}

Shape with_last_two(const Shape& batch_from, const Shape& last_from) {
  Shape s(batch_from.begin(), batch_from.end() - 2);
  s.push_back(last_from[last_from.size() - 2]);
  s.push_back(last_from[last_from.size() - 1]);
  return s;
}

// mul(x, c) by a single-element constant that makes v through single-use reshapes and permutes
// (a scale commutes with them), else null.
const Node* scale_of(const Graph& g, ValueId v) {
  for (size_t i = 0; i <= kMaxChain; ++i) {
    const Node* n = producer(g, v);
    if (n == nullptr || !passes::read_once(g, v)) return nullptr;
    if (n->op == OpKind::kMul && one_element_constant(g, n->inputs[1])) return n;
    if (n->op != OpKind::kPermute && n->op != OpKind::kReshape) return nullptr;
    v = n->inputs[0];
  }
  return nullptr;
}

// The operand of a chain add that carries the scores: of the add's shape, used once, and made by
// a matmul, else by another chain op (the other operand is the bias); kNoValue when neither is.
ValueId scores_operand(const Graph& g, const Node& add) {
  ValueId best = kNoValue;
  int rank = 0;
  for (ValueId in : add.inputs) {
    const Node* n = producer(g, in);
    if (n == nullptr || g.type(in).shape() != g.type(add.outputs[0]).shape() || !passes::read_once(g, in)) continue;
    const int r = n->op == OpKind::kMatmul ? 2
                  : n->op == OpKind::kAdd || n->op == OpKind::kMul || n->op == OpKind::kDiv || n->op == OpKind::kReshape
                      ? 1
                      : 0;
    if (r > rank) best = in, rank = r;
  }
  return best;
}

// mul(scores, m) with m constant along the scores' last two dims (their extents 1 in m): a scale
// per batch element or head (Swin V2's learned logit scale), which multiplies q instead.
bool per_head_scale(const Graph& g, const Node& n) {
  if (n.op != OpKind::kMul) return false;
  const Shape m = g.type(n.inputs[1]).shape(), x = g.type(n.inputs[0]).shape();
  return m.size() >= 2 && m.size() <= x.size() && m[m.size() - 1] == 1 && m[m.size() - 2] == 1 && broadcasts_to(m, x) &&
         g.type(n.inputs[1]).dtype == g.type(n.inputs[0]).dtype;
}

// The rewrite of the matmul at `pos` (reading the softmax), if it matches.
bool form_at(Graph& g, size_t pos) {
  const Node& pv = *g.nodes()[pos];
  if (pv.op != OpKind::kMatmul) return false;
  const ValueId p = pv.inputs[0], v = pv.inputs[1];
  const Node* sm = producer(g, p);
  const int64_t rank = g.type(p).rank();
  if (sm == nullptr || sm->op != OpKind::kSoftmax || rank < 3 || !passes::read_once(g, p) ||
      sm->attrs.get_int("axis") != rank - 1 || g.type(v).rank() != rank)
    return false;
  // The chain from the scores to the softmax, walked back.
  std::vector<const Node*> chain;
  ValueId x = sm->inputs[0];
  const Node* qk = nullptr;
  while (chain.size() <= kMaxChain) {
    const Node* n = producer(g, x);
    if (n == nullptr || !passes::read_once(g, x)) return false;
    if (n->op == OpKind::kMatmul) {
      qk = n;
      break;
    }
    const bool scalar_op = (n->op == OpKind::kMul || n->op == OpKind::kDiv) && one_element_constant(g, n->inputs[1]);
    const bool reshape = n->op == OpKind::kReshape && same_last_two(g.type(n->inputs[0]).shape(), g.type(x).shape());
    if (n->op != OpKind::kAdd && !scalar_op && !reshape && !per_head_scale(g, *n)) return false;
    chain.push_back(n);
    x = n->op == OpKind::kAdd ? scores_operand(g, *n) : n->inputs[0];
    if (x == kNoValue) return false;
  }
  if (qk == nullptr || g.type(qk->outputs[0]).rank() != rank) return false;
  std::reverse(chain.begin(), chain.end());

  ValueId q = qk->inputs[0], kt = qk->inputs[1];
  const DType dt = g.type(q).dtype;
  if (!is_floating(dt) || g.type(q).rank() != rank || g.type(kt).rank() != rank || g.type(v).dtype != dt) return false;
  const Node* q_scale = scale_of(g, q);
  const Node* k_scale = scale_of(g, kt);

  // Check every step before inserting anything: each bias has q's dtype and broadcasts to the
  // scores where it is added; after a batch reshape, q and k hold the same batch elements.
  {
    Shape shape = g.type(qk->outputs[0]).shape();
    ValueId carried = qk->outputs[0];
    bool after_reshape = false;
    for (const Node* n : chain) {
      if (n->op == OpKind::kReshape) shape = g.type(n->outputs[0]).shape(), after_reshape = true;
      if (per_head_scale(g, *n) && !one_element_constant(g, n->inputs[1]) && after_reshape) return false;
      if (n->op == OpKind::kAdd) {
        const ValueId b = n->inputs[0] == carried ? n->inputs[1] : n->inputs[0];
        if (g.type(b).dtype != dt || !broadcasts_to(g.type(b).shape(), shape)) return false;
      }
      carried = n->outputs[0];
    }
    const auto batch = [](const Shape& s) {
      int64_t n = 1;
      for (size_t i = 0; i + 2 < s.size(); ++i) n *= s[i];
      return n;
    };
    if (batch(shape) != batch(g.type(q).shape()) || batch(shape) != batch(g.type(kt).shape())) {
      for (const Node* n : chain)
        if (n->op == OpKind::kReshape) return false;
    }
  }

  // The operands' scales go into the scale: their views read what the mul read.
  double scale = 1.0;
  for (const Node* m : {q_scale, k_scale}) {
    if (m == nullptr) continue;
    scale *= constant_value(g, m->inputs[1]);
    const ValueId scaled = m->outputs[0], unscaled = m->inputs[0];
    g.replace_all_uses(scaled, unscaled);
    q = q == scaled ? unscaled : q;
    kt = kt == scaled ? unscaled : kt;
  }
  // Replay the chain: the scale, the summed bias and the scores' shape after each step.
  passes::NodeInserter at{g, pos, pv.name};
  ValueId bias = kNoValue;
  Shape shape = g.type(qk->outputs[0]).shape();
  ValueId carried = qk->outputs[0];
  bool reshaped = false;
  for (const Node* n : chain) {
    if (n->op == OpKind::kReshape) {
      const Shape next = g.type(n->outputs[0]).shape();
      if (bias != kNoValue) {
        const ValueId expanded = at.expand(bias, shape);
        bias = at.reshape(expanded, next);
        // Shaped as the scores: sized where they are (a dynamic program's batch), so that
        // fold_constants leaves the expanded bias a node rather than a constant of one batch.
        if (g.value(carried).sized)
          for (const ValueId v : {expanded, bias})
            if (!g.value(v).is_constant()) g.value(v).sized = true;
      }
      shape = next;
      reshaped = true;
    } else if (n->op == OpKind::kAdd) {
      const ValueId b = n->inputs[0] == carried ? n->inputs[1] : n->inputs[0];
      bias = bias == kNoValue ? b : at.node(OpKind::kAdd, {bias, b});
    } else if (!one_element_constant(g, n->inputs[1])) {  // a per-head scale: q carries it
      q = at.node(OpKind::kMul, {q, n->inputs[1]});
      if (bias != kNoValue) bias = at.node(OpKind::kMul, {bias, n->inputs[1]});
    } else {
      const double c = constant_value(g, n->inputs[1]);
      scale = n->op == OpKind::kMul ? scale * c : scale / c;
      if (bias != kNoValue) bias = at.node(n->op, {bias, n->inputs[1]});
    }
    carried = n->outputs[0];
  }
  // k: the input of a permute swapping the last two dims of k_t, else that permute.
  Perm last_two(static_cast<size_t>(rank));
  for (int64_t i = 0; i < rank; ++i) last_two[size_t(i)] = i;
  std::swap(last_two[size_t(rank - 1)], last_two[size_t(rank - 2)]);
  ValueId k;
  if (const Node* t = passes::permute_of(g, kt); t != nullptr && passes::perm_of(*t) == last_two) {
    k = t->inputs[0];
  } else {
    Attrs a;
    a.set("perm", last_two);
    k = at.node(OpKind::kPermute, {kt}, a);
  }
  if (reshaped) {  // q and k follow the scores' batch split / merge
    q = at.reshape(q, with_last_two(shape, g.type(q).shape()));
    k = at.reshape(k, with_last_two(shape, g.type(k).shape()));
  }
  Attrs a;
  a.set("scale", scale);
  std::vector<ValueId> ins{q, k, v};
  if (bias != kNoValue) ins.push_back(bias);
  const ValueId out = pv.outputs[0];
  const ValueId attention = at.node(OpKind::kSdpa, ins, a);
  g.replace_all_uses(out, attention);
  g.erase_node(at.pos);
  return true;
}

}  // namespace

bool form_attention(Graph& g) { return passes::rewrite_each(g, form_at); }

}  // namespace kiln
