// The graph passes (src/passes/): per pass, golden before/after IR text on a small graph, plus
// numeric checks that the rewritten graph computes what the original computes (both run on the
// CPU reference kernels through Engine::create, which applies no passes), and property checks
// on random graphs (verify() holds, results unchanged, memory plans never overlap live values).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "kiln/kiln.h"
#include "src/ops/shape_rules.h"
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

// ---- building and running graphs (the rest: tests/cpp/pass_test_util.h) ------------------

ValueId f32_scalar(Graph& g, float v) { return f32_constant(g, "", {}, {v}, false); }

Floats constant_floats(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  EXPECT_TRUE(val.is_constant()) << "%" << v;
  EXPECT_EQ(val.type.dtype, DType::kF32);
  if (!val.is_constant() || val.type.dtype != DType::kF32) return {};
  Floats out(size_t(val.type.numel()));
  if (!out.empty()) std::memcpy(out.data(), val.data->data(), out.size() * 4);
  return out;
}

// ---- eliminate_dead_code ------------------------------------------------------------------

TEST(DeadCode, RemovesUnusedChainsAndConstantsGolden) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3}));
  ValueId w = f32_weight(g, "w", {3, 3}, 1);
  ValueId two = f32_scalar(g, 2.0f);
  ValueId a = g.add_node1(OpKind::kRelu, {x});
  g.add_node1(OpKind::kMul, {a, two});
  ValueId b = g.add_node1(OpKind::kNeg, {x});
  g.mark_output(g.add_node1(OpKind::kLinear, {b, w}), "y");
  EXPECT_EQ(g.to_string(),
            "graph(%0 \"x\": f32[2,3]) {\n"
            "  %1 \"w\": f32[3,3] = weight\n"
            "  %2: f32[] = constant 2\n"
            "  %3: f32[2,3] = relu(%0)\n"
            "  %4: f32[2,3] = mul(%3, %2)\n"
            "  %5: f32[2,3] = neg(%0)\n"
            "  %6: f32[2,3] = linear(%5, %1)\n"
            "  return %6 \"y\"\n"
            "}\n");
  EXPECT_TRUE(eliminate_dead_code(g));
  g.verify();
  EXPECT_EQ(g.to_string(),
            "graph(%0 \"x\": f32[2,3]) {\n"
            "  %1 \"w\": f32[3,3] = weight\n"
            "  %2: f32[2,3] = neg(%0)\n"
            "  %3: f32[2,3] = linear(%2, %1)\n"
            "  return %3 \"y\"\n"
            "}\n");
  EXPECT_FALSE(eliminate_dead_code(g));
}

TEST(DeadCode, KeepsMultiOutputNodeWhenOneOutputIsUsedAndUnusedInputs) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3}));
  g.add_input("unused", TensorType(DType::kF32, {4}));
  Attrs split;
  split.set("axis", int64_t{1});
  split.set("sizes", Shape{1, 2});
  auto parts = g.add_node(OpKind::kSplit, {x}, split);
  g.mark_output(g.add_node1(OpKind::kRelu, {parts[1]}), "y");
  EXPECT_FALSE(eliminate_dead_code(g));
  EXPECT_EQ(g.nodes().size(), 2u);
  EXPECT_EQ(g.inputs().size(), 2u);
  g.verify();
}

TEST(DeadCode, RemovesTransitivelyDeadDiamond) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {4}));
  ValueId a = g.add_node1(OpKind::kExp, {x});
  ValueId b = g.add_node1(OpKind::kNeg, {a});
  ValueId c = g.add_node1(OpKind::kAbs, {a});
  g.add_node1(OpKind::kAdd, {b, c});  // dead, and with it b, c and a
  g.mark_output(g.add_node1(OpKind::kSin, {x}), "y");
  EXPECT_TRUE(eliminate_dead_code(g));
  ASSERT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(g.nodes()[0]->op, OpKind::kSin);
  EXPECT_EQ(g.num_values(), 2);
  g.verify();
}

// ---- fold_constants -----------------------------------------------------------------------

TEST(ConstantFold, FoldsGeneratorAndWeightArithmeticGolden) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3}));
  Floats bias = random_floats(3, 7);
  ValueId b = f32_constant(g, "bias", {3}, bias, true);
  Attrs full;
  full.set("dtype", DType::kF32);
  full.set("shape", Shape{3});
  full.set("value", 2.0);
  ValueId twos = g.add_node1(OpKind::kFull, {}, full);
  ValueId t = g.add_node1(OpKind::kAdd, {twos, b});
  g.mark_output(g.add_node1(OpKind::kMul, {x, t}), "y");
  const Graph original = g;
  EXPECT_EQ(g.to_string(),
            "graph(%0 \"x\": f32[2,3]) {\n"
            "  %1 \"bias\": f32[3] = weight\n"
            "  %2: f32[3] = full() {dtype=f32, shape=[3], value=2}\n"
            "  %3: f32[3] = add(%2, %1)\n"
            "  %4: f32[2,3] = mul(%0, %3)\n"
            "  return %4 \"y\"\n"
            "}\n");
  EXPECT_TRUE(fold_constants(g));
  g.verify();
  EXPECT_EQ(g.to_string(),
            "graph(%0 \"x\": f32[2,3]) {\n"
            "  %2: f32[3] = constant\n"
            "  %1: f32[2,3] = mul(%0, %2)\n"
            "  return %1 \"y\"\n"
            "}\n");
  const Value& folded = g.value(2);
  EXPECT_FALSE(folded.is_weight);
  Floats got = constant_floats(g, 2);
  for (size_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(got[i], 2.0f + bias[i]);
  EXPECT_FALSE(fold_constants(g));
  auto in = random_inputs(original, 3);
  expect_close(run_plain(g, in), run_plain(original, in), 1e-6f, 1e-6f);
}

