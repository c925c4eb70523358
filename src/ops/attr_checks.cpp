// Attribute checks shared by the shape rules of several op families (see shape_rules.h).
#include <algorithm>
#include <cmath>
#include <string>
#include <variant>

#include "src/ops/access.h"
#include "src/ops/shape_rules.h"

namespace kiln {

std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s + "]";
}

std::vector<int64_t> spatial_attr(OpKind op, const Attrs& a, const char* key, size_t n,
                                  const std::vector<int64_t>& fallback, int64_t lo) {
  if (!a.has(key)) return fallback;
  const auto* v = std::get_if<std::vector<int64_t>>(&a.items().at(key));
  KILN_CHECK(v != nullptr, kInvalidArgument, op_name(op), ": attribute '", key, "' must be a list of ints");
  KILN_CHECK(v->size() == n, kInvalidArgument, op_name(op), ": attribute '", key, "' ", list_str(*v), " has ",
             v->size(), " values, expected ", n, " (one per spatial dim)");
  for (int64_t x : *v)
    KILN_CHECK(x >= lo, kInvalidArgument, op_name(op), ": attribute '", key, "' ", list_str(*v),
               " must have every value >= ", lo);
  return *v;
}

bool OperandView::dense() const {
  if (offset != 0) return false;
  const std::vector<int64_t> shape = logical.shape();
  const std::vector<int64_t> st = row_major_strides(shape);
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] != 1 && strides[i] != st[i]) return false;
  return true;
}

OperandView dense_view(const TensorType& t) {
  OperandView v;
  v.logical = t;
  v.strides = row_major_strides(t.shape());
  return v;
}

OperandView parse_operand_view(OpKind op, const Attrs& a, const char* key, const char* operand, const TensorType& t,
                               size_t min_rank) {
  const char* name = op_name(op);
  const auto* attr = std::get_if<std::vector<int64_t>>(&a.items().at(key));
  KILN_CHECK(attr != nullptr, kInvalidArgument, name, ": attribute '", key, "' must be a list of ints");
  const std::string text = list_str(*attr);
  KILN_CHECK(attr->size() >= 2 * min_rank + 1 && attr->size() % 2 == 1, kInvalidArgument, name, ": attribute '", key,
             "' ", text, " must be [offset, size0, stride0, size1, stride1, ...] for rank >= ", min_rank,
             " (an odd count >= ", 2 * min_rank + 1, ")");
  OperandView v;
  v.offset = (*attr)[0];
  std::vector<int64_t> sizes;
  for (size_t j = 1; j < attr->size(); j += 2) sizes.push_back((*attr)[j]), v.strides.push_back((*attr)[j + 1]);
  KILN_CHECK(v.offset >= 0, kInvalidArgument, name, ": attribute '", key, "' ", text, " has a negative offset");
  int64_t n = 1, last = v.offset;
  bool overflow = false;
  for (size_t d = 0; d < sizes.size(); ++d) {
    KILN_CHECK(sizes[d] >= 0 && v.strides[d] >= 0, kInvalidArgument, name, ": attribute '", key, "' ", text,
               " has a negative size or stride (dim ", d, ")");
    int64_t step = 0;
    overflow |= __builtin_mul_overflow(n, sizes[d], &n);
    if (sizes[d] > 0) {
      overflow |= __builtin_mul_overflow(sizes[d] - 1, v.strides[d], &step);
      overflow |= __builtin_add_overflow(last, step, &last);
    }
  }
  KILN_CHECK(!overflow, kInvalidArgument, name, ": attribute '", key, "' ", text, " overflows int64");
  const int64_t have = t.numel();
  if (n > 0)
    KILN_CHECK(last < have, kShapeMismatch, name, ": ", operand, " view ", key, "=", text, " reaches element ", last,
               " of its input ", t.to_string(), ", which has ", have, " elements");
  else
    KILN_CHECK(v.offset <= have, kShapeMismatch, name, ": ", operand, " view ", key, "=", text,
               " starts past the end of its input ", t.to_string());
  v.logical = TensorType(t.dtype, sizes);
  return v;
}

std::string input_view_key(size_t i) { return "view" + std::to_string(i); }

bool reads_input_views(OpKind op) { return op == OpKind::kFusedPointwise || op == OpKind::kConcat; }

