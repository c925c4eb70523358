// convs_to_linears and dense_convs_to_linears (src/passes/patch_conv.cpp) and collapse_view_chains
// (src/passes/collapse_views.cpp): a patch-embedding conv becomes permute -> linear -> permute
// and a squeeze-excitation conv a linear, each computing what the conv computed; the convs they
// must leave alone stay convs; ViT's flatten(2).transpose(1, 2) after it collapses into a
// reshape; the whole pipeline on the CPU, refit of the patch weights included.
#include "kiln/refit.h"
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

// conv(x, w, b) with stride = kernel, then (tokens) reshape to [N, O, OH*OW] and transpose to
// [N, OH*OW, O], as torchvision's ViT does.
Graph patch_net(const Shape& x_shape, const Shape& w_shape, bool bias, bool tokens, uint32_t seed = 1) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, x_shape));
  std::vector<ValueId> ins = {x, f32_weight(g, "conv.w", w_shape, seed)};
  if (bias) ins.push_back(f32_weight(g, "conv.b", {w_shape[0]}, seed + 1));
  Attrs a;
  a.set("stride", Shape{w_shape[2], w_shape[3]});
  a.set("padding", Shape{0, 0});
  a.set("dilation", Shape{1, 1});
  a.set("groups", int64_t(1));
  ValueId y = g.add_node1(OpKind::kConv, ins, a, "conv");
  if (tokens) {
    const Shape s = g.type(y).shape();
    Attrs flat;
    flat.set("shape", Shape{s[0], s[1], s[2] * s[3]});
    y = g.add_node1(OpKind::kReshape, {y}, flat);
    Attrs t;
    t.set("perm", Shape{0, 2, 1});
    y = g.add_node1(OpKind::kPermute, {y}, t);
  }
  g.mark_output(y, "y");
  return g;
}

// Runs both passes on a copy of g (and fold_constants, as the builder does); checks it against g.
Graph rewrite_and_compare(const Graph& g, uint32_t seed) {
  Graph f = g;
  EXPECT_TRUE(convs_to_linears(f));
  collapse_view_chains(f);
  fold_constants(f);
  f.verify();
  auto in = random_inputs(g, seed);
  expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-5f);
  return f;
}

TEST(ConvsToLinears, PatchConvBecomesOneLinearAndMatches) {
  struct Case {
    Shape x, w;
    bool bias;
  };
  for (const Case& c : {Case{{2, 3, 8, 12}, {5, 3, 4, 4}, true}, Case{{1, 2, 6, 4}, {3, 2, 3, 2}, false},
                        Case{{3, 4, 10, 5}, {7, 4, 5, 1}, true}}) {
    const Graph f = rewrite_and_compare(patch_net(c.x, c.w, c.bias, false), 3);
    EXPECT_EQ(count_ops(f, OpKind::kConv), 0) << f.to_string();
    EXPECT_EQ(count_ops(f, OpKind::kLinear), 1) << f.to_string();
    EXPECT_EQ(count_ops(f, OpKind::kPermute), 2) << f.to_string();  // image -> patches, NHWC -> NCHW
  }
}

TEST(ConvsToLinears, TokensAfterThePatchLinearAreItsOutputReshaped) {
  const Graph f = rewrite_and_compare(patch_net({2, 3, 8, 8}, {6, 3, 4, 4}, true, true), 5);
  EXPECT_EQ(count_ops(f, OpKind::kPermute), 1) << f.to_string();  // only the image's
  EXPECT_EQ(f.value(f.outputs()[0]).producer->op, OpKind::kReshape) << f.to_string();
  EXPECT_EQ(f.type(f.outputs()[0]).shape(), (Shape{2, 4, 6}));
}

TEST(ConvsToLinears, LeavesOtherConvsAlone) {
  auto conv = [](const Shape& x, const Shape& w, const Shape& stride, int64_t pad, int64_t groups) {
    Graph g;
    ValueId in = g.add_input("x", TensorType(DType::kF32, x));
    Attrs a = conv2d_attrs(1, pad, groups);
    a.set("stride", stride);
    g.mark_output(g.add_node1(OpKind::kConv, {in, f32_weight(g, "w", w, 2)}, a), "y");
    return g;
  };
  for (Graph g : {conv({1, 3, 8, 8}, {4, 3, 4, 4}, {2, 2}, 0, 1),    // overlapping windows
                  conv({1, 3, 8, 8}, {4, 3, 4, 4}, {4, 4}, 1, 1),    // padded
                  conv({1, 4, 8, 8}, {4, 2, 4, 4}, {4, 4}, 0, 2),    // grouped
                  conv({1, 3, 10, 8}, {4, 3, 4, 4}, {4, 4}, 0, 1),   // H leaves a remainder
                  conv({1, 8, 5, 5}, {4, 8, 1, 1}, {1, 1}, 0, 1)}) {  // 1x1: channels-last's
    EXPECT_FALSE(convs_to_linears(g)) << g.to_string();
    EXPECT_EQ(count_ops(g, OpKind::kConv), 1);
  }
}