TEST(ConstantFold, FoldedGraphOutputStaysADistinctCopyGolden) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2}));
  ValueId c1 = f32_constant(g, "", {2}, {1.5f, -2.0f}, false);
  ValueId c2 = f32_constant(g, "", {2}, {0.25f, 4.0f}, false);
  g.mark_output(g.add_node1(OpKind::kAdd, {c1, c2}), "sum");
  g.mark_output(g.add_node1(OpKind::kRelu, {x}), "r");
  const Graph original = g;
  EXPECT_TRUE(fold_constants(g));
  g.verify();
  EXPECT_EQ(g.to_string(),
            "graph(%0 \"x\": f32[2]) {\n"
            "  %2: f32[2] = constant\n"
            "  %1: f32[2] = relu(%0)\n"
            "  %3: f32[2] = copy(%2)\n"
            "  return %3 \"sum\", %1 \"r\"\n"
            "}\n");
  EXPECT_EQ(constant_floats(g, 2), (Floats{1.75f, 2.0f}));
  EXPECT_FALSE(fold_constants(g));  // the copy that materializes the output stays
  auto in = random_inputs(original, 11);
  expect_close(run_plain(g, in), run_plain(original, in), 0.0f, 0.0f);
}

TEST(ConstantFold, FoldsChainsAndBypassesCopiesOfConstants) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {3, 4}));
  ValueId k = f32_weight(g, "k", {3, 4}, 5);
  ValueId c = g.add_node1(OpKind::kCopy, {k});
  ValueId e = g.add_node1(OpKind::kExp, {g.add_node1(OpKind::kNeg, {c})});
  Attrs sum;
  sum.set("axes", Shape{1});
  sum.set("keepdim", true);
  ValueId r = g.add_node1(OpKind::kReduceSum, {e}, sum);
  g.mark_output(g.add_node1(OpKind::kDiv, {x, r}), "y");
  const Graph original = g;
  EXPECT_TRUE(fold_constants(g));
  g.verify();
  ASSERT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(g.nodes()[0]->op, OpKind::kDiv);
  EXPECT_TRUE(g.value(g.nodes()[0]->inputs[1]).is_constant());
  EXPECT_TRUE(Engine::create(g, Device{}, KernelOptions{})->weight_names().empty());
  auto in = random_inputs(original, 2);
  expect_close(run_plain(g, in), run_plain(original, in), 1e-6f, 1e-6f);
}

TEST(ConstantFold, LeavesHugeGeneratorsAndRuntimeValuesAlone) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {4}));
  Attrs big;  // 17 MB of f32, over the 16 MiB cap
  big.set("dtype", DType::kF32);
  big.set("shape", Shape{1025, 4096});
  big.set("value", 1.0);
  g.mark_output(g.add_node1(OpKind::kFull, {}, big), "big");
  Attrs ar;
  ar.set("dtype", DType::kF32);
  ar.set("end", 4.0);
  ValueId idx = g.add_node1(OpKind::kArange, {}, ar);
  g.mark_output(g.add_node1(OpKind::kAdd, {x, idx}), "y");
  EXPECT_TRUE(fold_constants(g));  // the arange folds, the huge full does not
  g.verify();
  EXPECT_EQ(count_ops(g, OpKind::kFull), 1);
  EXPECT_EQ(count_ops(g, OpKind::kArange), 0);
  EXPECT_EQ(count_ops(g, OpKind::kAdd), 1);
  for (const auto& n : g.nodes()) {
    if (n->op != OpKind::kAdd) continue;
    EXPECT_EQ(constant_floats(g, n->inputs[1]), (Floats{0, 1, 2, 3}));
  }
}

TEST(ConstantFold, FoldsLargeConcatenationsOfWeightsButNotLargeBroadcasts) {
  // Both outputs are 17.2 MB of f32, over the 16 MiB cap: the concatenation is no larger than
  // its inputs together (a transformation of weights), the broadcast is 1025x its input.
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {1, 4200}));
  const ValueId a = f32_weight(g, "a", {1024, 2100}, 1), b = f32_weight(g, "b", {1024, 2100}, 2);
  Attrs rows;
  rows.set("axis", int64_t{1});
  const ValueId cat = g.add_node1(OpKind::kConcat, {a, b}, rows);
  Attrs wide;
  wide.set("shape", Shape{1025, 4200});
  const ValueId row = f32_weight(g, "row", {1, 4200}, 3);
  const ValueId broad = g.add_node1(OpKind::kExpand, {row}, wide);
  g.mark_output(g.add_node1(OpKind::kAdd, {x, cat}), "y");
  g.mark_output(g.add_node1(OpKind::kAdd, {x, broad}), "z");
  const Graph original = g;
  EXPECT_TRUE(fold_constants(g));
  g.verify();
  EXPECT_EQ(count_ops(g, OpKind::kConcat), 0);
  EXPECT_EQ(count_ops(g, OpKind::kExpand), 1);
  auto in = random_inputs(original, 4);
  expect_close(run_plain(g, in), run_plain(original, in), 0.0f, 0.0f);
}

// ---- fold_batch_norm ----------------------------------------------------------------------

struct BnParams {
  ValueId mean, var, gamma, beta;
};

BnParams bn_weights(Graph& g, int64_t c, uint32_t seed, const std::string& prefix = "bn") {
  return {f32_weight(g, prefix + ".running_mean", {c}, seed),
          f32_weight(g, prefix + ".running_var", {c}, seed + 1, 0.5f, 2.0f),
          f32_weight(g, prefix + ".weight", {c}, seed + 2, 0.5f, 1.5f), f32_weight(g, prefix + ".bias", {c}, seed + 3)};
}

ValueId batch_norm(Graph& g, ValueId x, const BnParams& p, double eps = 1e-3) {
  Attrs a;
  a.set("eps", eps);
  return g.add_node1(OpKind::kBatchNorm, {x, p.mean, p.var, p.gamma, p.beta}, a);
}

