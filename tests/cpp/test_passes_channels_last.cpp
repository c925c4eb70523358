// to_channels_last (src/passes/channels_last.cpp) and the channels-last conv it produces:
// the conv's shape rule for layout "nhwc", the CPU kernel against the channels-first conv,
// golden IR for a conv chain (one permute in, one out), and whole regions with residuals,
// activations, squeeze-excite products and a global pool computing what the original graph
// computes, on random inputs.
#include "src/ops/shape_rules.h"
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

// Converts a copy of g, checks it verifies and matches g on random inputs; returns it.
Graph convert_and_compare(const Graph& g, uint32_t seed) {
  Graph f = g;
  EXPECT_TRUE(to_channels_last(f));
  f.verify();
  fold_constants(f);
  auto in = random_inputs(g, seed);
  expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-5f);
  return f;
}

size_t count_op(const Graph& g, OpKind op) {
  return size_t(std::count_if(g.nodes().begin(), g.nodes().end(), [&](const auto& n) { return n->op == op; }));
}

TEST(ChannelsLastConv, ShapeRuleTakesChannelsLastTensors) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 9, 9, 4}));
  ValueId w = f32_weight(g, "w", {6, 3, 3, 2}, 1);
  ValueId b = f32_weight(g, "b", {6}, 2);
  Attrs a = conv2d_attrs(2, 1, 2);
  a.set("layout", std::string("nhwc"));
  ValueId y = g.add_node1(OpKind::kConv, {x, w, b}, a);
  EXPECT_EQ(g.type(y).shape(), (Shape{2, 5, 5, 6}));

  ValueId r = g.add_input("r", TensorType(DType::kF32, {2, 6, 5, 5}));  // channels-first: wrong
  expect_error([&] { g.add_node1(OpKind::kConv, {x, w, b, r}, a); }, ErrorCode::kShapeMismatch, {"residual"});
  Attrs bad = conv2d_attrs(1, 0, 1);
  bad.set("layout", std::string("nwhc"));
  expect_error([&] { g.add_node1(OpKind::kConv, {x, w}, bad); }, ErrorCode::kInvalidArgument, {"\"nwhc\""});
  Attrs transpose;
  transpose.set("layout", std::string("nhwc"));
  ValueId wt = f32_weight(g, "wt", {9, 2, 3, 3}, 3);
  ValueId xt = g.add_input("xt", TensorType(DType::kF32, {1, 9, 4, 4}));
  expect_error([&] { g.add_node1(OpKind::kConvTranspose, {xt, wt}, transpose); }, ErrorCode::kInvalidArgument,
               {"applies to conv, max_pool, avg_pool and group_norm only"});
}

// One conv of every CPU path (im2col, 1x1, depthwise; an RGB input, padded to 4 channels) with
// bias, residual and relu, channels-first against the same conv channels-last on the permuted
// tensors.
TEST(ChannelsLastConv, CpuKernelMatchesChannelsFirst) {
  struct Case {
    Shape x, w;
    int64_t stride, pad, groups;
  };
  for (const Case& c : {Case{{2, 5, 7, 7}, {6, 5, 3, 3}, 2, 1, 1}, Case{{1, 8, 5, 6}, {4, 8, 1, 1}, 1, 0, 1},
                        Case{{2, 6, 9, 9}, {6, 1, 3, 3}, 1, 1, 6}, Case{{2, 3, 8, 8}, {5, 3, 3, 3}, 2, 1, 1}}) {
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, c.x));
    ValueId w = f32_weight(g, "w", c.w, 4);
    ValueId b = f32_weight(g, "b", {c.w[0]}, 5);
    Attrs a = conv2d_attrs(c.stride, c.pad, c.groups);
    ValueId y0 = g.add_node1(OpKind::kConv, {x, w, b}, a);
    ValueId r = g.add_input("r", g.type(y0));
    a.set("activation", std::string("relu"));
    g.mark_output(g.add_node1(OpKind::kConv, {x, w, b, r}, a), "y");
    Graph f = convert_and_compare(g, 7);
    // x, r in; y out. An RGB x is read by its pad (input_perm) instead of a permute.
    EXPECT_EQ(count_op(f, OpKind::kPermute), c.x[1] < 4 ? 2u : 3u) << f.to_string();
  }
}

