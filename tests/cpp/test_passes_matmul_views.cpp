// matmul's operand views (a_view / b_view, src/ops/matmul.cpp) and the fold_matmul_views pass
// (src/passes/matmul_views.cpp): the shape rule and its errors; the CPU kernel on transposed,
// broadcast and head-split operands against the same product on copies; the pass on a
// transposed key and on DeBERTa's relative-position product (a table expanded over the batch,
// merged with the heads, transposed), leaving one matmul with views and no copy, computing what
// the original graph computes; and the atom views and batch refinement that it rests on.
#include <limits>

#include "src/ops/access.h"
#include "src/ops/shape_rules.h"
#include "src/passes/view_chain.h"
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

const Node& only(const Graph& g, OpKind op) {
  const Node* found = nullptr;
  for (const auto& n : g.nodes())
    if (n->op == op) {
      EXPECT_EQ(found, nullptr) << "more than one " << op_name(op);
      found = n.get();
    }
  EXPECT_NE(found, nullptr) << "no " << op_name(op);
  return *found;
}

Attrs views(const Shape& a, const Shape& b) {
  Attrs at;
  if (!a.empty()) at.set("a_view", a);
  if (!b.empty()) at.set("b_view", b);
  return at;
}

TEST(MatmulViews, ShapeRuleReadsLogicalDimsFromTheViews) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 5, 12}));  // [B, S, H * D], H = 3, D = 4
  // a: x read as [B, H, S, D]; b: x read as [B, H, D, S] (k^T).
  const Shape a = {0, 2, 60, 3, 4, 5, 12, 4, 1}, b = {0, 2, 60, 3, 4, 4, 1, 5, 12};
  ValueId y = g.add_node1(OpKind::kMatmul, {x, x}, views(a, b));
  EXPECT_EQ(g.type(y).shape(), (Shape{2, 3, 5, 5}));
  // A broadcast batch (stride 0) against a plain operand.
  ValueId t = g.add_input("t", TensorType(DType::kF32, {3, 4, 7}));
  ValueId y2 = g.add_node1(OpKind::kMatmul, {x, t}, views(a, {0, 2, 0, 3, 28, 4, 7, 7, 1}));
  EXPECT_EQ(g.type(y2).shape(), (Shape{2, 3, 5, 7}));
  // The view's sizes must fit the other operand, and stay inside the buffer.
  expect_error([&] { g.add_node1(OpKind::kMatmul, {x, t}, views(a, {0, 2, 0, 3, 28, 7, 1, 4, 7})); },
               ErrorCode::kShapeMismatch, {"matmul", "inner dims"});
  expect_error([&] { g.add_node1(OpKind::kMatmul, {x, x}, views({1, 2, 60, 3, 4, 5, 12, 4, 1}, b)); },
               ErrorCode::kShapeMismatch, {"matmul", "a view", "reaches element 120", "f32[2,5,12]"});
  expect_error([&] { g.add_node1(OpKind::kMatmul, {x, x}, views({0, 4, 1}, b)); }, ErrorCode::kInvalidArgument,
               {"matmul", "'a_view'", "rank >= 2"});
  expect_error([&] { g.add_node1(OpKind::kMatmul, {x, x}, views(a, {0, 2, -60, 3, 4, 4, 1, 5, 12})); },
               ErrorCode::kInvalidArgument, {"matmul", "'b_view'", "negative size or stride"});
  // out_perm writes the output permuted, the column dim staying last.
  Attrs placed = views(a, b);
  placed.set("out_perm", Shape{0, 2, 1, 3});
  EXPECT_EQ(g.type(g.add_node1(OpKind::kMatmul, {x, x}, placed)).shape(), (Shape{2, 5, 3, 5}));
  placed.set("out_perm", Shape{0, 1, 3, 2});
  expect_error([&] { g.add_node1(OpKind::kMatmul, {x, x}, placed); }, ErrorCode::kInvalidArgument,
               {"matmul", "'out_perm'", "column dim (3) last"});
  Attrs inf = views(a, b);
  inf.set("alpha", std::numeric_limits<double>::infinity());
  expect_error([&] { g.add_node1(OpKind::kMatmul, {x, x}, inf); }, ErrorCode::kInvalidArgument,
               {"matmul", "'alpha'", "finite"});
  Attrs not_ints;
  not_ints.set("b_view", std::string("T"));
  expect_error([&] { g.add_node1(OpKind::kMatmul, {x, x}, not_ints); }, ErrorCode::kInvalidArgument,
               {"matmul", "'b_view'", "list of ints"});
  ValueId h = g.add_input("h", TensorType(DType::kF16, {2, 5, 12}));
  expect_error([&] { g.add_node1(OpKind::kMatmul, {x, h}, views(a, b)); }, ErrorCode::kInvalidArgument,
               {"matmul", "dtype"});
}

