// name_activations: activations a model writes out as arithmetic become the op that names them,
// so that fuse_epilogue can fold them into a GEMM, conv or norm (cuBLASLt's GELU epilogue, a
// cuDNN conv's pointwise stage, a group norm's kernel) instead of leaving a kernel of their own:
//
//   0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))  ->  gelu(x) {approximate: tanh}
//       (transformers' NewGELUActivation: GPT-2, ALBERT, GPT-J, CodeGen), with x^3 as
//       x * x * x in either order (pow(x, 3) imports as those multiplies);
//   x * sigmoid(x)                                           ->  silu(x)
//
// Each add and mul may have its operands in either order. A constant must be a single-element
// floating constant equal to the formula's number as its dtype holds it (within the rounding of
// that dtype: f16 / bf16 graphs store 0.7978845608 as 0.797851562 / 0.796875), so a formula
// with other numbers is left alone. The result must have x's type (no broadcast). The
// replaced arithmetic stays for any other reader of its intermediate values.
//
// Does not: recognize other spellings (sigmoid(1.702 x) * x, erf forms, x * 0.5 outside the
// product), or look inside fused_pointwise nodes (run it before fuse_epilogue).
#include <cmath>
#include <numbers>

#include "kiln/passes.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

// The largest relative distance between a number and its nearest value of `t` (twice the unit
// roundoff, so that a number rounded twice, f64 -> f32 -> f16, still matches).
double rounding_of(DType t) {
  switch (t) {
    case DType::kF16: return std::ldexp(1.0, -10);
    case DType::kBF16: return std::ldexp(1.0, -7);
    case DType::kF32: return std::ldexp(1.0, -23);
    default: return std::ldexp(1.0, -52);
  }
}

// Whether v is a one-element floating constant holding `want` as its dtype can.
bool is_number(const Graph& g, ValueId v, double want) {
  const std::optional<double> got = passes::floating_scalar(g, v);
  return got && std::fabs(*got - want) <= rounding_of(g.type(v).dtype) * std::fabs(want);
}

// The other operand of v = op(a, c) or op(c, a) (op commutative) where c is the number `c`;
// kNoValue when v is not made so.
ValueId operand_beside(const Graph& g, ValueId v, OpKind op, double c) {
  const Node* n = passes::made_by(g, v, op);
  if (n == nullptr) return kNoValue;
  for (int i = 0; i < 2; ++i)
    if (is_number(g, n->inputs[size_t(i)], c)) return n->inputs[size_t(1 - i)];
  return kNoValue;
}

// Whether v = x * x * x, the multiplies in any order.
bool is_cube(const Graph& g, ValueId v, ValueId x) {
  const Node* m = passes::made_by(g, v, OpKind::kMul);
  if (m == nullptr) return false;
  for (int i = 0; i < 2; ++i) {
    const Node* sq = passes::made_by(g, m->inputs[size_t(i)], OpKind::kMul);
    if (m->inputs[size_t(1 - i)] == x && sq != nullptr && sq->inputs[0] == x && sq->inputs[1] == x) return true;
  }
  return false;
}

// x where `root` = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), else kNoValue.
ValueId tanh_gelu_input(const Graph& g, const Node& root) {
  const double sqrt_2_over_pi = std::sqrt(2.0 / std::numbers::pi);
  for (int i = 0; i < 2; ++i) {
    const ValueId x = operand_beside(g, root.inputs[size_t(i)], OpKind::kMul, 0.5);
    const ValueId t = operand_beside(g, root.inputs[size_t(1 - i)], OpKind::kAdd, 1.0);
    if (x == kNoValue || t == kNoValue) continue;
    const Node* th = passes::made_by(g, t, OpKind::kTanh);
    const ValueId inner = th ? operand_beside(g, th->inputs[0], OpKind::kMul, sqrt_2_over_pi) : kNoValue;
    const Node* sum = passes::made_by(g, inner, OpKind::kAdd);
    if (sum == nullptr) continue;
    for (int j = 0; j < 2; ++j)
      if (sum->inputs[size_t(j)] == x &&
          is_cube(g, operand_beside(g, sum->inputs[size_t(1 - j)], OpKind::kMul, 0.044715), x))
        return x;
  }
  return kNoValue;
}

// x where `root` = x * sigmoid(x) (either order), else kNoValue.
ValueId silu_input(const Graph& g, const Node& root) {
  for (int i = 0; i < 2; ++i) {
    const Node* s = passes::made_by(g, root.inputs[size_t(i)], OpKind::kSigmoid);
    if (s != nullptr && s->inputs[0] == root.inputs[size_t(1 - i)]) return s->inputs[0];
  }
  return kNoValue;
}

}  // namespace

bool name_activations(Graph& g) {
  return passes::rewrite_each(g, [](Graph& graph, size_t pos) {
    const Node& n = *graph.nodes()[pos];
    if (n.op != OpKind::kMul || !is_floating(graph.type(n.outputs[0]).dtype)) return false;
    Attrs attrs;
    OpKind op = OpKind::kSilu;
    ValueId x = silu_input(graph, n);
    if (x == kNoValue) {
      x = tanh_gelu_input(graph, n);
      op = OpKind::kGelu;
      attrs.set("approximate", std::string("tanh"));
    }
    if (x == kNoValue || graph.type(x) != graph.type(n.outputs[0])) return false;
    passes::replace_node(graph, pos, op, {x}, attrs);
    return true;
  });
}

}  // namespace kiln
