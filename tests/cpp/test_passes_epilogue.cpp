// fuse_epilogue (src/passes/fuse_epilogue.cpp) and the epilogue of linear / conv it targets
// (bias, residual, activation): golden before/after IR, the fused graph computing what the
// unfused one computes on the CPU reference kernels (every conv path, every activation), the
// single-use and ordering rules, and the shape rules' messages for bad epilogues.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

const char* const kActivations[] = {"none",    "relu", "gelu",      "gelu_tanh",   "silu",
                                    "sigmoid", "tanh", "hardswish", "hardsigmoid", "clipped_relu"};

// The unary node computing `act` on v (v itself for "none").
ValueId apply_activation(Graph& g, ValueId v, const std::string& act) {
  if (act == "none") return v;
  Attrs a;
  OpKind op = OpKind::kRelu;
  if (act == "gelu" || act == "gelu_tanh") {
    op = OpKind::kGelu;
    a.set("approximate", std::string(act == "gelu" ? "none" : "tanh"));
  } else if (act == "silu") {
    op = OpKind::kSilu;
  } else if (act == "sigmoid") {
    op = OpKind::kSigmoid;
  } else if (act == "tanh") {
    op = OpKind::kTanh;
  } else if (act == "hardswish") {
    op = OpKind::kHardswish;
  } else if (act == "hardsigmoid") {
    op = OpKind::kHardsigmoid;
  } else if (act == "clipped_relu") {  // a clamp to [0, 0.5]: random inputs cross both bounds
    op = OpKind::kClamp;
    a.set("min", 0.0);
    a.set("max", 0.5);
  }
  return g.add_node1(op, {v}, a);
}

// Fuses a copy of g (then folds the bias reshapes of constants, as the builder does), checks
// it verifies and matches g numerically; returns the fused graph.
Graph fuse_and_compare(const Graph& g, uint32_t seed, bool fold = true, bool pointwise_follows = true) {
  Graph f = g;
  fuse_epilogue(f, pointwise_follows);
  f.verify();
  if (fold) fold_constants(f);
  auto in = random_inputs(g, seed);
  expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-5f);
  return f;
}

TEST(FuseEpilogue, LinearBiasResidualGeluGolden) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4}));
  ValueId r = g.add_input("r", TensorType(DType::kF32, {2, 3}));
  ValueId w = f32_weight(g, "w", {3, 4}, 1);
  ValueId b = f32_weight(g, "b", {3}, 2);
  ValueId y = g.add_node1(OpKind::kLinear, {x, w});
  y = g.add_node1(OpKind::kAdd, {y, b});
  y = g.add_node1(OpKind::kAdd, {r, y});
  Attrs tanh_approx;
  tanh_approx.set("approximate", std::string("tanh"));
  g.mark_output(g.add_node1(OpKind::kGelu, {y}, tanh_approx), "y");
  EXPECT_EQ(g.to_string(),
            "graph(%0 \"x\": f32[2,4], %1 \"r\": f32[2,3]) {\n"
            "  %2 \"w\": f32[3,4] = weight\n"
            "  %3 \"b\": f32[3] = weight\n"
            "  %4: f32[2,3] = linear(%0, %2)\n"
            "  %5: f32[2,3] = add(%4, %3)\n"
            "  %6: f32[2,3] = add(%1, %5)\n"
            "  %7: f32[2,3] = gelu(%6) {approximate=\"tanh\"}\n"
            "  return %7 \"y\"\n"
            "}\n");
  Graph f = fuse_and_compare(g, 11);
  EXPECT_EQ(f.to_string(),
            "graph(%0 \"x\": f32[2,4], %1 \"r\": f32[2,3]) {\n"
            "  %2 \"w\": f32[3,4] = weight\n"
            "  %3 \"b\": f32[3] = weight\n"
            "  %4: f32[2,3] = linear(%0, %2, %3, %1) {activation=\"gelu_tanh\"}\n"
            "  return %4 \"y\"\n"
            "}\n");
  EXPECT_FALSE(fuse_epilogue(f));
}