TEST(FoldBatchNorm, ConvBatchNormGolden) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {1, 2, 5, 5}));
  ValueId w = f32_weight(g, "conv.weight", {3, 2, 3, 3}, 1);
  ValueId b = f32_weight(g, "conv.bias", {3}, 2);
  BnParams p = bn_weights(g, 3, 3);
  ValueId y = g.add_node1(OpKind::kConv, {x, w, b}, conv2d_attrs(1, 1, 1));
  g.mark_output(g.add_node1(OpKind::kRelu, {batch_norm(g, y, p)}), "y");
  const Graph original = g;
  EXPECT_EQ(g.to_string(),
            "graph(%0 \"x\": f32[1,2,5,5]) {\n"
            "  %1 \"conv.weight\": f32[3,2,3,3] = weight\n"
            "  %2 \"conv.bias\": f32[3] = weight\n"
            "  %3 \"bn.running_mean\": f32[3] = weight\n"
            "  %4 \"bn.running_var\": f32[3] = weight\n"
            "  %5 \"bn.weight\": f32[3] = weight\n"
            "  %6 \"bn.bias\": f32[3] = weight\n"
            "  %7: f32[1,3,5,5] = conv(%0, %1, %2) {dilation=[1,1], groups=1, padding=[1,1], stride=[1,1]}\n"
            "  %8: f32[1,3,5,5] = batch_norm(%7, %3, %4, %5, %6) {eps=0.001}\n"
            "  %9: f32[1,3,5,5] = relu(%8)\n"
            "  return %9 \"y\"\n"
            "}\n");
  // The folding arithmetic is emitted as nodes on the constants, in f64 (W's dtype at the end) ...
  EXPECT_TRUE(fold_batch_norm(g));
  g.verify();
  EXPECT_EQ(g.to_string(),
            "graph(%0 \"x\": f32[1,2,5,5]) {\n"
            "  %1 \"conv.weight\": f32[3,2,3,3] = weight\n"
            "  %2 \"conv.bias\": f32[3] = weight\n"
            "  %3 \"bn.running_mean\": f32[3] = weight\n"
            "  %4 \"bn.running_var\": f32[3] = weight\n"
            "  %5 \"bn.weight\": f32[3] = weight\n"
            "  %6 \"bn.bias\": f32[3] = weight\n"
            "  %8: f64[] = constant 0.001\n"
            "  %9: f64[3] = cast(%4) {dtype=f64}\n"
            "  %10: f64[3] = add(%9, %8)\n"
            "  %11: f64[3] = sqrt(%10)\n"
            "  %12: f64[3] = cast(%5) {dtype=f64}\n"
            "  %13: f64[3] = div(%12, %11)\n"
            "  %14: f64[3] = cast(%3) {dtype=f64}\n"
            "  %15: f64[3] = cast(%2) {dtype=f64}\n"
            "  %16: f64[3] = sub(%15, %14)\n"
            "  %17: f64[3] = mul(%16, %13)\n"
            "  %18: f64[3] = cast(%6) {dtype=f64}\n"
            "  %19: f64[3] = add(%17, %18)\n"
            "  %20: f64[3,1,1,1] = reshape(%13) {shape=[3,1,1,1]}\n"
            "  %21: f64[3,2,3,3] = cast(%1) {dtype=f64}\n"
            "  %22: f64[3,2,3,3] = mul(%21, %20)\n"
            "  %23: f32[3,2,3,3] = cast(%22) {dtype=f32}\n"
            "  %24: f32[3] = cast(%19) {dtype=f32}\n"
            "  %25: f32[1,3,5,5] = conv(%0, %23, %24) {dilation=[1,1], groups=1, padding=[1,1], stride=[1,1]}\n"
            "  %7: f32[1,3,5,5] = relu(%25)\n"
            "  return %7 \"y\"\n"
            "}\n");
  // ... which fold_constants evaluates (the one place derived constants are made).
  EXPECT_TRUE(fold_constants(g));
  g.verify();
  EXPECT_EQ(g.to_string(),
            "graph(%0 \"x\": f32[1,2,5,5]) {\n"
            "  %3: f32[3,2,3,3] = constant\n"
            "  %4: f32[3] = constant\n"
            "  %2: f32[1,3,5,5] = conv(%0, %3, %4) {dilation=[1,1], groups=1, padding=[1,1], stride=[1,1]}\n"
            "  %1: f32[1,3,5,5] = relu(%2)\n"
            "  return %1 \"y\"\n"
            "}\n");
  // W' and b' against the formula, from the original constants.
  Floats w0 = constant_floats(original, w), b0 = constant_floats(original, b);
  Floats m = constant_floats(original, p.mean), v = constant_floats(original, p.var);
  Floats ga = constant_floats(original, p.gamma), be = constant_floats(original, p.beta);
  Floats w1 = constant_floats(g, 3), b1 = constant_floats(g, 4);
  for (size_t o = 0; o < 3; ++o) {
    double s = double(ga[o]) / std::sqrt(double(v[o]) + 1e-3);
    EXPECT_NEAR(b1[o], (b0[o] - m[o]) * s + be[o], 1e-6);
    for (size_t i = 0; i < 18; ++i) EXPECT_NEAR(w1[o * 18 + i], w0[o * 18 + i] * s, 1e-6);
  }
  EXPECT_FALSE(fold_batch_norm(g));
  auto in = random_inputs(original, 9);
  expect_close(run_plain(g, in), run_plain(original, in), 1e-5f, 1e-5f);
}

TEST(FoldBatchNorm, GroupedConvWithoutBiasOrAffineMatchesUnfolded) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4, 6, 6}));
  ValueId w = f32_weight(g, "w", {6, 2, 3, 3}, 21);
  ValueId y = g.add_node1(OpKind::kConv, {x, w}, conv2d_attrs(2, 1, 2));
  BnParams p = bn_weights(g, 6, 22);
  Attrs a;
  a.set("eps", 1e-5);
  g.mark_output(g.add_node1(OpKind::kBatchNorm, {y, p.mean, p.var}, a), "y");
  const Graph original = g;
  EXPECT_TRUE(fold_batch_norm(g));
  EXPECT_TRUE(fold_constants(g));
  g.verify();
  EXPECT_EQ(count_ops(g, OpKind::kBatchNorm), 0);
  ASSERT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(g.nodes()[0]->inputs.size(), 3u);  // a bias appears
  auto in = random_inputs(original, 4);
  expect_close(run_plain(g, in), run_plain(original, in), 1e-5f, 1e-5f);
}

TEST(FoldBatchNorm, GroupedConvTransposeScalesPerOutputChannel) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {1, 4, 3, 3}));
  ValueId w = f32_weight(g, "w", {4, 3, 2, 2}, 31);  // C_in 4, groups 2 -> 6 output channels
  ValueId b = f32_weight(g, "b", {6}, 32);
  Attrs a = conv2d_attrs(2, 0, 2);
  a.set("output_padding", Shape{0, 0});
  ValueId y = g.add_node1(OpKind::kConvTranspose, {x, w, b}, a);
  g.mark_output(batch_norm(g, y, bn_weights(g, 6, 33)), "y");
  const Graph original = g;
  EXPECT_TRUE(fold_batch_norm(g));
  EXPECT_TRUE(fold_constants(g));
  g.verify();
  EXPECT_EQ(count_ops(g, OpKind::kBatchNorm), 0);
  EXPECT_EQ(count_ops(g, OpKind::kConvTranspose), 1);
  auto in = random_inputs(original, 5);
  expect_close(run_plain(g, in), run_plain(original, in), 1e-5f, 1e-5f);
}

