// Shape rules of the reduce family.
//
// reduce_sum / _mean / _max / _min / _var (x) {axes: ints (empty = all), keepdim: bool}: the
// reduced dims are dropped (or kept as 1 with keepdim). Axes are non-negative, in range and
// distinct. reduce_var also takes {correction: float} (default 1, Bessel's). reduce_sum and
// reduce_mean of a floating x take {square: bool} (default false): they reduce x * x, each square
// formed in the accumulator's precision (RMSNorm's mean of squares, an L2 norm's sum, read in one
// pass). argmax (x) {axis: int, keepdim: bool} gives i64 indices.
//
// Dtypes: sum, max and min take floating or integer tensors (max / min also bool: any / all);
// mean and var floating only (PyTorch refuses integer means); argmax any dtype. The output
// keeps x's dtype. max, min and argmax refuse an empty reduced dim (no identity to return).
#include <algorithm>

#include "src/ops/pointwise.h"
#include "src/ops/shape_rules.h"

namespace kiln {

namespace {

void check_axis(OpKind op, int64_t axis, const TensorType& x) {
  KILN_CHECK(axis >= 0 && axis < x.rank(), kInvalidArgument, op_name(op), ": axis ", axis, " out of range for ",
             x.to_string(), " (axes are non-negative, below the rank ", x.rank(), ")");
}

TensorType reduced_type(const TensorType& x, const std::vector<char>& reduced, bool keepdim, DType dt) {
  TensorType out;
  out.dtype = dt;
  for (size_t d = 0; d < x.dims.size(); ++d) {
    if (!reduced[d]) {
      out.dims.push_back(x.dims[d]);
    } else if (keepdim) {
      out.dims.push_back(Dim{});
      out.dims.back().extent = 1;
    }
  }
  return out;
}

}  // namespace

std::vector<TensorType> infer_reduce(OpKind op, const TypeList& in, const Attrs& a) {
  KILN_CHECK(op_info(op).family == OpFamily::kReduce, kInternal, op_name(op), " is not a reduce op");
  const TensorType& x = *in[0];
  const bool keepdim = pw::read_attrs(op, [&] { return a.get_bool("keepdim", false); });
  std::vector<char> reduced(x.dims.size(), 0);
  if (op == OpKind::kArgmax) {
    const int64_t axis = pw::read_attrs(op, [&] { return a.get_int("axis"); });
    check_axis(op, axis, x);
    reduced[size_t(axis)] = 1;
  } else {
    const std::vector<int64_t> axes = pw::read_attrs(op, [&] { return a.get_ints("axes", {}); });
    for (int64_t axis : axes) {
      check_axis(op, axis, x);
      KILN_CHECK(!reduced[size_t(axis)], kInvalidArgument, op_name(op), ": axis ", axis, " given twice");
      reduced[size_t(axis)] = 1;
    }
    if (axes.empty()) std::fill(reduced.begin(), reduced.end(), 1);
  }
  if (op == OpKind::kReduceVar) pw::read_attrs(op, [&] { return a.get_float("correction", 1.0); });
  if (pw::read_attrs(op, [&] { return a.get_bool("square", false); }))
    KILN_CHECK((op == OpKind::kReduceSum || op == OpKind::kReduceMean) && is_floating(x.dtype), kInvalidArgument,
               op_name(op), ": 'square' is taken by reduce_sum and reduce_mean of a floating x, not by ", op_name(op),
               " of ", x.to_string());

  const DType dt = x.dtype;
  switch (op) {
    case OpKind::kReduceMean:
    case OpKind::kReduceVar:
      KILN_CHECK(is_floating(dt), kInvalidArgument, op_name(op), ": x must be floating, got ", x.to_string());
      break;
    case OpKind::kReduceSum:
      KILN_CHECK(is_floating(dt) || is_integral(dt), kInvalidArgument, op_name(op),
                 ": x must be floating or integer, got ", x.to_string());
      break;
    default: break;  // max, min, argmax: every dtype
  }
  if (op == OpKind::kReduceMax || op == OpKind::kReduceMin || op == OpKind::kArgmax) {
    for (size_t d = 0; d < x.dims.size(); ++d)
      KILN_CHECK(!reduced[d] || x.dims[d].extent > 0, kShapeMismatch, op_name(op), ": cannot reduce ",
                 x.to_string(), " over its empty dim ", d);
  }
  return {reduced_type(x, reduced, keepdim, op == OpKind::kArgmax ? DType::kI64 : dt)};
}

}  // namespace kiln