TEST(FuseEpilogue, ConvChannelShiftBecomesBiasGolden) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {1, 3, 6, 6}));
  ValueId w = f32_weight(g, "conv.weight", {4, 3, 3, 3}, 3);
  ValueId shift = f32_weight(g, "shift", {4, 1, 1}, 4);
  ValueId y = g.add_node1(OpKind::kConv, {x, w}, conv2d_attrs(1, 1, 1));
  y = g.add_node1(OpKind::kAdd, {shift, y});
  g.mark_output(g.add_node1(OpKind::kRelu, {y}), "out");
  Graph f = fuse_and_compare(g, 12, false);
  EXPECT_EQ(f.to_string(),
            "graph(%0 \"x\": f32[1,3,6,6]) {\n"
            "  %1 \"conv.weight\": f32[4,3,3,3] = weight\n"
            "  %2 \"shift\": f32[4,1,1] = weight\n"
            "  %3: f32[4] = reshape(%2) {shape=[4]}\n"
            "  %4: f32[1,4,6,6] = conv(%0, %1, %3) {activation=\"relu\", dilation=[1,1], groups=1, padding=[1,1], "
            "stride=[1,1]}\n"
            "  return %4 \"out\"\n"
            "}\n");
  // fold_constants makes the reshaped shift the bias constant, holding the shift's values.
  EXPECT_TRUE(fold_constants(f));
  EXPECT_EQ(f.to_string(),
            "graph(%0 \"x\": f32[1,3,6,6]) {\n"
            "  %1 \"conv.weight\": f32[4,3,3,3] = weight\n"
            "  %3: f32[4] = constant\n"
            "  %2: f32[1,4,6,6] = conv(%0, %1, %3) {activation=\"relu\", dilation=[1,1], groups=1, padding=[1,1], "
            "stride=[1,1]}\n"
            "  return %2 \"out\"\n"
            "}\n");
  const Value& bias = f.value(f.nodes()[0]->inputs[2]);
  ASSERT_TRUE(bias.is_constant());
  EXPECT_EQ(*bias.data, *g.value(shift).data);
}

TEST(FuseEpilogue, ResidualWithoutBiasAndRunTimeBiasGolden) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4}));
  ValueId c = g.add_input("c", TensorType(DType::kF32, {1, 3}));
  ValueId r = g.add_input("r", TensorType(DType::kF32, {2, 3}));
  ValueId w = f32_weight(g, "w", {3, 4}, 5);
  ValueId y = g.add_node1(OpKind::kLinear, {x, w});
  y = g.add_node1(OpKind::kAdd, {y, r});
  y = g.add_node1(OpKind::kAdd, {y, c});
  g.mark_output(g.add_node1(OpKind::kSigmoid, {y}), "y");
  Graph f = fuse_and_compare(g, 13, false);
  EXPECT_EQ(f.to_string(),
            "graph(%0 \"x\": f32[2,4], %1 \"c\": f32[1,3], %2 \"r\": f32[2,3]) {\n"
            "  %3 \"w\": f32[3,4] = weight\n"
            "  %4: f32[3] = reshape(%1) {shape=[3]}\n"
            "  %5: f32[2,3] = linear(%0, %3, %4, %2) {activation=\"sigmoid\"}\n"
            "  return %5 \"y\"\n"
            "}\n");
}

struct ConvCase {
  const char* what;
  Shape x, w;
  Attrs attrs;
};

std::vector<ConvCase> conv_cases() {
  Attrs one_d;
  one_d.set("stride", Shape{2});
  one_d.set("padding", Shape{1});
  return {
      {"im2col", {2, 4, 7, 7}, {6, 2, 3, 3}, conv2d_attrs(1, 1, 2)},
      {"depthwise", {1, 4, 9, 9}, {4, 1, 3, 3}, conv2d_attrs(2, 1, 4)},
      {"1x1", {2, 3, 5, 5}, {8, 3, 1, 1}, conv2d_attrs(1, 0, 1)},
      {"1d", {2, 3, 10}, {4, 3, 3}, one_d},
  };
}