TEST(FoldBatchNorm, LinearOverFeaturesMatchesUnfolded) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {5, 7}));
  ValueId w = f32_weight(g, "fc.weight", {4, 7}, 41);
  ValueId b = f32_weight(g, "fc.bias", {4}, 42);
  ValueId y = g.add_node1(OpKind::kLinear, {x, w, b});
  g.mark_output(batch_norm(g, y, bn_weights(g, 4, 43)), "y");
  const Graph original = g;
  EXPECT_TRUE(fold_batch_norm(g));
  EXPECT_TRUE(fold_constants(g));
  g.verify();
  ASSERT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(g.nodes()[0]->op, OpKind::kLinear);
  auto in = random_inputs(original, 6);
  expect_close(run_plain(g, in), run_plain(original, in), 1e-5f, 1e-5f);
}

TEST(FoldBatchNorm, HalfWeightsFoldInDoubleAndRoundOnce) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF16, {1, 2, 4, 4}));
  Floats wf = random_floats(2 * 2, 51);
  std::vector<uint16_t> wh;
  for (float f : wf) wh.push_back(float_to_half(f));
  ValueId w = g.add_constant("w", TensorType(DType::kF16, {2, 2, 1, 1}), wh.data(), wh.size() * 2, true);
  BnParams p = bn_weights(g, 2, 52);  // f32 statistics on an f16 conv
  ValueId y = g.add_node1(OpKind::kConv, {x, w}, conv2d_attrs(1, 0, 1));
  g.mark_output(batch_norm(g, y, p), "y");
  const Graph original = g;
  ASSERT_TRUE(fold_batch_norm(g));
  ASSERT_TRUE(fold_constants(g));
  g.verify();
  const Node& conv = *g.nodes()[0];
  const Value& w1 = g.value(conv.inputs[1]);
  ASSERT_EQ(w1.type.dtype, DType::kF16);
  Floats v = constant_floats(original, p.var), ga = constant_floats(original, p.gamma);
  for (size_t i = 0; i < 4; ++i) {
    double s = double(ga[i / 2]) / std::sqrt(double(v[i / 2]) + 1e-3);
    uint16_t got;
    std::memcpy(&got, w1.data->data() + 2 * i, 2);
    EXPECT_EQ(got, float_to_half(float(double(half_to_float(wh[i])) * s))) << i;
  }
}

TEST(FoldBatchNorm, FoldsNothingIntoProducersItCannotFoldInto) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {1, 2, 4, 4}));
  ValueId runtime_var = g.add_input("var", TensorType(DType::kF32, {2}));
  ValueId w = f32_weight(g, "w", {2, 2, 1, 1}, 61);
  BnParams p = bn_weights(g, 2, 62);
  // 1. The conv output has a second use.
  ValueId y1 = g.add_node1(OpKind::kConv, {x, w}, conv2d_attrs(1, 0, 1));
  ValueId n1 = batch_norm(g, y1, p);
  g.mark_output(g.add_node1(OpKind::kAdd, {n1, y1}), "a");
  // 2. A statistic is a graph input.
  ValueId y2 = g.add_node1(OpKind::kConv, {x, w}, conv2d_attrs(1, 0, 1));
  g.mark_output(batch_norm(g, y2, {p.mean, runtime_var, p.gamma, p.beta}), "b");
  // 3. The weight is computed at run time.
  ValueId w3 = g.add_node1(OpKind::kAbs, {g.add_input("w3", TensorType(DType::kF32, {2, 2, 1, 1}))});
  ValueId y3 = g.add_node1(OpKind::kConv, {x, w3}, conv2d_attrs(1, 0, 1));
  g.mark_output(batch_norm(g, y3, p), "c");
  // 4. A linear with a rank-3 output: batch_norm's channel axis is not the feature axis.
  ValueId x4 = g.add_input("x4", TensorType(DType::kF32, {2, 3, 3}));
  ValueId y4 = g.add_node1(OpKind::kLinear, {x4, f32_weight(g, "fc", {3, 3}, 63)});
  g.mark_output(batch_norm(g, y4, bn_weights(g, 3, 64, "bn4")), "d");
  g.verify();
  const Graph original = g;
  // Nothing folds into a producer: every conv and the linear keep their weights. The norms with
  // constant parameters become per-channel multiply-adds; the one with a run-time statistic stays.
  EXPECT_TRUE(fold_batch_norm(g));
  g.verify();
  for (const auto& n : g.nodes()) {
    if (n->op != OpKind::kConv && n->op != OpKind::kLinear) continue;
    const Value& weight = g.value(n->inputs[1]);
    EXPECT_TRUE(weight.name == "w" || weight.name == "fc" || weight.producer->op == OpKind::kAbs) << g.to_string();
  }
  EXPECT_EQ(count_ops(g, OpKind::kBatchNorm), 1);
  auto in = random_inputs(original, 65);
  for (float& v : in[1]) v = std::fabs(v) + 0.5f;  // the run-time variance
  expect_close(run_plain(g, in), run_plain(original, in), 1e-5f, 1e-5f);
}

// ---- fuse_pointwise -----------------------------------------------------------------------

