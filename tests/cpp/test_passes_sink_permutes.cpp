// Layout propagation (src/passes/sink_permutes.cpp and its use in to_channels_last): each rule
// moves a permute past one op and computes what the graph computed, on random inputs; the
// reshape rule refuses merges of dims that are not adjacent in memory and reorders a block that
// is adjacent but out of order in place (a channel shuffle); whole conv regions with
// norms, concats and upsampling between the convs keep permutes only at their boundary; a
// permute that would only grow is left where it was; batch_norm that does not fold becomes a
// per-channel multiply-add.
#include "src/passes/pass_util.h"
#include "src/passes/sink_permutes.h"
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;
using passes::Perm;

const Perm kToFirst = {0, 3, 1, 2};

size_t position_of(const Graph& g, OpKind op) {
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (g.nodes()[i]->op == op) return i;
  ADD_FAILURE() << "no " << op_name(op) << " in\n" << g.to_string();
  return 0;
}

// Sinks the permute into the first `op` of g; checks that op now reads the permute's input
// (no permute produces its first input) and that the graph computes what g computes.
Graph sink_into(const Graph& g, OpKind op, uint32_t seed) {
  Graph f = g;
  EXPECT_TRUE(passes::sink_permute(f, position_of(f, op), true)) << g.to_string();
  eliminate_dead_code(f);
  f.verify();
  const Node& n = *f.nodes()[position_of(f, op)];
  EXPECT_EQ(passes::permute_of(f, n.inputs[0]), nullptr) << f.to_string();
  const auto in = random_inputs(g, seed);
  expect_close(run_plain(f, in), run_plain(g, in), 1e-6f, 1e-6f);
  return f;
}

TEST(SinkPermutes, AxisOpsRenumberTheirAxes) {
  const Shape nhwc = {2, 3, 4, 5};
  {  // slice of C
    Graph g;
    ValueId p = permute(g, g.add_input("x", TensorType(DType::kF32, nhwc)), kToFirst);
    Attrs a;
    a.set("axis", int64_t(1)), a.set("start", int64_t(1)), a.set("end", int64_t(5)), a.set("step", int64_t(2));
    g.mark_output(g.add_node1(OpKind::kSlice, {p}, a), "y");
    Graph f = sink_into(g, OpKind::kSlice, 1);
    EXPECT_EQ(f.nodes()[position_of(f, OpKind::kSlice)]->attrs.get_int("axis"), 3);
  }
  {  // split of H, two outputs
    Graph g;
    ValueId p = permute(g, g.add_input("x", TensorType(DType::kF32, nhwc)), kToFirst);
    Attrs a;
    a.set("axis", int64_t(2)), a.set("sizes", Shape{1, 2});
    auto outs = g.add_node(OpKind::kSplit, {p}, a);
    g.mark_output(outs[0], "a");
    g.mark_output(outs[1], "b");
    sink_into(g, OpKind::kSplit, 2);
  }
  {  // index_select of W (nearest upsampling) and a pad of H and W
    Graph g;
    ValueId p = permute(g, g.add_input("x", TensorType(DType::kF32, nhwc)), kToFirst);
    const std::vector<int64_t> idx = {0, 0, 1, 1, 2, 2, 3, 3};
    ValueId i = g.add_constant("", TensorType(DType::kI64, {8}), idx.data(), idx.size() * 8);
    Attrs a;
    a.set("axis", int64_t(3));
    ValueId up = g.add_node1(OpKind::kIndexSelect, {p, i}, a);
    Attrs pad;
    pad.set("pads", Shape{0, 0, 0, 0, 1, 2, 0, 1});
    g.mark_output(g.add_node1(OpKind::kPad, {up}, pad), "y");
    Graph f = sink_into(g, OpKind::kIndexSelect, 3);
    EXPECT_EQ(f.nodes()[position_of(f, OpKind::kIndexSelect)]->attrs.get_int("axis"), 2);
    f = sink_into(f, OpKind::kPad, 4);
    EXPECT_EQ(f.nodes()[position_of(f, OpKind::kPad)]->attrs.get_ints("pads"), (Shape{0, 0, 1, 2, 0, 1, 0, 0}));
  }
  {  // concat of C from two permuted values
    Graph g;
    ValueId a0 = permute(g, g.add_input("a", TensorType(DType::kF32, nhwc)), kToFirst);
    ValueId b0 = permute(g, g.add_input("b", TensorType(DType::kF32, {2, 3, 4, 2})), kToFirst);
    Attrs a;
    a.set("axis", int64_t(1));
    g.mark_output(g.add_node1(OpKind::kConcat, {a0, b0}, a), "y");
    Graph f = sink_into(g, OpKind::kConcat, 5);
    EXPECT_EQ(count_ops(f, OpKind::kPermute), 1);
  }
  {  // a concat with one operand in the other layout stays
    Graph g;
    ValueId a0 = permute(g, g.add_input("a", TensorType(DType::kF32, nhwc)), kToFirst);
    ValueId b0 = g.add_input("b", TensorType(DType::kF32, {2, 5, 3, 4}));
    Attrs a;
    a.set("axis", int64_t(1));
    g.mark_output(g.add_node1(OpKind::kConcat, {a0, b0}, a), "y");
    EXPECT_FALSE(passes::sink_permute(g, position_of(g, OpKind::kConcat), true));
  }
  {  // expand of a dim of 1
    Graph g;
    ValueId p = permute(g, g.add_input("x", TensorType(DType::kF32, {2, 3, 1, 5})), kToFirst);
    Attrs e;
    e.set("shape", Shape{2, 5, 3, 4});
    g.mark_output(g.add_node1(OpKind::kExpand, {p}, e), "y");
    sink_into(g, OpKind::kExpand, 6);
  }
}