TEST(ToChannelsLast, ConvChainKeepsOnePermuteEachWayGolden) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {1, 8, 4, 4}));
  ValueId w1 = f32_weight(g, "w1", {9, 8, 1, 1}, 1);
  ValueId w2 = f32_weight(g, "w2", {10, 9, 1, 1}, 2);
  Attrs relu;
  relu.set("activation", std::string("relu"));
  ValueId y = g.add_node1(OpKind::kConv, {x, w1}, relu);
  y = g.add_node1(OpKind::kHardswish, {y});
  y = g.add_node1(OpKind::kConv, {y, w2});
  g.mark_output(y, "y");
  Graph f = convert_and_compare(g, 3);
  EXPECT_EQ(f.to_string(),
            "graph(%0 \"x\": f32[1,8,4,4]) {\n"
            "  %6: f32[9,1,1,8] = constant\n"
            "  %7: f32[10,1,1,9] = constant\n"
            "  %1: f32[1,4,4,8] = permute(%0) {perm=[0,2,3,1]}\n"
            "  %2: f32[1,4,4,9] = conv(%1, %6) {activation=\"relu\", layout=\"nhwc\"}\n"
            "  %5: f32[1,4,4,9] = hardswish(%2)\n"
            "  %3: f32[1,4,4,10] = conv(%5, %7) {layout=\"nhwc\"}\n"
            "  %4: f32[1,10,4,4] = permute(%3) {perm=[0,3,1,2]}\n"
            "  return %4 \"y\"\n"
            "}\n");
  EXPECT_FALSE(to_channels_last(f));
}

// A residual block, a squeeze-excite block (global pool, 1x1 convs, a per-channel product) and
// a global pool into a linear head, as in ResNet and MobileNetV3.
TEST(ToChannelsLast, ResidualAndSqueezeExciteRegionsConvertOnlyAtTheBoundary) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 8, 6, 6}));
  Attrs same = conv2d_attrs(1, 1, 1);
  ValueId a = g.add_node1(OpKind::kConv, {x, f32_weight(g, "c1", {8, 8, 3, 3}, 1), f32_weight(g, "b1", {8}, 2)}, same);
  Attrs res = same;
  res.set("activation", std::string("relu"));
  ValueId blk = g.add_node1(OpKind::kConv, {a, f32_weight(g, "c2", {8, 8, 3, 3}, 3), kNoValue, x}, res);
  // squeeze-excite
  Attrs pool;
  pool.set("output_size", Shape{1, 1});
  ValueId s = g.add_node1(OpKind::kAdaptiveAvgPool, {blk}, pool);
  ValueId one = g.add_constant("", TensorType(DType::kF32, {}), random_floats(1, 9).data(), 4);
  s = g.add_node1(OpKind::kConv, {s, f32_weight(g, "se1", {2, 8, 1, 1}, 4)});
  s = g.add_node1(OpKind::kRelu, {s});
  s = g.add_node1(OpKind::kConv, {s, f32_weight(g, "se2", {8, 2, 1, 1}, 5)});
  s = g.add_node1(OpKind::kHardsigmoid, {s});
  ValueId z = g.add_node1(OpKind::kMul, {blk, s});
  z = g.add_node1(OpKind::kMul, {z, one});
  ValueId head = g.add_node1(OpKind::kAdaptiveAvgPool, {z}, pool);
  Attrs flat;
  flat.set("shape", Shape{2, 8});
  head = g.add_node1(OpKind::kReshape, {head}, flat);
  g.mark_output(g.add_node1(OpKind::kLinear, {head, f32_weight(g, "fc", {3, 8}, 6)}), "y");
  Graph f = convert_and_compare(g, 5);
  // One permute into the region (x, shared by the first conv and the residual); the way out is
  // the pooled [2,1,1,8] head, whose permute to [2,8,1,1] moves only dims of 1: a reshape.
  EXPECT_EQ(count_op(f, OpKind::kPermute), 1u) << f.to_string();
  EXPECT_EQ(count_op(f, OpKind::kAdaptiveAvgPool), 0u) << f.to_string();
  EXPECT_EQ(count_op(f, OpKind::kReduceMean), 2u) << f.to_string();
}

