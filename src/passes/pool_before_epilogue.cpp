// pool_before_epilogue: the bias and activation of a conv over an image move behind the max
// pool that reads the conv, so the conv runs alone and the epilogue touches the pooled tensor.
//
//   max_pool(conv(x, w, b?, act))  ->  act(max_pool(conv(x, w)) + b)
//
// for an f16 / bf16 channels-last conv (layout "nhwc", after to_channels_last) with at most 4
// input channels (an image, padded to 4), no residual, an activation that never decreases (none,
// relu, sigmoid, tanh, hardsigmoid, clipped_relu) and an output read only by a channels-last max_pool. Exact:
// the max over a window of act(y + b[c]) is act(max(y) + b[c]) for such an act and a per-channel
// b, padding reading -inf either way. Why: cuDNN runs an image's first layer alone on dedicated
// first-layer kernels that its fused graphs do not reach (a network's stem conv), and the
// epilogue then reads a quarter of the conv's output (a 3x3 / stride 2 pool); fuse_pointwise
// joins the add and the activation into one kernel. The builder runs it for CUDA builds, after
// to_channels_last. (f32 convs keep their epilogue: the first-layer kernels are accepted for
// f16 / bf16 only, see refused_numerics in conv_tactic.cpp.)
#include "kiln/passes.h"
#include "src/ops/epilogue.h"

namespace kiln {

namespace {

bool never_decreasing(const pw::Activation& a) {
  return a.none || a.op == OpKind::kRelu || a.op == OpKind::kSigmoid || a.op == OpKind::kTanh ||
         a.op == OpKind::kHardsigmoid || a.op == OpKind::kClamp;
}

bool movable(const Graph& g, const Node& pool) {
  if (pool.op != OpKind::kMaxPool || pool.attrs.get_string("layout", "nchw") != "nhwc") return false;
  const Node* conv = g.value(pool.inputs[0]).producer;
  if (conv == nullptr || conv->op != OpKind::kConv || conv->attrs.get_string("layout", "nchw") != "nhwc" ||
      conv->inputs.size() > 3 || g.num_uses(conv->outputs[0]) != 1 || g.type(conv->inputs[0]).rank() != 4 ||
      g.type(conv->inputs[0]).dims[3].extent > 4)
    return false;
  const DType dt = g.type(conv->inputs[0]).dtype;
  if (dt != DType::kF16 && dt != DType::kBF16) return false;
  const pw::Activation act = pw::parse_activation(conv->op, conv->attrs);
  const bool bias = conv->inputs.size() > 2 && conv->inputs[2] != kNoValue;
  return never_decreasing(act) && (bias || !act.none);
}

}  // namespace

bool pool_before_epilogue(Graph& g) {
  bool changed = false;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
    if (!movable(g, *g.nodes()[pos])) continue;
    const Node& pool = *g.nodes()[pos];
    Node& conv = *g.value(pool.inputs[0]).producer;
    const pw::Activation act = pw::parse_activation(conv.op, conv.attrs);
    const ValueId bias = conv.inputs.size() > 2 ? conv.inputs[2] : kNoValue;
    conv.inputs.resize(2);
    pw::erase_activation(conv.attrs);
    const std::string name = pool.name;
    const ValueId old = pool.outputs[0];
    size_t at = pos;
    ValueId v = g.insert_node(at++, OpKind::kMaxPool, pool.inputs, pool.attrs, name)[0];
    if (bias != kNoValue) v = g.insert_node(at++, OpKind::kAdd, {v, bias}, {}, name)[0];
    if (!act.none) v = g.insert_node(at++, act.op, {v}, pw::unary_attrs(act), name)[0];
    g.replace_all_uses(old, v);
    g.erase_node(at);
    pos = at - 1;
    changed = true;
  }
  return changed;
}

}  // namespace kiln
