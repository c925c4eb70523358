// Shape rule of sdpa (scaled dot-product attention, torch.nn.functional.
// scaled_dot_product_attention): q[..., L, E], k[..., S, E], v[..., S, Ev] -> [..., L, Ev].
//
// The batch dims of q, k and v broadcast (numpy rules, symbols kept). The optional mask is
// bool (true = attend) or of q's dtype (added to the scores) and must broadcast to
// [..., L, S] without growing it. Attributes: causal (bool, default false; may be combined
// with a mask), scale (float, default 1/sqrt(E)), layout (string, default "bhsd") and the
// operand views below.
//
// layout = "bshd" (set by the fold_attention_layout pass) keeps the heads inside the rows, as
// a linear's output viewed [B, S, H, D] has them: q [B, L, H, E], k [B, S, H, E],
// v [B, S, H, Ev] -> [B, L, H, Ev], attention per (B, H); rank 4 exactly, B and H broadcast as
// batch dims do. The mask is unchanged: it still broadcasts to the scores [B, H, L, S]. The
// rule is the "bhsd" rule on the operands with dims 1 and 2 swapped, its output swapped back.
//
// Operand views (set by fold_attention_layout where a head split is a chain of reshape,
// permute and slice nodes, as torchvision's MultiheadAttention writes it): q_view, k_view and
// v_view, each an int list [offset, size0, stride0, size1, stride1, ...], say that the
// operand's logical tensor (sizes [..., S, D], rank >= 2) is element offset + sum(i_k stride_k)
// of the input buffer, which is any tensor of the operand's dtype (several views may read one
// buffer: q, k and v of one qkv linear). Strides are >= 0, the head dim's is 1, and every
// element a non-empty view reaches lies inside the buffer. An operand without a view is its
// input, as in the default layout. out_perm (a permutation of the output's logical dims that
// keeps the head dim last) makes the output tensor permute(logical output, out_perm), dense:
// [2, 0, 1, 3] writes [L, B, H, Ev] for a [B, H, L, Ev] result. The mask always indexes the
// logical scores. Views and layout "bshd" exclude each other; internally "bshd" is the views
// it implies (sdpa_layout), so backends handle one description.
#include <algorithm>
#include <utility>
#include <variant>

#include "src/ops/access.h"
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

namespace {

const char* const kViewKeys[3] = {"q_view", "k_view", "v_view"};
const char* const kOperands[3] = {"q", "k", "v"};

bool has_views(const Attrs& a) {
  return a.has("q_view") || a.has("k_view") || a.has("v_view") || a.has("out_perm");
}

const std::vector<int64_t>& ints_attr(const Attrs& a, const char* key) {
  const auto* v = std::get_if<std::vector<int64_t>>(&a.items().at(key));
  KILN_CHECK(v != nullptr, kInvalidArgument, "sdpa: attribute '", key, "' must be a list of ints");
  return *v;
}

// A [B, S, H, D] buffer read as [B, H, S, D].
SdpaView bshd_view(const TensorType& t) {
  SdpaView v = dense_view(t);
  v.logical = swap_seq_heads(t);
  std::swap(v.strides[1], v.strides[2]);
  return v;
}

// Operand i's view attribute over its input buffer `t`; the head dim is read contiguously.
SdpaView parse_view(const Attrs& a, size_t i, const TensorType& t) {
  SdpaView v = parse_operand_view(OpKind::kSdpa, a, kViewKeys[i], kOperands[i], t, 2);
  KILN_CHECK(v.strides.back() == 1, kInvalidArgument, "sdpa: attribute '", kViewKeys[i], "' ",
             list_str(ints_attr(a, kViewKeys[i])), ": the head dim must be contiguous (stride 1), got stride ",
             v.strides.back());
  return v;
}

}  // namespace

SdpaLayout sdpa_layout(const TypeList& in, const Attrs& a) {
  KILN_CHECK(in.size() >= 3 && in[0] && in[1] && in[2], kInvalidArgument, "sdpa: needs q, k and v");
  const bool bshd = sdpa_bshd(a);
  KILN_CHECK(!(bshd && has_views(a)), kInvalidArgument,
             "sdpa: layout \"bshd\" and the operand views (q_view, k_view, v_view, out_perm) exclude each other");
  SdpaLayout l;
  SdpaView* views[3] = {&l.q, &l.k, &l.v};
  TypeList logical = in;
  for (size_t i = 0; i < 3; ++i) {
    *views[i] = bshd ? bshd_view(*in[i]) : a.has(kViewKeys[i]) ? parse_view(a, i, *in[i]) : dense_view(*in[i]);
    logical[i] = &views[i]->logical;
  }
  const TensorType y = infer_bhsd(logical, a)[0];
  l.out_perm = bshd ? std::vector<int64_t>{0, 2, 1, 3} : out_perm_attr(OpKind::kSdpa, a, y.rank(), "head dim");
  l.out = permuted_output(y, l.out_perm);
  return l;
}

std::vector<TensorType> infer_attention(OpKind op, const TypeList& in, const Attrs& a) {
  KILN_CHECK(op == OpKind::kSdpa, kInternal, op_name(op), " is not in the attention family");
  const SdpaLayout l = sdpa_layout(in, a);
  return {placed_type(l.out.logical, l.out_perm)};
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