// A UNet's resnet block: conv -> group_norm -> silu -> conv. The group_norm runs channels last,
// so the region keeps one permute in and one out, and the result is the channels-first one's.
TEST(ToChannelsLast, GroupNormRunsChannelsLast) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 8, 5, 5}));
  ValueId y = g.add_node1(OpKind::kConv, {x, f32_weight(g, "c1", {12, 8, 3, 3}, 1)}, conv2d_attrs(1, 1, 1));
  Attrs gn;
  gn.set("groups", int64_t(3));
  gn.set("eps", 1e-5);
  y = g.add_node1(OpKind::kGroupNorm, {y, f32_weight(g, "gw", {12}, 2), f32_weight(g, "gb", {12}, 3)}, gn);
  y = g.add_node1(OpKind::kSilu, {y});
  y = g.add_node1(OpKind::kConv, {y, f32_weight(g, "c2", {4, 12, 1, 1}, 4)});
  g.mark_output(y, "y");
  Graph f = convert_and_compare(g, 7);
  EXPECT_EQ(count_op(f, OpKind::kPermute), 2u) << f.to_string();
  const auto it =
      std::find_if(f.nodes().begin(), f.nodes().end(), [](const auto& n) { return n->op == OpKind::kGroupNorm; });
  ASSERT_NE(it, f.nodes().end());
  EXPECT_TRUE(channels_last((*it)->op, (*it)->attrs)) << f.to_string();
  EXPECT_EQ(f.type((*it)->outputs[0]).shape(), (Shape{2, 5, 5, 12}));
}

TEST(ChannelsLastGroupNorm, ShapeRuleTakesChannelsLastTensors) {
  Attrs a;
  a.set("groups", int64_t(4));
  a.set("layout", std::string("nhwc"));
  const TensorType x(DType::kF16, {2, 3, 3, 8}), p(DType::kF32, {8}), wrong(DType::kF32, {3});
  EXPECT_EQ(infer_types(OpKind::kGroupNorm, {&x, &p, &p}, a).at(0).shape(), (Shape{2, 3, 3, 8}));
  EXPECT_THROW(infer_types(OpKind::kGroupNorm, {&x, &wrong, &wrong}, a), Error);  // weight is per channel: [8]
  const TensorType flat(DType::kF16, {2, 8, 9});
  try {
    infer_types(OpKind::kGroupNorm, {&flat, nullptr, nullptr}, a);
    ADD_FAILURE() << "a rank-3 channels-last group_norm was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be [N, H, W, C]"), std::string::npos) << e.what();
  }
  const TensorType bn_x(DType::kF32, {2, 3, 3, 8});
  Attrs bn;
  bn.set("layout", std::string("nhwc"));
  EXPECT_THROW(infer_types(OpKind::kBatchNorm, {&bn_x, &p, &p}, bn), Error);  // only the listed ops take it
}

