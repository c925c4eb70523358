// The epilogue of linear and conv: y = act(x @ w^T + bias + residual) (conv: act(conv(x, w) +
// bias + residual)), with act named by the `activation` attribute; layer_norm and group_norm
// take the same attribute (y = act(norm(x))).
//
// One home for what an activation name means: the shape rules validate the attribute with
// parse_activation, the CPU kernels apply the unary op it maps to (through pw::unary_array, the
// same formulas as the stand-alone op), fuse_epilogue names a unary node with
// set_activation_for_unary, and the CUDA backend reads the same Activation.
//
//   "none"      -> identity (also when the attribute is absent)
//   "relu"      -> relu           "gelu"    -> gelu, approximate "none"
//   "gelu_tanh" -> gelu, tanh      "silu"    -> silu
//   "sigmoid"   -> sigmoid        "tanh"    -> tanh
//   "hardswish" -> hardswish      "hardsigmoid" -> hardsigmoid
//   "clipped_relu" -> clamp to [0, activation_max] (ReLU6 = clipped_relu with 6), with the
//                     float attribute `activation_max` (finite, > 0)
#pragma once

#include <cmath>
#include <optional>
#include <string>

#include "src/ops/pointwise.h"

namespace kiln::pw {

struct Activation {
  bool none = true;                // identity
  OpKind op = OpKind::kRelu;       // the unary op applied when !none
  UnaryParams params;              // gelu's approximation; clipped_relu's bounds (lo = 0, hi)
  std::string name = "none";       // the attribute's value
};

inline constexpr const char* kActivationNames =
    R"("none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "hardswish", "hardsigmoid", "clipped_relu")";

// The activation attribute of a linear / conv / norm node; throws kInvalidArgument naming `op` and the
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
  else if (*s == "clipped_relu") {
    act.op = OpKind::kClamp;
    act.params.lo = 0.0;
    act.params.hi = a.get_float("activation_max", 0.0);
    KILN_CHECK(std::isfinite(act.params.hi) && act.params.hi > 0, kInvalidArgument, op_name(op),
               ": activation \"clipped_relu\" needs a finite attribute 'activation_max' > 0, got ", act.params.hi);
  } else
    KILN_FAIL(kInvalidArgument, op_name(op), ": attribute 'activation' must be one of ", kActivationNames, ", got \"",
              *s, "\"");
  return act;
}

// Sets the activation attributes (`activation`, and `activation_max` for clipped_relu) that make a
// linear / conv / norm compute unary node `op` with attributes `a` as its epilogue on `target`; false
// (target unchanged) when the op cannot run as an epilogue. A clamp to [0, hi] is clipped_relu,
// a clamp to [0, inf) relu; other clamps stay nodes of their own.
inline bool set_activation_for_unary(OpKind op, const Attrs& a, Attrs& target) {
  std::string name;
  switch (op) {
    case OpKind::kRelu: name = "relu"; break;
    case OpKind::kGelu: name = UnaryParams::from(op, a).gelu_tanh ? "gelu_tanh" : "gelu"; break;
    case OpKind::kSilu: name = "silu"; break;
    case OpKind::kSigmoid: name = "sigmoid"; break;
    case OpKind::kTanh: name = "tanh"; break;
    case OpKind::kHardswish: name = "hardswish"; break;
    case OpKind::kHardsigmoid: name = "hardsigmoid"; break;
    case OpKind::kClamp: {
      const UnaryParams p = UnaryParams::from(op, a);
      if (p.lo != 0.0 || !(p.hi > 0)) return false;
      name = std::isinf(p.hi) ? "relu" : "clipped_relu";
      if (!std::isinf(p.hi)) target.set("activation_max", p.hi);
      break;
    }
    default: return false;
  }
  target.set("activation", name);
  return true;
}

// Copies the activation attributes of a linear / conv / norm (if any) from `from` to `to`.
inline void copy_activation(const Attrs& from, Attrs& to) {
  for (const char* key : {"activation", "activation_max"})
    if (from.has(key)) to.set(key, from.items().at(key));
}

// Removes the activation attributes of a linear / conv / norm.
inline void erase_activation(Attrs& a) {
  a.erase("activation");
  a.erase("activation_max");
}

// The attributes of the stand-alone unary node that computes `act` (clipped_relu: a clamp).
inline Attrs unary_attrs(const Activation& act) {
  Attrs a;
  if (act.none) return a;
  if (act.op == OpKind::kGelu && act.params.gelu_tanh) a.set("approximate", std::string("tanh"));
  if (act.op == OpKind::kClamp) a.set("min", act.params.lo), a.set("max", act.params.hi);
  return a;
}

}  // namespace kiln::pw
