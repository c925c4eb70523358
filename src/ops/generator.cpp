// Shape rules of the generator family: ops with no inputs whose output is fixed by attributes.
//
//   arange () {start = 0, end, step = 1: float, dtype} -> [ceil((end - start) / step)], as
//     torch.arange: step != 0 and its sign must agree with end - start.
//   full () {shape: ints, value: float, dtype} -> shape, every element value cast to dtype.
//
// The dtype is required: torch.arange infers it from its arguments' Python types, which only
// the importer sees. Values must convert to integral dtypes without overflow (PyTorch raises
// too), which also keeps the kernels' casts defined.
#include <cmath>
#include <optional>
#include <string>
#include <variant>

#include "src/ops/shape_rules.h"

namespace kiln {

namespace {

double float_attr(OpKind op, const Attrs& a, const char* key, std::optional<double> fallback = std::nullopt) {
  if (!a.has(key)) {
    KILN_CHECK(fallback.has_value(), kInvalidArgument, op_name(op), ": missing attribute '", key, "'");
    return *fallback;
  }
  const AttrValue& v = a.items().at(key);
  KILN_CHECK(std::holds_alternative<double>(v) || std::holds_alternative<int64_t>(v), kInvalidArgument,
             op_name(op), ": attribute '", key, "' must be a float");
  const double d = a.get_float(key);
  KILN_CHECK(!std::isnan(d), kInvalidArgument, op_name(op), ": attribute '", key, "' is NaN");
  return d;
}

DType dtype_attr(OpKind op, const Attrs& a) {
  KILN_CHECK(a.has("dtype"), kInvalidArgument, op_name(op), ": missing attribute 'dtype'");
  const DType* t = std::get_if<DType>(&a.items().at("dtype"));
  KILN_CHECK(t != nullptr, kInvalidArgument, op_name(op), ": attribute 'dtype' must be a dtype");
  return *t;
}

TensorType infer_arange(OpKind op, const Attrs& a) {
  const DType dt = dtype_attr(op, a);
  const double start = float_attr(op, a, "start", 0.0), end = float_attr(op, a, "end"),
               step = float_attr(op, a, "step", 1.0);
  KILN_CHECK(std::isfinite(start) && std::isfinite(end), kInvalidArgument, op_name(op), ": start ", start,
             " and end ", end, " must be finite");
  KILN_CHECK(step != 0.0 && std::isfinite(step), kInvalidArgument, op_name(op), ": step ", step,
             " must be finite and non-zero");
  KILN_CHECK((step > 0 && end >= start) || (step < 0 && end <= start), kInvalidArgument, op_name(op), ": step ",
             step, " goes the wrong way from start ", start, " to end ", end);
  const double size = std::ceil((end - start) / step);
  KILN_CHECK(size >= 0 && size < 9.0e15, kInvalidArgument, op_name(op), ": size ", size, " from start ", start,
             ", end ", end, ", step ", step, " is out of range");
  if (size > 0) {
    check_fits(op, dt, start, "start");
    check_fits(op, dt, start + (size - 1) * step, "last value");
  }
  return TensorType(dt, {static_cast<int64_t>(size)});
}

TensorType infer_full(OpKind op, const Attrs& a) {
  const DType dt = dtype_attr(op, a);
  KILN_CHECK(a.has("shape"), kInvalidArgument, op_name(op), ": missing attribute 'shape'");
  const auto* shape = std::get_if<std::vector<int64_t>>(&a.items().at("shape"));
  KILN_CHECK(shape != nullptr, kInvalidArgument, op_name(op), ": attribute 'shape' must be a list of ints");
  int64_t n = 1;
  for (int64_t e : *shape) {
    KILN_CHECK(e >= 0, kInvalidArgument, op_name(op), ": shape has a negative extent ", e);
    KILN_CHECK(!__builtin_mul_overflow(n, e, &n), kInvalidArgument, op_name(op), ": shape has too many elements");
  }
  const AttrValue* v = a.has("value") ? &a.items().at("value") : nullptr;
  KILN_CHECK(v != nullptr, kInvalidArgument, op_name(op), ": missing attribute 'value'");
  KILN_CHECK(std::holds_alternative<double>(*v) || std::holds_alternative<int64_t>(*v), kInvalidArgument,
             op_name(op), ": attribute 'value' must be a float");
  // An exact i64 value needs no check (its double rounds up at the top of the range).
  if (!(dt == DType::kI64 && std::holds_alternative<int64_t>(*v))) check_fits(op, dt, a.get_float("value"), "value");
  return TensorType(dt, *shape);
}

}  // namespace

std::vector<TensorType> infer_generator(OpKind op, const TypeList&, const Attrs& a) {
  switch (op) {
    case OpKind::kArange: return {infer_arange(op, a)};
    case OpKind::kFull: return {infer_full(op, a)};
    default: KILN_FAIL(kInternal, op_name(op), " is not in the generator family");
  }
}

}  // namespace kiln
