// layer_norm {rms} (src/ops/norm.cpp, the CPU kernel) and form_rms_norms
// (src/passes/rms_norms.cpp): the attribute's type checked; the kernel equals the written-out
// RMSNorm with and without weight and bias, over one and two trailing dims; the pass turns the
// written-out forms (mul(x, x) or a {square} mean, operands in either order, a weight with
// leading 1s) into one node computing the same, keeps a weight out when the unweighted value has
// other readers, and leaves other reductions alone; through the builder in f16 / bf16 an RMSNorm
// is one node.
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

Attrs mean_attrs(const Shape& axes) {
  Attrs a;
  a.set("axes", axes);
  a.set("keepdim", true);
  return a;
}

struct Spelling {
  bool swap = false;            // rsqrt * x, w * y
  bool square_attr = false;     // reduce_mean {square} of x rather than of mul(x, x)
  Shape axes = {2};
  Shape weight = {32};          // empty: no weight
  bool y_is_output = false;     // the unweighted value is also a graph output
};

// x [2, 6, 32] -> x * rsqrt(mean(x^2) + 1e-6) [* w] -> "y".
Graph written_rms_norm(const Spelling& s) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 6, 32}));
  Attrs mean = mean_attrs(s.axes);
  if (s.square_attr) mean.set("square", true);
  const ValueId sq = s.square_attr ? x : g.add_node1(OpKind::kMul, {x, x});
  const ValueId ms = g.add_node1(OpKind::kReduceMean, {sq}, mean);
  const ValueId eps = f32_constant(g, "", {}, {1e-6f}, false);
  const ValueId r = g.add_node1(OpKind::kRsqrt, {g.add_node1(OpKind::kAdd, {ms, eps})});
  const ValueId y = g.add_node1(OpKind::kMul, s.swap ? std::vector<ValueId>{r, x} : std::vector<ValueId>{x, r});
  if (s.weight.empty()) {
    g.mark_output(y, "y");
    return g;
  }
  const ValueId w = f32_weight(g, "w", s.weight, 3, 0.5f, 1.5f);
  g.mark_output(g.add_node1(OpKind::kMul, s.swap ? std::vector<ValueId>{w, y} : std::vector<ValueId>{y, w}), "z");
  if (s.y_is_output) g.mark_output(y, "y");
  return g;
}

TEST(RmsNorm, AttributeMustBeABool) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 8}));
  Attrs a;
  a.set("rms", int64_t{1});
  expect_error([&] { g.add_node1(OpKind::kLayerNorm, {x}, a); }, ErrorCode::kInvalidArgument, {"layer_norm", "rms"});
}

// The kernel against the written-out ops (then + bias where given), over the last one and two dims.
TEST(RmsNorm, KernelEqualsTheWrittenOutNorm) {
  for (const int64_t k : {1, 2})
    for (const bool weight : {false, true})
      for (const bool bias : {false, true}) {
        Graph ops, norm;
        for (Graph* g : {&ops, &norm}) {
          const ValueId x = g->add_input("x", TensorType(DType::kF32, {3, 5, 40}));
          const Shape tail = k == 1 ? Shape{40} : Shape{5, 40};
          const ValueId w = weight ? f32_weight(*g, "w", tail, 4) : kNoValue;
          const ValueId b = bias ? f32_weight(*g, "b", tail, 5) : kNoValue;
          ValueId y;
          if (g == &norm) {
            Attrs a;
            a.set("normalized_rank", k);
            a.set("eps", 1e-5);
            a.set("rms", true);
            std::vector<ValueId> ins = {x, w, b};
            while (ins.back() == kNoValue && ins.size() > 1) ins.pop_back();
            y = g->add_node1(OpKind::kLayerNorm, ins, a);
          } else {
            const ValueId ms = g->add_node1(OpKind::kReduceMean, {g->add_node1(OpKind::kMul, {x, x})},
                                            mean_attrs(k == 1 ? Shape{2} : Shape{1, 2}));
            const ValueId eps = f32_constant(*g, "", {}, {1e-5f}, false);
            y = g->add_node1(OpKind::kMul, {x, g->add_node1(OpKind::kRsqrt, {g->add_node1(OpKind::kAdd, {ms, eps})})});
            if (weight) y = g->add_node1(OpKind::kMul, {y, w});
            if (bias) y = g->add_node1(OpKind::kAdd, {y, b});
          }
          g->mark_output(y, "y");
        }
        const auto in = random_inputs(ops, 6);
        expect_close(run_plain(norm, in), run_plain(ops, in), 1e-5f, 1e-5f);
      }
}

