// fuse_epilogue: folds the add and activation that follow a linear or conv into the op's own
// epilogue (src/ops/epilogue.h), y = act(x @ w^T + bias + residual), so a GEMM backend (the CPU
// sgemm, cuBLASLt, cuDNN) applies them while the result is still in registers.
//
// Rewrites, for P a linear or conv whose output y has exactly one use (no other node, not a
// graph output) and whose activation is "none":
//   add(y, c) / add(c, y), P without bias, c broadcasting as a bias (linear: [..1.., N];
//       conv: [..1.., O, 1..1] with O on the output's channel axis, [..1.., O] for a channels-last
//       conv; or a constant scalar)
//       -> P(x, w, c') with c' = c as [N] / [O] through a reshape (and, for a scalar, an
//       expand) node; run fold_constants after this pass to make a constant c' a constant;
//   add(y, r) / add(r, y), P without residual, r of exactly y's shape and dtype
//       -> P(x, w, bias, r). r cannot depend on y: y's one use is this add;
//   add(v, r) / add(r, v), v = y through reshapes (or permutes moving only size-1 dims), each
//       used once, r of the add's shape -> reshape(P(x, w, bias, reshape(r))), since the views
//       keep the element order;
//   add(y, r) / add(r, y), P with residual z = P2(...) (z used only there, neither with an
//       activation, P2 without residual), r existing before P2 -> P(..., P2(..., r)): the sum
//       reassociated, (P + z) + r as P + (P2 + r) (GPT-NeoX's parallel residual);
//   relu / gelu (approximate none or tanh) / silu / sigmoid / tanh / hardswish / hardsigmoid /
//       clamp to [0, hi] (ReLU6) or [0, inf) of y, or of y through reshapes and permutes each
//       read once (SegFormer's GELU after its depthwise conv, flattened back to tokens)
//       -> P with that activation (after which P takes no further add: the add would come
//       after the activation), unless fuse_pointwise follows and the activation's one use is
//       a pointwise op (a squeeze-excitation gate hardsigmoid(conv(s)) * x, SwiGLU's
//       silu(gate) * up), which fuse_pointwise then computes inside that op's kernel. An
//       activation that stays out this way fuses in a later sweep if its use becomes an
//       epilogue input (the pointwise op itself fused as a residual). The same activations
//       also fold into a layer_norm or group_norm of f32 / f16 / bf16 under the same rules
//       (a UNet's group norm + SiLU), whose kernels apply them as they write.
// The add's output must have y's type (an add that broadcasts y to a larger shape stays). The
// sweep runs in topological order, so chains (conv -> add bias -> add skip -> relu) fuse in one
// pass; it repeats until nothing changes. Values that lose their uses are dropped (compact).
// Does not: fuse into conv_transpose or matmul, fuse a second bias into a biased op (even
// when both are constants), look inside fused_pointwise nodes (run this pass before
// fuse_pointwise), or fuse an add whose other operand has another dtype.
#include <algorithm>
#include <optional>

#include "kiln/errors.h"
#include "kiln/passes.h"
#include "src/ops/epilogue.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

size_t position_of(const Graph& g, const Node* n, size_t before) {
  for (size_t p = before; p-- > 0;)
    if (g.nodes()[p].get() == n) return p;
  KILN_FAIL(kInternal, "fuse_epilogue: producer of a fused value is not before its consumer");
}

// The producer of `y` when it can take an epilogue: a linear or conv (with `activation_only`,
// also a layer / group norm of f32, f16 or bf16) with no activation yet whose output is used once.
Node* fusable_producer(const Graph& g, ValueId y, bool activation_only = false) {
  Node* p = g.value(y).producer;
  if (p == nullptr) return nullptr;
  const bool norm = (p->op == OpKind::kLayerNorm || p->op == OpKind::kGroupNorm) && g.type(y).dtype != DType::kF64;
  if (p->op != OpKind::kLinear && p->op != OpKind::kConv && !(activation_only && norm)) return nullptr;
  if (!pw::parse_activation(p->op, p->attrs).none) return nullptr;
  if (g.num_uses(y) != 1) return nullptr;
  return p;
}

// c as a [channels] bias: c itself when it has that shape, else a reshape (a scalar: reshape
// to [1] and expand) inserted before position `pos` (which advances past it). On constants,
// the fold_constants that follows this pass turns those nodes into the bias constant (the one
// place derived constants are made, so a refit re-derives them: src/passes/refit_record.h).
// Nothing when c cannot become one.
std::optional<ValueId> as_bias(Graph& g, const Node& p, ValueId c, const TensorType& out, size_t& pos) {
  const TensorType ct = g.type(c);
  const passes::ChannelForm form = passes::channel_form(p, ct, out);
  if (form == passes::ChannelForm::kNone) return std::nullopt;
  const int64_t channels = out.dims[size_t(passes::output_channel_axis(p, out.rank()))].extent;
  const std::vector<int64_t> want = {channels};
  if (ct.shape() == want) return c;
  auto insert = [&](OpKind op, ValueId in, const std::vector<int64_t>& shape) {
    Attrs a;
    a.set("shape", shape);
    return g.insert_node(pos++, op, {in}, a, p.name)[0];
  };
  if (form == passes::ChannelForm::kChannels) return insert(OpKind::kReshape, c, want);
  const ValueId one = ct.shape() == std::vector<int64_t>{1} ? c : insert(OpKind::kReshape, c, {1});
  return channels == 1 ? one : insert(OpKind::kExpand, one, want);
}

