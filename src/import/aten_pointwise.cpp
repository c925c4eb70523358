// Importers of unary pointwise overloads: activations, math functions, clamp and its
// spellings (hardtanh, relu6, clamp_min, clamp_max, clamp.Tensor), logical_not, sign and the
// rounding functions (floor, ceil, round, round.decimals, trunc).
//
// Kiln's unary ops keep their input's dtype, while PyTorch promotes some of them (exp of an
// int tensor is float): the input is cast to the FX output's dtype first. floor, ceil, round
// and trunc of an integer tensor, and sign of a bool one, are the identity in PyTorch, so they
// import as the input itself.
#include <cmath>

#include "src/import/import_context.h"

namespace kiln::aten {

namespace {

// x at position 0, in the dtype of the FX output.
ValueId self_as_out(ImportContext& cx) { return cx.cast(cx.input(0, "self"), cx.args.out().dtype); }

template <OpKind K>
std::vector<ValueId> convert_unary(ImportContext& cx) {
  return {cx.add(K, {self_as_out(cx)})};
}

void check_gelu(const NodeArgs& args) {
  std::string mode = args.get_string(kKwOnly, "approximate", "none");
  if (mode != "none" && mode != "tanh") reject("gelu approximate='", mode, "' (expected 'none' or 'tanh')");
}

std::vector<ValueId> convert_gelu(ImportContext& cx) {
  Attrs a;
  a.set("approximate", cx.args.get_string(kKwOnly, "approximate", "none"));
  return {cx.add(OpKind::kGelu, {self_as_out(cx)}, a)};
}

std::vector<ValueId> convert_leaky_relu(ImportContext& cx) {
  Attrs a;
  a.set("negative_slope", cx.args.get_float(1, "negative_slope", 0.01));
  return {cx.add(OpKind::kLeakyRelu, {self_as_out(cx)}, a)};
}

ValueId clamp(ImportContext& cx, std::optional<double> lo, std::optional<double> hi) {
  Attrs a;
  if (lo) a.set("min", *lo);
  if (hi) a.set("max", *hi);
  return cx.add(OpKind::kClamp, {self_as_out(cx)}, a);
}

std::optional<double> opt_float(const NodeArgs& args, size_t pos, std::string_view name) {
  if (!args.given(pos, name)) return std::nullopt;
  return args.get_float(pos, name);
}

void check_clamp(const NodeArgs& args) {
  if (!args.given(1, "min") && !args.given(2, "max")) reject("clamp needs min or max");
}

std::vector<ValueId> convert_clamp(ImportContext& cx) {
  return {clamp(cx, opt_float(cx.args, 1, "min"), opt_float(cx.args, 2, "max"))};
}

std::vector<ValueId> convert_clamp_min(ImportContext& cx) {
  return {clamp(cx, cx.args.get_float(1, "min"), std::nullopt)};
}

std::vector<ValueId> convert_clamp_max(ImportContext& cx) {
  return {clamp(cx, std::nullopt, cx.args.get_float(1, "max"))};
}

std::vector<ValueId> convert_hardtanh(ImportContext& cx) {
  return {clamp(cx, cx.args.get_float(1, "min_val", -1.0), cx.args.get_float(2, "max_val", 1.0))};
}

std::vector<ValueId> convert_relu6(ImportContext& cx) { return {clamp(cx, 0.0, 6.0)}; }

// clamp.Tensor: bounds are tensors (often 0-d), so maximum / minimum with broadcasting.
std::vector<ValueId> convert_clamp_tensor(ImportContext& cx) {
  const DType dt = cx.args.out().dtype;
  ValueId x = self_as_out(cx);
  if (auto lo = cx.opt_input(1, "min")) x = cx.add(OpKind::kMaximum, {x, cx.cast(*lo, dt)});
  if (auto hi = cx.opt_input(2, "max")) x = cx.add(OpKind::kMinimum, {x, cx.cast(*hi, dt)});
  return {x};
}

std::vector<ValueId> convert_logical_not(ImportContext& cx) {
  ValueId x = cx.cast(cx.input(0, "self"), DType::kBool);
  return {cx.cast(cx.add(OpKind::kLogicalNot, {x}), cx.args.out().dtype)};
}

// floor, ceil, round, trunc: the identity on integer and bool tensors.
template <OpKind K>
std::vector<ValueId> convert_rounding(ImportContext& cx) {
  ValueId x = self_as_out(cx);
  return {is_floating(cx.type(x).dtype) ? cx.add(K, {x}) : x};
}

// sign and sgn (the same on real tensors); bool stays bool (its sign is itself).
std::vector<ValueId> convert_sign(ImportContext& cx) {
  ValueId x = self_as_out(cx);
  return {cx.type(x).dtype == DType::kBool ? x : cx.add(OpKind::kSign, {x})};
}

// round.decimals(self, *, decimals): as PyTorch, in the op-math type (f32 for f16 / bf16)
// with s = 10^|decimals| rounded to it: round(x * s) / s, or round(x / s) * s when decimals < 0.
std::vector<ValueId> convert_round_decimals(ImportContext& cx) {
  const DType dt = cx.args.out().dtype;
  ValueId x = self_as_out(cx);
  if (!is_floating(dt)) return {x};
  const int64_t decimals = cx.args.get_int(kKwOnly, "decimals", 0);
  if (decimals == 0) return {cx.add(OpKind::kRound, {x})};
  const DType math = dt == DType::kF64 ? DType::kF64 : DType::kF32;
  ValueId s = cx.scalar(std::pow(10.0, double(decimals < 0 ? -decimals : decimals)), math);
  const OpKind in = decimals < 0 ? OpKind::kDiv : OpKind::kMul, out = decimals < 0 ? OpKind::kMul : OpKind::kDiv;
  ValueId r = cx.add(OpKind::kRound, {cx.add(in, {cx.cast(x, math), s})});
  return {cx.cast(cx.add(out, {r, s}), dt)};
}

void check_bitwise_not(const NodeArgs& args) {
  DType dt = args.tensor_arg(0, "self").dtype;
  if (dt != DType::kBool) reject("bitwise_not of ", dtype_name(dt), " (only bool is supported)");
}

}  // namespace

std::vector<ImportEntry> pointwise_importers() {
  return {
      {"aten.relu.default", nullptr, &convert_unary<OpKind::kRelu>},
      {"aten.gelu.default", &check_gelu, &convert_gelu},
      {"aten.silu.default", nullptr, &convert_unary<OpKind::kSilu>},
      {"aten.sigmoid.default", nullptr, &convert_unary<OpKind::kSigmoid>},
      {"aten.tanh.default", nullptr, &convert_unary<OpKind::kTanh>},
      {"aten.exp.default", nullptr, &convert_unary<OpKind::kExp>},
      {"aten.log.default", nullptr, &convert_unary<OpKind::kLog>},
      {"aten.sqrt.default", nullptr, &convert_unary<OpKind::kSqrt>},
      {"aten.rsqrt.default", nullptr, &convert_unary<OpKind::kRsqrt>},
      {"aten.neg.default", nullptr, &convert_unary<OpKind::kNeg>},
      {"aten.abs.default", nullptr, &convert_unary<OpKind::kAbs>},
      {"aten.erf.default", nullptr, &convert_unary<OpKind::kErf>},
      {"aten.hardswish.default", nullptr, &convert_unary<OpKind::kHardswish>},
      {"aten.hardsigmoid.default", nullptr, &convert_unary<OpKind::kHardsigmoid>},
      {"aten.reciprocal.default", nullptr, &convert_unary<OpKind::kReciprocal>},
      {"aten.sin.default", nullptr, &convert_unary<OpKind::kSin>},
      {"aten.cos.default", nullptr, &convert_unary<OpKind::kCos>},
      {"aten.leaky_relu.default", nullptr, &convert_leaky_relu},
      {"aten.clamp.default", &check_clamp, &convert_clamp},
      {"aten.clamp.Tensor", nullptr, &convert_clamp_tensor},
      {"aten.clamp_min.default", nullptr, &convert_clamp_min},
      {"aten.clamp_max.default", nullptr, &convert_clamp_max},
      {"aten.hardtanh.default", nullptr, &convert_hardtanh},
      {"aten.relu6.default", nullptr, &convert_relu6},
      {"aten.sign.default", nullptr, &convert_sign},
      {"aten.sgn.default", nullptr, &convert_sign},
      {"aten.floor.default", nullptr, &convert_rounding<OpKind::kFloor>},
      {"aten.ceil.default", nullptr, &convert_rounding<OpKind::kCeil>},
      {"aten.round.default", nullptr, &convert_rounding<OpKind::kRound>},
      {"aten.round.decimals", nullptr, &convert_round_decimals},
      {"aten.trunc.default", nullptr, &convert_rounding<OpKind::kTrunc>},
      {"aten.logical_not.default", nullptr, &convert_logical_not},
      {"aten.bitwise_not.default", &check_bitwise_not, &convert_logical_not},
  };
}

}  // namespace kiln::aten
