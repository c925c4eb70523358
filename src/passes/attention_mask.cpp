// simplify_attention_masks: an sdpa mask that is logical_and(all true, m) reads m.
// causal_attention_masks: an sdpa whose mask is a causal pattern becomes causal, unmasked; one
// whose mask is logical_and(causal pattern, m) becomes causal, masked by m (below).
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
// In a dynamic program's block the index comparisons stay nodes (their aranges have the sizes of
// the range: fold_constants leaves them), so the all-true side is also recognized as what it is
// there: a comparison that holds for every element given lower bounds of its operands that
// follow from the ops alone (an ascending arange starts at its start; adding constants, views
// and broadcasts keep a bound), such as transformers' `q_idx >= 0`. No bound uses an arange's
// end, so the answer is the same at every size of the range (kiln/size_program.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "kiln/passes.h"
#include "src/ops/shape_rules.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

// Bounds every element of a value is known to lie within (either side may be unknown).
struct Bounds {
  std::optional<double> lo, hi;
};

// Constants larger than this are not scanned for their bounds.
constexpr int64_t kMaxBoundedConstant = int64_t(1) << 16;

class ValueBounds {
 public:
  explicit ValueBounds(const Graph& g) : g_(g) {}

  Bounds of(ValueId v) {
    auto [it, fresh] = memo_.try_emplace(v);
    if (fresh) it->second = compute(v);
    return it->second;
  }

  // Whether bool value `v` is true for every element: an all-true constant, a view or broadcast
  // of one, the and of two such, or a comparison the operands' bounds decide.
  bool all_true(ValueId v) {
    auto [it, fresh] = true_memo_.try_emplace(v, false);
    if (fresh) it->second = compute_all_true(v);
    return it->second;
  }

 private:
  bool compute_all_true(ValueId v) {
    const Value& val = g_.value(v);
    if (val.type.dtype != DType::kBool) return false;
    if (val.is_constant()) {
      for (uint8_t b : *val.data)
        if (b == 0) return false;
      return true;
    }
    const Node* p = val.producer;
    if (p == nullptr) return false;
    switch (p->op) {
      case OpKind::kReshape:
      case OpKind::kExpand: return all_true(p->inputs[0]);
      case OpKind::kLogicalAnd: return all_true(p->inputs[0]) && all_true(p->inputs[1]);
      case OpKind::kGe:
      case OpKind::kGt:
      case OpKind::kLe:
      case OpKind::kLt: {
        // x >= y for every pair when x's least value is at least y's greatest; the others alike.
        const bool greater = p->op == OpKind::kGe || p->op == OpKind::kGt;
        const Bounds big = of(p->inputs[greater ? 0 : 1]), small = of(p->inputs[greater ? 1 : 0]);
        if (!big.lo || !small.hi) return false;
        return p->op == OpKind::kGe || p->op == OpKind::kLe ? *big.lo >= *small.hi : *big.lo > *small.hi;
      }
      default: return false;
    }
  }

  Bounds compute(ValueId v) {
    const Value& val = g_.value(v);
    if (val.is_constant()) {
      const int64_t n = val.type.numel();
      if (n == 0 || n > kMaxBoundedConstant) return {};
      const std::vector<double> xs = passes::constant_as_doubles(g_, v);
      if (std::any_of(xs.begin(), xs.end(), [](double x) { return std::isnan(x); })) return {};
      const auto [lo, hi] = std::minmax_element(xs.begin(), xs.end());
      return {*lo, *hi};
    }
    const Node* p = val.producer;
    if (p == nullptr || p->outputs.size() != 1) return {};
    switch (p->op) {
      case OpKind::kArange: {  // never the end: it may be a size of the range
        const double start = p->attrs.get_float("start"), step = p->attrs.get_float("step");
        if (step > 0) return {start, std::nullopt};
        if (step < 0) return {std::nullopt, start};
        return {};
      }
      case OpKind::kReshape:
      case OpKind::kExpand:
      case OpKind::kPermute:
      case OpKind::kSlice: return of(p->inputs[0]);
      case OpKind::kAdd: {
        const Bounds a = of(p->inputs[0]), b = of(p->inputs[1]);
        return {a.lo && b.lo ? std::optional(*a.lo + *b.lo) : std::nullopt,
                a.hi && b.hi ? std::optional(*a.hi + *b.hi) : std::nullopt};
      }
      case OpKind::kSub: {
        const Bounds a = of(p->inputs[0]), b = of(p->inputs[1]);
        return {a.lo && b.hi ? std::optional(*a.lo - *b.hi) : std::nullopt,
                a.hi && b.lo ? std::optional(*a.hi - *b.lo) : std::nullopt};
      }
      default: return {};
    }
  }

  const Graph& g_;
  std::map<ValueId, Bounds> memo_;
  std::map<ValueId, bool> true_memo_;
};

