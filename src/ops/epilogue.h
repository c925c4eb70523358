// The epilogue of linear and conv: y = act(x @ w^T + bias + residual) (conv: act(conv(x, w) +
// bias + residual)), with act named by the `activation` attribute.
//
// One home for what an activation name means: the shape rules validate the attribute with
// parse_activation, the CPU kernels apply the unary op it maps to (through pw::unary_array, the
// same formulas as the stand-alone op), fuse_epilogue names a unary node with
// activation_for_unary, and the CUDA backend reads the same Activation.
//
//   "none"      -> identity (also when the attribute is absent)
//   "relu"      -> relu           "gelu"    -> gelu, approximate "none"
//   "gelu_tanh" -> gelu, tanh      "silu"    -> silu
//   "sigmoid"   -> sigmoid        "tanh"    -> tanh
//   "hardswish" -> hardswish      "hardsigmoid" -> hardsigmoid
#pragma once

#include <optional>
#include <string>

#include "src/ops/pointwise.h"

namespace kiln::pw {

struct Activation {
  bool none = true;                // identity
  OpKind op = OpKind::kRelu;       // the unary op applied when !none
  UnaryParams params;              // gelu's approximation
  std::string name = "none";       // the attribute's value
};

inline constexpr const char* kActivationNames = R"("none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "hardswish", "hardsigmoid")";

// The activation attribute of a linear / conv node; throws kInvalidArgument naming `op` and the
// bad value.
inline Activation parse_activation(OpKind op, const Attrs& a) {
  Activation act;
  if (!a.has("activation")) return act;
  const auto* s = std::get_if<std::string>(&a.items().at("activation"));
  KILN_CHECK(s != nullptr, kInvalidArgument, op_name(op), ": attribute 'activation' must be a string, one of ",
             kActivationNames);
  act.name = *s;
  act.none = false;
  if (*s == "none") act.none = true;
  else if (*s == "relu") act.op = OpKind::kRelu;
  else if (*s == "gelu") act.op = OpKind::kGelu;
  else if (*s == "gelu_tanh") act.op = OpKind::kGelu, act.params.gelu_tanh = true;
  else if (*s == "silu") act.op = OpKind::kSilu;
  else if (*s == "sigmoid") act.op = OpKind::kSigmoid;
  else if (*s == "tanh") act.op = OpKind::kTanh;
  else if (*s == "hardswish") act.op = OpKind::kHardswish;
  else if (*s == "hardsigmoid") act.op = OpKind::kHardsigmoid;
  else
    KILN_FAIL(kInvalidArgument, op_name(op), ": attribute 'activation' must be one of ", kActivationNames, ", got \"",
              *s, "\"");
  return act;
}

// The activation name that computes unary node `op` with attributes `a`, or nothing when the
// op cannot run as an epilogue.
inline std::optional<std::string> activation_for_unary(OpKind op, const Attrs& a) {
  switch (op) {
    case OpKind::kRelu: return "relu";
    case OpKind::kGelu: return UnaryParams::from(op, a).gelu_tanh ? "gelu_tanh" : "gelu";
    case OpKind::kSilu: return "silu";
    case OpKind::kSigmoid: return "sigmoid";
    case OpKind::kTanh: return "tanh";
    case OpKind::kHardswish: return "hardswish";
    case OpKind::kHardsigmoid: return "hardsigmoid";
    default: return std::nullopt;
  }
}

}  // namespace kiln::pw