TEST(FusePointwise, ChainsWithEscapingValuesGolden) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3}));
  ValueId bias = f32_weight(g, "bias", {3}, 71);
  ValueId w = f32_weight(g, "w", {3, 3}, 72);
  ValueId half = f32_scalar(g, 0.5f);
  ValueId a = g.add_node1(OpKind::kAdd, {x, bias});
  ValueId m = g.add_node1(OpKind::kMul, {a, half});
  ValueId r = g.add_node1(OpKind::kRelu, {m});
  ValueId l = g.add_node1(OpKind::kLinear, {r, w});
  ValueId s = g.add_node1(OpKind::kSub, {l, a});
  g.mark_output(g.add_node1(OpKind::kTanh, {s}), "y");
  const Graph original = g;
  EXPECT_TRUE(fuse_pointwise(g));
  g.verify();
  EXPECT_EQ(g.to_string(),
            "graph(%0 \"x\": f32[2,3]) {\n"
            "  %1 \"bias\": f32[3] = weight\n"
            "  %2 \"w\": f32[3,3] = weight\n"
            "  %4: f32[2,3], %5: f32[2,3] = fused_pointwise(%0, %1) "
            "graph(%0 \"in0\": f32[2,3], %1 \"in1\": f32[3]) {\n"
            "    %3: f32[] = constant 0.5\n"
            "    %2: f32[2,3] = add(%0, %1)\n"
            "    %4: f32[2,3] = mul(%2, %3)\n"
            "    %5: f32[2,3] = relu(%4)\n"
            "    return %2 \"out0\", %5 \"out1\"\n"
            "  }\n"
            "  %3: f32[2,3] = linear(%5, %2)\n"
            "  %6: f32[2,3] = fused_pointwise(%3, %4) graph(%0 \"in0\": f32[2,3], %1 \"in1\": f32[2,3]) {\n"
            "    %2: f32[2,3] = sub(%0, %1)\n"
            "    %3: f32[2,3] = tanh(%2)\n"
            "    return %3 \"out0\"\n"
            "  }\n"
            "  return %6 \"y\"\n"
            "}\n");
  EXPECT_FALSE(fuse_pointwise(g));
  auto in = random_inputs(original, 8);
  expect_close(run_plain(g, in), run_plain(original, in), 1e-6f, 1e-6f);
}

TEST(FusePointwise, SingleOpsAndShapeChangesStayApart) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 3}));
  ValueId v = g.add_input("v", TensorType(DType::kF32, {3}));
  ValueId vv = g.add_node1(OpKind::kExp, {g.add_node1(OpKind::kNeg, {v})});  // a [3] group...
  g.mark_output(vv, "vv");  // ...that is also a graph output, so not recomputed in the [4,3] one
  ValueId y = g.add_node1(OpKind::kSigmoid, {g.add_node1(OpKind::kMul, {x, vv})});  // a [4,3] group
  g.mark_output(y, "y");
  Attrs sum;
  sum.set("axes", Shape{0});
  sum.set("keepdim", false);
  g.mark_output(g.add_node1(OpKind::kRelu, {g.add_node1(OpKind::kReduceSum, {x}, sum)}), "lone");
  const Graph original = g;
  EXPECT_TRUE(fuse_pointwise(g));
  g.verify();
  EXPECT_EQ(count_ops(g, OpKind::kFusedPointwise), 2);
  EXPECT_EQ(count_ops(g, OpKind::kRelu), 1);  // a single op is not worth a fused node
  for (const auto& n : g.nodes()) {
    if (n->op != OpKind::kFusedPointwise) continue;
    EXPECT_EQ(n->body->nodes().size(), 2u);
    const Shape group = n->body->type(n->body->nodes()[0]->outputs[0]).shape();
    for (const auto& b : n->body->nodes()) EXPECT_EQ(n->body->type(b->outputs[0]).shape(), group);
  }
  auto in = random_inputs(original, 12);
  expect_close(run_plain(g, in), run_plain(original, in), 1e-6f, 1e-6f);
}

// A few ops of a smaller shape read only by a larger group (a per-channel gate: x *
// hardsigmoid(s)) join it and are recomputed per element; a longer small chain, or one read
// elsewhere too, stays a group of its own.
TEST(FusePointwise, SmallGatesJoinTheGroupTheyScale) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 5, 5, 4}));
  ValueId s = g.add_input("s", TensorType(DType::kF32, {2, 1, 1, 4}));
  ValueId gate = g.add_node1(OpKind::kHardsigmoid, {s});
  g.mark_output(g.add_node1(OpKind::kMul, {x, gate}), "y");
  // A five-op [4] chain: more than the recomputed limit.
  ValueId t = g.add_input("t", TensorType(DType::kF32, {4}));
  ValueId c = t;
  for (int k = 0; k < 5; ++k) c = g.add_node1(k % 2 ? OpKind::kTanh : OpKind::kSigmoid, {c});
  g.mark_output(g.add_node1(OpKind::kAdd, {x, c}), "z");
  const Graph original = g;
  EXPECT_TRUE(fuse_pointwise(g));
  g.verify();
  EXPECT_EQ(count_ops(g, OpKind::kFusedPointwise), 2);  // the gate with its mul; the [4] chain alone
  EXPECT_EQ(count_ops(g, OpKind::kAdd), 1);
  EXPECT_EQ(count_ops(g, OpKind::kHardsigmoid), 0);
  for (const auto& n : g.nodes()) {
    if (n->op != OpKind::kFusedPointwise) continue;
    const Graph& b = *n->body;
    for (ValueId o : b.outputs()) EXPECT_EQ(b.type(o).shape(), g.type(n->outputs[0]).shape());
    if (count_ops(b, OpKind::kHardsigmoid) == 1) {
      EXPECT_EQ(b.nodes().size(), 2u);
      EXPECT_EQ(g.type(n->outputs[0]).shape(), (Shape{2, 5, 5, 4}));
      EXPECT_EQ(b.type(b.nodes()[0]->outputs[0]).shape(), (Shape{2, 1, 1, 4}));  // computed per element
    } else {
      EXPECT_EQ(b.nodes().size(), 5u);
    }
  }
  auto in = random_inputs(original, 13);
  expect_close(run_plain(g, in), run_plain(original, in), 1e-6f, 1e-6f);
}