// Every conv path x {shift as bias, biased conv} x {residual or not} x every activation: the
// chain fuses into one conv that computes the same.
// torch's multi-head attention at batch 1: the out projection's [S, E] result goes back to
// [1, S, E] through a reshape and a permute that moves only the size-1 dim, then the block's
// residual is added. The views keep the element order, so the add fuses as the linear's
// residual, with the residual and the result reshaped around it.
TEST(FuseEpilogue, ResidualThroughOrderKeepingViewsGolden) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {6, 4}));
  ValueId r = g.add_input("r", TensorType(DType::kF32, {1, 6, 4}));
  ValueId w = f32_weight(g, "w", {4, 4}, 1);
  ValueId b = f32_weight(g, "b", {4}, 2);
  Attrs to3, perm;
  to3.set("shape", std::vector<int64_t>{6, 1, 4});
  perm.set("perm", std::vector<int64_t>{1, 0, 2});
  ValueId y = g.add_node1(OpKind::kLinear, {x, w, b});
  y = g.add_node1(OpKind::kPermute, {g.add_node1(OpKind::kReshape, {y}, to3)}, perm);
  g.mark_output(g.add_node1(OpKind::kAdd, {r, y}), "y");
  Graph f = fuse_and_compare(g, 12);
  EXPECT_EQ(f.to_string(),
            "graph(%0 \"x\": f32[6,4], %1 \"r\": f32[1,6,4]) {\n"
            "  %2 \"w\": f32[4,4] = weight\n"
            "  %3 \"b\": f32[4] = weight\n"
            "  %4: f32[6,4] = reshape(%1) {shape=[6,4]}\n"
            "  %6: f32[6,4] = linear(%0, %2, %3, %4)\n"
            "  %5: f32[1,6,4] = reshape(%6) {shape=[1,6,4]}\n"
            "  return %5 \"y\"\n"
            "}\n");
  EXPECT_FALSE(fuse_epilogue(f));
}

// The same at batch 2: the permute moves bytes, so the add stays; so does one whose view is
// also read elsewhere.
TEST(FuseEpilogue, ResidualThroughViewsNeedsOrderAndSingleUse) {
  for (const bool batch2 : {true, false}) {
    SCOPED_TRACE(batch2 ? "batch 2" : "view used twice");
    const int64_t B = batch2 ? 2 : 1;
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {6 * B, 4}));
    ValueId r = g.add_input("r", TensorType(DType::kF32, {B, 6, 4}));
    Attrs to3, perm;
    to3.set("shape", std::vector<int64_t>{6, B, 4});
    perm.set("perm", std::vector<int64_t>{1, 0, 2});
    ValueId y = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "w", {4, 4}, 1)});
    ValueId view = g.add_node1(OpKind::kReshape, {y}, to3);
    g.mark_output(g.add_node1(OpKind::kAdd, {r, g.add_node1(OpKind::kPermute, {view}, perm)}), "y");
    if (!batch2) g.mark_output(g.add_node1(OpKind::kRelu, {view}), "also");
    Graph f = fuse_and_compare(g, 13);
    EXPECT_EQ(f.to_string(), g.to_string());
  }
}

// conv(x) + linear(e)[:, :, None, None] (a UNet's time embedding): the linear's output reaches
// the add through a view and broadcasts there, so it is no residual of the linear; the conv,
// whose bias is taken, keeps it as a pointwise add, and the result matches the unfused graph.
TEST(FuseEpilogue, BroadcastViewOfALinearIsNoResidual) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {1, 3, 5, 5}));
  ValueId e = g.add_input("e", TensorType(DType::kF32, {1, 6}));
  ValueId c = g.add_node1(OpKind::kConv, {x, f32_weight(g, "cw", {4, 3, 3, 3}, 21), f32_weight(g, "cb", {4}, 22)},
                          conv2d_attrs(1, 1, 1));
  ValueId l = g.add_node1(OpKind::kLinear, {e, f32_weight(g, "lw", {4, 6}, 23)});
  Attrs to4;
  to4.set("shape", std::vector<int64_t>{1, 4, 1, 1});
  g.mark_output(g.add_node1(OpKind::kAdd, {c, g.add_node1(OpKind::kReshape, {l}, to4)}), "y");
  Graph f = fuse_and_compare(g, 14);
  EXPECT_EQ(std::count_if(f.nodes().begin(), f.nodes().end(), [](const auto& n) { return n->op == OpKind::kAdd; }), 1);
}

TEST(FuseEpilogue, ConvEveryPathAndActivationMatchesUnfused) {
  uint32_t seed = 100;
  for (const ConvCase& cc : conv_cases()) {
    for (bool has_bias : {false, true})
      for (bool residual : {false, true})
        for (const char* act : kActivations) {
          SCOPED_TRACE(std::string(cc.what) + " bias=" + std::to_string(has_bias) + " residual=" +
                       std::to_string(residual) + " act=" + act);
          Graph g;
          ValueId x = g.add_input("x", TensorType(DType::kF32, cc.x));
          ValueId w = f32_weight(g, "w", cc.w, seed++);
          std::vector<ValueId> ins = {x, w};
          if (has_bias) ins.push_back(f32_weight(g, "b", {cc.w[0]}, seed++));
          ValueId y = g.add_node1(OpKind::kConv, ins, cc.attrs);
          const Shape out = g.type(y).shape();
          if (!has_bias) {  // a per-channel shift, broadcast as [O, 1(, 1)]
            Shape s(out.size() - 1, 1);
            s[0] = out[1];
            y = g.add_node1(OpKind::kAdd, {y, f32_weight(g, "shift", s, seed++)});
          }
          if (residual) y = g.add_node1(OpKind::kAdd, {g.add_input("skip", TensorType(DType::kF32, out)), y});
          g.mark_output(apply_activation(g, y, act), "y");
          Graph f = fuse_and_compare(g, seed++);
          EXPECT_EQ(f.nodes().size(), 1u) << f.to_string();
          EXPECT_EQ(f.nodes()[0]->attrs.get_string("activation", "none"), act);
        }
  }
}

