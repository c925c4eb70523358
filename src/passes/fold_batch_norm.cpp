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
// no other use (not even as a graph output). Arithmetic is in double, rounded once into W's
// dtype; W' and b' are derived constants (not weights: the model's names no longer hold their
// values). For linear, only a rank-2 output [N, F] qualifies: batch_norm normalizes axis 1,
// which must be the feature axis.
// Does not: fold a batch_norm whose parameters are graph inputs or computed at run time, fold
// into a P with another consumer (the unnormalized value would be lost), or fold a batch_norm
// that precedes the conv (that needs a padding-aware bias and is not worth it).
#include <cmath>

#include "kiln/errors.h"
#include "kiln/passes.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

bool is_float_constant(const Graph& g, ValueId v) {
  return v != kNoValue && g.value(v).is_constant() && is_floating(g.type(v).dtype);
}

ValueId input_or_none(const Node& n, size_t i) { return i < n.inputs.size() ? n.inputs[i] : kNoValue; }

// Output channel of every element of W, for the producer's weight layout.
std::vector<int64_t> out_channel_of_elements(const Node& p, const TensorType& w) {
  const std::vector<int64_t> shape = w.shape();
  int64_t inner = 1;
  for (size_t d = 2; d < shape.size(); ++d) inner *= shape[d];
  const int64_t d0 = shape[0], d1 = shape.size() > 1 ? shape[1] : 1;
  std::vector<int64_t> ch(size_t(w.numel()));
  const bool transpose = p.op == OpKind::kConvTranspose;
  const int64_t groups = transpose ? p.attrs.get_int("groups", 1) : 1;
  const int64_t in_per_group = d0 / groups;
  for (int64_t a = 0; a < d0; ++a)
    for (int64_t b = 0; b < d1; ++b) {
      const int64_t o = transpose ? (a / in_per_group) * d1 + b : a;
      for (int64_t k = 0; k < inner; ++k) ch[size_t((a * d1 + b) * inner + k)] = o;
    }
  return ch;
}

// Tries to fold the batch_norm at index `bn_pos`; returns whether it did.
bool try_fold(Graph& g, size_t bn_pos, const std::vector<std::vector<int>>& users) {
  const Node& bn = *g.nodes()[bn_pos];
  const ValueId y = bn.inputs[0];
  const Value& yv = g.value(y);
  if (yv.producer == nullptr) return false;
  const Node& p = *yv.producer;
  if (p.op != OpKind::kConv && p.op != OpKind::kConvTranspose && p.op != OpKind::kLinear) return false;
  if (p.op == OpKind::kLinear && yv.type.rank() != 2) return false;
  if (users[size_t(y)].size() != 1 || g.num_uses(y) != 1) return false;

  const ValueId w = p.inputs[1], b = input_or_none(p, 2);
  const ValueId mean = bn.inputs[1], var = bn.inputs[2];
  const ValueId gamma = input_or_none(bn, 3), beta = input_or_none(bn, 4);
  if (!is_float_constant(g, w) || !is_float_constant(g, mean) || !is_float_constant(g, var)) return false;
  for (ValueId opt : {b, gamma, beta})
    if (opt != kNoValue && !is_float_constant(g, opt)) return false;

  const int64_t channels = yv.type.dims[1].extent;
  const double eps = bn.attrs.get_float("eps", 1e-5);
  const std::vector<double> m = passes::constant_as_doubles(g, mean);
  const std::vector<double> v = passes::constant_as_doubles(g, var);
  const size_t nch = static_cast<size_t>(channels);
  std::vector<double> s(nch), shift(nch);
  {
    const std::vector<double> ga = gamma == kNoValue ? std::vector<double>(nch, 1.0)
                                                     : passes::constant_as_doubles(g, gamma);
    const std::vector<double> be = beta == kNoValue ? std::vector<double>(nch, 0.0)
                                                    : passes::constant_as_doubles(g, beta);
    const std::vector<double> bias = b == kNoValue ? std::vector<double>(nch, 0.0)
                                                   : passes::constant_as_doubles(g, b);
    for (ValueId param : {mean, var, gamma, beta, b})
      KILN_CHECK(param == kNoValue || g.type(param).numel() == channels, kInternal, "fold_batch_norm: ",
                 g.type(param).to_string(), " does not have ", channels, " channels");
    for (int64_t c = 0; c < channels; ++c) {
      s[size_t(c)] = ga[size_t(c)] / std::sqrt(v[size_t(c)] + eps);
      shift[size_t(c)] = (bias[size_t(c)] - m[size_t(c)]) * s[size_t(c)] + be[size_t(c)];
    }
  }

  const TensorType wt = g.type(w);
  std::vector<double> wd = passes::constant_as_doubles(g, w);
  const std::vector<int64_t> ch = out_channel_of_elements(p, wt);
  for (size_t i = 0; i < wd.size(); ++i) {
    KILN_CHECK(ch[i] >= 0 && ch[i] < channels, kInternal, "fold_batch_norm: weight ", wt.to_string(),
               " maps to output channel ", ch[i], " of ", channels);
    wd[i] *= s[size_t(ch[i])];
  }
  const ValueId new_w =
      g.add_constant(passes::derived_constant_name(g, "bn_folded"), wt, passes::bytes_from_doubles(wt.dtype, wd));
  const TensorType bt(wt.dtype, {channels});
  const ValueId new_b =
      g.add_constant(passes::derived_constant_name(g, "bn_folded"), bt, passes::bytes_from_doubles(wt.dtype, shift));

  // Locate the producer, insert the folded node just before the batch_norm (all of its inputs
  // are defined by then), reroute, then drop the pair.
  size_t p_pos = bn_pos;
  while (p_pos-- > 0)
    if (g.nodes()[p_pos].get() == &p) break;
  KILN_CHECK(p_pos < bn_pos, kInternal, "fold_batch_norm: producer of %", y, " is not before its batch_norm");
  const ValueId bn_out = bn.outputs[0];
  const ValueId x = p.inputs[0];
  const OpKind op = p.op;
  const Attrs attrs = p.attrs;
  const std::string name = p.name;
  const ValueId folded = g.insert_node(bn_pos, op, {x, new_w, new_b}, attrs, name)[0];
  g.replace_all_uses(bn_out, folded);
  g.erase_node(bn_pos + 1);
  g.erase_node(p_pos);
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
  if (changed) g.compact();
  return changed;
}

}  // namespace kiln