TEST(FusePointwise, MergesSiblingGroupsAndHandlesWhereAndCast) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {8}));
  ValueId z = g.add_input("z", TensorType(DType::kF32, {8}));
  ValueId a = g.add_node1(OpKind::kRelu, {x});
  ValueId b = g.add_node1(OpKind::kSigmoid, {z});
  ValueId c = g.add_node1(OpKind::kMul, {a, b});
  ValueId cond = g.add_node1(OpKind::kGt, {c, f32_scalar(g, 0.1f)});
  Attrs to64;
  to64.set("dtype", DType::kF64);
  ValueId d = g.add_node1(OpKind::kCast, {g.add_node1(OpKind::kWhere, {cond, c, z})}, to64);
  Attrs to32;
  to32.set("dtype", DType::kF32);
  g.mark_output(g.add_node1(OpKind::kCast, {d}, to32), "y");
  const Graph original = g;
  EXPECT_TRUE(fuse_pointwise(g));
  g.verify();
  ASSERT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(g.nodes()[0]->op, OpKind::kFusedPointwise);
  EXPECT_EQ(g.nodes()[0]->inputs, (std::vector<ValueId>{0, 1}));
  EXPECT_EQ(g.nodes()[0]->body->nodes().size(), 7u);
  auto in = random_inputs(original, 13);
  expect_close(run_plain(g, in), run_plain(original, in), 1e-6f, 1e-6f);
}

// T5's relative position buckets: an i64 distance cast to f32, log(d / 8) / log(16) * 8 + 8,
// truncated to i64. A body with i64 values computes in f64 on the CPU; its f32 values must still
// round as the f32 kernels round them, or d = 16 and 32 (exactly 10 and 12 in f32) truncate to
// 9 and 11. The fused node equals the unfused ops bit for bit.
TEST(FusePointwise, AnF32ChainInsideAnI64BodyRoundsAsF32) {
  Graph g;
  const ValueId x = g.add_input("d", TensorType(DType::kF32, {8}));
  Attrs to;
  to.set("dtype", DType::kI64);
  const ValueId d = g.add_node1(OpKind::kCast, {x}, to);
  to.set("dtype", DType::kF32);
  ValueId v = g.add_node1(OpKind::kCast, {d}, to);
  v = g.add_node1(OpKind::kLog, {g.add_node1(OpKind::kDiv, {v, f32_scalar(g, 8.0f)})});
  v = g.add_node1(OpKind::kDiv, {v, f32_scalar(g, float(std::log(16.0)))});
  v = g.add_node1(OpKind::kAdd, {g.add_node1(OpKind::kMul, {v, f32_scalar(g, 8.0f)}), f32_scalar(g, 8.0f)});
  to.set("dtype", DType::kI64);
  const ValueId bucket = g.add_node1(OpKind::kCast, {v}, to);
  to.set("dtype", DType::kF32);
  g.mark_output(g.add_node1(OpKind::kCast, {bucket}, to), "y");
  const Graph original = g;
  ASSERT_TRUE(fuse_pointwise(g));
  ASSERT_EQ(count_ops(g, OpKind::kFusedPointwise), 1);
  const std::vector<Floats> in = {{16, 32, 64, 128, 9, 17, 33, 100}};
  const auto fused = run_plain(g, in), plain = run_plain(original, in);
  EXPECT_EQ(plain[0][0], 10.0f);
  EXPECT_EQ(plain[0][1], 12.0f);
  expect_close(fused, plain, 0.0f, 0.0f);
}

// A random DAG of pointwise ops over [4,5] and [5] values with some linears in between.
Graph random_graph(uint32_t seed, int steps) {
  std::mt19937 rng(seed);
  auto pick = [&](const std::vector<ValueId>& pool) { return pool[rng() % pool.size()]; };
  Graph g;
  std::vector<ValueId> big{g.add_input("x", TensorType(DType::kF32, {4, 5}))};
  std::vector<ValueId> small{g.add_input("v", TensorType(DType::kF32, {5}))};
  ValueId w = f32_weight(g, "w", {5, 5}, seed + 100, -0.5f, 0.5f);
  ValueId half = f32_scalar(g, 0.5f);
  const OpKind unary[] = {OpKind::kRelu, OpKind::kNeg, OpKind::kTanh, OpKind::kSigmoid, OpKind::kSin, OpKind::kAbs};
  const OpKind binary[] = {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kMaximum};
  for (int s = 0; s < steps; ++s) {
    const int kind = int(rng() % 10);
    if (kind < 4) {
      bool on_big = rng() % 4 != 0;
      ValueId v = g.add_node1(unary[rng() % 6], {pick(on_big ? big : small)});
      (on_big ? big : small).push_back(v);
    } else if (kind < 8) {
      OpKind op = binary[rng() % 4];
      const int form = int(rng() % 4);
      if (form == 0) small.push_back(g.add_node1(op, {pick(small), pick(small)}));
      else if (form == 1) big.push_back(g.add_node1(op, {pick(big), pick(small)}));
      else if (form == 2) big.push_back(g.add_node1(op, {pick(big), half}));
      else big.push_back(g.add_node1(op, {pick(big), pick(big)}));
    } else if (kind == 8) {
      big.push_back(g.add_node1(OpKind::kLinear, {pick(big), w}));
    } else {
      ValueId cond = g.add_node1(OpKind::kLt, {pick(big), pick(small)});
      big.push_back(g.add_node1(OpKind::kWhere, {cond, pick(big), pick(small)}));
    }
  }
  g.mark_output(big.back(), "y0");
  if (big.size() > 2 && big[big.size() / 2] != big.back()) g.mark_output(big[big.size() / 2], "y1");
  if (small.size() > 1) g.mark_output(small.back(), "y2");
  return g;
}

TEST(FusePointwise, RandomGraphsStayVerifiedAndComputeTheSame) {
  for (uint32_t seed = 0; seed < 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Graph g = random_graph(seed, 25);
    const Graph original = g;
    fuse_pointwise(g);
    ASSERT_NO_THROW(g.verify());
    for (const auto& n : g.nodes()) {
      if (n->op != OpKind::kFusedPointwise) continue;
      ASSERT_GE(n->body->nodes().size(), 2u);
      const Shape group = g.type(n->outputs[0]).shape();
      for (const auto& b : n->body->nodes()) {  // a recomputed gate broadcasts to the group shape
        EXPECT_TRUE(op_info(b->op).pointwise());
        EXPECT_TRUE(broadcasts_to(n->body->type(b->outputs[0]).shape(), group));
      }
      for (ValueId o : n->body->outputs()) EXPECT_EQ(n->body->type(o).shape(), group);
    }
    auto in = random_inputs(original, seed);
    expect_close(run_plain(g, in), run_plain(original, in), 1e-5f, 1e-5f);
  }
}

// ---- plan_memory --------------------------------------------------------------------------