ValueId cast(Graph& g, ValueId v, DType dt) {
  if (g.type(v).dtype == dt) return v;
  Attrs a;
  a.set("dtype", dt);
  return g.add_node1(OpKind::kCast, {v}, a);
}

// The CPU kernel reading views computes what a plain matmul computes on the copies the views
// describe (permute / expand nodes run as given; alpha as a multiplication after, out_perm as a
// permute after), in f32 (sgemm) and f64 (dgemm).
TEST(MatmulViews, CpuKernelMatchesTheProductOfCopies) {
  for (DType dt : {DType::kF32, DType::kF64}) {
    Graph viewed, copied;
    for (Graph* g : {&viewed, &copied}) {
      ValueId x = cast(*g, g->add_input("x", TensorType(DType::kF32, {2, 5, 12})), dt);
      ValueId t = cast(*g, g->add_input("t", TensorType(DType::kF32, {3, 4, 7})), dt);
      ValueId s, p;
      if (g == &viewed) {
        Attrs scaled = views({0, 2, 60, 3, 4, 5, 12, 4, 1}, {0, 2, 60, 3, 4, 4, 1, 5, 12});
        scaled.set("alpha", -0.5);
        s = g->add_node1(OpKind::kMatmul, {x, x}, scaled);
        Attrs placed = views({0, 2, 60, 3, 4, 5, 12, 4, 1}, {0, 2, 0, 3, 28, 4, 7, 7, 1});
        placed.set("out_perm", Shape{0, 2, 1, 3});
        p = g->add_node1(OpKind::kMatmul, {x, t}, placed);
      } else {
        ValueId heads = permute(*g, reshape(*g, x, {2, 5, 3, 4}), {0, 2, 1, 3});
        ValueId half = cast(*g, f32_constant(*g, "half", {}, {-0.5f}, false), dt);
        s = g->add_node1(OpKind::kMul,
                         {g->add_node1(OpKind::kMatmul, {heads, permute(*g, heads, {0, 1, 3, 2})}), half});
        p = permute(*g, g->add_node1(OpKind::kMatmul, {heads, expand(*g, reshape(*g, t, {1, 3, 4, 7}), {2, 3, 4, 7})}),
                    {0, 2, 1, 3});
      }
      g->mark_output(cast(*g, s, DType::kF32), "s");
      g->mark_output(cast(*g, p, DType::kF32), "p");
    }
    const std::vector<Floats> in = random_inputs(copied, 7);
    expect_close(run_plain(viewed, in), run_plain(copied, in), 1e-5f, 1e-5f);
  }
}

// A matrix dim of extent 1 takes any stride; a view whose matrix has no contiguous dim is
// refused with the reason (CUDA), and matrix_layout names the leading dim either way.
TEST(MatmulViews, MatrixLayoutPicksStoredOrTransposed) {
  const MatrixLayout n = matrix_layout(5, 4, 12, 1), t = matrix_layout(4, 5, 1, 12);
  EXPECT_TRUE(n.ok && !n.trans);
  EXPECT_EQ(n.ld, 12);
  EXPECT_TRUE(t.ok && t.trans);
  EXPECT_EQ(t.ld, 12);
  EXPECT_TRUE(matrix_layout(1, 4, 0, 1).ok);
  EXPECT_EQ(matrix_layout(1, 4, 0, 1).ld, 4);
  EXPECT_FALSE(matrix_layout(5, 4, 8, 2).ok);  // neither dim contiguous
  EXPECT_FALSE(matrix_layout(5, 4, 3, 1).ok);  // rows overlap
}

