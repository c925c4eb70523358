// eliminate_common_subexpressions (src/passes/common_subexpressions.cpp): repeats of a node
// merge into the first, chains of repeats collapse, and what differs (attributes, inputs) or
// is a graph output stays; the merged graph computes what the original computes.
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

// A diffusion UNet's pattern: every block takes silu(t) and projects it with its own linear.
TEST(CommonSubexpressions, RepeatedActivationsOfOneTensorMerge) {
  Graph g;
  ValueId t = g.add_input("t", TensorType(DType::kF32, {2, 16}));
  for (const char* name : {"a", "b", "c"}) {
    ValueId s = g.add_node1(OpKind::kSilu, {reshape(g, t, {2, 16})});
    g.mark_output(g.add_node1(OpKind::kLinear, {s, f32_weight(g, name, {8, 16}, uint32_t(name[0]))}), name);
  }
  const Graph f = pass_applied(g, eliminate_common_subexpressions, 1, 0.0f);
  EXPECT_EQ(count_ops(f, OpKind::kSilu), 1) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kReshape), 1) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kLinear), 3) << f.to_string();
  Graph again = f;
  EXPECT_FALSE(eliminate_common_subexpressions(again));
}

TEST(CommonSubexpressions, NodesThatDifferOrAreOutputsStay) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 6}));
  ValueId y = g.add_input("y", TensorType(DType::kF32, {4, 6}));
  Attrs six, one;
  six.set("min", 0.0), six.set("max", 6.0);
  one.set("min", 0.0), one.set("max", 1.0);
  ValueId a = g.add_node1(OpKind::kClamp, {x}, six);
  ValueId b = g.add_node1(OpKind::kClamp, {x}, one);    // other attributes
  ValueId c = g.add_node1(OpKind::kAdd, {x, y});
  ValueId d = g.add_node1(OpKind::kAdd, {y, x});        // other input order
  ValueId e = g.add_node1(OpKind::kMul, {a, b});
  g.mark_output(g.add_node1(OpKind::kAdd, {g.add_node1(OpKind::kAdd, {c, d}), e}), "sum");
  g.mark_output(g.add_node1(OpKind::kNeg, {x}), "n0");
  g.mark_output(g.add_node1(OpKind::kNeg, {x}), "n1");  // both are graph outputs
  const std::string before = g.to_string();
  EXPECT_FALSE(eliminate_common_subexpressions(g));
  EXPECT_EQ(g.to_string(), before);
}

// A node with several outputs merges whole, and the readers of each output follow.
TEST(CommonSubexpressions, MultiOutputNodesMergeWithEveryOutput) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 6}));
  Attrs split;
  split.set("axis", int64_t(1));
  split.set("sizes", Shape{2, 4});
  const auto p = g.add_node(OpKind::kSplit, {x}, split);
  const auto q = g.add_node(OpKind::kSplit, {x}, split);
  g.mark_output(g.add_node1(OpKind::kMul, {p[0], q[0]}), "a");
  g.mark_output(g.add_node1(OpKind::kSub, {p[1], q[1]}), "b");
  const Graph f = pass_applied(g, eliminate_common_subexpressions, 2, 0.0f);
  EXPECT_EQ(count_ops(f, OpKind::kSplit), 1) << f.to_string();
}

}  // namespace