TEST(SinkPermutes, ReductionsKeepOrDropTheirAxes) {
  for (bool keepdim : {true, false}) {
    Graph g;
    ValueId p = permute(g, g.add_input("x", TensorType(DType::kF32, {2, 3, 4, 5})), kToFirst);
    Attrs a;
    a.set("axes", Shape{2, 3});
    a.set("keepdim", keepdim);
    g.mark_output(g.add_node1(OpKind::kReduceMean, {p}, a), "y");
    Graph f = sink_into(g, OpKind::kReduceMean, 7);
    EXPECT_EQ(f.nodes()[position_of(f, OpKind::kReduceMean)]->attrs.get_ints("axes"), (Shape{1, 2}));
    // Mean over H and W of NCHW: [2, 5] is already in order without keepdim; with it, the
    // permute only moves dims of 1.
    f.verify();
    if (!keepdim) {
      EXPECT_EQ(count_ops(f, OpKind::kPermute), 0) << f.to_string();
    }
  }
}

TEST(SinkPermutes, ReshapesOfBlocksAdjacentInMemory) {
  {  // tokens [B, HW, C] -> transpose -> [B, C, H, W]: one reshape of the tokens and a permute
    Graph g;
    ValueId p = permute(g, g.add_input("x", TensorType(DType::kF32, {2, 12, 5})), {0, 2, 1});
    Attrs a;
    a.set("shape", Shape{2, 5, 3, 4});
    g.mark_output(g.add_node1(OpKind::kReshape, {p}, a), "y");
    Graph f = sink_into(g, OpKind::kReshape, 8);
    EXPECT_EQ(f.type(f.nodes()[position_of(f, OpKind::kReshape)]->outputs[0]).shape(), (Shape{2, 3, 4, 5}));
    EXPECT_EQ(passes::perm_of(*f.nodes()[position_of(f, OpKind::kPermute)]), kToFirst);
  }
  {  // NCHW -> [B, C, HW] with dims of 1 around
    Graph g;
    ValueId p = permute(g, g.add_input("x", TensorType(DType::kF32, {1, 3, 4, 5})), kToFirst);
    Attrs a;
    a.set("shape", Shape{1, 5, 1, 12});
    g.mark_output(g.add_node1(OpKind::kReshape, {p}, a), "y");
    sink_into(g, OpKind::kReshape, 9);
  }
  {  // merging C with H (not adjacent in NHWC memory) has no such form
    Graph g;
    ValueId p = permute(g, g.add_input("x", TensorType(DType::kF32, {2, 3, 4, 5})), kToFirst);
    Attrs a;
    a.set("shape", Shape{2, 15, 4});
    g.mark_output(g.add_node1(OpKind::kReshape, {p}, a), "y");
    EXPECT_FALSE(passes::sink_permute(g, position_of(g, OpKind::kReshape), true));
  }
}

