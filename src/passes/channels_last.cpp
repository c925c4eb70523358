// to_channels_last: runs 2-D convolutions on channels-last tensors and keeps whole conv regions
// in that layout, so that only the region's boundary converts.
//
// Tensor-core convolutions (cuDNN on sm_80+) read and write NHWC; given NCHW they transpose
// every input, weight and output on every call. This pass makes the layout explicit in the IR:
//   1. every conv over [N, C, H, W] becomes permute(x, NHWC) -> conv(layout "nhwc") ->
//      permute(y, NCHW), its weight and residual permuted the same way (a permuted constant
//      weight is folded by the fold_constants that follows, and recorded for refit);
//   2. permutes then move towards the outputs and cancel, repeated until nothing changes:
//        permute(permute(v, P), Q)  -> permute(v, P o Q), or v when that is the identity;
//        max_pool / avg_pool of permute(v, NCHW)
//                                   -> permute(the pool with layout "nhwc" on v, NCHW);
//        adaptive_avg_pool to 1x1 of permute(v, NCHW)
//                                   -> permute(reduce_mean(v, H and W, keepdim), NCHW);
//        group_norm of permute(v, NCHW) -> permute(the group_norm with layout "nhwc" on v, NCHW);
//        op(permute(v, P), ...)     -> permute(op'(v, ...), P') by the rules of sink_permutes.h,
//      first only through pointwise ops (which never enlarge a permute), then through every
//      op with a rule, the latter kept only when the permutes left write fewer bytes; last
//      also through reshapes that keep rows whole as row gathers (row_gathers.h), kept only
//      when the permutes and gathers left write fewer bytes. A conv's
//      output permute meets the next conv's input permute (directly, or after the activations,
//      residual adds, squeeze-excite products, norms, concats and upsampling between them);
//   3. a conv at a region's entry with fewer than 4 input channels (an image) gets them
//      zero-padded to 4, by a pad that reads the image through the entry permute (input_perm).
// Does not: convert conv_transpose or 1-D convs; move permutes through adaptive pools other
// than the global one, softmax, norms other than group_norm, or matmuls; change a graph
// output's permute into an alias of a graph input. Run it after fuse_epilogue (residuals and activations are then
// inside the convs) and before fuse_pointwise; the builder runs it for CUDA builds only (the
// CPU runs a channels-last conv through channels-first copies).
#include <algorithm>

#include "kiln/errors.h"
#include "kiln/passes.h"
#include "src/ops/shape_rules.h"
#include "src/passes/pass_util.h"
#include "src/passes/sink_permutes.h"

