// convs_to_linears: runs a patch embedding (a 2-D conv whose stride equals its kernel, as in
// a vision transformer's 16x16 / stride 16 stem) as one linear over the patches.
//
// The kernel windows of such a conv do not overlap and cover x, so im2col is a permute:
//   conv(x [N, C, H, W], w [O, C, kh, kw], b?)           with stride = (kh, kw), no padding,
//                                                          dilation 1, groups 1
//   -> p = reshape(x, [N, C, H/kh, kh, W/kw, kw])
//      p = permute(p, [0, 2, 4, 1, 3, 5])                  [N, OH, OW, C, kh, kw], one copy
//      y = linear(reshape(p, [N, OH, OW, C*kh*kw]), reshape(w, [O, C*kh*kw]), b?)
//      permute(y, [0, 3, 1, 2])                            the conv's [N, O, OH, OW]
// The weight's reshape keeps its element order (fold_constants folds it, and a refit re-derives
// it). What usually follows a patch embedding, flatten(2).transpose(1, 2), then reads y in order:
// collapse_view_chains makes that a reshape, so the tokens are the GEMM's output itself.
// (Why: a library conv with so few, so large windows runs far from the tensor cores' rate and
// needs the image padded and transposed around it, while the same work as one GEMM of
// [N*OH*OW, C*kh*kw] x [C*kh*kw, O] runs at full rate.)
//
// Does: static shapes with H and W multiples of the kernel, kernels larger than 1x1, a conv
// without residual or activation (run it before fuse_epilogue, which then fuses into the linear).
// Does not: rewrite 1-D / 3-D convs, overlapping or padded windows, grouped or channels-last
// convs, or drop a remainder of H or W that the windows do not reach.
//
// dense_convs_to_linears: runs a channels-last conv over a 1x1 image with a 1x1 kernel (a
// squeeze-excitation block's convs over the pooled [N, 1, 1, C]) as a linear: x is already
// [..., C] and the output [N, 1, 1, O], so only the weight [O, 1, 1, C] is reshaped (a constant,
// folded); bias, residual and activation carry over (src/ops/epilogue.h is the same for both).
// (Why: cuDNN runs these tiny convs with direct kernels slower than cuBLASLt's GEMM of the same
// [N, C] x [C, O].) Run it after to_channels_last, where the layout puts the channels last and
// the permutes around the block are gone.
#include "kiln/passes.h"
#include "src/ops/epilogue.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

ValueId insert(Graph& g, size_t& pos, OpKind op, const std::vector<ValueId>& ins, const char* key,
               const std::vector<int64_t>& value, const std::string& name) {
  Attrs a;
  a.set(key, value);
  return g.insert_node(pos++, op, ins, a, name)[0];
}

bool is_patch_conv(const Graph& g, const Node& n) {
  if (n.op != OpKind::kConv || n.inputs.size() > 3 || n.attrs.has("activation") ||
      n.attrs.get_string("layout", "nchw") != "nchw" || n.attrs.get_int("groups", 1) != 1)
    return false;
  const TensorType& x = g.type(n.inputs[0]);
  const TensorType& w = g.type(n.inputs[1]);
  if (x.rank() != 4 || w.rank() != 4 || !passes::all_static(x)) return false;
  const std::vector<int64_t> kernel = {w.dims[2].extent, w.dims[3].extent};
  if (kernel[0] * kernel[1] == 1) return false;
  if (n.attrs.get_ints("stride", {1, 1}) != kernel || n.attrs.get_ints("padding", {0, 0}) != std::vector<int64_t>{0, 0} ||
      n.attrs.get_ints("dilation", {1, 1}) != std::vector<int64_t>{1, 1})
    return false;
  return x.dims[2].extent % kernel[0] == 0 && x.dims[3].extent % kernel[1] == 0;
}

// A channels-last conv (groups 1, static) of a 1x1 kernel over a 1x1 image, no padding or dilation.
bool is_dense_conv(const Graph& g, const Node& n) {
  if (n.op != OpKind::kConv || n.attrs.get_string("layout", "nchw") != "nhwc" || n.attrs.get_int("groups", 1) != 1 ||
      n.attrs.get_ints("padding", {0, 0}) != std::vector<int64_t>{0, 0} ||
      n.attrs.get_ints("dilation", {1, 1}) != std::vector<int64_t>{1, 1})
    return false;
  const TensorType& x = g.type(n.inputs[0]);
  const TensorType& w = g.type(n.inputs[1]);
  return x.rank() == 4 && w.rank() == 4 && passes::all_static(x) && passes::all_static(w) && x.dims[1].extent == 1 &&
         x.dims[2].extent == 1 && w.dims[1].extent == 1 && w.dims[2].extent == 1;
}

}  // namespace

bool dense_convs_to_linears(Graph& g) {
  bool changed = false;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
    const Node& n = *g.nodes()[pos];
    if (!is_dense_conv(g, n)) continue;
    std::vector<ValueId> ins = n.inputs;
    Attrs a;
    pw::copy_activation(n.attrs, a);
    const auto w = g.type(ins[1]).shape();
    ins[1] = insert(g, pos, OpKind::kReshape, {ins[1]}, "shape", {w[0], w[3]}, n.name);
    passes::replace_node(g, pos, OpKind::kLinear, ins, a);  // the conv, now at pos
    changed = true;
  }
  return changed;
}

bool convs_to_linears(Graph& g) {
  bool changed = false;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
    const Node& n = *g.nodes()[pos];
    if (!is_patch_conv(g, n)) continue;
    const std::string name = n.name;
    const ValueId y = n.outputs[0];
    const std::vector<ValueId> ins = n.inputs;
    const auto x = g.type(ins[0]).shape(), w = g.type(ins[1]).shape();
    const int64_t kh = w[2], kw = w[3], oh = x[2] / kh, ow = x[3] / kw, k = w[1] * kh * kw;
    size_t at = pos;
    ValueId p = insert(g, at, OpKind::kReshape, {ins[0]}, "shape", {x[0], x[1], oh, kh, ow, kw}, name);
    p = insert(g, at, OpKind::kPermute, {p}, "perm", {0, 2, 4, 1, 3, 5}, name);
    p = insert(g, at, OpKind::kReshape, {p}, "shape", {x[0], oh, ow, k}, name);
    std::vector<ValueId> linear_ins = {p, insert(g, at, OpKind::kReshape, {ins[1]}, "shape", {w[0], k}, name)};
    if (ins.size() > 2 && ins[2] != kNoValue) linear_ins.push_back(ins[2]);
    const ValueId out = g.insert_node(at++, OpKind::kLinear, linear_ins, {}, name)[0];
    g.replace_all_uses(y, insert(g, at, OpKind::kPermute, {out}, "perm", {0, 3, 1, 2}, name));
    g.erase_node(at);
    pos = at - 1;
    changed = true;
  }
  return changed;
}

}  // namespace kiln