TEST(RmsNorm, PassFormsOneNodeFromEachSpelling) {
  for (const Spelling& s :
       {Spelling{}, Spelling{.swap = true}, Spelling{.square_attr = true}, Spelling{.axes = {1, 2}, .weight = {6, 32}},
        Spelling{.weight = {1, 1, 32}}, Spelling{.weight = {}}}) {
    const Graph f = pass_applied(written_rms_norm(s), &form_rms_norms, 7, 1e-5f);
    ASSERT_EQ(count_ops(f, OpKind::kLayerNorm), 1) << f.to_string();
    EXPECT_EQ(count_ops(f, OpKind::kReduceMean), 0);
    EXPECT_EQ(count_ops(f, OpKind::kMul), 0) << f.to_string();
    for (const auto& n : f.nodes())
      if (n->op == OpKind::kLayerNorm) {
        EXPECT_TRUE(n->attrs.get_bool("rms"));
        EXPECT_EQ(n->inputs.size(), s.weight.empty() ? 1u : 2u);
        EXPECT_FLOAT_EQ(float(n->attrs.get_float("eps")), 1e-6f);
      }
  }
}

TEST(RmsNorm, WeightStaysOutWhenTheUnweightedValueIsReadElsewhere) {
  const Graph f = pass_applied(written_rms_norm({.y_is_output = true}), &form_rms_norms, 8, 1e-5f);
  ASSERT_EQ(count_ops(f, OpKind::kLayerNorm), 1) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kMul), 1);  // the weight's
}

TEST(RmsNorm, OtherReductionsAreLeftAlone) {
  for (const Spelling& s : {Spelling{.axes = {1}}, Spelling{.axes = {0}}}) {
    Graph g = written_rms_norm(s);
    EXPECT_FALSE(form_rms_norms(g)) << g.to_string();
  }
  // The mean of another tensor's squares.
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 16}));
  const ValueId other = g.add_input("o", TensorType(DType::kF32, {4, 16}));
  const ValueId ms = g.add_node1(OpKind::kReduceMean, {g.add_node1(OpKind::kMul, {other, other})}, mean_attrs({1}));
  const ValueId r =
      g.add_node1(OpKind::kRsqrt, {g.add_node1(OpKind::kAdd, {ms, f32_constant(g, "", {}, {1e-6f}, false)})});
  g.mark_output(g.add_node1(OpKind::kMul, {x, r}), "y");
  EXPECT_FALSE(form_rms_norms(g));
}

TEST(RmsNorm, ThroughTheBuilderInHalfPrecisionAnRmsNormIsOneNode) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const Graph g = written_rms_norm({});
    BuilderConfig cfg;
    cfg.enabled_precisions = {dt};
    const Graph plan = Builder(cfg).optimize(g);
    EXPECT_EQ(count_ops(plan, OpKind::kLayerNorm), 1) << plan.to_string();
    EXPECT_EQ(count_ops(plan, OpKind::kReduceMean), 0) << plan.to_string();
    const auto in = random_inputs(g, 9);
    expect_close(run_engine(Builder(cfg).build(g), in), run_plain(g, in), 2e-2f, 2e-2f);
  }
}

}  // namespace