// q @ (k^T / 8) where k^T is a permute of the key heads: one matmul reading both head splits
// from the linear outputs, [B * H] split into [B] x [H], the scale as alpha, no permute or div
// left.
TEST(MatmulViews, PassReadsTransposedKeysAndHeadSplits) {
  Graph g;
  const int64_t B = 2, S = 5, H = 3, D = 4;
  ValueId xq = g.add_input("xq", TensorType(DType::kF32, {B, S, H * D}));
  ValueId xk = g.add_input("xk", TensorType(DType::kF32, {B, S, H * D}));
  auto heads = [&](ValueId x) {
    return reshape(g, permute(g, reshape(g, x, {B, S, H, D}), {0, 2, 1, 3}), {B * H, S, D});
  };
  ValueId scale = f32_constant(g, "scale", {}, {8.0f}, false);
  ValueId kt = g.add_node1(OpKind::kDiv, {permute(g, heads(xk), {0, 2, 1}), scale});
  ValueId scores = g.add_node1(OpKind::kMatmul, {heads(xq), kt});
  g.mark_output(scores, "scores");
  const Graph r = pass_applied(g, fold_matmul_views, 11, 1e-5f);
  EXPECT_EQ(count_ops(r, OpKind::kPermute), 0);
  EXPECT_EQ(count_ops(r, OpKind::kDiv), 0);
  const Node& mm = only(r, OpKind::kMatmul);
  EXPECT_DOUBLE_EQ(mm.attrs.get_float("alpha"), 0.125);
  EXPECT_EQ(mm.inputs[0], r.inputs()[0]);
  EXPECT_EQ(mm.inputs[1], r.inputs()[1]);
  EXPECT_EQ(mm.attrs.get_ints("a_view"), (Shape{0, B, S * H * D, H, D, S, H * D, D, 1}));
  EXPECT_EQ(mm.attrs.get_ints("b_view"), (Shape{0, B, S * H * D, H, D, D, 1, S, H * D}));
  EXPECT_EQ(r.type(r.outputs()[0]).shape(), (Shape{B * H, S, S}));
}

// DeBERTa's position keys: a [1, H, 1, P, 1, D] table expanded over the batch, reshaped to
// [B * H, P, D], transposed; q a dense [B * H, S, D]. The table is read broadcast (stride 0 over
// B) and transposed, q as it is; the expand and permute are gone.
TEST(MatmulViews, PassReadsAnExpandedTransposedTable) {
  Graph g;
  const int64_t B = 3, S = 4, H = 2, P = 6, D = 5;
  ValueId q = g.add_input("q", TensorType(DType::kF32, {B * H, S, D}));
  ValueId table = g.add_input("table", TensorType(DType::kF32, {1, H, 1, P, 1, D}));
  ValueId keys = reshape(g, expand(g, table, {B, H, 1, P, 1, D}), {B * H, P, D});
  ValueId y = g.add_node1(OpKind::kMatmul, {q, permute(g, keys, {0, 2, 1})});
  g.mark_output(y, "y");
  const Graph r = pass_applied(g, fold_matmul_views, 12, 1e-5f);
  EXPECT_EQ(count_ops(r, OpKind::kPermute), 0);
  EXPECT_EQ(count_ops(r, OpKind::kExpand), 0);
  const Node& mm = only(r, OpKind::kMatmul);
  EXPECT_EQ(mm.inputs[1], r.inputs()[1]);
  EXPECT_EQ(mm.attrs.get_ints("b_view"), (Shape{0, B, 0, H, P * D, D, 1, P, D}));
  // q saves nothing through a view: it is reshaped to the split batch (free) and read dense.
  EXPECT_FALSE(mm.attrs.has("a_view"));
  EXPECT_EQ(r.type(mm.inputs[0]).shape(), (Shape{B, H, S, D}));
  EXPECT_EQ(r.value(mm.inputs[0]).producer->op, OpKind::kReshape);
  EXPECT_EQ(r.type(mm.outputs[0]).shape(), (Shape{B, H, S, P}));
  EXPECT_EQ(r.type(r.outputs()[0]).shape(), (Shape{B * H, S, P}));
}