OperandView input_view(OpKind op, const Attrs& a, size_t i, const TensorType& buffer) {
  const std::string key = input_view_key(i);
  if (!a.has(key)) return dense_view(buffer);
  KILN_CHECK(reads_input_views(op), kInvalidArgument, op_name(op), ": attribute '", key, "' (a view of input ", i,
             ") is taken by fused_pointwise and concat only");
  const std::string operand = "input " + std::to_string(i);
  return parse_operand_view(op, a, key.c_str(), operand.c_str(), buffer, 0);
}

std::vector<int64_t> out_perm_attr(OpKind op, const Attrs& a, int64_t rank, const char* last) {
  std::vector<int64_t> perm(static_cast<size_t>(rank));
  for (int64_t i = 0; i < rank; ++i) perm[size_t(i)] = i;
  if (!a.has("out_perm")) return perm;
  const auto* p = std::get_if<std::vector<int64_t>>(&a.items().at("out_perm"));
  KILN_CHECK(p != nullptr, kInvalidArgument, op_name(op), ": attribute 'out_perm' must be a list of ints");
  std::vector<bool> seen(size_t(rank), false);
  bool ok = int64_t(p->size()) == rank && p->back() == rank - 1;
  for (size_t i = 0; ok && i < p->size(); ++i) {
    ok = (*p)[i] >= 0 && (*p)[i] < rank && !seen[size_t((*p)[i])];
    if (ok) seen[size_t((*p)[i])] = true;
  }
  KILN_CHECK(ok, kInvalidArgument, op_name(op), ": attribute 'out_perm' ", list_str(*p),
             " must be a permutation of the ", rank, " output dims that keeps the ", last, " (", rank - 1, ") last");
  return *p;
}

OperandView permuted_output(const TensorType& logical, const std::vector<int64_t>& perm) {
  std::vector<int64_t> placed;
  for (int64_t p : perm) placed.push_back(logical.dims[size_t(p)].extent);
  const std::vector<int64_t> placed_strides = row_major_strides(placed);
  OperandView v;
  v.logical = logical;
  v.strides.assign(perm.size(), 0);
  for (size_t j = 0; j < perm.size(); ++j) v.strides[size_t(perm[j])] = placed_strides[j];
  return v;
}

TensorType placed_type(const TensorType& logical, const std::vector<int64_t>& perm) {
  TensorType y = logical;
  for (size_t j = 0; j < perm.size(); ++j) y.dims[j] = logical.dims[size_t(perm[j])];
  return y;
}

void check_fits(OpKind op, DType dt, double v, const char* what) {
  if (!is_integral(dt)) return;
  double lo = -9223372036854775808.0, hi = 9223372036854775807.0;
  if (dt == DType::kI32) lo = -2147483648.0, hi = 2147483647.0;
  if (dt == DType::kI8) lo = -128.0, hi = 127.0;
  if (dt == DType::kU8) lo = 0.0, hi = 255.0;
  const double t = std::trunc(v);
  KILN_CHECK(std::isfinite(v) && t >= lo && (dt == DType::kI64 ? t < hi : t <= hi), kInvalidArgument, op_name(op),
             ": ", what, " ", v, " cannot be converted to ", dtype_name(dt), " without overflow");
}

bool channels_last(OpKind op, const Attrs& a) {
  if (!a.has("layout")) return false;
  const auto* layout = std::get_if<std::string>(&a.items().at("layout"));
  KILN_CHECK(layout != nullptr, kInvalidArgument, op_name(op), ": attribute 'layout' must be a string");
  KILN_CHECK(*layout == "nchw" || *layout == "nhwc", kInvalidArgument, op_name(op),
             ": attribute 'layout' must be \"nchw\" or \"nhwc\", got \"", *layout, "\"");
  KILN_CHECK(*layout == "nchw" || op == OpKind::kConv || op == OpKind::kMaxPool || op == OpKind::kAvgPool ||
                 op == OpKind::kGroupNorm,
             kInvalidArgument, op_name(op),
             ": layout \"nhwc\" applies to conv, max_pool, avg_pool and group_norm only");
  return *layout == "nhwc";
}

TensorType channels_first_view(TensorType t) {
  KILN_CHECK(t.rank() == 4, kShapeMismatch, "a channels-last tensor is [N, H, W, C], got ", t.to_string());
  std::rotate(t.dims.begin() + 1, t.dims.end() - 1, t.dims.end());
  return t;
}

TensorType channels_last_view(TensorType t) {
  KILN_CHECK(t.rank() == 4, kShapeMismatch, "a channels-first tensor here is [N, C, H, W], got ", t.to_string());
  std::rotate(t.dims.begin() + 1, t.dims.begin() + 2, t.dims.end());
  return t;
}

}  // namespace kiln
