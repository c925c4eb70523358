// fold_channel_scales: folds a constant factor that multiplies a linear's or conv's output into
// the op's weight and bias, so the product costs no kernel and the add after it (a residual) can
// join the op's epilogue.
//
//   mul(P(x, W, b?), c) / mul(c, P(...))  ->  P(x, W * c[o], b * c)
//
// for P a linear or conv (either layout) with no activation and no residual, whose output has no
// other use, W and b floating constants, c a floating constant that is per output channel (every
// dim 1 but the output's channel axis) or one element (a layer scale: ConvNeXt's, CaiT's), and a
// product of P's output type. c scales W along W's output-channel axis 0 (linear W[N, K], conv
// W[O, ...] in either layout). The arithmetic is emitted as nodes in f64, cast back to W's dtype,
// for the fold_constants that follows to evaluate and record for refit, as fold_batch_norm does.
// Does not: fold into conv_transpose, into a P whose bias or weight is computed at run time, or a
// factor of another dtype than P's output (the product would widen it).
#include "kiln/passes.h"
#include "src/ops/epilogue.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

// Folds the mul at `pos` into its operand `y`'s producer, c being the other operand; false when
// the pair does not qualify (nothing changed).
bool try_fold(Graph& g, size_t pos, ValueId y, ValueId c) {
  const Node* p = g.value(y).producer;
  if (p == nullptr || (p->op != OpKind::kLinear && p->op != OpKind::kConv)) return false;
  if (!pw::parse_activation(p->op, p->attrs).none || p->inputs.size() > 3 || g.num_uses(y) != 1) return false;
  const ValueId w = p->inputs[1], b = passes::input_or_none(*p, 2);
  if (!passes::is_float_constant(g, w) || (b != kNoValue && !passes::is_float_constant(g, b)) ||
      !passes::is_float_constant(g, c))
    return false;
  const TensorType yt = g.type(y), ct = g.type(c), product = g.type(g.nodes()[pos]->outputs[0]);
  if (product.dtype != yt.dtype || product.shape() != yt.shape() || !passes::all_static(yt)) return false;
  const passes::ChannelForm form = passes::channel_form(*p, ct, yt);
  if (form == passes::ChannelForm::kNone) return false;

  const TensorType wt = g.type(w);
  const int64_t channels = wt.dims[0].extent;
  std::vector<ValueId> ins = p->inputs;
  const Attrs attrs = p->attrs;
  const OpKind op = p->op;
  const std::string name = p->name;
  passes::NodeInserter e{g, pos, name};
  // c as f64 [O] (a scalar stays one element and broadcasts), then [O, 1, ..] against W.
  ValueId s = e.cast(c, DType::kF64);
  s = form == passes::ChannelForm::kChannels ? e.reshape(s, {channels}) : e.reshape(s, {1});
  std::vector<int64_t> per_row(size_t(wt.rank()), 1);
  per_row[0] = form == passes::ChannelForm::kChannels ? channels : 1;
  ins[1] = e.cast(e.node(OpKind::kMul, {e.cast(w, DType::kF64), e.reshape(s, per_row)}), wt.dtype);
  if (b != kNoValue) ins[2] = e.cast(e.node(OpKind::kMul, {e.cast(b, DType::kF64), s}), g.type(b).dtype);
  const ValueId product_out = g.nodes()[e.pos]->outputs[0];
  g.replace_all_uses(product_out, g.insert_node(e.pos, op, ins, attrs, name)[0]);
  g.erase_node(e.pos + 1);
  return true;
}

}  // namespace

bool fold_channel_scales(Graph& g) {
  return passes::rewrite_each(g, [](Graph& graph, size_t pos) {
    const Node& n = *graph.nodes()[pos];
    if (n.op != OpKind::kMul || n.inputs.size() != 2) return false;
    const ValueId a = n.inputs[0], b = n.inputs[1];
    return try_fold(graph, pos, a, b) || try_fold(graph, pos, b, a);
  });
}

}  // namespace kiln
