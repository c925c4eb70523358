// simplify_attention_masks: an sdpa mask that is logical_and(all-true constant, m) reads m.
// additive_attention_masks: an f16 / bf16 sdpa's bool mask becomes where(m, 0, -inf) in q's
// dtype (below).
//
// Transformers build their attention masks with vmapped index comparisons that constant folding
// turns into an all-true constant, and-ed with the padding mask of the batch. That and gives a
// [B, 1, L, S] mask where [B, 1, 1, S] says the same, and every score then reads its own mask
// byte. sdpa broadcasts its mask over the scores [..., L, S] (a mask dim of 1 repeats), so
// when the other operand m broadcasts to the scores too, the node can read m directly: the
// same keep / drop decision for every score, read from a smaller tensor (one mask row per batch
// instead of a mask byte per score). The and-node goes when nothing else reads it.
#include <map>

#include "kiln/passes.h"
#include "src/ops/shape_rules.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

bool all_true(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  if (!val.is_constant() || val.type.dtype != DType::kBool || !val.data) return false;
  for (uint8_t b : *val.data)
    if (b == 0) return false;
  return true;
}

// Replaces the sdpa node at `pos` by one reading `mask` (the IR has no in-place input edit).
void set_mask(Graph& g, size_t pos, ValueId mask) {
  const Node& n = *g.nodes()[pos];
  std::vector<ValueId> ins = n.inputs;
  ins[3] = mask;
  const Attrs attrs = n.attrs;
  const std::string name = n.name;
  const ValueId y = n.outputs[0];
  const ValueId y2 = g.insert_node(pos, OpKind::kSdpa, ins, attrs, name)[0];
  g.replace_all_uses(y, y2);
  g.erase_node(pos + 1);
}

}  // namespace

bool simplify_attention_masks(Graph& g) {
  bool changed = false;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
    const Node& n = *g.nodes()[pos];
    if (n.op != OpKind::kSdpa || n.inputs.size() < 4 || n.inputs[3] == kNoValue) continue;
    const Node* and_node = g.value(n.inputs[3]).producer;
    if (and_node == nullptr || and_node->op != OpKind::kLogicalAnd) continue;
    // The scores' shape: the mask's own shape is what the shape rule broadcast to them.
    const std::vector<int64_t> scores = g.type(n.inputs[3]).shape();
    ValueId keep = kNoValue;
    for (int i = 0; i < 2 && keep == kNoValue; ++i) {
      const ValueId c = and_node->inputs[size_t(i)], m = and_node->inputs[size_t(1 - i)];
      if (all_true(g, c) && g.type(m).dtype == DType::kBool && broadcasts_to(g.type(m).shape(), scores)) keep = m;
    }
    if (keep == kNoValue) continue;
    set_mask(g, pos, keep);
    changed = true;
  }
  if (changed) eliminate_dead_code(g);
  return changed;
}

// cuDNN's fused attention takes a mask only as an additive bias (attention_cudnn.h), so on CUDA
// each distinct bool mask of f16 / bf16 sdpa nodes becomes one where(m, 0, -inf) node in q's
// dtype that all of them read: the same keep / drop decision (a kept score adds 0, a dropped
// one is -inf, as the bool mask's false is), computed once per forward and fused by
// fuse_pointwise into whatever made the mask. The generated kernels read either kind.
bool additive_attention_masks(Graph& g) {
  std::map<std::pair<ValueId, DType>, ValueId> additive;  // (bool mask, dtype) -> where node's output
  bool changed = false;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
    const Node& n = *g.nodes()[pos];
    if (n.op != OpKind::kSdpa || n.inputs.size() < 4 || n.inputs[3] == kNoValue) continue;
    const ValueId mask = n.inputs[3];
    const DType dt = g.type(n.inputs[0]).dtype;
    if (g.type(mask).dtype != DType::kBool || (dt != DType::kF16 && dt != DType::kBF16)) continue;
    auto [it, fresh] = additive.try_emplace({mask, dt}, kNoValue);
    if (fresh) {
      const uint16_t zero = 0, neg_inf = dt == DType::kF16 ? 0xFC00 : 0xFF80;
      const TensorType scalar(dt, {});
      const ValueId z = g.add_constant(passes::derived_constant_name(g, "mask_zero"), scalar, &zero, sizeof zero);
      const ValueId ninf = g.add_constant(passes::derived_constant_name(g, "mask_neg_inf"), scalar, &neg_inf,
                                          sizeof neg_inf);
      it->second = g.insert_node(pos++, OpKind::kWhere, {mask, z, ninf}, {}, n.name + ".additive_mask")[0];
    }
    set_mask(g, pos, it->second);
    changed = true;
  }
  if (changed) eliminate_dead_code(g);
  return changed;
}

}  // namespace kiln