namespace kiln {

namespace {

using passes::fold_permutes;
using passes::Perm;
using passes::perm_of;
using passes::permute_of;
const Perm kToLast = {0, 2, 3, 1};   // NCHW -> NHWC
const Perm kToFirst = {0, 3, 1, 2};  // NHWC -> NCHW
const int64_t kChannelQuantum = 4;
const int kMaxRounds = 64;  // sweeps of the propagation (each moves every permute at least one op)

// permute(v, perm) before `pos` (which advances past a new node): an existing one if there is.
ValueId insert_permute(Graph& g, size_t& pos, ValueId v, const Perm& perm, const std::string& name) {
  // One permute per value and order (x feeding a conv and a residual).
  if (const Node* existing = passes::permute_before(g, v, perm, pos)) return existing->outputs[0];
  Attrs a;
  a.set("perm", perm);
  return g.insert_node(pos++, OpKind::kPermute, {v}, a, name)[0];
}

// Step 1 for the conv at `pos`; returns false when it stays as it is.
bool convert_conv(Graph& g, size_t pos) {
  const Node& n = *g.nodes()[pos];
  if (n.op != OpKind::kConv || g.type(n.inputs[0]).rank() != 4 || channels_last(n.op, n.attrs)) return false;
  const std::string name = n.name;
  std::vector<ValueId> ins = n.inputs;
  Attrs attrs = n.attrs;
  const ValueId y = n.outputs[0];
  size_t at = pos;
  for (size_t i = 0; i < ins.size(); ++i)
    if (i != 2 && ins[i] != kNoValue) ins[i] = insert_permute(g, at, ins[i], kToLast, name);
  attrs.set("layout", std::string("nhwc"));
  const ValueId y_last = g.insert_node(at++, OpKind::kConv, ins, attrs, name)[0];
  const ValueId y_first = insert_permute(g, at, y_last, kToFirst, name);
  g.replace_all_uses(y, y_first);
  g.erase_node(at);
  return true;
}

// Step 3 for the conv at `pos`: at a region's entry (x = permute(v, NHWC)), fewer than
// kChannelQuantum input channels (an RGB image) are zero-padded to it in x and w: cuDNN's
// kernels for an image's first layer want 4 channels, and zeros add nothing to the sum. Four,
// not eight: more padding only adds bytes for the stem to read. The image's pad reads it
// through the entry permute (input_perm), so moving the channels last and padding them is one
// pass over the image instead of two.
bool pad_entry_channels(Graph& g, size_t pos) {
  const Node& n = *g.nodes()[pos];
  if (n.op != OpKind::kConv || !channels_last(n.op, n.attrs) || n.attrs.get_int("groups", 1) != 1) return false;
  const Node* entry = permute_of(g, n.inputs[0]);
  const int64_t c = g.type(n.inputs[0]).dims[3].extent;
  if (entry == nullptr || perm_of(*entry) != kToLast || c >= kChannelQuantum) return false;
  const std::string name = n.name;
  std::vector<ValueId> ins = n.inputs;
  const Attrs attrs = n.attrs;
  const ValueId y = n.outputs[0], image = entry->inputs[0];
  size_t at = pos;
  Attrs pad;
  pad.set("pads", std::vector<int64_t>{0, 0, 0, 0, 0, 0, 0, kChannelQuantum - c});
  ins[1] = g.insert_node(at++, OpKind::kPad, {ins[1]}, pad, name)[0];
  // The image itself is read through the permute: one pass moves its channels last and pads them
  // (the permute goes with eliminate_dead_code unless something else reads it).
  pad.set("input_perm", kToLast);
  ins[0] = g.insert_node(at++, OpKind::kPad, {image}, pad, name)[0];
  g.replace_all_uses(y, g.insert_node(at++, OpKind::kConv, ins, attrs, name)[0]);
  g.erase_node(at);
  return true;
}

// max_pool / avg_pool / group_norm of permute(v, NCHW) -> the op channels-last on v; a global
// average pool -> a mean over H and W.
bool sink_channel_op(Graph& g, size_t pos) {
  const Node& n = *g.nodes()[pos];
  if ((op_info(n.op).family != OpFamily::kPool && n.op != OpKind::kGroupNorm) || g.type(n.inputs[0]).rank() != 4 ||
      channels_last(n.op, n.attrs))
    return false;
  const Node* p = permute_of(g, n.inputs[0]);
  if (p == nullptr || perm_of(*p) != kToFirst) return false;
  Attrs a = n.attrs;
  OpKind op = n.op;
  if (op == OpKind::kAdaptiveAvgPool) {
    const auto y = g.type(n.outputs[0]).shape();
    if (y[2] != 1 || y[3] != 1) return false;
    op = OpKind::kReduceMean;
    a = Attrs();
    a.set("axes", std::vector<int64_t>{1, 2});
    a.set("keepdim", true);
  } else {
    a.set("layout", std::string("nhwc"));
  }
  std::vector<ValueId> ins = n.inputs;  // group_norm's weight and bias stay per channel
  ins[0] = p->inputs[0];
  passes::replace_permuted(g, pos, op, ins, a, {kToFirst});
  return true;
}

}  // namespace

bool to_channels_last(Graph& g) {
  bool changed = false;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) changed |= convert_conv(g, pos);
  if (!changed) return false;
  // Permutes move through the ops that never enlarge them first; then through every op that
  // has a rule (sink_permutes.h), kept only when the permutes left write fewer bytes (a permute
  // moved past an upsample and meeting no other is larger than before).
  auto propagate = [&](bool all_rules, bool row_gathers) {
    for (int round = 0; round < kMaxRounds; ++round) {
      bool again = false;
      for (size_t pos = 0; pos < g.nodes().size(); ++pos)
        again |= fold_permutes(g, pos) || sink_channel_op(g, pos) ||
                 passes::sink_permute(g, pos, all_rules, row_gathers) ||
                 (all_rules && passes::permute_to_reshape(g, pos));
      if (!again) return;
      eliminate_dead_code(g);
    }
  };
  propagate(false, false);
  eliminate_dead_code(g);
  Graph kept = g;
  int64_t bytes = passes::moved_bytes(g);
  propagate(true, false);
  eliminate_dead_code(g);
  if (passes::moved_bytes(g) > bytes) g = kept;
  // Then reshapes that only a row gather moves a permute past (a window partition read as a
  // grid), kept only when the gathers, composed, and the permutes left write fewer bytes.
  kept = g;
  bytes = passes::moved_bytes(g);
  propagate(true, true);
  chains_to_row_gathers(g);
  eliminate_dead_code(g);
  if (passes::moved_bytes(g) >= bytes) g = std::move(kept);
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) pad_entry_channels(g, pos);
  eliminate_dead_code(g);
  return true;
}

}  // namespace kiln