// A channel shuffle in NCHW ([N, g*c, H, W] -> [N, g, c, H, W] -> swap g and c -> merge) over
// channels-last memory: the merge of (c, g) is no block of memory in that order, so the swap is
// done in place on the channels-last tensor (one permute of the channel block) and the merge
// moves past the rest; a merge of dims that are no block of memory (heads and head width with
// tokens between) is still refused.
TEST(SinkPermutes, ReshapesOfAReorderedBlockReorderItInPlace) {
  for (int64_t batch : {1, 2}) {
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {batch, 3, 4, 2, 6}));  // [N, H, W, g, c]
    ValueId p = permute(g, x, {0, 4, 3, 1, 2});                                    // [N, c, g, H, W]
    Attrs a;
    a.set("shape", Shape{batch, 12, 3, 4});
    ValueId r = g.add_node1(OpKind::kReshape, {p}, a);
    g.mark_output(g.add_node1(OpKind::kRelu, {r}), "y");
    Graph f = g;
    EXPECT_TRUE(passes::sink_permute(f, position_of(f, OpKind::kReshape), true)) << g.to_string();
    eliminate_dead_code(f);
    f.verify();
    const auto in = random_inputs(g, 20 + uint32_t(batch));
    expect_close(run_plain(f, in), run_plain(g, in), 0.0f, 0.0f);
    // The swap of g and c on x, then the NHWC -> NCHW permute after the reshape.
    std::vector<Perm> perms;
    for (const auto& n : f.nodes())
      if (n->op == OpKind::kPermute) perms.push_back(passes::perm_of(*n));
    ASSERT_EQ(perms.size(), 2u) << f.to_string();
    EXPECT_EQ(perms[0], (Perm{0, 1, 2, 4, 3}));
    EXPECT_EQ(perms[1], kToFirst) << f.to_string();
  }
  {  // [B, S, H, D] <- permute of [B, H, S, D], merged to [B, S, H*D]: H and D are apart in memory
    Graph g;
    ValueId p = permute(g, g.add_input("x", TensorType(DType::kF32, {2, 4, 5, 8})), {0, 2, 1, 3});
    Attrs a;
    a.set("shape", Shape{2, 5, 32});
    g.mark_output(g.add_node1(OpKind::kReshape, {p}, a), "y");
    EXPECT_FALSE(passes::sink_permute(g, position_of(g, OpKind::kReshape), true)) << g.to_string();
  }
}

TEST(SinkPermutes, BinaryAndWhereOperandsFollowTheLayout) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 4, 5}));
  ValueId p = permute(g, x, kToFirst);
  ValueId per_channel = g.add_input("s", TensorType(DType::kF32, {5, 1, 1}));  // reshaped, not permuted
  ValueId full = f32_weight(g, "w", {5, 3, 4}, 10);                              // a constant: permuted
  ValueId y = g.add_node1(OpKind::kMul, {p, per_channel});
  ValueId q = permute(g, g.add_input("z", TensorType(DType::kF32, {2, 3, 4, 5})), kToFirst);
  ValueId cond = g.add_node1(OpKind::kGt, {q, p});
  g.mark_output(g.add_node1(OpKind::kWhere, {cond, g.add_node1(OpKind::kAdd, {y, full}), q}), "y");
  Graph f = g;
  for (int round = 0, again = 1; again && round < 16; ++round) {
    again = 0;
    for (size_t pos = 0; pos < f.nodes().size(); ++pos)
      again |= passes::fold_permutes(f, pos) || passes::sink_permute(f, pos, true);
  }
  eliminate_dead_code(f);
  fold_constants(f);
  f.verify();
  const auto in = random_inputs(g, 11);
  expect_close(run_plain(f, in), run_plain(g, in), 1e-6f, 1e-6f);
  // Only the output's permute is left: the operands were read in x's order.
  EXPECT_EQ(count_ops(f, OpKind::kPermute), 1) << f.to_string();
  EXPECT_EQ(f.value(f.outputs()[0]).producer->op, OpKind::kPermute);

  Graph h;  // an operand of another layout that is no constant: the op stays
  ValueId a = permute(h, h.add_input("a", TensorType(DType::kF32, {2, 3, 4, 5})), kToFirst);
  ValueId b = h.add_input("b", TensorType(DType::kF32, {2, 5, 3, 4}));
  h.mark_output(h.add_node1(OpKind::kAdd, {a, b}), "y");
  EXPECT_FALSE(passes::sink_permute(h, position_of(h, OpKind::kAdd), true));
  // Without all rules, a broadcast operand does not move either.
  Graph k;
  ValueId c = permute(k, k.add_input("a", TensorType(DType::kF32, {2, 3, 4, 5})), kToFirst);
  k.mark_output(k.add_node1(OpKind::kMul, {c, k.add_input("s", TensorType(DType::kF32, {5, 1, 1}))}), "y");
  EXPECT_FALSE(passes::sink_permute(k, position_of(k, OpKind::kMul), false));
  EXPECT_TRUE(passes::sink_permute(k, position_of(k, OpKind::kMul), true));
}

