// fold_attention_layout: lets sdpa read and write [B, S, H, D] tensors directly, so that the
// head split and merge around attention move no bytes.
//
// A transformer computes q = linear(x).view(B, S, H, D).transpose(1, 2) (likewise k and v),
// then sdpa over [B, H, S, D], then out.transpose(1, 2).reshape(B, S, H * D). Kiln's IR is
// dense, so each transpose is a permute that copies. This pass rewrites
//   sdpa(permute(xq, P), permute(xk, P), permute(xv, P), [mask])    with P = [0, 2, 1, 3]
// into permute(sdpa(xq, xk, xv, [mask]) {layout="bshd"}, P): the same values, since a bshd
// sdpa computes attention per (B, H) on exactly the rows the permutes would have gathered (the
// mask indexes the scores [B, H, L, S] in either layout, so it stays as it is). Then every
// permute reading the new output permute folds with it (permute(permute(v, P), Q) ->
// permute(v, P o Q), or v for the identity): the transpose back before the merge disappears.
//
// Does not: match q, k, v of which only some are permuted, permutes other than P or ranks other
// than 4, a head split written as reshape(permute(3-D)) (torchvision's MultiheadAttention), an
// sdpa the filter declines (by default those fused kernels do not serve: f32, head dims other
// than 64 / 128; see fused_attention_shape), or fold permutes elsewhere in the graph. The old permutes stay when something else reads them.
// Run it after fuse_epilogue and before fuse_pointwise (the pointwise ops between two permutes
// would otherwise hide the pair); on the CPU a bshd sdpa runs through permuted copies, so the
// pass pays off on CUDA, whose kernels read the strides directly.
#include <unordered_set>

#include "kiln/errors.h"
#include "kiln/passes.h"
#include "src/ops/shape_rules.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

const passes::Perm kSwap = {0, 2, 1, 3};

// The x of permute(x, kSwap) producing v (x of rank 4), or kNoValue.
ValueId unswapped(const Graph& g, ValueId v) {
  const Node* p = passes::permute_of(g, v);
  if (p == nullptr || passes::perm_of(*p) != kSwap || g.type(p->inputs[0]).rank() != 4) return kNoValue;
  return p->inputs[0];
}

// Rewrites the sdpa at `pos`; returns the new output permute's value, or kNoValue.
ValueId rewrite(Graph& g, size_t pos, const AttentionFilter& foldable) {
  const Node& n = *g.nodes()[pos];
  if (n.op != OpKind::kSdpa || sdpa_bshd(n.attrs) || !foldable(g, n)) return kNoValue;
  std::vector<ValueId> ins = n.inputs;
  for (size_t i = 0; i < 3; ++i) {
    ins[i] = unswapped(g, n.inputs[i]);
    if (ins[i] == kNoValue) return kNoValue;
  }
  const std::string name = n.name;
  Attrs attrs = n.attrs;
  attrs.set("layout", std::string("bshd"));
  const ValueId y = n.outputs[0];
  size_t at = pos;
  const ValueId y_bshd = g.insert_node(at++, OpKind::kSdpa, ins, attrs, name)[0];
  Attrs swap;
  swap.set("perm", kSwap);
  const ValueId y_bhsd = g.insert_node(at++, OpKind::kPermute, {y_bshd}, swap, name)[0];
  g.replace_all_uses(y, y_bhsd);
  g.erase_node(at);
  return y_bhsd;
}

}  // namespace

// Others run as matmul-softmax-matmul, which wants whole heads contiguous: with [B, S, H, D]
// operands its batched GEMMs split into one launch group per sample (measured on an H100 for
// BERT-base FP32 batch 32: 384 softmax and 768 GEMM launches, 4.6 ms of a 7.9 ms forward).
bool fused_attention_shape(const Graph& g, const Node& sdpa) {
  const TensorType& q = g.type(sdpa.inputs[0]);
  const int64_t d = q.rank() ? q.dims.back().extent : 0;
  return (q.dtype == DType::kF16 || q.dtype == DType::kBF16) && (d == 64 || d == 128);
}

bool fold_attention_layout(Graph& g, const AttentionFilter& foldable) {
  std::unordered_set<ValueId> swapped_outputs;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
    const ValueId v = rewrite(g, pos, foldable);
    if (v != kNoValue) swapped_outputs.insert(v);
  }
  if (swapped_outputs.empty()) return false;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
    const Node& n = *g.nodes()[pos];
    if (n.op == OpKind::kPermute && swapped_outputs.count(n.inputs[0]) && passes::fold_permutes(g, pos)) --pos;
  }
  eliminate_dead_code(g);
  return true;
}

}  // namespace kiln