// Where `mask` is logical_and(c, m) (either order) with `part(c)` and m a bool that broadcasts
// to the scores (the mask's own shape, which the shape rule broadcast to them): m. Else kNoValue.
template <typename Part>
ValueId and_rest(const Graph& g, ValueId mask, Part&& part) {
  const Node* a = g.value(mask).producer;
  if (a == nullptr || a->op != OpKind::kLogicalAnd) return kNoValue;
  const std::vector<int64_t> scores = g.type(mask).shape();
  for (int i = 0; i < 2; ++i) {
    const ValueId c = a->inputs[size_t(i)], m = a->inputs[size_t(1 - i)];
    if (part(c) && g.type(m).dtype == DType::kBool && broadcasts_to(g.type(m).shape(), scores)) return m;
  }
  return kNoValue;
}

// Replaces the sdpa node at `pos` by one reading `mask`.
void set_mask(Graph& g, size_t pos, ValueId mask) {
  const Node& n = *g.nodes()[pos];
  std::vector<ValueId> ins = n.inputs;
  ins[3] = mask;
  passes::replace_node(g, pos, OpKind::kSdpa, ins, n.attrs);
}

}  // namespace

bool simplify_attention_masks(Graph& g) {
  bool changed = false;
  ValueBounds bounds(g);  // set_mask leaves every value it has seen as it was
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
    const Node& n = *g.nodes()[pos];
    if (n.op != OpKind::kSdpa || n.inputs.size() < 4 || n.inputs[3] == kNoValue) continue;
    const ValueId keep = and_rest(g, n.inputs[3], [&](ValueId c) { return bounds.all_true(c); });
    if (keep == kNoValue) continue;
    set_mask(g, pos, keep);
    changed = true;
  }
  if (changed) eliminate_dead_code(g);
  return changed;
}

namespace {

// Whether constant `mask` (bool, or additive in a floating dtype) says, in every slice its batch
// dims hold, exactly what causal attention over [L, S] scores does: query i sees key j iff
// j <= i. An additive mask keeps with 0 and drops with -inf or its dtype's lowest finite value
// (what transformers fill with); any other value is no causal pattern.
bool is_causal_mask(const Graph& g, ValueId mask, int64_t L, int64_t S) {
  const Value& val = g.value(mask);
  const TensorType& t = val.type;
  if (!val.is_constant() || !val.data || t.rank() < 2 || !passes::all_static(t) ||
      t.dims[size_t(t.rank() - 2)].extent != L || t.dims.back().extent != S)
    return false;
  const bool is_bool = t.dtype == DType::kBool;
  if (!is_bool && !is_floating(t.dtype)) return false;
  const double lowest = t.dtype == DType::kF16    ? -65504.0
                        : t.dtype == DType::kBF16 ? -3.3895313892515355e38
                        : t.dtype == DType::kF32  ? double(std::numeric_limits<float>::lowest())
                                                  : std::numeric_limits<double>::lowest();
  const int64_t n = t.numel();
  for (int64_t e = 0; e < n; ++e) {
    const int64_t j = e % S, i = (e / S) % L;
    const double x = load_as_double(val.data->data(), t.dtype, e);
    const bool keep = j <= i;
    const bool ok = is_bool ? (x != 0.0) == keep : keep ? x == 0.0 : (x == lowest || x == -HUGE_VAL);
    if (!ok) return false;
  }
  return true;
}

// A value whose element at index i of one dim is offset + i, the same along every other dim:
// that dim counted from the end (0: the last), and the offset.
struct IndexRange {
  int from_end = 0;
  double offset = 0;
};

// The dim of a shape that is not 1 (counted from the end), where exactly one is.
std::optional<int> only_long_dim(const std::vector<int64_t>& shape) {
  std::optional<int> found;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (found) return std::nullopt;
    found = int(shape.size() - 1 - d);
  }
  return found;
}

