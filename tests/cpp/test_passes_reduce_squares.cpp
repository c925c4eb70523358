// reduce_sum / reduce_mean {square} (src/ops/reduce.cpp) and the square_into_reductions pass
// (src/passes/reduce_squares.cpp): the shape rule's refusals; the CPU kernel against the
// reduction of an explicit square over the last dim, an outer dim and every dim; the pass on
// RMSNorm's mean of squares and an L2 norm's sum, computing what the graph computed, and
// leaving a square that something else reads or a product of two tensors alone.
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

Attrs reduce_attrs(const Shape& axes, bool keepdim, bool square = false) {
  Attrs a;
  a.set("axes", axes);
  a.set("keepdim", keepdim);
  if (square) a.set("square", true);
  return a;
}

TEST(ReduceSquares, ShapeRuleTakesSquareOnlyForFloatingSumsAndMeans) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3}));
  ValueId i = g.add_input("i", TensorType(DType::kI64, {2, 3}));
  EXPECT_EQ(g.type(g.add_node1(OpKind::kReduceMean, {x}, reduce_attrs({1}, true, true))).shape(), (Shape{2, 1}));
  expect_error([&] { g.add_node1(OpKind::kReduceMax, {x}, reduce_attrs({1}, false, true)); },
               ErrorCode::kInvalidArgument, {"reduce_max", "'square'", "reduce_sum and reduce_mean"});
  expect_error([&] { g.add_node1(OpKind::kReduceSum, {i}, reduce_attrs({1}, false, true)); },
               ErrorCode::kInvalidArgument, {"reduce_sum", "'square'", "i64[2,3]"});
  Attrs wrong = reduce_attrs({1}, false);
  wrong.set("square", int64_t{1});
  expect_error([&] { g.add_node1(OpKind::kReduceSum, {x}, wrong); }, ErrorCode::kInvalidArgument,
               {"reduce_sum", "square"});
}

// The kernel with {square} equals the reduction of x * x, over each collapsed form the CPU
// kernel has (inner runs reduced, rows kept, everything).
TEST(ReduceSquares, KernelReducesTheSquaresOfItsInput) {
  for (const auto& [op, axes] : std::vector<std::pair<OpKind, Shape>>{{OpKind::kReduceMean, {2}},
                                                                      {OpKind::kReduceSum, {0}},
                                                                      {OpKind::kReduceSum, {}},
                                                                      {OpKind::kReduceMean, {0, 2}}}) {
    Graph sq, fused;
    for (Graph* g : {&sq, &fused}) {
      ValueId x = g->add_input("x", TensorType(DType::kF32, {3, 5, 70}));
      const bool square = g == &fused;
      ValueId in = square ? x : g->add_node1(OpKind::kMul, {x, x});
      g->mark_output(g->add_node1(op, {in}, reduce_attrs(axes, true, square)), "y");
    }
    const auto in = random_inputs(sq, 7);
    expect_close(run_plain(fused, in), run_plain(sq, in), 1e-5f, 1e-6f);
  }
}

// RMSNorm: x * rsqrt(mean(x * x) + eps) * w.
Graph rms_norm() {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 6, 32}));
  ValueId ms = g.add_node1(OpKind::kReduceMean, {g.add_node1(OpKind::kMul, {x, x})}, reduce_attrs({2}, true));
  const float eps = 1e-6f;
  ValueId e = f32_constant(g, "eps", {1}, {eps}, false);
  ValueId r = g.add_node1(OpKind::kRsqrt, {g.add_node1(OpKind::kAdd, {ms, e})});
  g.mark_output(g.add_node1(OpKind::kMul, {g.add_node1(OpKind::kMul, {x, r}), f32_weight(g, "w", {32}, 3)}), "y");
  return g;
}

TEST(ReduceSquares, PassFoldsRmsNormsMeanOfSquares) {
  Graph f = pass_applied(rms_norm(), square_into_reductions, 11, 1e-5f);
  EXPECT_EQ(count_ops(f, OpKind::kMul), 2);  // x * r and * w stay; the square is gone
  for (const auto& n : f.nodes())
    if (n->op == OpKind::kReduceMean) {
      EXPECT_TRUE(n->attrs.get_bool("square", false));
      EXPECT_EQ(n->inputs[0], f.inputs()[0]);
    }
}

TEST(ReduceSquares, PassFoldsAnL2NormsSumOverAnOuterDim) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 9}));
  ValueId n = g.add_node1(
      OpKind::kSqrt, {g.add_node1(OpKind::kReduceSum, {g.add_node1(OpKind::kMul, {x, x})}, reduce_attrs({0}, true))});
  g.mark_output(g.add_node1(OpKind::kDiv, {x, n}), "y");
  Graph f = pass_applied(g, square_into_reductions, 5, 1e-5f);
  EXPECT_EQ(count_ops(f, OpKind::kMul), 0);
}

// A square read elsewhere too (a graph output, a second reduction after the square was shared
// between two norms): every reduction reads x, the mul stays for its other reader. A product of
// two tensors is no square.
TEST(ReduceSquares, PassReadsXForEverySumOfASharedSquareAndLeavesProducts) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 8}));
  ValueId y = g.add_input("y", TensorType(DType::kF32, {2, 8}));
  ValueId sq = g.add_node1(OpKind::kMul, {x, x});
  g.mark_output(g.add_node1(OpKind::kReduceSum, {sq}, reduce_attrs({1}, false)), "s");
  g.mark_output(g.add_node1(OpKind::kReduceMean, {sq}, reduce_attrs({0}, true)), "m");
  g.mark_output(sq, "sq");
  g.mark_output(g.add_node1(OpKind::kReduceSum, {g.add_node1(OpKind::kMul, {x, y})}, reduce_attrs({1}, false)), "d");
  Graph f = pass_applied(g, square_into_reductions, 7, 1e-5f);
  EXPECT_EQ(count_ops(f, OpKind::kMul), 2) << f.to_string();
  int squared = 0;
  for (const auto& n : f.nodes()) squared += n->attrs.get_bool("square", false) && n->inputs[0] == f.inputs()[0];
  EXPECT_EQ(squared, 2) << f.to_string();
}

}  // namespace