// A channels-last conv over x [N, H, W, C] with weight [O, kh, kw, C / groups], bias, and
// optionally a residual and an activation.
Graph nhwc_conv(const Shape& x, const Shape& w, int64_t stride, int64_t pad, int64_t groups, bool residual,
                const std::string& act) {
  Graph g;
  std::vector<ValueId> ins = {g.add_input("x", TensorType(DType::kF32, x)), f32_weight(g, "w", w, 4),
                              f32_weight(g, "b", {w[0]}, 5)};
  const int64_t oh = (x[1] + 2 * pad - w[1]) / stride + 1, ow = (x[2] + 2 * pad - w[2]) / stride + 1;
  if (residual) ins.push_back(g.add_input("r", TensorType(DType::kF32, {x[0], oh, ow, w[0]})));
  Attrs a = conv2d_attrs(stride, pad, groups);
  a.set("layout", std::string("nhwc"));
  if (!act.empty()) a.set("activation", act);
  g.mark_output(g.add_node1(OpKind::kConv, ins, a, "conv"), "y");
  return g;
}

TEST(DenseConvsToLinears, SqueezeExcitationConvsBecomeLinearsAndMatch) {
  for (const auto& [residual, act] : std::vector<std::pair<bool, std::string>>{
           {false, ""}, {false, "relu"}, {false, "sigmoid"}, {true, "hardswish"}}) {
    const Graph g = nhwc_conv({3, 1, 1, 12}, {5, 1, 1, 12}, 1, 0, 1, residual, act);
    Graph f = g;
    EXPECT_TRUE(dense_convs_to_linears(f));
    fold_constants(f);
    f.verify();
    EXPECT_EQ(count_ops(f, OpKind::kConv), 0) << f.to_string();
    ASSERT_EQ(count_ops(f, OpKind::kLinear), 1) << f.to_string();
    for (const auto& n : f.nodes())
      if (n->op == OpKind::kLinear) {
        EXPECT_EQ(n->attrs.get_string("activation", ""), act);
        EXPECT_EQ(n->inputs.size(), residual ? 4u : 3u);
      }
    EXPECT_EQ(f.type(f.outputs()[0]).shape(), (Shape{3, 1, 1, 5}));
    const auto in = random_inputs(g, 13);
    expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-5f);
  }
  for (Graph g : {nhwc_conv({2, 2, 2, 8}, {4, 1, 1, 8}, 1, 0, 1, false, ""),    // a larger image
                  nhwc_conv({2, 1, 1, 8}, {4, 3, 3, 8}, 1, 1, 1, false, ""),    // padded 3x3
                  nhwc_conv({2, 1, 1, 8}, {8, 1, 1, 4}, 1, 0, 2, false, ""),    // grouped
                  patch_net({2, 8, 1, 1}, {4, 8, 1, 1}, true, false)}) {        // channels first
    EXPECT_FALSE(dense_convs_to_linears(g)) << g.to_string();
    EXPECT_EQ(count_ops(g, OpKind::kConv), 1);
  }
}

TEST(CollapseViewChains, InOrderChainsBecomeReshapesOthersStay) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 4, 5}));
  auto permute = [&](ValueId v, const Shape& p) {
    Attrs a;
    a.set("perm", p);
    return g.add_node1(OpKind::kPermute, {v}, a);
  };
  auto reshape = [&](ValueId v, const Shape& s) {
    Attrs a;
    a.set("shape", s);
    return g.add_node1(OpKind::kReshape, {v}, a);
  };
  ValueId e = g.add_node1(OpKind::kExp, {x});  // an intermediate, so the chain starts inside the graph
  // [2, 3, 4, 5] -> NCHW-style [2, 5, 3, 4] -> [2, 5, 12] -> [2, 12, 5]: x's order again.
  g.mark_output(permute(reshape(permute(e, {0, 3, 1, 2}), {2, 5, 12}), {0, 2, 1}), "back");
  g.mark_output(permute(e, {0, 2, 1, 3}), "swapped");  // a real transpose
  const auto in = random_inputs(g, 9);
  const auto want = run_plain(g, in);
  EXPECT_TRUE(collapse_view_chains(g));
  g.verify();
  EXPECT_EQ(count_ops(g, OpKind::kPermute), 1) << g.to_string();
  EXPECT_EQ(g.type(g.outputs()[0]).shape(), (Shape{2, 12, 5}));
  expect_close(run_plain(g, in), want, 0, 0);
  EXPECT_FALSE(collapse_view_chains(g));
}

TEST(ConvsToLinears, BuilderRunsItAndRefitRederivesThePatchWeights) {
  const Graph g = patch_net({2, 3, 8, 8}, {6, 3, 4, 4}, true, true, 1);
  BuilderConfig cfg;
  cfg.refittable = true;
  auto e = Builder(cfg).build(g);
  EXPECT_NE(e->build_log().find("pass convs_to_linears: changed"), std::string::npos) << e->build_log();
  EXPECT_NE(e->build_log().find("pass collapse_view_chains: changed"), std::string::npos) << e->build_log();
  EXPECT_EQ(count_ops(e->graph(), OpKind::kConv), 0) << e->graph().to_string();
  const auto in = random_inputs(g, 11);
  expect_close(run_engine(e, in), run_plain(g, in), 1e-5f, 1e-5f);

  // New patch weights through a refit give what a build with them gives.
  const Graph other = patch_net({2, 3, 8, 8}, {6, 3, 4, 4}, true, true, 40);
  Refitter r(e);
  const Floats w = random_floats(6 * 3 * 4 * 4, 40), b = random_floats(6, 41);
  r.set_weight("conv.w", TensorType(DType::kF32, {6, 3, 4, 4}), w.data());
  r.set_weight("conv.b", TensorType(DType::kF32, {6}), b.data());
  r.refit();
  expect_close(run_engine(e, in), run_plain(other, in), 1e-5f, 1e-5f);
}

}  // namespace
