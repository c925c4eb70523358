// name_activations (src/passes/name_activations.cpp): transformers' written-out tanh GELU and
// x * sigmoid(x) become gelu {tanh} / silu in each operand order, computing what the arithmetic
// did; their numbers are matched as the graph's dtype holds them (an f16 plan's), other numbers
// and other operands are left alone; intermediates read elsewhere stay; and through the builder
// the GELU ends in the linear's epilogue with no kernel of its own.
#include "src/ops/epilogue.h"
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

ValueId number(Graph& g, float v) { return f32_constant(g, "", {}, {v}, false); }

ValueId mul(Graph& g, ValueId a, ValueId b) { return g.add_node1(OpKind::kMul, {a, b}); }
ValueId add(Graph& g, ValueId a, ValueId b) { return g.add_node1(OpKind::kAdd, {a, b}); }

struct GeluSpelling {
  bool swap = false;       // every constant first, the cube as x * (x * x), 1 + t, x + c x^3
  float cube_coef = 0.044715f;
  float tanh_coef = 0.7978845608f;
};

// 0.5 * x * (1 + tanh(c1 * (x + c2 * x^3))) as transformers' NewGELUActivation writes it; `inner`
// (if given) receives the tanh's output.
ValueId written_gelu(Graph& g, ValueId x, const GeluSpelling& s, ValueId* inner = nullptr) {
  auto m = [&](ValueId a, ValueId b) { return s.swap ? mul(g, b, a) : mul(g, a, b); };
  auto p = [&](ValueId a, ValueId b) { return s.swap ? add(g, b, a) : add(g, a, b); };
  const ValueId half = m(x, number(g, 0.5f));
  const ValueId cube = s.swap ? mul(g, x, mul(g, x, x)) : mul(g, mul(g, x, x), x);
  const ValueId t = g.add_node1(OpKind::kTanh, {m(p(x, m(cube, number(g, s.cube_coef))), number(g, s.tanh_coef))});
  if (inner != nullptr) *inner = t;
  return mul(g, half, p(t, number(g, 1.0f)));
}

// x: [4, 8] -> linear -> written-out GELU -> linear -> output "y" (a transformer's MLP).
Graph linear_then(const GeluSpelling& s, bool tanh_is_output = false) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 8}));
  const ValueId h = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "w", {16, 8}, 3), f32_weight(g, "b", {16}, 4)});
  ValueId t = kNoValue;
  const ValueId a = written_gelu(g, h, s, &t);
  g.mark_output(g.add_node1(OpKind::kLinear, {a, f32_weight(g, "w2", {8, 16}, 5)}), "y");
  if (tanh_is_output) g.mark_output(t, "t");
  return g;
}

TEST(NameActivations, WrittenOutTanhGeluBecomesGeluInEitherOperandOrder) {
  for (bool swap : {false, true}) {
    const Graph g = linear_then({.swap = swap});
    const Graph f = pass_applied(g, &name_activations, 11, 1e-5f);
    ASSERT_EQ(count_ops(f, OpKind::kGelu), 1) << f.to_string();
    EXPECT_EQ(count_ops(f, OpKind::kTanh), 0);
    EXPECT_EQ(count_ops(f, OpKind::kMul), 0) << f.to_string();  // every multiply was the formula's
    for (const auto& n : f.nodes())
      if (n->op == OpKind::kGelu) {
        EXPECT_EQ(n->attrs.get_string("approximate"), "tanh");
      }
  }
}

TEST(NameActivations, OtherNumbersAndOperandsAreLeftAlone) {
  for (const GeluSpelling& s : {GeluSpelling{.cube_coef = 0.045f}, GeluSpelling{.tanh_coef = 0.8f}}) {
    Graph g = linear_then(s);
    EXPECT_FALSE(name_activations(g)) << g.to_string();
  }
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {3, 5}));
  const ValueId y = g.add_input("y", TensorType(DType::kF32, {3, 5}));
  g.mark_output(mul(g, x, g.add_node1(OpKind::kSigmoid, {y})), "gate");  // a gate, not SiLU
  const ValueId row = g.add_input("row", TensorType(DType::kF32, {5}));
  g.mark_output(mul(g, row, g.add_node1(OpKind::kSigmoid, {row})), "silu_row");
  g.mark_output(mul(g, x, g.add_node1(OpKind::kSigmoid, {row})), "other_operand");
  Graph f = g;
  EXPECT_TRUE(name_activations(f));
  EXPECT_EQ(count_ops(f, OpKind::kSilu), 1) << f.to_string();  // only row * sigmoid(row)
  EXPECT_EQ(count_ops(f, OpKind::kSigmoid), 2);
}

TEST(NameActivations, SiluInEitherOrder) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {6, 7}));
  const ValueId s = g.add_node1(OpKind::kSigmoid, {x});
  g.mark_output(mul(g, x, s), "a");
  g.mark_output(mul(g, g.add_node1(OpKind::kSigmoid, {x}), x), "b");
  const Graph f = pass_applied(g, &name_activations, 12, 1e-6f);
  EXPECT_EQ(count_ops(f, OpKind::kSilu), 2) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kSigmoid), 0);
}

// The tanh is also an output: the GELU is named, the arithmetic up to the tanh stays for it.
TEST(NameActivations, IntermediatesReadElsewhereStay) {
  const Graph f = pass_applied(linear_then({}, true), &name_activations, 13, 1e-5f);
  EXPECT_EQ(count_ops(f, OpKind::kGelu), 1);
  EXPECT_EQ(count_ops(f, OpKind::kTanh), 1);
}

// An f16 plan holds the formula's numbers rounded (0.797851562, 0.044708252): they still match,
// and the GELU rides in the linear's epilogue (cuBLASLt's GELU epilogue on a GPU).
TEST(NameActivations, ThroughTheBuilderInF16TheGeluIsTheLinearsEpilogue) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const Graph g = linear_then({});
    BuilderConfig cfg;
    cfg.enabled_precisions = {dt};
    const Graph plan = Builder(cfg).optimize(g);
    EXPECT_EQ(count_ops(plan, OpKind::kTanh), 0) << plan.to_string();
    EXPECT_EQ(count_ops(plan, OpKind::kFusedPointwise), 0) << plan.to_string();
    std::vector<std::string> activations;
    for (const auto& n : plan.nodes())
      if (n->op == OpKind::kLinear) activations.push_back(pw::parse_activation(n->op, n->attrs).name);
    EXPECT_EQ(activations, (std::vector<std::string>{"gelu_tanh", "none"})) << plan.to_string();
    auto e = Builder(cfg).build(g);
    const auto in = random_inputs(g, 14);
    expect_close(run_engine(e, in), run_plain(g, in), 2e-2f, 2e-2f);
  }
}

}  // namespace