TEST(FuseEpilogue, LinearEveryActivationWithScalarBiasMatchesUnfused) {
  uint32_t seed = 300;
  for (bool residual : {false, true})
    for (const char* act : kActivations) {
      SCOPED_TRACE(std::string("residual=") + std::to_string(residual) + " act=" + act);
      Graph g;
      ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 8}));
      ValueId y = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "w", {5, 8}, seed++)});
      y = g.add_node1(OpKind::kAdd, {y, f32_constant(g, "", {}, {0.375f}, false)});  // a scalar: repeated
      if (residual) y = g.add_node1(OpKind::kAdd, {y, g.add_input("r", TensorType(DType::kF32, {2, 3, 5}))});
      g.mark_output(apply_activation(g, y, act), "y");
      Graph f = fuse_and_compare(g, seed++);
      EXPECT_EQ(f.nodes().size(), 1u) << f.to_string();
      EXPECT_EQ(f.type(f.nodes()[0]->inputs[2]).shape(), Shape{5});
    }
}

// The kernels' own semantics against the unfused ops: a broadcast residual of linear, an
// absent bias next to a present residual, and f16 tensors computed in f32.
TEST(FuseEpilogue, KernelsMatchUnfusedOpsForBroadcastResidualAndHalf) {
  for (DType dt : {DType::kF32, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Attrs to;
    to.set("dtype", dt);
    Attrs silu;
    silu.set("activation", std::string("silu"));
    Graph fused, plain;
    for (Graph* g : {&fused, &plain}) {
      ValueId x = g->add_node1(OpKind::kCast, {g->add_input("x", TensorType(DType::kF32, {4, 6}))}, to);
      ValueId r = g->add_node1(OpKind::kCast, {g->add_input("r", TensorType(DType::kF32, {1, 3}))}, to);
      ValueId w = g->add_node1(OpKind::kCast, {f32_weight(*g, "w", {3, 6}, 7)}, to);
      ValueId y;
      if (g == &fused) {
        y = g->add_node1(OpKind::kLinear, {x, w, kNoValue, r}, silu);
      } else {
        y = g->add_node1(OpKind::kSilu, {g->add_node1(OpKind::kAdd, {g->add_node1(OpKind::kLinear, {x, w}), r})});
      }
      Attrs back;
      back.set("dtype", DType::kF32);
      g->mark_output(g->add_node1(OpKind::kCast, {y}, back), "y");
    }
    auto in = random_inputs(plain, 21);
    // f16: the unfused graph rounds twice more (after linear, after add).
    const float tol = dt == DType::kF32 ? 1e-5f : 4e-3f;
    expect_close(run_plain(fused, in), run_plain(plain, in), tol, tol);
  }
}

TEST(FuseEpilogue, OnlySingleUseOutputsFuse) {
  {  // the conv's output is also a graph output
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {1, 2, 5, 5}));
    ValueId y = g.add_node1(OpKind::kConv, {x, f32_weight(g, "w", {3, 2, 3, 3}, 8)}, conv2d_attrs(1, 1, 1));
    g.mark_output(y, "conv");
    g.mark_output(g.add_node1(OpKind::kRelu, {y}), "relu");
    EXPECT_FALSE(fuse_epilogue(g));
  }
  {  // the linear's output feeds the add and another node
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4}));
    ValueId y = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "w", {3, 4}, 9)});
    ValueId s = g.add_node1(OpKind::kAdd, {y, f32_weight(g, "b", {3}, 10)});
    g.mark_output(g.add_node1(OpKind::kMul, {s, y}), "y");
    EXPECT_FALSE(fuse_epilogue(g));
  }
  {  // add(y, y): y is used twice by one node
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4}));
    ValueId y = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "w", {3, 4}, 11)});
    g.mark_output(g.add_node1(OpKind::kAdd, {y, y}), "y");
    EXPECT_FALSE(fuse_epilogue(g));
  }
}

