// Shape rules of the shape family: reshape, permute, expand, slice, concat, split, pad, copy.
//
// These ops only move data, so any dtype is accepted. The rules are strict about attributes
// (axes already normalized to [0, rank) by importers, reshape extents concrete), because the
// CPU kernels precompute their index arithmetic from the validated types and never recheck.
// An output dim that is the very same input dim (a permuted dim, a dim a slice, concat, split
// or pad leaves alone, every dim of copy) keeps its Dim, symbol and range included; new dims
// are static.
#include <cmath>
#include <string>
#include <variant>

#include "src/ops/checked.h"
#include "src/ops/shape_rules.h"

namespace kiln {

namespace {

const AttrValue& attr(OpKind op, const Attrs& a, const char* key) {
  KILN_CHECK(a.has(key), kInvalidArgument, op_name(op), ": missing attribute '", key, "'");
  return a.items().at(key);
}

int64_t int_attr(OpKind op, const Attrs& a, const char* key) {
  const int64_t* v = std::get_if<int64_t>(&attr(op, a, key));
  KILN_CHECK(v != nullptr, kInvalidArgument, op_name(op), ": attribute '", key, "' must be an int");
  return *v;
}

const std::vector<int64_t>& ints_attr(OpKind op, const Attrs& a, const char* key) {
  const auto* v = std::get_if<std::vector<int64_t>>(&attr(op, a, key));
  KILN_CHECK(v != nullptr, kInvalidArgument, op_name(op), ": attribute '", key, "' must be a list of ints");
  return *v;
}

int64_t axis_attr(OpKind op, const Attrs& a, const TensorType& x) {
  int64_t axis = int_attr(op, a, "axis");
  KILN_CHECK(axis >= 0 && axis < x.rank(), kInvalidArgument, op_name(op), ": axis ", axis, " out of range [0, ",
             x.rank(), ") for ", x.to_string());
  return axis;
}

Dim static_dim(int64_t extent) {
  Dim d;
  d.extent = extent;
  return d;
}

// Extents from an attribute: each >= 0, product representable.
void check_extents(OpKind op, const char* key, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) {
    KILN_CHECK(e >= 0, kInvalidArgument, op_name(op), ": attribute '", key, "' ", list_str(shape),
               " has a negative extent ", e, " (extents must be concrete and >= 0)");
    KILN_CHECK(!__builtin_mul_overflow(n, e, &n), kInvalidArgument, op_name(op), ": attribute '", key, "' ",
               list_str(shape), " has too many elements");
  }
}

TensorType infer_reshape(OpKind op, const TensorType& x, const Attrs& a) {
  const auto& shape = ints_attr(op, a, "shape");
  check_extents(op, "shape", shape);
  TensorType out(x.dtype, shape);
  KILN_CHECK(out.numel() == x.numel(), kShapeMismatch, op_name(op), ": cannot reshape ", x.to_string(), " (",
             x.numel(), " elements) to ", list_str(shape), " (", out.numel(), " elements)");
  // A leading run of unchanged extents is the same dims (row-major order is preserved).
  for (size_t i = 0; i < out.dims.size() && i < x.dims.size() && x.dims[i].extent == shape[i]; ++i)
    out.dims[i] = x.dims[i];
  return out;
}

// x read through `perm` (attribute `key`): dim i of the result is dim perm[i] of x.
TensorType permuted(OpKind op, const TensorType& x, const Attrs& a, const char* key) {
  const auto& perm = ints_attr(op, a, key);
  KILN_CHECK(int64_t(perm.size()) == x.rank(), kInvalidArgument, op_name(op), ": ", key, " ", list_str(perm), " has ",
             perm.size(), " entries, ", x.to_string(), " has rank ", x.rank());
  std::vector<bool> seen(perm.size(), false);
  TensorType out = x;
  for (size_t i = 0; i < perm.size(); ++i) {
    int64_t p = perm[i];
    KILN_CHECK(p >= 0 && p < x.rank() && !seen[size_t(p)], kInvalidArgument, op_name(op), ": ", key, " ",
               list_str(perm), " is not a permutation of 0..", x.rank() - 1);
    seen[size_t(p)] = true;
    out.dims[i] = x.dims[size_t(p)];
  }
  return out;
}

TensorType infer_expand(OpKind op, const TensorType& x, const Attrs& a) {
  const auto& shape = ints_attr(op, a, "shape");
  KILN_CHECK(int64_t(shape.size()) == x.rank(), kInvalidArgument, op_name(op), ": shape ", list_str(shape),
             " must have the rank of ", x.to_string(), " (importers add the leading unit dims)");
  check_extents(op, "shape", shape);
  TensorType out = x;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (x.dims[i].extent == shape[i]) continue;
    KILN_CHECK(x.dims[i].extent == 1, kShapeMismatch, op_name(op), ": cannot expand ", x.to_string(), " to ",
               list_str(shape), ": dim ", i, " is ", x.dims[i].extent, ", must be 1 or ", shape[i]);
    out.dims[i] = static_dim(shape[i]);
  }
  return out;
}