TEST(SinkPermutes, PermuteOfDimsOfOneIsAReshape) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 1, 1, 8}));
  ValueId p = permute(g, x, kToFirst);
  g.mark_output(g.add_node1(OpKind::kRelu, {p}), "y");
  Graph f = g;
  EXPECT_TRUE(passes::permute_to_reshape(f, position_of(f, OpKind::kPermute)));
  f.verify();
  EXPECT_EQ(count_ops(f, OpKind::kPermute), 0);
  const auto in = random_inputs(g, 12);
  expect_close(run_plain(f, in), run_plain(g, in), 0, 0);
  Graph h;  // a graph output keeps its permute (it would alias the input)
  h.mark_output(permute(h, h.add_input("x", TensorType(DType::kF32, {2, 1, 1, 8})), kToFirst), "y");
  EXPECT_FALSE(passes::permute_to_reshape(h, position_of(h, OpKind::kPermute)));
}

ValueId conv(Graph& g, ValueId x, int64_t out_channels, int64_t in_channels, uint32_t seed, bool relu = false) {
  Attrs a = conv2d_attrs(1, 1, 1);
  if (relu) a.set("activation", std::string("relu"));
  return g.add_node1(
      OpKind::kConv,
      {x, f32_weight(g, std::string("w").append(std::to_string(seed)), {out_channels, in_channels, 3, 3}, seed)}, a);
}

ValueId batch_norm(Graph& g, ValueId x, int64_t channels, uint32_t seed) {
  const std::string tag = std::to_string(seed);  // (GCC 12 warns on "m" + std::to_string(...))
  ValueId mean = f32_weight(g, std::string("m").append(tag), {channels}, seed);
  ValueId var = f32_weight(g, std::string("v").append(tag), {channels}, seed + 1, 0.5f, 2.0f);
  ValueId gamma = f32_weight(g, std::string("g").append(tag), {channels}, seed + 2);
  ValueId beta = f32_weight(g, std::string("b").append(tag), {channels}, seed + 3);
  Attrs a;
  a.set("eps", 1e-5);
  return g.add_node1(OpKind::kBatchNorm, {x, mean, var, gamma, beta}, a);
}

// A DenseNet block (concat, batch_norm, relu, conv) and a SegFormer head (tokens to an image,
// nearest upsampling, concat, 1x1 conv) keep permutes only where the graph's inputs and
// outputs are channels-first.
TEST(ToChannelsLast, NormsConcatsAndUpsamplingBetweenConvsNeedNoPermute) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 8, 6, 6}));
  ValueId a = conv(g, x, 4, 8, 1, true);
  Attrs cat;
  cat.set("axis", int64_t(1));
  ValueId c = g.add_node1(OpKind::kConcat, {x, a}, cat);
  ValueId n = g.add_node1(OpKind::kRelu, {batch_norm(g, c, 12, 2)});
  ValueId b = conv(g, n, 4, 12, 3);
  ValueId c2 = g.add_node1(OpKind::kConcat, {c, b}, cat);
  // tokens [2, 9, 16] of a 3x3 image: transpose, reshape, upsample to 6x6 by index_select
  ValueId tokens = g.add_input("t", TensorType(DType::kF32, {2, 9, 16}));
  ValueId img = permute(g, tokens, {0, 2, 1});
  Attrs r;
  r.set("shape", Shape{2, 16, 3, 3});
  img = g.add_node1(OpKind::kReshape, {img}, r);
  const std::vector<int64_t> idx = {0, 0, 1, 1, 2, 2};
  ValueId i = g.add_constant("", TensorType(DType::kI64, {6}), idx.data(), idx.size() * 8);
  for (int64_t axis : {2, 3}) {
    Attrs s;
    s.set("axis", axis);
    img = g.add_node1(OpKind::kIndexSelect, {img, i}, s);
  }
  ValueId all = g.add_node1(OpKind::kConcat, {c2, img}, cat);
  g.mark_output(conv(g, all, 5, 32, 4), "y");

  Graph f = g;
  fold_batch_norm(f);
  EXPECT_EQ(count_ops(f, OpKind::kBatchNorm), 0) << f.to_string();
  ASSERT_TRUE(to_channels_last(f));
  fold_constants(f);
  f.verify();
  const auto in = random_inputs(g, 13);
  expect_close(run_plain(f, in), run_plain(g, in), 1e-4f, 1e-4f);
  // x in, y out; the tokens need none (their reshape is NHWC already).
  EXPECT_EQ(count_ops(f, OpKind::kPermute), 2) << f.to_string();
}