TEST(FuseEpilogue, RespectsOrderAndWhatAnOpCanHold) {
  // relu -> add -> sigmoid without fuse_pointwise after it: relu fuses; the add comes after it
  // and stays, so does sigmoid. With fuse_pointwise after it, relu (feeding the add) stays out
  // for fuse_pointwise, and the linear's output goes to the add unchanged.
  for (const bool pointwise_follows : {false, true}) {
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4}));
    ValueId y = g.add_node1(OpKind::kRelu, {g.add_node1(OpKind::kLinear, {x, f32_weight(g, "w", {3, 4}, 12)})});
    y = g.add_node1(OpKind::kAdd, {y, f32_weight(g, "b", {3}, 13)});
    g.mark_output(g.add_node1(OpKind::kSigmoid, {y}), "y");
    Graph f = fuse_and_compare(g, 14, true, pointwise_follows);
    EXPECT_EQ(f.nodes().size(), pointwise_follows ? 4u : 3u);
    EXPECT_EQ(f.nodes()[0]->attrs.get_string("activation", "none"), pointwise_follows ? "none" : "relu");
    EXPECT_EQ(count_ops(f, OpKind::kRelu), pointwise_follows ? 1 : 0);
    EXPECT_EQ(count_ops(f, OpKind::kAdd), 1);
  }
  {  // a biased linear takes a full-shape add as residual, but not a second one
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4}));
    ValueId y = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "w", {3, 4}, 15), f32_weight(g, "b", {3}, 16)});
    y = g.add_node1(OpKind::kAdd, {y, f32_weight(g, "c", {3}, 17)});  // not a residual: [3] != [2,3]
    y = g.add_node1(OpKind::kAdd, {y, g.add_input("r1", TensorType(DType::kF32, {2, 3}))});
    y = g.add_node1(OpKind::kAdd, {y, g.add_input("r2", TensorType(DType::kF32, {2, 3}))});
    g.mark_output(y, "y");
    Graph f = fuse_and_compare(g, 18);
    EXPECT_EQ(count_ops(f, OpKind::kAdd), 3);  // the [3] add blocks everything after it
  }
  {  // an add that broadcasts the output to a larger shape, conv_transpose and matmul stay
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {1, 4}));
    ValueId y = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "w", {3, 4}, 19)});
    g.mark_output(g.add_node1(OpKind::kAdd, {y, g.add_input("big", TensorType(DType::kF32, {5, 3}))}), "a");
    ValueId m = g.add_node1(OpKind::kMatmul, {g.add_input("p", TensorType(DType::kF32, {2, 3})),
                                              f32_weight(g, "q", {3, 2}, 20)});
    g.mark_output(g.add_node1(OpKind::kRelu, {m}), "b");
    Attrs ta;
    ta.set("stride", Shape{2, 2});
    ValueId t = g.add_node1(OpKind::kConvTranspose, {g.add_input("t", TensorType(DType::kF32, {1, 2, 3, 3})),
                                                     f32_weight(g, "tw", {2, 3, 2, 2}, 21)},
                            ta);
    g.mark_output(g.add_node1(OpKind::kRelu, {t}), "c");
    EXPECT_FALSE(fuse_epilogue(g));
  }
}

// A clamp is an epilogue when its lower bound is 0: clipped_relu with its upper bound (ReLU6),
// or relu when it has none; other clamps stay nodes.
TEST(FuseEpilogue, ClampsFromZeroBecomeClippedRelu) {
  struct Case {
    double lo, hi;
    const char* fused;  // the activation, or nullptr when the clamp stays
  };
  const double inf = std::numeric_limits<double>::infinity();
  uint32_t seed = 500;
  for (const Case& c : {Case{0.0, 6.0, "clipped_relu"}, Case{0.0, inf, "relu"}, Case{-1.0, 1.0, nullptr},
                        Case{0.0, -1.0, nullptr}, Case{-inf, 0.5, nullptr}}) {
    SCOPED_TRACE(std::to_string(c.lo) + " .. " + std::to_string(c.hi));
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {3, 8}));
    ValueId y = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "w", {5, 8}, seed++), f32_weight(g, "b", {5}, seed++)});
    Attrs a;
    if (!std::isinf(c.lo)) a.set("min", c.lo);
    if (!std::isinf(c.hi)) a.set("max", c.hi);
    g.mark_output(g.add_node1(OpKind::kClamp, {y}, a), "y");
    Graph f = fuse_and_compare(g, seed++);
    ASSERT_EQ(f.nodes().size(), c.fused ? 1u : 2u) << f.to_string();
    if (!c.fused) continue;
    EXPECT_EQ(f.nodes()[0]->attrs.get_string("activation"), c.fused);
    EXPECT_EQ(f.nodes()[0]->attrs.has("activation_max"), std::string(c.fused) == "clipped_relu");
  }
}

