// Inputs read through views ("view<i>", src/ops/shape_rules.h input_view) and the
// fold_input_views pass (src/passes/input_views.cpp): RoPE on a head split (a permute, with
// rotate_half as a gathered leaf of the permuted value) and GPT-NeoX's partial rotary (a split
// and slices of that permute, the rotated part concatenated with the rest) read the projection
// where it lies, with no copy left, computing what the graph computed on the CPU kernels; a
// transposed innermost dim stays a copy; a split left with parts nothing reads becomes slices;
// a view that does not fit its body, its buffer or its op is refused.
#include "src/ops/shape_rules.h"
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

// x * cos + rotate_half(x) * sin over the last dim of x ([.., d]), rotate_half as the gathered
// leaf gather_concats makes of it: index_select(x, [d/2 .. d-1, 0 .. d/2-1]) * [-1.., 1..].
ValueId rope(Graph& g, ValueId x, uint32_t seed) {
  const auto shape = g.type(x).shape();
  const int64_t d = shape.back(), s = shape[shape.size() - 2];
  std::vector<int64_t> idx;
  Floats sign;
  for (int64_t k = 0; k < d; ++k) idx.push_back((k + d / 2) % d), sign.push_back(k < d / 2 ? -1.0f : 1.0f);
  ValueId index =
      g.add_constant("rot" + std::to_string(seed), TensorType(DType::kI64, {d}), idx.data(), idx.size() * 8, false);
  Attrs last;
  last.set("axis", int64_t(shape.size()) - 1);
  ValueId rotated = g.add_node1(OpKind::kMul, {g.add_node1(OpKind::kIndexSelect, {x, index}, last),
                                               f32_constant(g, "sign" + std::to_string(seed), {d}, sign, false)});
  ValueId cos = f32_weight(g, "cos" + std::to_string(seed), {s, d}, seed);
  ValueId sin = f32_weight(g, "sin" + std::to_string(seed), {s, d}, seed + 1);
  return g.add_node1(OpKind::kAdd, {g.add_node1(OpKind::kMul, {x, cos}), g.add_node1(OpKind::kMul, {rotated, sin})});
}

bool fuse_and_fold(Graph& g) {
  const bool fused = fuse_pointwise(g);
  return fold_input_views(g) && fused;
}

// The inputs that are read through a view.
int viewed_inputs(const Graph& g) {
  int n = 0;
  for (const auto& node : g.nodes())
    for (size_t i = 0; i < node->inputs.size(); ++i) n += node->attrs.has(input_view_key(i));
  return n;
}

TEST(PointwiseViews, RopeReadsTheHeadSplitInPlace) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 6, 32}));  // [b, s, h * d], h = 4, d = 8
  ValueId q = permute(g, reshape(g, x, {2, 6, 4, 8}), {0, 2, 1, 3});
  g.mark_output(rope(g, q, 3), "y");
  Graph f = pass_applied(g, fuse_and_fold, 5, 1e-5f);
  EXPECT_EQ(count_ops(f, OpKind::kPermute), 0);
  EXPECT_EQ(count_ops(f, OpKind::kFusedPointwise), 1);
  EXPECT_EQ(viewed_inputs(f), 1);  // q, read by the multiply and by the gather
}

TEST(PointwiseViews, PartialRotaryReadsSlicesOfASplit) {
  // GPT-NeoX: [b, s, h, 3 d] permuted to [b, h, s, 3 d], split into q, k, v; the first 4 of q's
  // 8 dims rotate and are concatenated with the other 4; k's halves multiply.
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 5, 48}));
  ValueId qkv = permute(g, reshape(g, x, {2, 5, 2, 24}), {0, 2, 1, 3});
  Attrs split;
  split.set("axis", int64_t{3});
  split.set("sizes", Shape{8, 8, 8});
  const std::vector<ValueId> parts = g.add_node(OpKind::kSplit, {qkv}, split);
  Attrs last;
  last.set("axis", int64_t{3});
  ValueId q =
      g.add_node1(OpKind::kConcat, {rope(g, slice(g, parts[0], 3, 0, 4), 7), slice(g, parts[0], 3, 4, 8)}, last);
  g.mark_output(q, "q");
  g.mark_output(g.add_node1(OpKind::kMul, {slice(g, parts[1], 3, 0, 4), slice(g, parts[1], 3, 4, 8)}), "k_mix");
  Graph f = pass_applied(g, fuse_and_fold, 9, 1e-5f);
  EXPECT_EQ(count_ops(f, OpKind::kSlice) + count_ops(f, OpKind::kSplit) + count_ops(f, OpKind::kPermute), 0);
  // q_rot in the rotary kernel, k's two halves in the mul (made a fused node), q's passing half in
  // the concat
  EXPECT_EQ(viewed_inputs(f), 4);
  for (const auto& n : f.nodes())
    if (n->op == OpKind::kConcat) {
      EXPECT_FALSE(n->attrs.has(input_view_key(0)));
      EXPECT_EQ(n->attrs.get_ints(input_view_key(1)), (Shape{4, 2, 240, 2, 24, 5, 48, 4, 1}));
    }
}