// Replaces P (at p_pos) and its consumer (at c_pos) by P with `inputs` and `attrs`, placed
// where the consumer was.
void replace_pair(Graph& g, size_t p_pos, size_t c_pos, const std::vector<ValueId>& inputs, const Attrs& attrs) {
  const Node& p = *g.nodes()[p_pos];
  const OpKind op = p.op;
  const std::string name = p.name;
  const ValueId consumer_out = g.nodes()[c_pos]->outputs[0];
  std::vector<ValueId> ins = inputs;
  while (ins.size() > 2 && ins.back() == kNoValue) ins.pop_back();
  const ValueId fused = g.insert_node(c_pos, op, ins, attrs, name)[0];
  g.replace_all_uses(consumer_out, fused);
  g.erase_node(c_pos + 1);
  g.erase_node(p_pos);
}

bool try_add(Graph& g, size_t pos, ValueId y, ValueId other) {
  Node* p = fusable_producer(g, y);
  if (p == nullptr || other == y) return false;
  const TensorType out = g.type(y);
  const TensorType& sum = g.type(g.nodes()[pos]->outputs[0]);
  if (sum.dtype != out.dtype || sum.shape() != out.shape() || g.type(other).dtype != out.dtype) return false;
  std::vector<ValueId> ins = {p->inputs[0], p->inputs[1], passes::input_or_none(*p, 2), passes::input_or_none(*p, 3)};
  const Attrs attrs = p->attrs;
  if (ins[2] == kNoValue && passes::channel_form(*p, g.type(other), out) != passes::ChannelForm::kNone) {
    std::optional<ValueId> b = as_bias(g, *p, other, out, pos);
    if (b) {
      ins[2] = *b;
      replace_pair(g, position_of(g, p, pos), pos, ins, attrs);
      return true;
    }
  }
  if (ins[3] != kNoValue || g.type(other).shape() != out.shape()) return false;
  ins[3] = other;
  replace_pair(g, position_of(g, p, pos), pos, ins, attrs);
  return true;
}

// add(v, r) where v is y viewed in its own element order (reshapes, or a permute moving only
// size-1 dims: MultiheadAttention's output on its way back to [B, S, E]) of a fusable producer's
// output y, v does not broadcast in the add, and r has the add's shape: rewritten as
// reshape(add(y, reshape(r))), the view chain dropped, and that add fused by try_add. Element
// order is kept, so the sums are the same elements; the reshapes are aliases in the memory plan.
bool try_add_through_views(Graph& g, size_t pos, ValueId v, ValueId r) {
  std::vector<const Node*> views;
  ValueId y = v;
  for (const Node* view = g.value(y).producer; view != nullptr && g.num_uses(y) == 1 &&
                                                output_reinterprets_input(*view, g);
       view = g.value(y).producer) {
    views.push_back(view);
    y = view->inputs[0];
  }
  const Node* p = views.empty() ? nullptr : fusable_producer(g, y);
  const TensorType sum = g.type(g.nodes()[pos]->outputs[0]);
  if (p == nullptr || passes::input_or_none(*p, 3) != kNoValue || g.type(r).dtype != sum.dtype ||
      g.type(r).shape() != sum.shape() || g.type(v).numel() != sum.numel() || g.type(y).dtype != sum.dtype)
    return false;
  const std::string name = g.nodes()[pos]->name;
  Attrs to_y, to_sum;
  to_y.set("shape", g.type(y).shape());
  to_sum.set("shape", sum.shape());
  const ValueId r_as_y = g.insert_node(pos, OpKind::kReshape, {r}, to_y, name)[0];
  const ValueId fused_sum = g.insert_node(pos + 1, OpKind::kAdd, {y, r_as_y}, {}, name)[0];
  const ValueId out = g.insert_node(pos + 2, OpKind::kReshape, {fused_sum}, to_sum, name)[0];
  g.replace_all_uses(g.nodes()[pos + 3]->outputs[0], out);
  g.erase_node(pos + 3);
  size_t add_pos = pos + 1;
  for (const Node* view : views) {  // each now unused; all before pos
    g.erase_node(position_of(g, view, pos));
    --add_pos;
  }
  const bool fused = try_add(g, add_pos, y, r_as_y);
  KILN_CHECK(fused, kInternal, "fuse_epilogue: a residual seen through views did not fuse at ", name);
  return true;
}