// Layer and group norms (channels first and last) take every activation the same way and
// compute what the unfused graph does; f64 norms keep theirs as a node, a norm whose output has
// another reader keeps it too, and batch_norm takes none.
TEST(FuseEpilogue, NormsTakeActivations) {
  struct NormCase {
    OpKind op;
    Shape x;
    Attrs attrs;
    int64_t channels;
  };
  Attrs ln;
  ln.set("normalized_rank", int64_t(1));
  Attrs gn;
  gn.set("groups", int64_t(2));
  Attrs gn_last = gn;
  gn_last.set("layout", std::string("nhwc"));
  const std::vector<NormCase> cases = {{OpKind::kLayerNorm, {3, 5, 12}, ln, 12},
                                       {OpKind::kGroupNorm, {2, 6, 4, 5}, gn, 6},
                                       {OpKind::kGroupNorm, {2, 4, 5, 6}, gn_last, 6}};
  uint32_t seed = 700;
  for (const NormCase& c : cases)
    for (const char* act : kActivations) {
      if (std::string(act) == "none") continue;
      SCOPED_TRACE(std::string(op_name(c.op)) + (c.attrs.has("layout") ? " nhwc" : "") + " act=" + act);
      Graph g;
      ValueId x = g.add_input("x", TensorType(DType::kF32, c.x));
      ValueId y = g.add_node1(
          c.op, {x, f32_weight(g, "w", {c.channels}, seed++), f32_weight(g, "b", {c.channels}, seed++)}, c.attrs);
      g.mark_output(apply_activation(g, y, act), "y");
      Graph f = fuse_and_compare(g, seed++);
      ASSERT_EQ(f.nodes().size(), 1u) << f.to_string();
      EXPECT_EQ(f.nodes()[0]->op, c.op);
      EXPECT_EQ(f.nodes()[0]->attrs.get_string("activation"), act);
    }
  for (const bool wide : {true, false}) {  // f64, or an output read twice
    Graph g;
    ValueId x = g.add_input("x", TensorType(wide ? DType::kF64 : DType::kF32, {2, 6, 4, 5}));
    ValueId y = g.add_node1(OpKind::kGroupNorm, {x}, gn);
    g.mark_output(g.add_node1(OpKind::kSilu, {y}), "y");
    if (!wide) g.mark_output(y, "norm");
    EXPECT_FALSE(fuse_epilogue(g)) << g.to_string();
  }
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 4}));
  ValueId stat = f32_weight(g, "s", {3}, seed++);
  Attrs bn;
  bn.set("activation", std::string("relu"));
  expect_error([&] { g.add_node1(OpKind::kBatchNorm, {x, stat, stat}, bn); }, ErrorCode::kInvalidArgument,
               {"batch_norm", "applies to layer_norm and group_norm only"});
}

// An activation of the producer's output seen through reshapes and permutes (SegFormer's GELU
// after its depthwise conv, flattened to tokens) moves into the producer; the views stay and read
// the activated output. A view read twice keeps the activation out.
TEST(FuseEpilogue, ActivationThroughViewsMovesIntoTheProducer) {
  for (const bool shared_view : {false, true}) {
    SCOPED_TRACE(shared_view ? "view read twice" : "views read once");
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4, 5, 6}));
    ValueId y = g.add_node1(OpKind::kConv, {x, f32_weight(g, "w", {4, 1, 3, 3}, 31), f32_weight(g, "b", {4}, 32)},
                            conv2d_attrs(1, 1, 4));
    ValueId v = permute(g, reshape(g, y, {2, 4, 30}), {0, 2, 1});
    Attrs tanh_gelu;
    tanh_gelu.set("approximate", std::string("tanh"));
    g.mark_output(g.add_node1(OpKind::kGelu, {v}, tanh_gelu), "y");
    if (shared_view) g.mark_output(v, "tokens");
    Graph f = g;
    EXPECT_EQ(fuse_epilogue(f), !shared_view);
    f.verify();
    const auto in = random_inputs(g, 33);
    expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-5f);
    EXPECT_EQ(count_ops(f, OpKind::kGelu), shared_view ? 1 : 0) << f.to_string();
    EXPECT_EQ(count_ops(f, OpKind::kPermute), 1) << f.to_string();
    if (!shared_view) {
      EXPECT_EQ(f.nodes()[0]->attrs.get_string("activation"), "gelu_tanh") << f.to_string();
    }
  }
}