TensorType infer_slice(OpKind op, const TensorType& x, const Attrs& a) {
  const int64_t axis = axis_attr(op, a, x);
  const int64_t start = int_attr(op, a, "start"), end = int_attr(op, a, "end"), step = int_attr(op, a, "step");
  const int64_t dim = x.dims[size_t(axis)].extent;
  KILN_CHECK(0 <= start && start <= end && end <= dim, kInvalidArgument, op_name(op), ": start ", start, ", end ",
             end, " must satisfy 0 <= start <= end <= ", dim, " (axis ", axis, " of ", x.to_string(), ")");
  KILN_CHECK(step >= 1, kInvalidArgument, op_name(op), ": step ", step, " must be >= 1");
  TensorType out = x;
  // ceil((end - start) / step) without forming end - start + step - 1, which a huge step overflows.
  const int64_t span = end - start;
  if (!(start == 0 && end == dim && step == 1)) out.dims[size_t(axis)] = static_dim(span / step + (span % step != 0));
  return out;
}

TensorType infer_concat(OpKind op, const TypeList& in, const Attrs& a) {
  const TensorType& first = *in[0];
  KILN_CHECK(first.rank() >= 1, kShapeMismatch, op_name(op), ": inputs must have rank >= 1, got ", first.to_string());
  const int64_t axis = axis_attr(op, a, first);
  TensorType out = first;
  int64_t total = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    KILN_CHECK(in[i] != nullptr, kInvalidArgument, op_name(op), ": input ", i, " is absent");
    const TensorType& t = *in[i];
    KILN_CHECK(t.dtype == first.dtype, kInvalidArgument, op_name(op), ": input ", i, " ", t.to_string(),
               " must have the dtype of input 0 ", first.to_string());
    KILN_CHECK(t.rank() == first.rank(), kShapeMismatch, op_name(op), ": input ", i, " ", t.to_string(),
               " must have the rank of input 0 ", first.to_string());
    for (int64_t d = 0; d < t.rank(); ++d)
      KILN_CHECK(d == axis || t.dims[size_t(d)].extent == first.dims[size_t(d)].extent, kShapeMismatch,
                 op_name(op), ": input ", i, " ", t.to_string(), " differs from input 0 ", first.to_string(),
                 " in dim ", d, " (only axis ", axis, " may differ)");
    total = Checked(op, "the concatenated extent").add(total, t.dims[size_t(axis)].extent);
  }
  if (in.size() > 1) out.dims[size_t(axis)] = static_dim(total);
  return out;
}

