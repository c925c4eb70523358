// Importers of scaled dot-product attention: the public overload and the backend-specific
// ones (flash, efficient, cuDNN, flash for CPU) that torch.export / aot_autograd leave in the
// graph. All map to Kiln's sdpa; their extra outputs (logsumexp, RNG state, debug masks) are
// training artifacts, so a node that uses them is refused, as is non-zero dropout.
//
// Grouped-query attention (enable_gqa, fewer k / v heads than q heads) is expressed with
// broadcasting: q [B, Hkv*G, L, E] is viewed as [B, Hkv, G, L, E] and k / v as [B, Hkv, 1, S, E],
// which pairs q head h with kv head h / G exactly as PyTorch's repeat_interleave does.
#include "src/import/import_context.h"

namespace kiln::aten {

namespace {

void check_dropout(const NodeArgs& args, size_t pos) {
  const double p = args.get_float(pos, "dropout_p", 0.0);
  if (p != 0.0) reject("attention dropout_p ", p, " (inference only)");
}

// Inserts the group dim after the head dim (rank - 3) of t: heads -> (heads / g, g), or a unit
// dim when the head dim is 1 (or absent).
ValueId split_heads(ImportContext& cx, ValueId t, int64_t groups, bool unit_group) {
  std::vector<int64_t> s = cx.type(t).shape();
  if (s.size() < 3) return t;  // no head dim: broadcasts as is
  const size_t h = s.size() - 3;
  if (unit_group || s[h] == 1) {
    s.insert(s.begin() + std::ptrdiff_t(h) + 1, 1);
  } else {
    s[h] /= groups;
    s.insert(s.begin() + std::ptrdiff_t(h) + 1, groups);
  }
  return cx.reshape(t, s);
}

ValueId sdpa(ImportContext& cx, std::optional<ValueId> mask, bool causal, bool gqa) {
  ValueId q = cx.input(0, "query"), k = cx.input(1, "key"), v = cx.input(2, "value");
  const DType dt = cx.type(q).dtype;
  Attrs a;
  a.set("causal", causal);
  if (cx.args.given(kKwOnly, "scale")) a.set("scale", cx.args.get_float(kKwOnly, "scale"));
  if (mask) {
    const DType mdt = cx.type(*mask).dtype;
    if (mdt != DType::kBool && !is_floating(mdt)) reject("attention mask of dtype ", dtype_name(mdt));
    if (mdt != DType::kBool) mask = cx.cast(*mask, dt);
  }
  const std::vector<int64_t> qs = cx.type(q).shape(), ks = cx.type(k).shape();
  const bool grouped = gqa && qs.size() >= 3 && ks.size() == qs.size() && qs[qs.size() - 3] != ks[ks.size() - 3];
  if (!grouped) {
    std::vector<ValueId> in = {q, k, v};
    if (mask) in.push_back(*mask);
    return cx.add(OpKind::kSdpa, in, a);
  }
  const int64_t hq = qs[qs.size() - 3], hkv = ks[ks.size() - 3];
  if (hkv <= 0 || hq % hkv != 0) reject("enable_gqa with ", hq, " query heads and ", hkv, " key heads");
  const int64_t g = hq / hkv;
  std::vector<ValueId> in = {split_heads(cx, q, g, false), split_heads(cx, k, g, true), split_heads(cx, v, g, true)};
  if (mask) {
    const std::vector<int64_t> ms = cx.type(*mask).shape();
    if (ms.size() >= 3 && ms[ms.size() - 3] != 1 && ms[ms.size() - 3] != hq)
      reject("enable_gqa with a mask of head dim ", ms[ms.size() - 3]);
    in.push_back(split_heads(cx, *mask, g, false));
  }
  return cx.reshape(cx.add(OpKind::kSdpa, in, a), cx.args.out().shape);
}

// scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0, is_causal=False, *,
// scale=None, enable_gqa=False)
void check_sdpa(const NodeArgs& args) { check_dropout(args, 4); }
std::vector<ValueId> convert_sdpa(ImportContext& cx) {
  return {sdpa(cx, cx.opt_input(3, "attn_mask"), cx.args.get_bool(5, "is_causal", false),
               cx.args.get_bool(kKwOnly, "enable_gqa", false))};
}

// _scaled_dot_product_flash_attention(q, k, v, dropout_p=0, is_causal=False,
// return_debug_mask=False, *, scale=None)
void check_flash(const NodeArgs& args) {
  check_dropout(args, 3);
  args.require_unused_from(1, "logsumexp / RNG state / debug mask");
}
std::vector<ValueId> convert_flash(ImportContext& cx) {
  return {sdpa(cx, std::nullopt, cx.args.get_bool(4, "is_causal", false), false)};
}

// _scaled_dot_product_efficient_attention(q, k, v, attn_bias?, compute_log_sumexp,
// dropout_p=0, is_causal=False, *, scale=None); _scaled_dot_product_cudnn_attention has the
// same leading arguments.
void check_efficient(const NodeArgs& args) {
  check_dropout(args, 5);
  args.require_unused_from(1, "logsumexp / RNG state / debug mask");
}
std::vector<ValueId> convert_efficient(ImportContext& cx) {
  return {sdpa(cx, cx.opt_input(3, "attn_bias"), cx.args.get_bool(6, "is_causal", false), false)};
}

// _scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p=0, is_causal=False, *,
// attn_mask=None, scale=None)
void check_flash_cpu(const NodeArgs& args) {
  check_dropout(args, 3);
  args.require_unused_from(1, "logsumexp");
}
std::vector<ValueId> convert_flash_cpu(ImportContext& cx) {
  return {sdpa(cx, cx.opt_input(kKwOnly, "attn_mask"), cx.args.get_bool(4, "is_causal", false), false)};
}

}  // namespace

std::vector<ImportEntry> attention_importers() {
  return {
      {"aten.scaled_dot_product_attention.default", &check_sdpa, &convert_sdpa},
      {"aten._scaled_dot_product_flash_attention.default", &check_flash, &convert_flash},
      {"aten._scaled_dot_product_efficient_attention.default", &check_efficient, &convert_efficient},
      {"aten._scaled_dot_product_cudnn_attention.default", &check_efficient, &convert_efficient},
      {"aten._scaled_dot_product_flash_attention_for_cpu.default", &check_flash_cpu, &convert_flash_cpu},
  };
}

}  // namespace kiln::aten