// ResNet's first block of a stage: 1x1 -> 3x3 stride 2 -> 1x1 with the residual from a strided
// 1x1 downsample of the block input, fused as the last conv's residual (fuse_epilogue).
TEST(ToChannelsLast, BottleneckWithDownsampleResidual) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 8, 6, 6}));
  Attrs relu1 = conv2d_attrs(1, 0, 1), relu2 = conv2d_attrs(2, 1, 1);
  relu1.set("activation", std::string("relu"));
  relu2.set("activation", std::string("relu"));
  ValueId a = g.add_node1(OpKind::kConv, {x, f32_weight(g, "c1", {4, 8, 1, 1}, 1), f32_weight(g, "b1", {4}, 2)}, relu1);
  a = g.add_node1(OpKind::kConv, {a, f32_weight(g, "c2", {4, 4, 3, 3}, 3), f32_weight(g, "b2", {4}, 4)}, relu2);
  ValueId d = g.add_node1(OpKind::kConv, {x, f32_weight(g, "cd", {16, 8, 1, 1}, 5), f32_weight(g, "bd", {16}, 6)},
                          conv2d_attrs(2, 0, 1));
  ValueId y = g.add_node1(OpKind::kConv, {a, f32_weight(g, "c3", {16, 4, 1, 1}, 7), f32_weight(g, "b3", {16}, 8), d},
                          relu1);
  g.mark_output(y, "y");
  Graph f = convert_and_compare(g, 11);
  EXPECT_EQ(count_op(f, OpKind::kPermute), 2u) << f.to_string();
}

TEST(ChannelsLastPool, ShapeRuleAndCpuKernelMatchChannelsFirst) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 9, 9, 5}));
  Attrs a;
  a.set("kernel", Shape{3, 3});
  a.set("stride", Shape{2, 2});
  a.set("padding", Shape{1, 1});
  a.set("layout", std::string("nhwc"));
  EXPECT_EQ(g.type(g.add_node1(OpKind::kMaxPool, {x}, a)).shape(), (Shape{2, 5, 5, 5}));
  Attrs adaptive;
  adaptive.set("output_size", Shape{1, 1});
  adaptive.set("layout", std::string("nhwc"));
  expect_error([&] { g.add_node1(OpKind::kAdaptiveAvgPool, {x}, adaptive); }, ErrorCode::kInvalidArgument,
               {"adaptive_avg_pool", "layout"});

  // conv -> max_pool / avg_pool (ceil mode, padding excluded) -> conv: the pools go channels-last.
  for (OpKind pool : {OpKind::kMaxPool, OpKind::kAvgPool}) {
    Graph h;
    ValueId in = h.add_input("x", TensorType(DType::kF32, {2, 4, 9, 9}));
    ValueId y = h.add_node1(OpKind::kConv, {in, f32_weight(h, "w1", {6, 4, 3, 3}, 1)}, conv2d_attrs(1, 1, 1));
    Attrs p;
    p.set("kernel", Shape{3, 3});
    p.set("stride", Shape{2, 2});
    p.set("padding", Shape{1, 1});
    if (pool == OpKind::kAvgPool) {
      p.set("ceil_mode", true);
      p.set("count_include_pad", false);
    }
    y = h.add_node1(pool, {y}, p);
    h.mark_output(h.add_node1(OpKind::kConv, {y, f32_weight(h, "w2", {3, 6, 1, 1}, 2)}), "y");
    Graph f = convert_and_compare(h, 8);
    EXPECT_EQ(count_op(f, OpKind::kPermute), 2u) << f.to_string();
    for (const auto& n : f.nodes()) EXPECT_TRUE(n->op != pool || channels_last(n->op, n->attrs)) << f.to_string();
  }
}

TEST(ToChannelsLast, LeavesGraphsWithoutTwoDimensionalConvsAlone) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 8}));
  ValueId y = g.add_node1(OpKind::kConv, {x, f32_weight(g, "w", {4, 3, 3}, 1)});
  g.mark_output(g.add_node1(OpKind::kRelu, {y}), "y");
  const std::string before = g.to_string();
  EXPECT_FALSE(to_channels_last(g));
  EXPECT_EQ(g.to_string(), before);
}

