// Gathered leaves of fused_pointwise (fuse_pointwise.cpp, cpu/fused.cpp): an index_select by a
// constant index joins the pointwise ops that read it, and the fused kernel reads the data at the
// indexed positions. Nearest and bilinear upsampling fuse into one node computing what the
// unfused graph computes, on random inputs; an index_select never fuses with its data's
// producer; an index out of range is an error naming it.
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

ValueId index_constant(Graph& g, const std::vector<int64_t>& idx) {
  return g.add_constant("", TensorType(DType::kI64, {int64_t(idx.size())}), idx.data(), idx.size() * 8);
}

ValueId index_select(Graph& g, ValueId x, ValueId idx, int64_t axis) {
  Attrs a;
  a.set("axis", axis);
  return g.add_node1(OpKind::kIndexSelect, {x, idx}, a);
}

// fuse_pointwise on a copy of g: checks the result verifies and matches g; returns it.
Graph fuse_and_compare(const Graph& g, uint32_t seed) { return pass_applied(g, fuse_pointwise, seed, 1e-6f); }

int body_ops(const Graph& g, OpKind op) {
  int n = 0;
  for (const auto& node : g.nodes())
    if (node->body) n += count_ops(*node->body, op);
  return n;
}

TEST(FusedGathers, NearestUpsampleJoinsTheOpsThatReadIt) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4, 3, 5}));  // channels last: [N, H, W, C]
  ValueId y = g.add_input("y", TensorType(DType::kF32, {2, 8, 3, 5}));
  ValueId up = index_select(g, x, index_constant(g, {0, 0, 1, 1, 2, 2, 3, 3}), 1);
  ValueId c = f32_weight(g, "c", {5}, 3);
  g.mark_output(g.add_node1(OpKind::kRelu, {g.add_node1(OpKind::kAdd, {g.add_node1(OpKind::kMul, {up, y}), c})}), "z");
  Graph f = fuse_and_compare(g, 1);
  EXPECT_EQ(count_ops(f, OpKind::kIndexSelect), 0) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kFusedPointwise), 1);
  EXPECT_EQ(body_ops(f, OpKind::kIndexSelect), 1);
}

// An upsample of a flattened H * W axis, viewed as [H, W] by a reshape (as bilinear upsampling
// imports): the reshape joins the gather, and the kernel reads it in the reshape's shape.
TEST(FusedGathers, AReshapedGatherFusesInItsNewShape) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 6, 3}));  // [N, 2 * 3, C]
  std::vector<int64_t> idx;
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t w = 0; w < 6; ++w) idx.push_back((h / 2) * 3 + w / 2);
  ValueId up = index_select(g, x, index_constant(g, idx), 1);
  Attrs r;
  r.set("shape", Shape{2, 4, 6, 3});
  up = g.add_node1(OpKind::kReshape, {up}, r);
  ValueId y = g.add_input("y", TensorType(DType::kF32, {2, 4, 6, 3}));
  g.mark_output(g.add_node1(OpKind::kMul, {up, y}), "z");
  Graph f = fuse_and_compare(g, 5);
  EXPECT_EQ(count_ops(f, OpKind::kIndexSelect), 0) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kReshape), 0) << f.to_string();
  EXPECT_EQ(body_ops(f, OpKind::kReshape), 1);
}

// Bilinear along one axis: two gathers of the same data (the lower and upper neighbours, negative
// indices counting from the end) and a per-row weight, a * (1 - w) + b * w.
TEST(FusedGathers, BilinearLerpOfTwoGathersIsOneKernel) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 4, 6}));
  ValueId lo = index_select(g, x, index_constant(g, {0, 0, 1, 1, 2, 2}), 2);
  ValueId hi = index_select(g, x, index_constant(g, {0, 1, 1, 2, 2, -1}), 2);
  ValueId w = f32_weight(g, "w", {6, 1}, 4, 0.0f, 1.0f);
  ValueId one = g.add_constant("", TensorType(DType::kF32, {}), std::vector<float>{1.0f}.data(), 4);
  ValueId a = g.add_node1(OpKind::kMul, {lo, g.add_node1(OpKind::kSub, {one, w})});
  g.mark_output(g.add_node1(OpKind::kAdd, {a, g.add_node1(OpKind::kMul, {hi, w})}), "y");
  Graph f = fuse_and_compare(g, 2);
  EXPECT_EQ(count_ops(f, OpKind::kIndexSelect), 0) << f.to_string();
  EXPECT_EQ(body_ops(f, OpKind::kIndexSelect), 2);
}

// relu(x) gathered and added to relu(x) itself: the gather reads relu(x) from outside its kernel.
TEST(FusedGathers, NeverWithTheDataProducer) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {3, 4}));
  ValueId r = g.add_node1(OpKind::kRelu, {g.add_node1(OpKind::kNeg, {x})});
  ValueId s = index_select(g, r, index_constant(g, {3, 2, 1, 0}), 1);
  g.mark_output(g.add_node1(OpKind::kSigmoid, {g.add_node1(OpKind::kAdd, {s, r})}), "y");
  Graph f = fuse_and_compare(g, 3);
  for (const auto& n : f.nodes()) {
    if (!n->body || count_ops(*n->body, OpKind::kIndexSelect) == 0) continue;
    EXPECT_EQ(count_ops(*n->body, OpKind::kRelu), 0) << f.to_string();
  }
}

TEST(FusedGathers, AnIndexOutOfRangeIsAnError) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4}));
  ValueId s = index_select(g, x, index_constant(g, {0, 9}), 1);
  g.mark_output(g.add_node1(OpKind::kExp, {g.add_node1(OpKind::kNeg, {s})}), "y");
  Graph f = g;
  ASSERT_TRUE(fuse_pointwise(f));
  ASSERT_EQ(body_ops(f, OpKind::kIndexSelect), 1);
  expect_error([&] { run_plain(f, random_inputs(g, 4)); }, ErrorCode::kInvalidArgument, {"index 9", "out of range"});
}

}  // namespace