TEST(FuseEpilogue, ShapeRulesRejectBadActivationsAndResiduals) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4}));
  ValueId w = f32_weight(g, "w", {3, 4}, 22);
  Attrs swish;
  swish.set("activation", std::string("swish"));
  expect_error([&] { g.add_node1(OpKind::kLinear, {x, w}, swish); }, ErrorCode::kInvalidArgument,
               {"linear", "'activation'", "\"swish\"", "gelu_tanh"});
  for (const double bad_max : {0.0, -2.0, std::numeric_limits<double>::infinity()}) {
    Attrs clip;
    clip.set("activation", std::string("clipped_relu"));
    if (bad_max != 0.0) clip.set("activation_max", bad_max);
    expect_error([&] { g.add_node1(OpKind::kLinear, {x, w}, clip); }, ErrorCode::kInvalidArgument,
                 {"linear", "clipped_relu", "'activation_max' > 0"});
  }
  Attrs not_string;
  not_string.set("activation", int64_t(1));
  expect_error([&] { g.add_node1(OpKind::kLinear, {x, w}, not_string); }, ErrorCode::kInvalidArgument,
               {"linear", "'activation' must be a string"});
  ValueId bad = g.add_input("bad", TensorType(DType::kF32, {2, 4}));
  expect_error([&] { g.add_node1(OpKind::kLinear, {x, w, kNoValue, bad}); }, ErrorCode::kShapeMismatch,
               {"linear: residual f32[2,4] does not broadcast to the output f32[2,3]"});
  ValueId half = g.add_input("half", TensorType(DType::kF16, {2, 3}));
  expect_error([&] { g.add_node1(OpKind::kLinear, {x, w, kNoValue, half}); }, ErrorCode::kInvalidArgument,
               {"linear", "residual f16[2,3]"});
  ValueId row = g.add_input("row", TensorType(DType::kF32, {3}));
  EXPECT_EQ(g.type(g.add_node1(OpKind::kLinear, {x, w, kNoValue, row})).shape(), (Shape{2, 3}));

  ValueId img = g.add_input("img", TensorType(DType::kF32, {1, 2, 6, 6}));
  ValueId cw = f32_weight(g, "cw", {4, 2, 3, 3}, 23);
  ValueId skip = g.add_input("skip", TensorType(DType::kF32, {1, 4, 6, 5}));
  expect_error([&] { g.add_node1(OpKind::kConv, {img, cw, kNoValue, skip}, conv2d_attrs(1, 1, 1)); },
               ErrorCode::kShapeMismatch, {"conv: residual f32[1,4,6,5] must have the output's shape f32[1,4,6,6]"});
  Attrs conv_swish = conv2d_attrs(1, 1, 1);
  conv_swish.set("activation", std::string("swish"));
  expect_error([&] { g.add_node1(OpKind::kConv, {img, cw}, conv_swish); }, ErrorCode::kInvalidArgument,
               {"conv", "'activation'", "\"swish\""});
  Attrs transpose_relu;
  transpose_relu.set("activation", std::string("relu"));
  ValueId tw = f32_weight(g, "tw", {2, 3, 2, 2}, 24);
  expect_error([&] { g.add_node1(OpKind::kConvTranspose, {img, tw}, transpose_relu); }, ErrorCode::kInvalidArgument,
               {"conv_transpose", "applies to conv only"});
}

}  // namespace

// relu(linear a) + linear b: the add becomes linear b's residual, after which relu's one use
// is no pointwise op any more and a later sweep fuses it into linear a.
TEST(FuseEpilogue, ActivationFusesOnceItsPointwiseUseBecameAResidual) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4}));
  ValueId a = g.add_node1(OpKind::kRelu, {g.add_node1(OpKind::kLinear, {x, f32_weight(g, "wa", {3, 4}, 21)})});
  ValueId b = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "wb", {3, 4}, 22)});
  g.mark_output(g.add_node1(OpKind::kAdd, {a, b}), "y");
  Graph f = fuse_and_compare(g, 23);
  ASSERT_EQ(f.nodes().size(), 2u) << f.to_string();
  EXPECT_EQ(f.nodes()[0]->attrs.get_string("activation", "none"), "relu");
  EXPECT_EQ(f.nodes()[1]->inputs.size(), 4u);  // x, w, no bias, residual
}