// Checks a plan against an independent liveness computation: planned values that are live at
// one node index never share a byte, offsets are aligned, everything fits in the arena.
void check_plan(const Graph& g, const MemoryPlan& p, size_t alignment) {
  ASSERT_EQ(p.offsets.size(), size_t(g.num_values()));
  std::vector<int> first(size_t(g.num_values()), -1), last(size_t(g.num_values()), -1);
  std::vector<char> is_out(size_t(g.num_values()), 0);
  for (ValueId o : g.outputs()) is_out[size_t(o)] = 1;
  size_t naive = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    for (ValueId in : g.nodes()[i]->inputs)
      if (in != kNoValue) last[size_t(in)] = int(i);
    for (ValueId out : g.nodes()[i]->outputs) first[size_t(out)] = last[size_t(out)] = int(i);
  }
  for (ValueId v = 0; v < g.num_values(); ++v) {
    const bool planned = first[size_t(v)] >= 0 && !is_out[size_t(v)];
    if (!planned) {
      EXPECT_EQ(p.offsets[size_t(v)], -1) << "%" << v << " is an input, output or constant";
      continue;
    }
    ASSERT_GE(p.offsets[size_t(v)], 0) << "%" << v;
    EXPECT_EQ(size_t(p.offsets[size_t(v)]) % alignment, 0u) << "%" << v;
    const size_t bytes = g.type(v).nbytes();
    EXPECT_LE(size_t(p.offsets[size_t(v)]) + bytes, p.arena_bytes) << "%" << v;
    naive += (bytes + alignment - 1) / alignment * alignment;
  }
  EXPECT_EQ(p.naive_bytes, naive);
  EXPECT_LE(p.arena_bytes, p.naive_bytes);
  for (ValueId a = 0; a < g.num_values(); ++a)
    for (ValueId b = a + 1; b < g.num_values(); ++b) {
      if (p.offsets[size_t(a)] < 0 || p.offsets[size_t(b)] < 0) continue;
      if (g.type(a).nbytes() == 0 || g.type(b).nbytes() == 0) continue;
      if (last[size_t(a)] < first[size_t(b)] || last[size_t(b)] < first[size_t(a)]) continue;  // never live together
      const int64_t a0 = p.offsets[size_t(a)], a1 = a0 + int64_t(g.type(a).nbytes());
      const int64_t b0 = p.offsets[size_t(b)], b1 = b0 + int64_t(g.type(b).nbytes());
      EXPECT_TRUE(a1 <= b0 || b1 <= a0) << "%" << a << " [" << a0 << "," << a1 << ") and %" << b << " [" << b0
                                        << "," << b1 << ") are live together and overlap";
    }
}

TEST(MemoryPlan, ChainReusesTwoBuffers) {
  Graph g;
  ValueId v = g.add_input("x", TensorType(DType::kF32, {2, 3, 4}));  // 96 bytes -> 128 at 64
  for (int i = 0; i < 5; ++i) v = g.add_node1(OpKind::kRelu, {v});
  g.mark_output(v, "y");
  MemoryPlan p = plan_memory(g, 64);
  check_plan(g, p, 64);
  EXPECT_EQ(p.naive_bytes, 4u * 128u);
  EXPECT_EQ(p.arena_bytes, 2u * 128u);
  EXPECT_EQ(p.offsets, (std::vector<int64_t>{-1, 0, 128, 0, 128, -1}));
}

TEST(MemoryPlan, OutputsNeverAliasTheirNodesInputs) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {16}));
  ValueId a = g.add_node1(OpKind::kExp, {x});
  ValueId b = g.add_node1(OpKind::kNeg, {a});
  ValueId c = g.add_node1(OpKind::kAdd, {a, b});  // a live until here
  ValueId d = g.add_node1(OpKind::kRelu, {c});
  g.mark_output(g.add_node1(OpKind::kSin, {d}), "y");
  MemoryPlan p = plan_memory(g, 64);
  check_plan(g, p, 64);
  EXPECT_NE(p.offsets[size_t(a)], p.offsets[size_t(b)]);
  EXPECT_NE(p.offsets[size_t(c)], p.offsets[size_t(a)]);
  EXPECT_NE(p.offsets[size_t(c)], p.offsets[size_t(b)]);
  EXPECT_NE(p.offsets[size_t(d)], p.offsets[size_t(c)]);
  EXPECT_EQ(p.arena_bytes, 3u * 64u);
}

TEST(MemoryPlan, ZeroSizeValuesTakeNoSpaceAndAlignmentIsHonoured) {
  Graph g;
  ValueId e = g.add_input("e", TensorType(DType::kF32, {0, 3}));
  ValueId x = g.add_input("x", TensorType(DType::kF32, {3}));  // 12 bytes
  ValueId z = g.add_node1(OpKind::kRelu, {e});
  ValueId a = g.add_node1(OpKind::kNeg, {x});
  ValueId b = g.add_node1(OpKind::kExp, {a});
  g.mark_output(g.add_node1(OpKind::kAbs, {z}), "z");
  g.mark_output(g.add_node1(OpKind::kAdd, {a, b}), "y");
  for (size_t alignment : {size_t(1), size_t(16), size_t(48), size_t(256)}) {
    MemoryPlan p = plan_memory(g, alignment);
    check_plan(g, p, alignment);
    EXPECT_EQ(p.offsets[size_t(z)], 0);
    const size_t slot = (12 + alignment - 1) / alignment * alignment;
    EXPECT_EQ(p.arena_bytes, 2 * slot) << alignment;
  }
  try {
    plan_memory(g, 0);
    FAIL() << "alignment 0 accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("alignment"), std::string::npos) << err.what();
  }
}

TEST(MemoryPlan, RandomGraphsNeverOverlapLiveValues) {
  for (uint32_t seed = 0; seed < 30; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Graph g = random_graph(seed + 1000, 40);
    for (size_t alignment : {size_t(64), size_t(128)}) check_plan(g, plan_memory(g, alignment), alignment);
    fuse_pointwise(g);  // fused bodies are not planned; the outer graph is
    check_plan(g, plan_memory(g, 64), 64);
  }
}

// ---- the pipeline -------------------------------------------------------------------------