// `v` as an IndexRange where its producers say it is one: an arange of step 1, a scalar constant
// added or subtracted, a reshape that only moves the one long dim among dims of 1, a broadcast of
// the other dims. Sizes never enter, so the answer is the same at every size of a dynamic range.
std::optional<IndexRange> index_range(const Graph& g, ValueId v) {
  const Node* p = g.value(v).producer;
  if (p == nullptr || p->outputs.size() != 1) return std::nullopt;
  auto scalar = [&](ValueId c) -> std::optional<double> {
    const Value& val = g.value(c);
    if (!val.is_constant() || val.type.numel() != 1) return std::nullopt;
    return passes::constant_as_doubles(g, c)[0];
  };
  switch (p->op) {
    case OpKind::kArange:
      if (p->attrs.get_float("step") != 1.0) return std::nullopt;
      return IndexRange{0, p->attrs.get_float("start")};
    case OpKind::kAdd:
    case OpKind::kSub:
      for (int side = 0; side < 2; ++side) {
        if (p->op == OpKind::kSub && side == 1) break;  // c - x counts down
        const std::optional<double> c = scalar(p->inputs[size_t(1 - side)]);
        std::optional<IndexRange> r = c ? index_range(g, p->inputs[size_t(side)]) : std::nullopt;
        if (!r) continue;
        r->offset += p->op == OpKind::kAdd ? *c : -*c;
        return r;
      }
      return std::nullopt;
    case OpKind::kReshape: {
      const std::optional<IndexRange> r = index_range(g, p->inputs[0]);
      const std::optional<int> before = only_long_dim(g.type(p->inputs[0]).shape()),
                               after = only_long_dim(g.type(v).shape());
      if (!r || !before || !after || *before != r->from_end) return std::nullopt;
      return IndexRange{*after, r->offset};
    }
    case OpKind::kExpand: {
      std::optional<IndexRange> r = index_range(g, p->inputs[0]);
      const std::vector<int64_t> in = g.type(p->inputs[0]).shape(), out = g.type(v).shape();
      if (!r || r->from_end >= int(in.size()) ||
          in[in.size() - 1 - size_t(r->from_end)] != out[out.size() - 1 - size_t(r->from_end)])
        return std::nullopt;
      return r;
    }
    default: return std::nullopt;
  }
}

// Whether bool `c` is the causal pattern over the scores' last two dims [L, S] (query i sees key j
// iff j <= i), the same for every batch slice: such a constant, the comparison kv_idx <= q_idx of
// index ranges of equal offset along the keys' and the queries' dims (how transformers builds it,
// left unfolded in a dynamic program's block), or one of those and-ed with something all true.
bool is_causal_part(const Graph& g, ValueBounds& bounds, ValueId c, int64_t L, int64_t S) {
  const TensorType& t = g.type(c);
  if (t.dtype != DType::kBool || t.rank() < 2 || t.dims[size_t(t.rank() - 2)].extent != L || t.dims.back().extent != S)
    return false;
  const Node* p = g.value(c).producer;
  if (p == nullptr) return is_causal_mask(g, c, L, S);
  if (p->op == OpKind::kLogicalAnd) {
    for (int i = 0; i < 2; ++i)
      if (bounds.all_true(p->inputs[size_t(1 - i)]) && is_causal_part(g, bounds, p->inputs[size_t(i)], L, S))
        return true;
    return false;
  }
  if (p->op != OpKind::kLe && p->op != OpKind::kGe) return false;
  // kv <= q, or q >= kv.
  const ValueId kv = p->inputs[p->op == OpKind::kLe ? 0 : 1], q = p->inputs[p->op == OpKind::kLe ? 1 : 0];
  const std::optional<IndexRange> j = index_range(g, kv), i = index_range(g, q);
  return j && i && j->from_end == 0 && i->from_end == 1 && j->offset == i->offset;
}

}  // namespace

// Transformers give decoders without a padding mask (and torch code that builds its own
// triangle) a folded constant mask of the causal pattern; as "causal" the kernels skip the
// blocks above the diagonal instead of reading a mask per score. With a padding mask the mask is
// the causal pattern and-ed with the padding rows: the sdpa becomes causal and reads the
// padding mask alone ([B, 1, 1, S] instead of [B, 1, L, S]), the same keep / drop decision
// for every score. In a dynamic program's block the pattern is the index comparison itself.
bool causal_attention_masks(Graph& g) {
  bool changed = false;
  ValueBounds bounds(g);
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
    const Node& n = *g.nodes()[pos];
    if (n.op != OpKind::kSdpa || n.inputs.size() < 4 || n.inputs[3] == kNoValue || n.attrs.get_bool("causal", false))
      continue;
    const TypeList types = {&g.type(n.inputs[0]), &g.type(n.inputs[1]), &g.type(n.inputs[2])};
    const SdpaLayout l = sdpa_layout(types, n.attrs);  // the logical q and k under any layout or views
    const TensorType &q = l.q.logical, &k = l.k.logical;
    if (!passes::all_static(q) || !passes::all_static(k)) continue;
    const int64_t L = q.dims[size_t(q.rank() - 2)].extent, S = k.dims[size_t(k.rank() - 2)].extent;
    const ValueId mask = n.inputs[3];
    std::vector<ValueId> ins(n.inputs.begin(), n.inputs.begin() + 3);
    if (!is_causal_mask(g, mask, L, S) && !is_causal_part(g, bounds, mask, L, S)) {
      // causal and m: the causal flag, and m as the mask.
      const ValueId m = and_rest(g, mask, [&](ValueId c) { return is_causal_part(g, bounds, c, L, S); });
      if (m == kNoValue) continue;
      ins.push_back(m);
    }
    Attrs attrs = n.attrs;
    attrs.set("causal", true);
    passes::replace_node(g, pos, OpKind::kSdpa, ins, attrs);
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