std::vector<TensorType> infer_split(OpKind op, const TensorType& x, const Attrs& a) {
  const int64_t axis = axis_attr(op, a, x);
  const auto& sizes = ints_attr(op, a, "sizes");
  KILN_CHECK(!sizes.empty(), kInvalidArgument, op_name(op), ": attribute 'sizes' is empty");
  for (int64_t s : sizes)
    KILN_CHECK(s >= 0, kInvalidArgument, op_name(op), ": sizes ", list_str(sizes), " has a negative entry ", s);
  int64_t sum = 0;
  for (int64_t s : sizes) {
    sum = Checked(op, "the sum of 'sizes'").add(sum, s);
    KILN_CHECK(sum <= x.dims[size_t(axis)].extent, kShapeMismatch, op_name(op), ": sizes ", list_str(sizes),
               " exceed dim ", axis, " of ", x.to_string());
  }
  KILN_CHECK(sum == x.dims[size_t(axis)].extent, kShapeMismatch, op_name(op), ": sizes ", list_str(sizes),
             " sum to ", sum, ", dim ", axis, " of ", x.to_string(), " is ", x.dims[size_t(axis)].extent);
  std::vector<TensorType> outs(sizes.size(), x);
  if (sizes.size() > 1)
    for (size_t i = 0; i < sizes.size(); ++i) outs[i].dims[size_t(axis)] = static_dim(sizes[i]);
  return outs;
}

// pad's optional `input_perm` reads x permuted (to_channels_last pads an image's channels while
// moving them last, in one pass).
TensorType infer_pad(OpKind op, const TensorType& x_in, const Attrs& a) {
  const TensorType x = a.has("input_perm") ? permuted(op, x_in, a, "input_perm") : x_in;
  const auto& pads = ints_attr(op, a, "pads");
  KILN_CHECK(int64_t(pads.size()) == 2 * x.rank(), kInvalidArgument, op_name(op), ": pads ", list_str(pads),
             " has ", pads.size(), " values, expected ", 2 * x.rank(), " (a before/after pair per dim of ",
             x.to_string(), ")");
  std::string mode = "constant";
  if (a.has("mode")) {
    const auto* m = std::get_if<std::string>(&a.items().at("mode"));
    KILN_CHECK(m != nullptr, kInvalidArgument, op_name(op), ": attribute 'mode' must be a string");
    mode = *m;
  }
  KILN_CHECK(mode == "constant" || mode == "reflect" || mode == "replicate", kInvalidArgument, op_name(op),
             ": mode '", mode, "' must be one of constant, reflect, replicate");
  if (a.has("value") && mode == "constant") {
    const AttrValue& v = a.items().at("value");
    KILN_CHECK(std::holds_alternative<double>(v) || std::holds_alternative<int64_t>(v), kInvalidArgument,
               op_name(op), ": attribute 'value' must be a float");
    check_fits(op, x.dtype, a.get_float("value"), "value");
  }
  TensorType out = x;
  for (size_t d = 0; d < x.dims.size(); ++d) {
    const int64_t before = pads[2 * d], after = pads[2 * d + 1], dim = x.dims[d].extent;
    KILN_CHECK(before >= 0 && after >= 0, kInvalidArgument, op_name(op), ": pads ", list_str(pads),
               " must be >= 0 (dim ", d, ")");
    if (before == 0 && after == 0) continue;
    if (mode == "reflect")
      KILN_CHECK(before < dim && after < dim, kInvalidArgument, op_name(op), ": reflect padding (", before, ", ",
                 after, ") of dim ", d, " must be < the dim (", dim, ") of ", x.to_string());
    if (mode == "replicate")
      KILN_CHECK(dim > 0, kInvalidArgument, op_name(op), ": replicate padding of the empty dim ", d, " of ",
                 x.to_string());
    const Checked ck(op, "the padded extent");
    out.dims[d] = static_dim(ck.add(ck.add(dim, before), after));
  }
  return out;
}

}  // namespace

std::vector<TensorType> infer_shape_op(OpKind op, const TypeList& in, const Attrs& a) {
  const TensorType& x = *in[0];
  switch (op) {
    case OpKind::kReshape: return {infer_reshape(op, x, a)};
    case OpKind::kPermute: return {permuted(op, x, a, "perm")};
    case OpKind::kExpand: return {infer_expand(op, x, a)};
    case OpKind::kSlice: return {infer_slice(op, x, a)};
    case OpKind::kConcat: return {infer_concat(op, in, a)};
    case OpKind::kSplit: return infer_split(op, x, a);
    case OpKind::kPad: return {infer_pad(op, x, a)};
    case OpKind::kCopy: return {x};
    default: KILN_FAIL(kInternal, op_name(op), " is not in the shape family");
  }
}

}  // namespace kiln
