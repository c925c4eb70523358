// Shape rules of the gather family: gather (torch.gather) and index_select.
//
//   gather (x, index) {axis, broadcast}: out[i...] = x[i... with i_axis := index[i...]]; index
//     has the rank of x and, in every other dim, an extent <= x's; out has index's shape, x's
//     dtype. In the dims listed in `broadcast` (optional, never axis) index has extent 1 and is
//     read broadcast: out takes x's extent there (torch.gather of an expanded index).
//   index_select (x, index[K]) {axis}: out = x with dim `axis` replaced by K.
//
// Index values are data, so their range is checked by the kernels (negative values count
// from the end, as in PyTorch). Output dims taken from x or index keep their symbols.
#include <variant>

#include "src/ops/shape_rules.h"

namespace kiln {

namespace {

int64_t axis_attr(OpKind op, const Attrs& a, const TensorType& x) {
  KILN_CHECK(a.has("axis"), kInvalidArgument, op_name(op), ": missing attribute 'axis'");
  const int64_t* axis = std::get_if<int64_t>(&a.items().at("axis"));
  KILN_CHECK(axis != nullptr, kInvalidArgument, op_name(op), ": attribute 'axis' must be an int");
  KILN_CHECK(*axis >= 0 && *axis < x.rank(), kInvalidArgument, op_name(op), ": axis ", *axis, " out of range [0, ",
             x.rank(), ") for x ", x.to_string());
  return *axis;
}

}  // namespace

std::vector<TensorType> infer_gather(OpKind op, const TypeList& in, const Attrs& a) {
  KILN_CHECK(op == OpKind::kGather || op == OpKind::kIndexSelect, kInternal, op_name(op),
             " is not in the gather family");
  const TensorType& x = *in[0];
  const TensorType& index = *in[1];
  KILN_CHECK(index.dtype == DType::kI64 || index.dtype == DType::kI32, kInvalidArgument, op_name(op),
             ": index must be i64 or i32, got ", index.to_string());
  const int64_t axis = axis_attr(op, a, x);

  if (op == OpKind::kIndexSelect) {
    KILN_CHECK(index.rank() == 1, kShapeMismatch, op_name(op), ": index must be 1-D, got ", index.to_string());
    TensorType out = x;
    out.dims[size_t(axis)] = index.dims[0];
    return {out};
  }

  KILN_CHECK(index.rank() == x.rank(), kShapeMismatch, op_name(op), ": index ", index.to_string(),
             " must have the rank of x ", x.to_string());
  for (int64_t d = 0; d < x.rank(); ++d)
    KILN_CHECK(d == axis || index.dims[size_t(d)].extent <= x.dims[size_t(d)].extent, kShapeMismatch, op_name(op),
               ": index ", index.to_string(), " is larger than x ", x.to_string(), " in dim ", d,
               " (only axis ", axis, " may be larger)");
  TensorType out = with_dtype(index, x.dtype);
  for (int64_t d : a.get_ints("broadcast", {})) {
    KILN_CHECK(d >= 0 && d < x.rank() && d != axis, kInvalidArgument, op_name(op), ": broadcast dim ", d,
               " must be a dim of x ", x.to_string(), " other than axis ", axis);
    KILN_CHECK(index.dims[size_t(d)].extent == 1, kShapeMismatch, op_name(op), ": index ", index.to_string(),
               " must have extent 1 in broadcast dim ", d);
    out.dims[size_t(d)] = x.dims[size_t(d)];
  }
  return {out};
}

}  // namespace kiln
