// Importers of binary pointwise overloads: arithmetic (add, sub, rsub, mul, div with rounding
// modes (floor on integers only), integer floor_divide / remainder / fmod, pow, maximum,
// minimum), comparisons, logical and bitwise ops on bool, where and masked_fill.
//
// Kiln's binary ops take one dtype, so operands are cast to a common dtype first. For
// arithmetic that is the FX output's dtype (PyTorch's promotion already decided it); for
// comparisons, which output bool, it is torch.result_type of the operands. Python scalars
// (in .Scalar overloads, and where FX passes a number for a Tensor argument) become 0-d
// constants of that dtype.
#include "src/import/import_context.h"

namespace kiln::aten {

namespace {

// The operand at `pos`: a tensor (cast to dt) or a scalar (a 0-d constant of dt).
ValueId operand(ImportContext& cx, size_t pos, std::string_view name, DType dt) {
  const ImportArg* a = cx.args.find(pos, name);
  if (a && a->kind == ImportArg::Kind::kTensor) return cx.cast(cx.value(cx.args.tensor_id(pos, name)), dt);
  return cx.scalar(cx.args.get_scalar(pos, name), dt);
}

Operand promo_operand(const NodeArgs& args, size_t pos, std::string_view name) {
  const ImportArg* a = args.find(pos, name);
  if (a && a->kind == ImportArg::Kind::kTensor) return operand_of(args.tensor_arg(pos, name));
  return operand_of(args.get_scalar(pos, name));
}

ImportArg alpha_of(const NodeArgs& args, size_t pos) {
  return args.given(pos, "alpha") ? args.get_scalar(pos, "alpha") : ImportArg::of_int(1);
}

// add, sub, mul, maximum, minimum, div: both operands in the output dtype. On bool outputs add
// and maximum are logical_or, mul and minimum logical_and (PyTorch's bool arithmetic).
template <OpKind K>
std::vector<ValueId> convert_arith(ImportContext& cx) {
  const DType dt = cx.args.out().dtype;
  ValueId a = operand(cx, 0, "self", dt);
  ValueId b = operand(cx, 1, "other", dt);
  OpKind op = K;
  if (K == OpKind::kAdd || K == OpKind::kSub) b = cx.scale(b, alpha_of(cx.args, 2));
  if (dt == DType::kBool) {
    if (K == OpKind::kAdd || K == OpKind::kMaximum) op = OpKind::kLogicalOr;
    if (K == OpKind::kMul || K == OpKind::kMinimum) op = OpKind::kLogicalAnd;
  }
  return {cx.add(op, {a, b})};
}

// rsub(self, other, alpha) = other - alpha * self.
std::vector<ValueId> convert_rsub(ImportContext& cx) {
  const DType dt = cx.args.out().dtype;
  ValueId self = cx.scale(operand(cx, 0, "self", dt), alpha_of(cx.args, 2));
  return {cx.add(OpKind::kSub, {operand(cx, 1, "other", dt), self})};
}

std::string rounding_mode(const NodeArgs& args) { return args.get_string(kKwOnly, "rounding_mode", ""); }

// Floating division rounds in trunc mode only: PyTorch's floor mode on floats is not floor(a / b)
// (it corrects a / b by fmod), which Kiln has no op for.
void check_div_mode(const NodeArgs& args) {
  const std::string mode = rounding_mode(args);
  if (mode.empty()) return;
  if (mode != "trunc" && mode != "floor") reject("div rounding_mode '", mode, "'");
  if (mode == "floor" && !is_integral(args.out().dtype))
    reject("div rounding_mode 'floor' on ", dtype_name(args.out().dtype), " (only integer division is supported)");
}

// Integer division. Kiln's div truncates; floor division subtracts one where the remainder is
// non-zero and its sign differs from the divisor's (and the floor remainder adds the divisor).
struct DivMod {
  ValueId quotient, remainder;
};

DivMod int_divmod(ImportContext& cx, ValueId a, ValueId b, bool floor) {
  const DType dt = cx.type(a).dtype;
  ValueId q = cx.add(OpKind::kDiv, {a, b});
  ValueId r = cx.add(OpKind::kSub, {a, cx.add(OpKind::kMul, {q, b})});
  if (!floor) return {q, r};
  ValueId zero = cx.scalar(0.0, dt);
  ValueId inexact = cx.add(OpKind::kNe, {r, zero});
  ValueId signs_differ = cx.add(OpKind::kNe, {cx.add(OpKind::kLt, {r, zero}), cx.add(OpKind::kLt, {b, zero})});
  ValueId adjust = cx.add(OpKind::kLogicalAnd, {inexact, signs_differ});
  return {cx.add(OpKind::kSub, {q, cx.cast(adjust, dt)}),
          cx.add(OpKind::kAdd, {r, cx.add(OpKind::kMul, {cx.cast(adjust, dt), b})})};
}

// div with rounding_mode: trunc of floats is trunc(a / b), as PyTorch computes it (in f32 for f16
// and bf16, so that the quotient is not rounded before it is truncated); Kiln's integer div
// truncates already.
std::vector<ValueId> convert_div_mode(ImportContext& cx) {
  const DType dt = cx.args.out().dtype;
  ValueId a = operand(cx, 0, "self", dt);
  ValueId b = operand(cx, 1, "other", dt);
  const std::string mode = rounding_mode(cx.args);
  if (mode == "trunc" && is_floating(dt)) {
    const DType math = dt == DType::kF64 ? DType::kF64 : DType::kF32;
    ValueId q = cx.add(OpKind::kDiv, {cx.cast(a, math), cx.cast(b, math)});
    return {cx.cast(cx.add(OpKind::kTrunc, {q}), dt)};
  }
  if (mode != "floor") return {cx.add(OpKind::kDiv, {a, b})};
  return {int_divmod(cx, a, b, true).quotient};
}

void check_int_out(const NodeArgs& args) {
  if (!is_integral(args.out().dtype))
    reject(args.node().target, " on ", dtype_name(args.out().dtype), " (only integers are supported)");
}

// floor_divide(self, other); remainder (sign of the divisor) and fmod (sign of the dividend).
template <bool kFloor, bool kRemainder>
std::vector<ValueId> convert_int_divmod(ImportContext& cx) {
  const DType dt = cx.args.out().dtype;
  DivMod qr = int_divmod(cx, operand(cx, 0, "self", dt), operand(cx, 1, "other", dt), kFloor);
  return {kRemainder ? qr.remainder : qr.quotient};
}

void check_float_out(const NodeArgs& args) {
  if (!is_floating(args.out().dtype)) reject("pow on ", dtype_name(args.out().dtype), " (Kiln's pow is float only)");
}

// pow; a tensor to a constant exponent that PyTorch's pow kernels compute without pow (2, 3,
// 0.5, -0.5, -1, -2) becomes those kernels' multiplies, root or reciprocal, which every backend
// runs as cheap pointwise ops (GPT-2's written-out GELU cubes, RMSNorm squares).
std::vector<ValueId> convert_pow(ImportContext& cx) {
  const DType dt = cx.args.out().dtype;
  const ValueId x = operand(cx, 0, "self", dt);
  const ImportArg* e = cx.args.find(1, "exponent");
  const bool tensor_base = cx.args.find(0, "self")->kind == ImportArg::Kind::kTensor;
  if (tensor_base && e != nullptr && (e->kind == ImportArg::Kind::kInt || e->kind == ImportArg::Kind::kFloat)) {
    const double v = cx.args.get_float(1, "exponent");
    auto square = [&] { return cx.add(OpKind::kMul, {x, x}); };
    if (v == 2) return {square()};
    if (v == 3) return {cx.add(OpKind::kMul, {square(), x})};
    if (v == 0.5) return {cx.add(OpKind::kSqrt, {x})};
    if (v == -0.5) return {cx.add(OpKind::kRsqrt, {x})};
    if (v == -1) return {cx.add(OpKind::kReciprocal, {x})};
    if (v == -2) return {cx.add(OpKind::kReciprocal, {square()})};
  }
  return {cx.add(OpKind::kPow, {x, operand(cx, 1, "exponent", dt)})};
}

template <OpKind K>
std::vector<ValueId> convert_compare(ImportContext& cx) {
  const DType dt = result_type({promo_operand(cx.args, 0, "self"), promo_operand(cx.args, 1, "other")});
  return {cx.add(K, {operand(cx, 0, "self", dt), operand(cx, 1, "other", dt)})};
}

// logical_* take any dtypes (non-zero is true); xor is ne on bools.
template <OpKind K>
std::vector<ValueId> convert_logical(ImportContext& cx) {
  ValueId a = operand(cx, 0, "self", DType::kBool);
  ValueId b = operand(cx, 1, "other", DType::kBool);
  return {cx.cast(cx.add(K, {a, b}), cx.args.out().dtype)};
}

void check_bitwise(const NodeArgs& args) {
  for (size_t i = 0; i < 2; ++i) {
    Operand o = promo_operand(args, i, i == 0 ? "self" : "other");
    if (o.dtype != DType::kBool) reject("bitwise op on ", dtype_name(o.dtype), " (only bool is supported)");
  }
}

std::vector<ValueId> convert_where(ImportContext& cx) {
  const DType dt = cx.args.out().dtype;
  ValueId cond = cx.cast(cx.input(0, "condition"), DType::kBool);
  return {cx.add(OpKind::kWhere, {cond, operand(cx, 1, "self", dt), operand(cx, 2, "other", dt)})};
}

// masked_fill(self, mask, value) = where(mask, value, self); value is a Scalar or a 0-d tensor.
std::vector<ValueId> convert_masked_fill(ImportContext& cx) {
  const DType dt = cx.args.out().dtype;
  ValueId mask = cx.cast(cx.input(1, "mask"), DType::kBool);
  return {cx.add(OpKind::kWhere, {mask, operand(cx, 2, "value", dt), operand(cx, 0, "self", dt)})};
}

void check_masked_fill_tensor(const NodeArgs& args) {
  const ImportTensor& v = args.tensor_arg(2, "value");
  if (!v.shape.empty()) reject("masked_fill value must be a 0-d tensor, got ", shape_str(v.shape));
}

}  // namespace

std::vector<ImportEntry> binary_importers() {
  return {
      {"aten.add.Tensor", nullptr, &convert_arith<OpKind::kAdd>},
      {"aten.add.Scalar", nullptr, &convert_arith<OpKind::kAdd>},
      {"aten.sub.Tensor", nullptr, &convert_arith<OpKind::kSub>},
      {"aten.sub.Scalar", nullptr, &convert_arith<OpKind::kSub>},
      {"aten.rsub.Tensor", nullptr, &convert_rsub},
      {"aten.rsub.Scalar", nullptr, &convert_rsub},
      {"aten.mul.Tensor", nullptr, &convert_arith<OpKind::kMul>},
      {"aten.mul.Scalar", nullptr, &convert_arith<OpKind::kMul>},
      {"aten.div.Tensor", nullptr, &convert_arith<OpKind::kDiv>},
      {"aten.div.Scalar", nullptr, &convert_arith<OpKind::kDiv>},
      {"aten.div.Tensor_mode", &check_div_mode, &convert_div_mode},
      {"aten.div.Scalar_mode", &check_div_mode, &convert_div_mode},
      {"aten.floor_divide.default", &check_int_out, &convert_int_divmod<true, false>},
      {"aten.remainder.Scalar", &check_int_out, &convert_int_divmod<true, true>},
      {"aten.remainder.Tensor", &check_int_out, &convert_int_divmod<true, true>},
      {"aten.fmod.Scalar", &check_int_out, &convert_int_divmod<false, true>},
      {"aten.fmod.Tensor", &check_int_out, &convert_int_divmod<false, true>},
      {"aten.pow.Tensor_Scalar", &check_float_out, &convert_pow},
      {"aten.pow.Tensor_Tensor", &check_float_out, &convert_pow},
      {"aten.pow.Scalar", &check_float_out, &convert_pow},
      {"aten.maximum.default", nullptr, &convert_arith<OpKind::kMaximum>},
      {"aten.minimum.default", nullptr, &convert_arith<OpKind::kMinimum>},
      {"aten.eq.Tensor", nullptr, &convert_compare<OpKind::kEq>},
      {"aten.eq.Scalar", nullptr, &convert_compare<OpKind::kEq>},
      {"aten.ne.Tensor", nullptr, &convert_compare<OpKind::kNe>},
      {"aten.ne.Scalar", nullptr, &convert_compare<OpKind::kNe>},
      {"aten.lt.Tensor", nullptr, &convert_compare<OpKind::kLt>},
      {"aten.lt.Scalar", nullptr, &convert_compare<OpKind::kLt>},
      {"aten.le.Tensor", nullptr, &convert_compare<OpKind::kLe>},
      {"aten.le.Scalar", nullptr, &convert_compare<OpKind::kLe>},
      {"aten.gt.Tensor", nullptr, &convert_compare<OpKind::kGt>},
      {"aten.gt.Scalar", nullptr, &convert_compare<OpKind::kGt>},
      {"aten.ge.Tensor", nullptr, &convert_compare<OpKind::kGe>},
      {"aten.ge.Scalar", nullptr, &convert_compare<OpKind::kGe>},
      {"aten.logical_and.default", nullptr, &convert_logical<OpKind::kLogicalAnd>},
      {"aten.logical_or.default", nullptr, &convert_logical<OpKind::kLogicalOr>},
      {"aten.logical_xor.default", nullptr, &convert_logical<OpKind::kNe>},
      {"aten.bitwise_and.Tensor", &check_bitwise, &convert_logical<OpKind::kLogicalAnd>},
      {"aten.bitwise_or.Tensor", &check_bitwise, &convert_logical<OpKind::kLogicalOr>},
      {"aten.bitwise_xor.Tensor", &check_bitwise, &convert_logical<OpKind::kNe>},
      {"aten.where.self", nullptr, &convert_where},
      {"aten.where.ScalarOther", nullptr, &convert_where},
      {"aten.where.ScalarSelf", nullptr, &convert_where},
      {"aten.where.Scalar", nullptr, &convert_where},
      {"aten.masked_fill.Scalar", nullptr, &convert_masked_fill},
      {"aten.masked_fill.Tensor", &check_masked_fill_tensor, &convert_masked_fill},
  };
}

}  // namespace kiln::aten
