// fold_batch_norm: folds an inference batch_norm into the conv, conv_transpose or linear that
// produces its input, so the pair runs as one op.
//
//   batch_norm(P(x, W, b?), mean, var, gamma?, beta?)  ->  P(x, W', b')
//   s[o] = gamma[o] / sqrt(var[o] + eps)
//   W'   = W scaled by s[o] along W's output-channel axis
//   b'   = (b - mean) * s + beta          (b = 0, gamma = 1, beta = 0 when absent)
//
// The output-channel axis of W is axis 0 for conv (W[O, C/g, k..]) and linear (W[N, K]); for
// conv_transpose (W[C, O/g, k..]) input channel c of group c / (C/g) feeds output channel
// (c / (C/g)) * (O/g) + j through W[c, j], so the scale depends on both leading axes.
//
// Does: fold when W, b and every batch_norm parameter are floating constants and P's output has
// no other use (not even as a graph output). The arithmetic is emitted as nodes on the constants
// (casts to f64, add, sqrt, div, sub, mul, reshape / expand of s to W's layout, casts back to W's
// dtype), so W' and b' are computed in double and rounded once into W's dtype when the
// fold_constants that follows evaluates them; that fold is what makes them constants and what
// records how to re-derive them from new weights (refit). For linear, only a rank-2 output
// [N, F] qualifies: batch_norm normalizes axis 1, which must be the feature axis.
// A batch_norm that does not fold (its input has another use, or comes from another op: a
// DenseNet's norm after a concat) but has constant parameters becomes x * s + t, s and t per
// channel and derived the same way, so that it fuses with the pointwise ops around it.
// Does not: fold or rewrite a batch_norm whose parameters are graph inputs or computed at run
// time, fold into a P with another consumer (the unnormalized value would be lost), or fold a
// batch_norm that precedes the conv (that needs a padding-aware bias and is not worth it).
#include "kiln/errors.h"
#include "kiln/passes.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

// Inserts the folding arithmetic as nodes on constants, at consecutive positions; they are all
// evaluated by the fold_constants that follows (the only place where derived constants are made,
// so that a refit re-derives them: src/passes/refit_record.h).
struct Emitter : passes::NodeInserter {
  // A per-channel [C] parameter as f64.
  ValueId channel(ValueId v, int64_t channels) { return reshape(cast(v, DType::kF64), {channels}); }
};

// The per-output-channel scale s[O] laid out to broadcast against W (see the file comment).
ValueId scale_for_weight(Emitter& e, ValueId s, OpKind op, int64_t groups, const std::vector<int64_t>& w) {
  std::vector<int64_t> shape(w.size(), 1);
  if (op != OpKind::kConvTranspose) {
    shape[0] = w[0];
    return e.reshape(s, shape);
  }
  if (groups == 1) {
    shape[1] = w[1];
    return e.reshape(s, shape);
  }
  // W[C, O/g, k..]: input channel c feeds output channel (c / (C/g)) * (O/g) + j through W[c, j].
  const int64_t in_per_group = w[0] / groups, out_per_group = w[1];
  ValueId grouped = e.reshape(s, {groups, 1, out_per_group});
  ValueId wide = e.expand(grouped, {groups, in_per_group, out_per_group});
  shape[0] = w[0];
  shape[1] = w[1];
  return e.reshape(wide, shape);
}