// An activation whose one use is a pointwise op stays out of the conv, and fuse_pointwise
// computes it inside that op's kernel: a squeeze-excitation gate x * hardsigmoid(conv(mean(x)))
// (broadcast into the mul) and a gated unit act(conv(x)) * x (same shape). The same activation
// feeding another conv still fuses.
TEST(FuseEpilogue, ActivationFeedingAPointwiseOpStaysOut) {
  for (const char* act : {"hardsigmoid", "sigmoid", "silu"}) {
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4, 5, 5}));
    Attrs mean;
    mean.set("axes", Shape{2, 3});
    mean.set("keepdim", true);
    ValueId s = g.add_node1(OpKind::kReduceMean, {x}, mean);
    ValueId c = g.add_node1(OpKind::kConv, {s, f32_weight(g, "fc.weight", {4, 4, 1, 1}, 91), f32_weight(g, "fc.bias", {4}, 92)},
                            conv2d_attrs(1, 0, 1));
    ValueId gate = apply_activation(g, c, act);
    g.mark_output(g.add_node1(OpKind::kMul, {x, gate}), "y");
    ValueId c2 = g.add_node1(OpKind::kConv, {x, f32_weight(g, "c2.weight", {4, 4, 1, 1}, 93)}, conv2d_attrs(1, 0, 1));
    g.mark_output(g.add_node1(OpKind::kMul, {apply_activation(g, c2, act), x}), "z");
    ValueId c3 = g.add_node1(OpKind::kConv, {x, f32_weight(g, "c3.weight", {4, 4, 1, 1}, 95)}, conv2d_attrs(1, 0, 1));
    ValueId c4 =
        g.add_node1(OpKind::kConv, {apply_activation(g, c3, act), f32_weight(g, "c4.weight", {4, 4, 1, 1}, 96)},
                    conv2d_attrs(1, 0, 1));
    g.mark_output(c4, "w");
    Graph f = fuse_and_compare(g, 94);
    EXPECT_EQ(count_ops(f, OpKind::kConv), 4) << act;
    const OpKind kind = act == std::string("sigmoid") ? OpKind::kSigmoid
                        : act == std::string("silu")  ? OpKind::kSilu
                                                      : OpKind::kHardsigmoid;
    EXPECT_EQ(count_ops(f, kind), 2) << act;
    int fused = 0;
    for (const auto& n : f.nodes())
      if (n->op == OpKind::kConv && n->attrs.get_string("activation", "none") == act) ++fused;
    EXPECT_EQ(fused, 1) << act;
  }
}

// GPT-NeoX's parallel residual: mlp(x) + attn(x) + x, parsed as (mlp + attn) + x.
Graph parallel_residual(bool late_residual) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 8}));
  ValueId attn =
      g.add_node1(OpKind::kLinear, {x, f32_weight(g, "attn.w", {8, 8}, 21), f32_weight(g, "attn.b", {8}, 22)});
  ValueId r = x;
  if (late_residual) r = g.add_node1(OpKind::kTanh, {x});  // made after attn's linear: cannot move in
  ValueId h = g.add_node1(OpKind::kRelu, {x});
  ValueId mlp = g.add_node1(OpKind::kLinear, {h, f32_weight(g, "mlp.w", {8, 8}, 23)});
  ValueId sum = g.add_node1(OpKind::kAdd, {mlp, attn});
  g.mark_output(g.add_node1(OpKind::kAdd, {sum, r}), "y");
  return g;
}

TEST(FuseEpilogue, ParallelResidualReassociatesIntoBothLinears) {
  const Graph f = fuse_and_compare(parallel_residual(false), 24);
  EXPECT_EQ(count_ops(f, OpKind::kAdd), 0) << f.to_string();
  for (const auto& n : f.nodes()) {
    if (n->op == OpKind::kLinear) {
      EXPECT_EQ(n->inputs.size(), 4u) << f.to_string();  // each has a residual
    }
  }
  // The residual is made after the first linear: only the first add fuses.
  const Graph late = fuse_and_compare(parallel_residual(true), 25);
  EXPECT_EQ(count_ops(late, OpKind::kAdd), 1) << late.to_string();
}
