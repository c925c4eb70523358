// fuse_pointwise_concats (src/passes/pointwise_concats.cpp): a concat of fused pointwise parts
// that only it reads, and of parts read through strided views, becomes one fused node whose
// body ends in the concat, computing what the graph computed (on the CPU, which runs each part
// apart and joins them); a concat of dense parts, or of a part read elsewhere too, stays.
#include "src/ops/pointwise.h"
#include "src/ops/shape_rules.h"
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

bool fuse_all(Graph& g) {
  fuse_pointwise(g);
  fold_input_views(g);
  return fuse_pointwise_concats(g);
}

// The fused nodes whose body ends in a concat.
int concat_bodies(const Graph& g) {
  int n = 0;
  for (const auto& node : g.nodes())
    n += node->op == OpKind::kFusedPointwise && pw::concat_body(*node->body).has_value();
  return n;
}

TEST(PointwiseConcats, PartialRotaryIsOneKernel) {
  // GPT-NeoX: q of a [b, s, h, 3 d] projection permuted to [b, h, s, d]; its first 4 of 8 dims
  // rotate (x * cos + rotate_half(x) * sin, rotate_half a gathered leaf) and join the other 4.
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 5, 48}));
  ValueId q = slice(g, permute(g, reshape(g, x, {2, 5, 2, 24}), {0, 2, 1, 3}), 3, 0, 8);
  ValueId rot = slice(g, q, 3, 0, 4);
  std::vector<int64_t> idx{2, 3, 0, 1};
  ValueId index = g.add_constant("rot", TensorType(DType::kI64, {4}), idx.data(), idx.size() * 8, false);
  Attrs last;
  last.set("axis", int64_t{3});
  ValueId half = g.add_node1(OpKind::kMul, {g.add_node1(OpKind::kIndexSelect, {rot, index}, last),
                                            f32_constant(g, "sign", {4}, {-1, -1, 1, 1}, false)});
  ValueId rotated = g.add_node1(OpKind::kAdd, {g.add_node1(OpKind::kMul, {rot, f32_weight(g, "cos", {5, 4}, 3)}),
                                               g.add_node1(OpKind::kMul, {half, f32_weight(g, "sin", {5, 4}, 4)})});
  g.mark_output(concat(g, {rotated, slice(g, q, 3, 4, 8)}, 3), "q");
  Graph f = pass_applied(g, fuse_all, 5, 1e-5f);
  EXPECT_EQ(count_ops(f, OpKind::kConcat), 0);
  EXPECT_EQ(concat_bodies(f), 1);
  EXPECT_EQ(f.nodes().size(), 1u) << f.to_string();
}

TEST(PointwiseConcats, StridedViewsJoinInOneKernel) {
  // Swin's patch merge: four strided views of one tensor, joined along the channels.
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4, 4, 6}));
  std::vector<ValueId> parts;
  for (int64_t r : {0, 1})
    for (int64_t c : {0, 1}) {
      Attrs a;
      a.set("axis", int64_t{1});
      a.set("start", r);
      a.set("end", int64_t{4});
      a.set("step", int64_t{2});
      Attrs b = a;
      b.set("axis", int64_t{2});
      b.set("start", c);
      parts.push_back(g.add_node1(OpKind::kSlice, {g.add_node1(OpKind::kSlice, {x}, a)}, b));
    }
  g.mark_output(concat(g, parts, 3), "y");
  Graph f = pass_applied(g, fuse_all, 6, 0.0f);
  EXPECT_EQ(concat_bodies(f), 1);
  EXPECT_EQ(count_ops(f, OpKind::kSlice), 0);
}

TEST(PointwiseConcats, DenseOrSharedPartsStayAConcat) {
  // Dense parts: the concat copies whole rows, one launch already.
  Graph g;
  ValueId a = g.add_input("a", TensorType(DType::kF32, {3, 4}));
  ValueId b = g.add_input("b", TensorType(DType::kF32, {3, 2}));
  g.mark_output(concat(g, {a, b}, 1), "y");
  Graph f = g;
  EXPECT_FALSE(fuse_all(f));
  // A computed part that is also an output is written anyway: the concat copies it.
  Graph h;
  ValueId c = h.add_input("c", TensorType(DType::kF32, {3, 4}));
  ValueId d = h.add_node1(OpKind::kExp, {h.add_node1(OpKind::kAdd, {c, c})});
  h.mark_output(d, "d");
  h.mark_output(concat(h, {d, c}, 1), "y");
  EXPECT_FALSE(fuse_all(h));
  EXPECT_EQ(count_ops(h, OpKind::kConcat), 1);
}

TEST(PointwiseConcats, TwoComputedPartsOfOneInputKeepTheirOwnReads) {
  // Each part reads x in its own columns: x is two inputs of the fused node.
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {3, 5}));
  ValueId y = g.add_input("y", TensorType(DType::kF32, {5}));
  ValueId p0 = g.add_node1(OpKind::kTanh, {g.add_node1(OpKind::kMul, {x, y})});
  ValueId p1 = g.add_node1(OpKind::kSigmoid, {g.add_node1(OpKind::kSub, {x, y})});
  g.mark_output(concat(g, {p0, p1, slice(g, x, 1, 1, 3)}, 1), "z");
  Graph f = pass_applied(g, fuse_all, 7, 1e-6f);
  ASSERT_EQ(concat_bodies(f), 1);
  const Node& n = *f.nodes().back();
  EXPECT_EQ(n.inputs.size(), 5u);  // x, y for each computed part, x through a view
  const pw::ConcatBody cb = *pw::concat_body(*n.body);
  EXPECT_EQ(cb.start, (std::vector<int64_t>{0, 5, 10, 12}));
}

}  // namespace