// Tries to fold the batch_norm at index `bn_pos`; returns whether it did.
bool try_fold(Graph& g, size_t bn_pos, const std::vector<std::vector<int>>& users) {
  const Node& bn = *g.nodes()[bn_pos];
  const ValueId y = bn.inputs[0];
  const Node* producer = g.value(y).producer;
  if (producer == nullptr) return false;
  const Node& p = *producer;
  const TensorType yt = g.type(y);
  if (p.op != OpKind::kConv && p.op != OpKind::kConvTranspose && p.op != OpKind::kLinear) return false;
  if (p.op == OpKind::kLinear && yt.rank() != 2) return false;
  if (users[size_t(y)].size() != 1 || g.num_uses(y) != 1) return false;

  const ValueId w = p.inputs[1], b = passes::input_or_none(p, 2);
  const ValueId mean = bn.inputs[1], var = bn.inputs[2];
  const ValueId gamma = passes::input_or_none(bn, 3), beta = passes::input_or_none(bn, 4);
  if (!passes::is_float_constant(g, w) || !passes::is_float_constant(g, mean) || !passes::is_float_constant(g, var))
    return false;
  for (ValueId opt : {b, gamma, beta})
    if (opt != kNoValue && !passes::is_float_constant(g, opt)) return false;
  const int64_t channels = yt.dims[1].extent;
  for (ValueId param : {mean, var, gamma, beta, b})
    KILN_CHECK(param == kNoValue || g.type(param).numel() == channels, kInternal, "fold_batch_norm: ",
               g.type(param).to_string(), " does not have ", channels, " channels");

  // Locate the producer; the folded node goes just before the batch_norm (all of its inputs are
  // defined by then), after the arithmetic that makes W' and b'.
  size_t p_pos = bn_pos;
  while (p_pos-- > 0)
    if (g.nodes()[p_pos].get() == &p) break;
  KILN_CHECK(p_pos < bn_pos, kInternal, "fold_batch_norm: producer of %", y, " is not before its batch_norm");
  const ValueId bn_out = bn.outputs[0];
  const ValueId x = p.inputs[0];
  const OpKind op = p.op;
  const Attrs attrs = p.attrs;
  const std::string name = p.name;
  const TensorType wt = g.type(w);
  const double eps = bn.attrs.get_float("eps", 1e-5);

  // s = gamma / sqrt(var + eps);  W' = W * s;  b' = (b - mean) * s + beta, all in f64.
  Emitter e{g, bn_pos, bn.name};
  const double one = 1.0;
  const TensorType scalar(DType::kF64, {});
  const ValueId eps_c = g.add_constant("", scalar, &eps, sizeof eps);
  const ValueId denom = e.node(OpKind::kSqrt, {e.node(OpKind::kAdd, {e.channel(var, channels), eps_c})});
  const ValueId numer = gamma != kNoValue ? e.channel(gamma, channels) : g.add_constant("", scalar, &one, sizeof one);
  const ValueId s = e.node(OpKind::kDiv, {numer, denom});
  const ValueId m = e.channel(mean, channels);
  const ValueId centered = b != kNoValue ? e.node(OpKind::kSub, {e.channel(b, channels), m}) : e.node(OpKind::kNeg, {m});
  ValueId shift = e.node(OpKind::kMul, {centered, s});
  if (beta != kNoValue) shift = e.node(OpKind::kAdd, {shift, e.channel(beta, channels)});
  const ValueId s_w = scale_for_weight(e, s, op, op == OpKind::kConvTranspose ? attrs.get_int("groups", 1) : 1,
                                       wt.shape());
  const ValueId new_w = e.cast(e.node(OpKind::kMul, {e.cast(w, DType::kF64), s_w}), wt.dtype);
  const ValueId new_b = e.cast(shift, wt.dtype);

  const ValueId folded = g.insert_node(e.pos, op, {x, new_w, new_b}, attrs, name)[0];
  g.replace_all_uses(bn_out, folded);
  g.erase_node(e.pos + 1);
  g.erase_node(p_pos);
  return true;
}

// The batch_norm at `pos`, when its parameters are constants, as x * s + t with s and t per
// channel ([C, 1, ...] against x[N, C, ...]) derived in f64 like a fold's and cast to x's dtype:
// two pointwise ops that fuse with their neighbours and move through layouts (to_channels_last).
bool to_affine(Graph& g, size_t pos) {
  const Node& bn = *g.nodes()[pos];
  const ValueId x = bn.inputs[0];
  const ValueId mean = bn.inputs[1], var = bn.inputs[2];
  const ValueId gamma = passes::input_or_none(bn, 3), beta = passes::input_or_none(bn, 4);
  const TensorType xt = g.type(x);
  if (!is_floating(xt.dtype) || xt.rank() < 2) return false;
  for (ValueId param : {mean, var, gamma, beta})
    if (param != kNoValue && !passes::is_float_constant(g, param)) return false;
  const int64_t channels = xt.dims[1].extent;
  const double eps = bn.attrs.get_float("eps", 1e-5), one = 1.0;
  const ValueId out = bn.outputs[0];
  Emitter e{g, pos, bn.name};
  const TensorType scalar(DType::kF64, {});
  const ValueId eps_c = g.add_constant("", scalar, &eps, sizeof eps);
  const ValueId denom = e.node(OpKind::kSqrt, {e.node(OpKind::kAdd, {e.channel(var, channels), eps_c})});
  const ValueId numer = gamma != kNoValue ? e.channel(gamma, channels) : g.add_constant("", scalar, &one, sizeof one);
  const ValueId s = e.node(OpKind::kDiv, {numer, denom});
  ValueId t = e.node(OpKind::kNeg, {e.node(OpKind::kMul, {e.channel(mean, channels), s})});
  if (beta != kNoValue) t = e.node(OpKind::kAdd, {t, e.channel(beta, channels)});
  std::vector<int64_t> per_channel(size_t(xt.rank() - 1), 1);
  per_channel[0] = channels;
  const ValueId scaled = e.node(OpKind::kMul, {x, e.cast(e.reshape(s, per_channel), xt.dtype)});
  const ValueId y = e.node(OpKind::kAdd, {scaled, e.cast(e.reshape(t, per_channel), xt.dtype)});
  g.replace_all_uses(out, y);
  g.erase_node(e.pos);
  return true;
}

}  // namespace

bool fold_batch_norm(Graph& g) {
  bool changed = false;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (g.nodes()[i]->op != OpKind::kBatchNorm) continue;
    // Each fold removes one node before i and keeps the count at i: recompute uses, revisit i-1.
    if (try_fold(g, i, g.users())) {
      changed = true;
      --i;
    }
  }
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (g.nodes()[i]->op == OpKind::kBatchNorm) changed |= to_affine(g, i);
  if (changed) g.compact();
  return changed;
}

}  // namespace kiln
