// Shape rules of the binary family: numpy broadcasting of a and b, which share one dtype
// (importers insert the casts PyTorch's type promotion implies).
//
// Dtypes: add, sub, mul, div, maximum, minimum take floating or integer tensors; pow floating
// only; comparisons (eq..ge) take any dtype and give bool; logical_and / logical_or take and
// give bool. Broadcasting keeps symbolic dims (pw::broadcast_dims).
#include "src/ops/pointwise.h"
#include "src/ops/shape_rules.h"

namespace kiln {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  out += ']';
  return out;
}

bool is_comparison(OpKind op) {
  return op == OpKind::kEq || op == OpKind::kNe || op == OpKind::kLt || op == OpKind::kLe || op == OpKind::kGt ||
         op == OpKind::kGe;
}

}  // namespace

std::vector<int64_t> broadcast_shapes(OpKind op, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const size_t r = std::max(a.size(), b.size());
  std::vector<int64_t> out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    KILN_CHECK(da == db || da == 1 || db == 1, kShapeMismatch, op_name(op), ": shapes ", shape_str(a), " and ",
               shape_str(b), " do not broadcast (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

bool broadcasts_to(const std::vector<int64_t>& small, const std::vector<int64_t>& big) {
  if (small.size() > big.size()) return false;
  const size_t lead = big.size() - small.size();
  for (size_t i = 0; i < small.size(); ++i)
    if (small[i] != 1 && small[i] != big[lead + i]) return false;
  return true;
}

std::vector<TensorType> infer_binary(OpKind op, const TypeList& in, const Attrs&) {
  KILN_CHECK(op_info(op).family == OpFamily::kBinary, kInternal, op_name(op), " is not a binary op");
  const TensorType& a = *in[0];
  const TensorType& b = *in[1];
  KILN_CHECK(a.dtype == b.dtype, kInvalidArgument, op_name(op), ": a ", a.to_string(), " and b ", b.to_string(),
             " must have one dtype (cast one of them first)");
  const bool logical = op == OpKind::kLogicalAnd || op == OpKind::kLogicalOr;
  if (logical) {
    KILN_CHECK(a.dtype == DType::kBool, kInvalidArgument, op_name(op), ": inputs must be bool, got ", a.to_string());
  } else if (op == OpKind::kPow) {
    KILN_CHECK(is_floating(a.dtype), kInvalidArgument, op_name(op), ": inputs must be floating, got ", a.to_string());
  } else if (!is_comparison(op)) {
    KILN_CHECK(is_floating(a.dtype) || is_integral(a.dtype), kInvalidArgument, op_name(op),
               ": inputs must be floating or integer, got ", a.to_string());
  }
  TensorType out;
  out.dtype = logical || is_comparison(op) ? DType::kBool : a.dtype;
  out.dims = pw::broadcast_dims(op, a, b);
  return {out};
}

}  // namespace kiln