TEST(Pipeline, BuilderFoldsFusesAndMatchesTheUnoptimizedGraph) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 6, 6}));
  ValueId w = f32_weight(g, "conv.weight", {4, 3, 3, 3}, 81);
  ValueId y = g.add_node1(OpKind::kConv, {x, w}, conv2d_attrs(1, 1, 1));
  ValueId n = batch_norm(g, y, bn_weights(g, 4, 82));
  ValueId r = g.add_node1(OpKind::kRelu, {n});
  ValueId s = g.add_node1(OpKind::kMul, {r, f32_scalar(g, 2.0f)});
  g.mark_output(g.add_node1(OpKind::kAdd, {s, f32_weight(g, "shift", {4, 1, 1}, 83)}), "y");
  auto in = random_inputs(g, 14);
  auto want = run_plain(g, in);
  for (bool fuse : {false, true}) {
    BuilderConfig cfg;
    cfg.fuse_pointwise = fuse;
    auto engine = Builder(cfg).build(g);
    const Graph& plan = engine->graph();
    EXPECT_EQ(count_ops(plan, OpKind::kBatchNorm), 0);
    // relu rides in the conv's epilogue (fuse_epilogue), or, with fuse_pointwise, in the fused
    // kernel of the mul and add it feeds.
    EXPECT_EQ(count_ops(plan, OpKind::kRelu), 0);
    EXPECT_EQ(count_ops(plan, OpKind::kFusedPointwise), fuse ? 1 : 0);
    EXPECT_EQ(plan.nodes().size(), fuse ? 2u : 3u);
    EXPECT_LE(engine->memory_plan().arena_bytes, engine->memory_plan().naive_bytes);
    expect_close(run_engine(engine, in), want, 1e-5f, 1e-5f);
  }
}

}  // namespace

// ---- broadcast_expands ----------------------------------------------------------------------

// F.normalize's x / expand(norm): the division reads the [B, N, 1] norm broadcast; a sum of two
// expands that broadcast against each other keeps its shape with neither; the results match.
TEST(BroadcastExpands, PointwiseOpsReadTheExpandedValue) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 4}));
  const ValueId n = g.add_input("n", TensorType(DType::kF32, {2, 3, 1}));
  const ValueId a = g.add_input("a", TensorType(DType::kF32, {3, 1}));
  const ValueId b = g.add_input("b", TensorType(DType::kF32, {1, 4}));
  g.mark_output(g.add_node1(OpKind::kDiv, {x, expand(g, n, {2, 3, 4})}), "normalized");
  g.mark_output(g.add_node1(OpKind::kAdd, {expand(g, a, {3, 4}), expand(g, b, {3, 4})}), "outer");
  const Graph f = pass_applied(g, broadcast_expands, 3, 1e-6f);
  EXPECT_EQ(count_ops(f, OpKind::kExpand), 0) << f.to_string();
}

// DeBERTa's relative-position gather: an index of extent 1 over batch and heads, expanded to
// the scores' shape, is read broadcast; an expand to less than x's extent or along the axis stays.
TEST(BroadcastExpands, GatherReadsItsExpandedIndexBroadcast) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {6, 4, 10}));
  std::vector<int64_t> values(4 * 5);
  for (size_t i = 0; i < values.size(); ++i) values[i] = int64_t((i * 7) % 10);
  const ValueId idx =
      g.add_constant("idx", TensorType(DType::kI64, {1, 4, 5}), values.data(), values.size() * 8, false);
  Attrs last;
  last.set("axis", int64_t{2});
  g.mark_output(g.add_node1(OpKind::kGather, {x, expand(g, idx, {6, 4, 5})}, last), "scores");
  const Graph f = pass_applied(g, broadcast_gather_indices, 4, 0.0f);
  EXPECT_EQ(count_ops(f, OpKind::kExpand), 0) << f.to_string();
  EXPECT_EQ(f.nodes().back()->attrs.get_ints("broadcast"), std::vector<int64_t>{0});

  Graph keep;
  const ValueId y = keep.add_input("y", TensorType(DType::kF32, {6, 4, 10}));
  const ValueId k = keep.add_constant("k", TensorType(DType::kI64, {1, 4, 5}), values.data(), values.size() * 8, false);
  keep.mark_output(keep.add_node1(OpKind::kGather, {y, expand(keep, k, {3, 4, 5})}, last), "fewer");
  Attrs first;
  first.set("axis", int64_t{0});
  const ValueId z = keep.add_input("z", TensorType(DType::kF32, {10, 4, 5}));
  keep.mark_output(keep.add_node1(OpKind::kGather, {z, expand(keep, k, {6, 4, 5})}, first), "along_axis");
  EXPECT_FALSE(broadcast_gather_indices(keep)) << keep.to_string();
}

// What keeps its expand: a unary op (its output would shrink), an expand that is also a graph
// output (its reader takes the value, the expand stays for the output), and the operand that
// carries the output shape once the other reads its value.
TEST(BroadcastExpands, KeepsExpandsTheOutputNeeds) {
  Graph g;
  const ValueId y = g.add_input("y", TensorType(DType::kF32, {3, 1}));
  const ValueId z = g.add_input("z", TensorType(DType::kF32, {3, 1}));
  g.mark_output(g.add_node1(OpKind::kRelu, {expand(g, y, {3, 4})}), "relu");
  const ValueId shown = expand(g, z, {3, 4});
  g.mark_output(shown, "shown");
  g.mark_output(g.add_node1(OpKind::kMul, {shown, expand(g, y, {3, 4})}), "both");
  Graph f = g;
  EXPECT_TRUE(broadcast_expands(f));  // the mul reads z itself; y's expand carries the shape
  f.verify();
  EXPECT_EQ(count_ops(f, OpKind::kExpand), 3) << f.to_string();
  const Node& mul = *f.nodes().back();
  ASSERT_EQ(mul.op, OpKind::kMul);
  EXPECT_EQ(mul.inputs[0], z);
  EXPECT_EQ(f.value(mul.inputs[1]).producer->op, OpKind::kExpand);
  const auto in = random_inputs(g, 5);
  expect_close(run_plain(f, in), run_plain(g, in), 1e-6f, 1e-6f);
  Graph lone;
  const ValueId w = lone.add_input("w", TensorType(DType::kF32, {3, 1}));
  lone.mark_output(lone.add_node1(OpKind::kNeg, {expand(lone, w, {3, 4})}), "neg");
  EXPECT_FALSE(broadcast_expands(lone));
}
