// gather_concats (src/passes/gather_concats.cpp): a concat of (negated) slices of one tensor
// becomes one index_select (times a sign) that computes what the graph computed; slices of slices
// and steps compose; a concat that reads its source whole and in order is the source; concats of
// other inputs, and negated integer slices, stay.
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

TEST(GatherConcats, RotateHalfIsOneSignedGather) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 8}));
  ValueId lo = slice(g, x, 2, 0, 4), hi = slice(g, x, 2, 4, 8);
  ValueId rot = concat(g, {g.add_node1(OpKind::kNeg, {hi}), lo}, 2);
  g.mark_output(g.add_node1(OpKind::kAdd, {rot, x}), "y");
  Graph f = pass_applied(g, gather_concats, 1, 0.0f);
  EXPECT_EQ(count_ops(f, OpKind::kConcat), 0) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kSlice), 0) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kNeg), 0) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kIndexSelect), 1) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kMul), 1) << f.to_string();
}

TEST(GatherConcats, SlicesOfSlicesAndStepsCompose) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 9, 2}));
  ValueId inner = slice(g, x, 1, 1, 8);                     // positions 1..7
  ValueId every_other = slice(g, inner, 1, 0, 7, 2);        // 1, 3, 5, 7
  ValueId head = slice(g, x, 1, 0, 1);                      // 0
  g.mark_output(concat(g, {every_other, head, every_other}, 1), "y");
  Graph f = pass_applied(g, gather_concats, 2, 0.0f);
  EXPECT_EQ(count_ops(f, OpKind::kIndexSelect), 1) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kMul), 0) << f.to_string();  // nothing negated: no sign
  EXPECT_EQ(count_ops(f, OpKind::kSlice), 0) << f.to_string();
}

TEST(GatherConcats, AWholeInOrderConcatIsItsSource) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {3, 5}));
  ValueId y = concat(g, {slice(g, x, 1, 0, 2), slice(g, x, 1, 2, 5)}, 1);
  g.mark_output(g.add_node1(OpKind::kRelu, {y}), "y");
  Graph f = pass_applied(g, gather_concats, 3, 0.0f);
  ASSERT_EQ(f.nodes().size(), 1u) << f.to_string();
  EXPECT_EQ(f.nodes()[0]->op, OpKind::kRelu);
  EXPECT_EQ(f.nodes()[0]->inputs[0], f.inputs()[0]);
}

TEST(GatherConcats, OtherConcatsStay) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {3, 6}));
  ValueId z = g.add_input("z", TensorType(DType::kF32, {3, 6}));
  g.mark_output(concat(g, {slice(g, x, 1, 0, 3), slice(g, z, 1, 0, 3)}, 1), "two_sources");
  g.mark_output(concat(g, {slice(g, x, 1, 0, 3), slice(g, x, 1, 3, 6)}, 0), "sliced_on_another_axis");
  g.mark_output(concat(g, {g.add_node1(OpKind::kRelu, {x}), slice(g, x, 1, 0, 2)}, 1), "not_a_slice");
  g.mark_output(concat(g, {slice(g, x, 1, 0, 3), slice(g, x, 1, 3, 6)}, 1), "whole_but_an_output");
  ValueId i = g.add_input("i", TensorType(DType::kI32, {3, 6}));
  g.mark_output(concat(g, {g.add_node1(OpKind::kNeg, {slice(g, i, 1, 3, 6)}), slice(g, i, 1, 0, 3)}, 1),
                "negated_integers");
  Graph f = g;
  EXPECT_FALSE(gather_concats(f)) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kConcat), 5);
}

TEST(GatherConcats, UnnegatedIntegerSlicesGather) {
  Graph g;
  ValueId i = g.add_input("i", TensorType(DType::kI64, {2, 6}));
  g.mark_output(concat(g, {slice(g, i, 1, 3, 6), slice(g, i, 1, 0, 3)}, 1), "rolled");
  Graph f = g;
  EXPECT_TRUE(gather_concats(f)) << g.to_string();
  f.verify();
  EXPECT_EQ(count_ops(f, OpKind::kIndexSelect), 1) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kConcat), 0) << f.to_string();
}

}  // namespace
