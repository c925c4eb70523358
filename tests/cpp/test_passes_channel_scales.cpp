// fold_channel_scales (src/passes/fold_channel_scales.cpp): a constant per-output-channel or
// one-element factor after a linear or conv (either operand order, with and without bias, the
// factor with leading 1s) goes into the weight and bias, computing what the product did; other
// factors and producers are left alone; and through the builder ConvNeXt's block tail (linear,
// permute back, layer scale, residual add) becomes one linear with the residual in its epilogue.
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

struct Tail {
  Shape factor = {16};    // the constant's shape
  bool factor_first = false;
  bool bias = true;
  bool factor_is_input = false;
  bool y_is_output = false;  // the unscaled value is also a graph output
  std::string activation = "none";
};

// x [2, 5, 8] -> linear to 16 -> * c -> "z".
Graph scaled_linear(const Tail& t) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 5, 8}));
  std::vector<ValueId> ins = {x, f32_weight(g, "w", {16, 8}, 1)};
  if (t.bias) ins.push_back(f32_weight(g, "b", {16}, 2));
  Attrs a;
  if (t.activation != "none") a.set("activation", t.activation);
  const ValueId y = g.add_node1(OpKind::kLinear, ins, a);
  const ValueId c = t.factor_is_input ? g.add_input("c", TensorType(DType::kF32, t.factor))
                                      : f32_weight(g, "c", t.factor, 3, 0.5f, 1.5f);
  g.mark_output(g.add_node1(OpKind::kMul, t.factor_first ? std::vector<ValueId>{c, y} : std::vector<ValueId>{y, c}),
                "z");
  if (t.y_is_output) g.mark_output(y, "y");
  return g;
}

Graph folded(const Graph& g, uint32_t seed) {
  return pass_applied(
      g,
      [](Graph& f) {
        const bool changed = fold_channel_scales(f);
        fold_constants(f);
        return changed;
      },
      seed, 1e-5f);
}

TEST(ChannelScales, LinearFactorGoesIntoWeightAndBias) {
  for (const Tail& t : {Tail{}, Tail{.factor_first = true}, Tail{.bias = false}, Tail{.factor = {1, 1, 16}},
                        Tail{.factor = {}}, Tail{.factor = {1}}}) {
    const Graph f = folded(scaled_linear(t), 4);
    EXPECT_EQ(count_ops(f, OpKind::kMul), 0) << f.to_string();
    ASSERT_EQ(count_ops(f, OpKind::kLinear), 1);
    for (const auto& n : f.nodes())
      if (n->op == OpKind::kLinear) {
        EXPECT_EQ(n->inputs.size(), t.bias ? 3u : 2u);
        for (size_t i = 1; i < n->inputs.size(); ++i) EXPECT_TRUE(f.value(n->inputs[i]).is_constant());
      }
  }
}

TEST(ChannelScales, ConvFactorPerOutputChannel) {
  for (const Shape& factor : std::vector<Shape>{{6, 1, 1}, {1, 6, 1, 1}, {}}) {
    for (const int64_t groups : {1, 3}) {
      Graph g;
      const ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 7, 7}));
      const ValueId w = f32_weight(g, "w", {6, 3 / groups, 3, 3}, 5);
      const ValueId y = g.add_node1(OpKind::kConv, {x, w, f32_weight(g, "b", {6}, 6)}, conv2d_attrs(1, 1, groups));
      g.mark_output(g.add_node1(OpKind::kMul, {y, f32_weight(g, "c", factor, 7, 0.5f, 1.5f)}), "z");
      const Graph f = folded(g, 8);
      EXPECT_EQ(count_ops(f, OpKind::kMul), 0) << f.to_string();
      EXPECT_EQ(count_ops(f, OpKind::kConv), 1);
    }
  }
}

TEST(ChannelScales, OtherFactorsAndProducersAreLeftAlone) {
  for (const Tail& t : {Tail{.factor = {5, 1}},            // per row, not per channel
                        Tail{.factor = {2, 5, 16}},        // a whole tensor
                        Tail{.factor_is_input = true},     // computed at run time
                        Tail{.y_is_output = true},         // the unscaled value is read elsewhere
                        Tail{.activation = "relu"}}) {     // the factor would come after the relu
    Graph g = scaled_linear(t);
    EXPECT_FALSE(fold_channel_scales(g)) << g.to_string();
  }
  // A linear with a residual: (x W + b + r) * c is not (x W c + b c) + r.
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 8}));
  const ValueId r = g.add_input("r", TensorType(DType::kF32, {4, 16}));
  const ValueId y = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "w", {16, 8}, 1), f32_weight(g, "b", {16}, 2), r});
  g.mark_output(g.add_node1(OpKind::kMul, {y, f32_weight(g, "c", {16}, 3)}), "z");
  EXPECT_FALSE(fold_channel_scales(g));
}

// ConvNeXt's block: depthwise conv (NCHW) -> permute to NHWC -> two linears -> permute back ->
// layer scale [C, 1, 1] -> + the block input. The CUDA plan (channels-last) runs the tail as the
// second linear with the residual in its epilogue.
TEST(ChannelScales, ThroughTheBuilderConvNeXtsTailIsOneLinear) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 8, 4, 4}));
  const ValueId dw = g.add_node1(OpKind::kConv, {x, f32_weight(g, "dw", {8, 1, 3, 3}, 1), f32_weight(g, "dwb", {8}, 2)},
                                 conv2d_attrs(1, 1, 8));
  const ValueId h = g.add_node1(OpKind::kLinear, {permute(g, dw, {0, 2, 3, 1}), f32_weight(g, "w1", {32, 8}, 3)});
  const ValueId y = g.add_node1(OpKind::kLinear, {h, f32_weight(g, "w2", {8, 32}, 4), f32_weight(g, "b2", {8}, 5)});
  const ValueId gamma = f32_weight(g, "gamma", {8, 1, 1}, 6, 0.5f, 1.5f);
  g.mark_output(g.add_node1(OpKind::kAdd, {g.add_node1(OpKind::kMul, {gamma, permute(g, y, {0, 3, 1, 2})}), x}), "z");
  for (const DeviceType device : {DeviceType::kCPU, DeviceType::kCUDA}) {
    BuilderConfig cfg;
    cfg.device.type = device;
    const Graph plan = Builder(cfg).optimize(g);
    const auto in = random_inputs(g, 9);
    expect_close(run_plain(plan, in), run_plain(g, in), 1e-5f, 1e-5f);
    if (device == DeviceType::kCPU) continue;  // channels-first: the permute stays before the product
    EXPECT_EQ(count_ops(plan, OpKind::kMul), 0) << plan.to_string();
    EXPECT_EQ(count_ops(plan, OpKind::kAdd), 0) << plan.to_string();
    EXPECT_EQ(count_ops(plan, OpKind::kFusedPointwise), 0) << plan.to_string();
    int with_residual = 0;
    for (const auto& n : plan.nodes()) with_residual += n->op == OpKind::kLinear && n->inputs.size() == 4;
    EXPECT_EQ(with_residual, 1) << plan.to_string();
  }
}

}  // namespace
