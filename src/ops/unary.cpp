// Shape rules of the unary family: y has x's shape and dtype.
//
// Dtypes: logical_not takes and gives bool; relu, abs, neg, clamp and sign take floating or
// integer tensors; every other unary op is floating only (their math is defined on reals, and an
// importer that meets an integer input casts it first, as PyTorch promotes). Attributes are
// validated here through pw::UnaryParams, the same parser the kernels use.
#include "src/ops/pointwise.h"
#include "src/ops/shape_rules.h"

namespace kiln {

std::vector<TensorType> infer_unary(OpKind op, const TypeList& in, const Attrs& a) {
  KILN_CHECK(op_info(op).family == OpFamily::kUnary, kInternal, op_name(op), " is not a unary op");
  const TensorType& x = *in[0];
  pw::UnaryParams::from(op, a);
  if (op == OpKind::kLogicalNot) {
    KILN_CHECK(x.dtype == DType::kBool, kInvalidArgument, op_name(op), ": x must be bool, got ", x.to_string());
    return {x};
  }
  const bool takes_int =
      op == OpKind::kRelu || op == OpKind::kAbs || op == OpKind::kNeg || op == OpKind::kClamp || op == OpKind::kSign;
  KILN_CHECK(is_floating(x.dtype) || (takes_int && is_integral(x.dtype)), kInvalidArgument, op_name(op),
             ": x must be ", takes_int ? "floating or integer" : "floating", ", got ", x.to_string());
  return {x};
}

}  // namespace kiln