// pool_before_epilogue: an image conv's bias and a never-decreasing activation move behind its
// max pool; the result matches the original graph (ceil mode and padding included).
Graph stem(const std::string& act, int64_t channels, bool second_use, bool half = true) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, channels, 13, 13}));
  Attrs c = conv2d_attrs(2, 3, 1);
  if (!act.empty()) c.set("activation", act);
  if (act == "clipped_relu") c.set("activation_max", 0.5);
  ValueId y = g.add_node1(OpKind::kConv, {x, f32_weight(g, "w", {6, channels, 7, 7}, 1), f32_weight(g, "b", {6}, 2)}, c);
  Attrs p;
  p.set("kernel", Shape{3, 3});
  p.set("stride", Shape{2, 2});
  p.set("padding", Shape{1, 1});
  p.set("ceil_mode", true);
  g.mark_output(g.add_node1(OpKind::kMaxPool, {y}, p), "y");
  if (second_use) g.mark_output(y, "conv");
  if (half) lower_precision(g, DType::kF16);
  return g;
}

TEST(PoolBeforeEpilogue, ImageConvRunsAloneAndTheEpilogueFollowsThePool) {
  for (const std::string act : {"relu", "sigmoid", "clipped_relu", ""}) {
    const Graph g = stem(act, 3, false);
    Graph f = g;
    ASSERT_TRUE(to_channels_last(f));
    ASSERT_TRUE(pool_before_epilogue(f)) << f.to_string();
    f.verify();
    fold_constants(f);
    for (const auto& n : f.nodes())
      if (n->op == OpKind::kConv) {
        EXPECT_EQ(n->inputs.size(), 2u) << f.to_string();
        EXPECT_FALSE(n->attrs.has("activation")) << f.to_string();
      }
    EXPECT_EQ(count_op(f, OpKind::kAdd), 1u) << f.to_string();
    const auto in = random_inputs(g, 3);
    expect_close(run_plain(f, in), run_plain(g, in), 2e-3f, 2e-3f);
  }
}

TEST(PoolBeforeEpilogue, LeavesOtherConvsAlone) {
  for (const Graph& g : {stem("silu", 3, false),    // silu decreases below its minimum
                         stem("relu", 8, false),    // not an image
                         stem("relu", 3, true),     // the conv's output has another reader
                         stem("relu", 3, false, false)}) {  // f32
    Graph f = g;
    ASSERT_TRUE(to_channels_last(f));
    EXPECT_FALSE(pool_before_epilogue(f)) << f.to_string();
  }
}

// pad with input_perm reads x permuted: the same as pad(permute(x)) in every mode, padded dim
// and dtype size the CPU kernel has (the last dim strided in x included); a bad perm is refused.
TEST(PadInputPerm, ReadsThePermutedInput) {
  struct Case {
    Shape x, perm, pads;
    std::string mode;
  };
  for (const Case& c : {Case{{2, 3, 4, 5}, {0, 2, 3, 1}, {0, 0, 0, 0, 0, 0, 0, 1}, "constant"},
                        Case{{2, 3, 4, 5}, {0, 2, 3, 1}, {0, 1, 1, 0, 0, 0, 2, 1}, "reflect"},
                        Case{{3, 4, 5}, {2, 0, 1}, {1, 0, 0, 2, 1, 1}, "replicate"}}) {
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, c.x));
    Attrs pa;
    pa.set("perm", c.perm);
    Attrs pad;
    pad.set("pads", c.pads);
    pad.set("mode", c.mode);
    g.mark_output(g.add_node1(OpKind::kPad, {g.add_node1(OpKind::kPermute, {x}, pa)}, pad), "two");
    pad.set("input_perm", c.perm);
    ValueId fused = g.add_node1(OpKind::kPad, {x}, pad);
    g.mark_output(fused, "one");
    const auto out = run_plain(g, random_inputs(g, 5));
    EXPECT_EQ(g.type(fused), g.type(g.outputs()[0]));
    expect_close({out[1]}, {out[0]}, 0, 0);
  }
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 4}));
  Attrs bad;
  bad.set("pads", Shape{0, 0, 0, 0, 0, 1});
  bad.set("input_perm", Shape{0, 2, 2});
  expect_error([&] { g.add_node1(OpKind::kPad, {x}, bad); }, ErrorCode::kInvalidArgument,
               {"input_perm", "not a permutation"});
}

}  // namespace