// A concat whose parts are all views, one of them transposed (a concat copies any strides).
TEST(PointwiseViews, ConcatReadsEveryPartThroughItsView) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {3, 4, 10}));
  Attrs mid;
  mid.set("axis", int64_t{1});
  g.mark_output(g.add_node1(OpKind::kConcat, {slice(g, x, 2, 2, 5), permute(g, slice(g, x, 2, 0, 3), {0, 1, 2})}, mid),
                "y");
  Graph f = pass_applied(g, fold_input_views, 4, 0.0f);
  EXPECT_EQ(count_ops(f, OpKind::kSlice), 0);
}

// ShuffleNet's split: the concat reads the first half where it lies; the split, left with one
// part that a matmul reads, becomes a slice of that part.
TEST(PointwiseViews, ASplitLeftWithPartsNobodyReadsIsASlice) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {3, 4, 12}));
  Attrs split;
  split.set("axis", int64_t{2});
  split.set("sizes", Shape{4, 5, 3});
  const std::vector<ValueId> parts = g.add_node(OpKind::kSplit, {x}, split);
  ValueId mm = g.add_node1(OpKind::kMatmul, {parts[1], f32_weight(g, "w", {5, 4}, 3)});
  Attrs last;
  last.set("axis", int64_t{2});
  g.mark_output(g.add_node1(OpKind::kConcat, {parts[0], mm}, last), "y");
  Graph f = pass_applied(g, fold_input_views, 6, 1e-6f);
  EXPECT_EQ(count_ops(f, OpKind::kSplit), 0) << f.to_string();
  ASSERT_EQ(count_ops(f, OpKind::kSlice), 1) << f.to_string();
  for (const auto& n : f.nodes())
    if (n->op == OpKind::kSlice) {
      EXPECT_EQ(n->attrs.get_int("start"), 4);
      EXPECT_EQ(n->attrs.get_int("end"), 9);
    }
}

TEST(PointwiseViews, ATransposedInnermostDimStaysACopy) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {3, 16, 8}));
  ValueId t = permute(g, x, {0, 2, 1});
  g.mark_output(g.add_node1(OpKind::kSigmoid, {g.add_node1(OpKind::kAdd, {t, f32_weight(g, "b", {16}, 2)})}), "y");
  Graph f = g;
  fuse_pointwise(f);
  EXPECT_FALSE(fold_input_views(f));
  EXPECT_EQ(count_ops(f, OpKind::kPermute), 1);
}

TEST(PointwiseViews, ViewsMustFitTheBodyAndTheBuffer) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 6}));
  auto body = std::make_shared<Graph>();
  ValueId in = body->add_input("in0", TensorType(DType::kF32, {6, 4}));
  body->mark_output(body->add_node1(OpKind::kRelu, {in}), "out0");
  Attrs view;
  view.set("view0", Shape{0, 6, 1, 4, 6});  // x transposed: fits
  EXPECT_EQ(g.type(g.insert_fused(g.nodes().size(), {x}, body, "t", view)[0]).shape(), (Shape{6, 4}));
  view.set("view0", Shape{0, 6, 4});  // rank 1: not the body input's type
  expect_error([&] { g.insert_fused(g.nodes().size(), {x}, body, "t", view); }, ErrorCode::kInternal,
               {"fused body input 0", "f32[6]"});
  view.set("view0", Shape{1, 6, 1, 4, 6});  // reaches element 24 of 24
  expect_error([&] { g.insert_fused(g.nodes().size(), {x}, body, "t", view); }, ErrorCode::kShapeMismatch,
               {"fused_pointwise", "view0", "reaches element 24"});
  // concat sees its parts' views; other ops take none.
  Attrs cat;
  cat.set("axis", int64_t{0});
  cat.set("view1", Shape{0, 6, 1, 4, 6});
  EXPECT_EQ(g.type(g.add_node1(OpKind::kConcat, {g.add_input("z", TensorType(DType::kF32, {2, 4})), x}, cat)).shape(),
            (Shape{8, 4}));
  Attrs relu;
  relu.set("view0", Shape{0, 6, 1, 4, 6});
  expect_error([&] { g.add_node1(OpKind::kRelu, {x}, relu); }, ErrorCode::kInvalidArgument,
               {"relu", "'view0'", "fused_pointwise and concat only"});
}

}  // namespace