// A permute moved past an upsample that it never meets another permute after is four times its
// size: the propagation keeps the permute before the upsample.
TEST(ToChannelsLast, APermuteThatOnlyGrowsStaysWhereItWas) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 8, 4, 4}));
  ValueId y = conv(g, x, 8, 8, 1);
  const std::vector<int64_t> idx = {0, 0, 1, 1, 2, 2, 3, 3};
  ValueId i = g.add_constant("", TensorType(DType::kI64, {8}), idx.data(), idx.size() * 8);
  for (int64_t axis : {2, 3}) {
    Attrs s;
    s.set("axis", axis);
    y = g.add_node1(OpKind::kIndexSelect, {y, i}, s);
  }
  g.mark_output(y, "y");
  const Graph f = channels_last_applied(g, 14, 1e-5f);
  const Node& out = *f.value(f.outputs()[0]).producer;
  EXPECT_EQ(out.op, OpKind::kIndexSelect) << f.to_string();
  EXPECT_EQ(out.attrs.get_int("axis"), 3);
}

// ShuffleNet's unit: split the channels, convs on one half, concat, channel shuffle. The whole
// chain stays channels-last: the only permutes left are the graph's input and output ones and
// one channel swap per shuffle, none of them at batch 1 either.
TEST(ToChannelsLast, AChannelShuffleStaysChannelsLast) {
  for (int64_t batch : {1, 2}) {
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {batch, 8, 5, 5}));
    ValueId s = conv(g, x, 8, 8, 1, true);
    for (uint32_t unit = 0; unit < 2; ++unit) {
      Attrs split;
      split.set("axis", int64_t(1));
      split.set("sizes", std::vector<int64_t>{4, 4});
      const std::vector<ValueId> halves = g.add_node(OpKind::kSplit, {s}, split);
      ValueId b = conv(g, halves[1], 4, 4, 2 + unit, true);
      Attrs cat;
      cat.set("axis", int64_t(1));
      ValueId c = g.add_node1(OpKind::kConcat, {halves[0], b}, cat);
      Attrs r5;
      r5.set("shape", Shape{batch, 2, 4, 5, 5});
      ValueId t = permute(g, g.add_node1(OpKind::kReshape, {c}, r5), {0, 2, 1, 3, 4});
      Attrs r4;
      r4.set("shape", Shape{batch, 8, 5, 5});
      s = g.add_node1(OpKind::kReshape, {t}, r4);
    }
    g.mark_output(conv(g, s, 3, 8, 9), "y");
    const Graph f = channels_last_applied(g, 16 + uint32_t(batch), 1e-4f);
    int64_t swaps = 0, others = 0;
    for (const auto& n : f.nodes())
      if (n->op == OpKind::kPermute && !f.value(n->inputs[0]).is_constant())
        ++(passes::perm_of(*n) == Perm{0, 1, 2, 4, 3} ? swaps : others);
    EXPECT_EQ(swaps, 2) << f.to_string();
    EXPECT_EQ(others, 2) << f.to_string();  // x in, y out
  }
}

TEST(FoldBatchNorm, ANormThatCannotFoldIsAPerChannelMultiplyAdd) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 6, 3, 3}));
  ValueId y = batch_norm(g, g.add_node1(OpKind::kRelu, {x}), 6, 1);
  g.mark_output(y, "y");
  Graph f = g;
  EXPECT_TRUE(fold_batch_norm(f));
  fold_constants(f);
  f.verify();
  EXPECT_EQ(count_ops(f, OpKind::kBatchNorm), 0);
  EXPECT_EQ(count_ops(f, OpKind::kMul), 1);
  EXPECT_EQ(count_ops(f, OpKind::kAdd), 1);
  const auto in = random_inputs(g, 15);
  expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-5f);

  Graph h;  // statistics that are graph inputs: the norm stays
  ValueId hx = h.add_input("x", TensorType(DType::kF32, {2, 6, 3, 3}));
  ValueId mean = h.add_input("m", TensorType(DType::kF32, {6}));
  ValueId var = f32_weight(h, "v", {6}, 2, 0.5f, 2.0f);
  Attrs a;
  a.set("eps", 1e-5);
  h.mark_output(h.add_node1(OpKind::kBatchNorm, {h.add_node1(OpKind::kRelu, {hx}), mean, var}, a), "y");
  EXPECT_FALSE(fold_batch_norm(h));
}

}  // namespace
