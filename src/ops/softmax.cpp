// Shape rules of softmax and log_softmax (x) {axis: int}: y has x's type; x is floating and
// the axis non-negative and below the rank.
#include "src/ops/pointwise.h"
#include "src/ops/shape_rules.h"

namespace kiln {

std::vector<TensorType> infer_softmax(OpKind op, const TypeList& in, const Attrs& a) {
  KILN_CHECK(op_info(op).family == OpFamily::kSoftmax, kInternal, op_name(op), " is not a softmax op");
  const TensorType& x = *in[0];
  const int64_t axis = pw::read_attrs(op, [&] { return a.get_int("axis"); });
  KILN_CHECK(is_floating(x.dtype), kInvalidArgument, op_name(op), ": x must be floating, got ", x.to_string());
  KILN_CHECK(axis >= 0 && axis < x.rank(), kInvalidArgument, op_name(op), ": axis ", axis, " out of range for ",
             x.to_string(), " (axes are non-negative, below the rank ", x.rank(), ")");
  return {x};
}

}  // namespace kiln
