// Attribute checks shared by the shape rules of several op families (see shape_rules.h).
#include <algorithm>
#include <cmath>
#include <string>
#include <variant>

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
