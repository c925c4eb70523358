// Shape rule of where(cond, a, b): the numpy broadcast of all three; cond is bool, a and b
// share a dtype, which the output takes.
#include "src/ops/pointwise.h"
#include "src/ops/shape_rules.h"

namespace kiln {

std::vector<TensorType> infer_where(OpKind op, const TypeList& in, const Attrs&) {
  KILN_CHECK(op == OpKind::kWhere, kInternal, op_name(op), " is not where");
  const TensorType& cond = *in[0];
  const TensorType& a = *in[1];
  const TensorType& b = *in[2];
  KILN_CHECK(cond.dtype == DType::kBool, kInvalidArgument, op_name(op), ": cond must be bool, got ", cond.to_string());
  KILN_CHECK(a.dtype == b.dtype, kInvalidArgument, op_name(op), ": a ", a.to_string(), " and b ", b.to_string(),
             " must have one dtype (cast one of them first)");
  TensorType ab;
  ab.dtype = a.dtype;
  ab.dims = pw::broadcast_dims(op, a, b);
  TensorType out = ab;
  out.dims = pw::broadcast_dims(op, cond, ab);
  return {out};
}

}  // namespace kiln