// add(y, r) / add(r, y) where y = P1(..., residual = z), z = P2(...) used only there, and P1 and
// P2 have no activation while P2 has no residual: (P1 + z) + r is computed as P1 + (P2 + r), r
// moving into P2's epilogue, when r exists before P2 runs. That is the parallel residual of
// GPT-NeoX-style blocks, mlp(x) + attn(x) + x, whose first add fused into the MLP's linear and
// left the second standalone. The sums take another order: a rounding apart in f16.
bool try_add_reassociate(Graph& g, size_t pos, ValueId y, ValueId r) {
  Node* p1 = fusable_producer(g, y);
  if (p1 == nullptr || r == y) return false;
  const ValueId z = passes::input_or_none(*p1, 3);
  Node* p2 = z == kNoValue ? nullptr : fusable_producer(g, z);
  const TensorType& sum = g.type(g.nodes()[pos]->outputs[0]);
  if (p2 == nullptr || passes::input_or_none(*p2, 3) != kNoValue || g.type(r).dtype != sum.dtype ||
      g.type(r).shape() != sum.shape() || g.type(y).shape() != sum.shape() || g.type(y).dtype != sum.dtype ||
      g.type(z).shape() != sum.shape())
    return false;
  const size_t p2_pos = position_of(g, p2, pos);
  if (const Node* made = g.value(r).producer; made != nullptr && position_of(g, made, pos) > p2_pos) return false;
  std::vector<ValueId> ins = {p2->inputs[0], p2->inputs[1], passes::input_or_none(*p2, 2), r};
  passes::replace_node(g, p2_pos, p2->op, ins, p2->attrs);  // one node for one: pos stays the add's
  g.replace_all_uses(g.nodes()[pos]->outputs[0], y);
  g.erase_node(pos);
  return true;
}

// Whether v's one use is a pointwise op (a gate scaling a feature map, SwiGLU's silu(gate) * up).
bool feeds_pointwise(const Graph& g, ValueId v) {
  if (g.num_uses(v) != 1 || passes::is_graph_output(g, v)) return false;
  for (const auto& n : g.nodes())
    if (std::find(n->inputs.begin(), n->inputs.end(), v) != n->inputs.end()) return op_info(n->op).pointwise();
  return false;
}

// act(y), or act(v) where v is y through reshapes and permutes each read once: P takes the
// activation and act's readers read v (the views of act(y) are act of the views of y, element
// for element).
bool try_activation(Graph& g, size_t pos, bool pointwise_follows) {
  const Node& k = *g.nodes()[pos];
  ValueId y = k.inputs[0];
  for (const Node* view = g.value(y).producer;
       view != nullptr && (view->op == OpKind::kReshape || view->op == OpKind::kPermute) && passes::read_once(g, y);
       view = g.value(y).producer)
    y = view->inputs[0];
  Node* p = fusable_producer(g, y, true);
  if (p == nullptr) return false;
  Attrs attrs = p->attrs;
  if (!pw::set_activation_for_unary(k.op, k.attrs, attrs)) return false;
  // Left to fuse_pointwise, which computes it inside the op it feeds: no more traffic where the
  // producer's library fuses the activation, one pass over the output fewer where it cannot
  // (cuBLASLt has no silu: it would run as a kernel of its own after the GEMM).
  if (pointwise_follows && feeds_pointwise(g, k.outputs[0])) return false;
  if (y == k.inputs[0]) {
    replace_pair(g, position_of(g, p, pos), pos, p->inputs, attrs);
  } else {
    p->attrs = attrs;  // P's output type stays; the views now read act(y)
    g.replace_all_uses(k.outputs[0], k.inputs[0]);
    g.erase_node(pos);
  }
  return true;
}

// One sweep in topological order; returns whether anything fused.
bool sweep(Graph& g, bool pointwise_follows) {
  bool changed = false;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& k = *g.nodes()[i];
    bool fused = false;
    if (k.op == OpKind::kAdd) {
      const ValueId a = k.inputs[0], b = k.inputs[1];
      fused = try_add(g, i, a, b) || try_add(g, i, b, a) || try_add_through_views(g, i, a, b) ||
              try_add_through_views(g, i, b, a) || try_add_reassociate(g, i, a, b) || try_add_reassociate(g, i, b, a);
    } else if (op_info(k.op).family == OpFamily::kUnary) {
      fused = try_activation(g, i, pointwise_follows);
    }
    // A fusion removes the producer (before i) and replaces node i: the fused node now sits
    // at i - 1 (or i with an inserted reshape), and the next node to look at at i (i + 1). An
    // activation through views removes node i alone: the next node is at i.
    if (fused) {
      changed = true;
      --i;
    }
  }
  return changed;
}

}  // namespace

bool fuse_epilogue(Graph& g, bool pointwise_follows) {
  bool changed = false;
  while (sweep(g, pointwise_follows)) changed = true;
  if (changed) g.compact();
  return changed;
}

}  // namespace kiln