// Left alone: plain operands, reshapes alone (free already), a view with no contiguous matrix
// dim (a permute that moves the last dim into the batch), batch cuts that do not nest, an empty
// batch.
TEST(MatmulViews, PassLeavesWhatSavesNothingOrNoGemmReads) {
  Graph g;
  ValueId a = g.add_input("a", TensorType(DType::kF32, {6, 4, 5}));
  ValueId b = g.add_input("b", TensorType(DType::kF32, {6, 5, 3}));
  g.mark_output(g.add_node1(OpKind::kMatmul, {a, b}), "plain");
  g.mark_output(g.add_node1(OpKind::kMatmul, {reshape(g, a, {2, 3, 4, 5}), reshape(g, b, {2, 3, 5, 3})}), "reshaped");
  ValueId c = g.add_input("c", TensorType(DType::kF32, {5, 4, 6}));
  g.mark_output(g.add_node1(OpKind::kMatmul, {permute(g, c, {2, 1, 0}), b}), "strided");
  // a's batch [6] read as [2] x [3] (through its permute), b's as [3] x [2]: no common cuts.
  ValueId d = g.add_input("d", TensorType(DType::kF32, {3, 2, 4, 5}));
  ValueId e = g.add_input("e", TensorType(DType::kF32, {2, 3, 5, 3}));
  g.mark_output(g.add_node1(OpKind::kMatmul, {reshape(g, permute(g, d, {1, 0, 2, 3}), {6, 4, 5}),
                                              reshape(g, permute(g, e, {1, 0, 2, 3}), {6, 5, 3})}),
                "crossed");
  // An empty batch: nothing to read.
  ValueId z = g.add_input("z", TensorType(DType::kF32, {0, 5, 4}));
  g.mark_output(g.add_node1(OpKind::kMatmul, {permute(g, z, {0, 2, 1}), reshape(g, z, {0, 5, 4})}), "empty");
  Graph r = g;
  EXPECT_FALSE(fold_matmul_views(r));
}

// p @ v merged back to [B, S, H * D]: the matmul writes [B, S, H, D] itself (out_perm), through
// the reshapes to [B * H, S, D] and back; a permute that moves the column dim stays.
TEST(MatmulViews, PassWritesTheHeadMergeOrder) {
  Graph g;
  const int64_t B = 2, S = 5, H = 3, D = 4;
  ValueId p = g.add_input("p", TensorType(DType::kF32, {B, H, S, S}));
  ValueId v = g.add_input("v", TensorType(DType::kF32, {B, H, S, D}));
  ValueId o = reshape(g, g.add_node1(OpKind::kMatmul, {p, v}), {B * H, S, D});
  ValueId merged = reshape(g, permute(g, reshape(g, o, {B, H, S, D}), {0, 2, 1, 3}), {B, S, H * D});
  g.mark_output(merged, "merged");
  g.mark_output(permute(g, g.add_node1(OpKind::kMatmul, {p, v}), {0, 1, 3, 2}), "transposed");
  const Graph r = pass_applied(g, fold_matmul_views, 13, 1e-5f);
  EXPECT_EQ(count_ops(r, OpKind::kPermute), 1);  // the transposed output's
  size_t placed = 0;
  for (const auto& n : r.nodes())
    if (n->op == OpKind::kMatmul && n->attrs.has("out_perm")) {
      ++placed;
      EXPECT_EQ(n->attrs.get_ints("out_perm"), (Shape{0, 2, 1, 3}));
      EXPECT_EQ(r.type(n->outputs[0]).shape(), (Shape{B, S, H, D}));
    }
  EXPECT_EQ(placed, 1u);
}

// atom_view_of keeps a merged batch dim as its atoms and looks through expand only when asked;
// strided_view_of (one atom per dim) is unchanged by it.
TEST(MatmulViews, AtomViewsKeepMergedDimsAndBroadcasts) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 5, 3, 4}));
  ValueId heads = reshape(g, permute(g, x, {0, 2, 1, 3}), {6, 5, 4});
  auto any = [](const passes::AtomView&) { return true; };
  const passes::AtomView v = passes::atom_view_of(g, heads, false, any);
  EXPECT_EQ(v.base, x);
  ASSERT_EQ(v.dims.size(), 3u);
  ASSERT_EQ(v.dims[0].size(), 2u);
  EXPECT_EQ(v.dims[0][0].size, 2);
  EXPECT_EQ(v.dims[0][0].stride, 60);
  EXPECT_EQ(v.dims[0][1].size, 3);
  EXPECT_EQ(v.dims[0][1].stride, 4);
  EXPECT_NE(passes::strided_view_of(g, heads).base, x);  // x has no single-atom view of it
  ValueId t = g.add_input("t", TensorType(DType::kF32, {1, 3, 4}));
  ValueId wide = expand(g, t, {2, 3, 4});
  EXPECT_EQ(passes::atom_view_of(g, wide, false, any).base, wide);
  const passes::AtomView e = passes::atom_view_of(g, wide, true, any);
  EXPECT_EQ(e.base, t);
  ASSERT_EQ(e.dims[0].size(), 1u);
  EXPECT_EQ(e.dims[0][0].stride, 0);
  EXPECT_FALSE(e.in_order(g));
  EXPECT_TRUE(passes::atom_view_of(g, reshape(g, t, {3, 4}), false, any).in_order(g));
}

}  // namespace
