// Shape rule of sdpa (scaled dot-product attention, torch.nn.functional.
// scaled_dot_product_attention): q[..., L, E], k[..., S, E], v[..., S, Ev] -> [..., L, Ev].
//
// The batch dims of q, k and v broadcast (numpy rules, symbols kept). The optional mask is
// bool (true = attend) or of q's dtype (added to the scores) and must broadcast to
// [..., L, S] without growing it. Attributes: causal (bool, default false; may be combined
// with a mask), scale (float, default 1/sqrt(E)) and layout (string, default "bhsd").
//
// layout = "bshd" (set by the fold_attention_layout pass) keeps the heads inside the rows, as
// a linear's output viewed [B, S, H, D] has them: q [B, L, H, E], k [B, S, H, E],
// v [B, S, H, Ev] -> [B, L, H, Ev], attention per (B, H); rank 4 exactly, B and H broadcast as
// batch dims do. The mask is unchanged: it still broadcasts to the scores [B, H, L, S]. The
// rule is the "bhsd" rule on the operands with dims 1 and 2 swapped, its output swapped back.
#include <algorithm>
#include <utility>
#include <variant>

#include "src/ops/shape_rules.h"

namespace kiln {

namespace {

// numpy broadcasting of batch dims (right-aligned), keeping symbols.
std::vector<Dim> broadcast_batch(const std::vector<Dim>& a, const std::vector<Dim>& b, const TensorType& ta,
                                 const TensorType& tb) {
  size_t r = std::max(a.size(), b.size());
  std::vector<Dim> out(r);
  for (size_t i = 0; i < r; ++i) {
    const Dim* da = i < r - a.size() ? nullptr : &a[i - (r - a.size())];
    const Dim* db = i < r - b.size() ? nullptr : &b[i - (r - b.size())];
    if (!da || !db) out[i] = da ? *da : *db;
    else if (da->extent == db->extent) out[i] = da->is_static() ? *db : *da;
    else if (da->extent == 1) out[i] = *db;
    else if (db->extent == 1) out[i] = *da;
    else
      KILN_FAIL(kShapeMismatch, "sdpa: batch dims of ", ta.to_string(), " and ", tb.to_string(),
                " do not broadcast (", da->extent, " vs ", db->extent, ")");
  }
  return out;
}

std::vector<Dim> batch_of(const TensorType& t) { return {t.dims.begin(), t.dims.end() - 2}; }

std::vector<TensorType> infer_bhsd(const TypeList& in, const Attrs& a);

}  // namespace

bool sdpa_bshd(const Attrs& a) {
  if (!a.has("layout")) return false;
  const auto* layout = std::get_if<std::string>(&a.items().at("layout"));
  KILN_CHECK(layout != nullptr, kInvalidArgument, "sdpa: attribute 'layout' must be a string");
  KILN_CHECK(*layout == "bhsd" || *layout == "bshd", kInvalidArgument,
             "sdpa: attribute 'layout' must be \"bhsd\" or \"bshd\", got \"", *layout, "\"");
  return *layout == "bshd";
}

TensorType swap_seq_heads(TensorType t) {
  KILN_CHECK(t.rank() == 4, kShapeMismatch, "sdpa: layout \"bshd\" takes rank-4 q, k, v ([B, S, H, D]), got ",
             t.to_string());
  std::swap(t.dims[1], t.dims[2]);
  return t;
}

std::vector<TensorType> infer_attention(OpKind op, const TypeList& in, const Attrs& a) {
  KILN_CHECK(op == OpKind::kSdpa, kInternal, op_name(op), " is not in the attention family");
  if (!sdpa_bshd(a)) return infer_bhsd(in, a);
  KILN_CHECK(in.size() >= 3 && in[0] && in[1] && in[2], kInvalidArgument, "sdpa: needs q, k and v");
  std::vector<TensorType> swapped;
  for (size_t i = 0; i < 3; ++i) swapped.push_back(swap_seq_heads(*in[i]));
  TypeList views = in;
  for (size_t i = 0; i < 3; ++i) views[i] = &swapped[i];
  std::vector<TensorType> out = infer_bhsd(views, a);
  out[0] = swap_seq_heads(out[0]);
  return out;
}

namespace {

std::vector<TensorType> infer_bhsd(const TypeList& in, const Attrs& a) {
  const TensorType& q = *in[0];
  const TensorType& k = *in[1];
  const TensorType& v = *in[2];
  const TensorType* mask = in.size() > 3 ? in[3] : nullptr;

  KILN_CHECK(is_floating(q.dtype), kInvalidArgument, "sdpa: q must be floating, got ", q.to_string());
  KILN_CHECK(k.dtype == q.dtype && v.dtype == q.dtype, kInvalidArgument, "sdpa: q ", q.to_string(), ", k ",
             k.to_string(), " and v ", v.to_string(), " must have one dtype");
  KILN_CHECK(q.rank() >= 2 && k.rank() >= 2 && v.rank() >= 2, kShapeMismatch,
             "sdpa: q, k and v need rank >= 2, got ", q.to_string(), ", ", k.to_string(), ", ", v.to_string());
  const int64_t L = q.dims[size_t(q.rank() - 2)].extent, E = q.dims.back().extent;
  const int64_t S = k.dims[size_t(k.rank() - 2)].extent;
  KILN_CHECK(k.dims.back().extent == E, kShapeMismatch, "sdpa: q ", q.to_string(), " and k ", k.to_string(),
             " differ in the embedding dim (", E, " vs ", k.dims.back().extent, ")");
  KILN_CHECK(v.dims[size_t(v.rank() - 2)].extent == S, kShapeMismatch, "sdpa: k ", k.to_string(), " and v ",
             v.to_string(), " differ in the sequence dim (", S, " vs ", v.dims[size_t(v.rank() - 2)].extent, ")");

  if (a.has("causal"))
    KILN_CHECK(std::holds_alternative<bool>(a.items().at("causal")), kInvalidArgument,
               "sdpa: attribute 'causal' must be a bool");
  if (a.has("scale")) {
    const AttrValue& s = a.items().at("scale");
    KILN_CHECK(std::holds_alternative<double>(s) || std::holds_alternative<int64_t>(s), kInvalidArgument,
               "sdpa: attribute 'scale' must be a float");
  }

  TensorType out;
  out.dtype = q.dtype;
  out.dims = broadcast_batch(broadcast_batch(batch_of(q), batch_of(k), q, k), batch_of(v), q, v);
  out.dims.push_back(q.dims[size_t(q.rank() - 2)]);
  out.dims.push_back(v.dims.back());

  if (mask) {
    KILN_CHECK(mask->dtype == DType::kBool || mask->dtype == q.dtype, kInvalidArgument, "sdpa: mask ",
               mask->to_string(), " must be bool or of q's dtype ", dtype_name(q.dtype));
    // The scores' shape [..., L, S]: the mask broadcasts to it.
    std::vector<int64_t> scores;
    for (size_t i = 0; i + 2 < out.dims.size(); ++i) scores.push_back(out.dims[i].extent);
    scores.push_back(L);
    scores.push_back(S);
    bool ok = mask->rank() <= int64_t(scores.size());
    for (int64_t i = 1; ok && i <= mask->rank(); ++i) {
      int64_t m = mask->dims[size_t(mask->rank() - i)].extent, t = scores[scores.size() - size_t(i)];
      ok = m == t || m == 1;
    }
    TensorType st(q.dtype, scores);
    KILN_CHECK(ok, kShapeMismatch, "sdpa: mask ", mask->to_string(), " does not broadcast to the scores' shape ",
               st.to_string().substr(std::string(dtype_name(q.dtype)).size()));
  }
  return {out};
}

}  // namespace

}  // namespace kiln
