// simplify_attention_masks (src/passes/attention_mask.cpp): an sdpa mask that is
// logical_and(all-true constant, m) becomes m, with the and gone and the same outputs on random
// inputs; a constant with one false element, or a non-bool and, is left alone. The all-true
// side may also be an index comparison that holds for every element by the bounds of its
// operands (a dynamic program's `arange(L) + 0 >= 0`, its arange left unfolded): the same
// rewrite; a comparison the bounds do not decide (one that needs the arange's end) stays.
// additive_attention_masks: the bool mask two f16 sdpa nodes share becomes one additive f16
// mask they both read, with the same outputs (dropped keys included); f32 nodes keep theirs.
#include <array>

#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

struct MaskCase {
  Graph g;
  ValueId padding_mask = kNoValue;  // the [B, 1, 1, S] bool the pass should keep
};

// q, k, v [2, 3, 5, 8]; a padding input p [2, 1, 1, 5] -> m = p > 0; the all-true (or not)
// constant c [1, 1, 5, 1]; mask = logical_and(c, m) (or (m, c)) -> [2, 1, 5, 5].
// The inputs q, k, v [2, 3, 5, 8] and p [2, 1, 1, 5] of c.g, with c.padding_mask = p > 0; returns
// q, k and v.
std::array<ValueId, 3> attention_inputs(MaskCase& c) {
  Graph& g = c.g;
  const Shape qs = {2, 3, 5, 8};
  const ValueId q = g.add_input("q", TensorType(DType::kF32, qs));
  const ValueId k = g.add_input("k", TensorType(DType::kF32, qs));
  const ValueId v = g.add_input("v", TensorType(DType::kF32, qs));
  const ValueId p = g.add_input("p", TensorType(DType::kF32, {2, 1, 1, 5}));
  c.padding_mask = g.add_node1(OpKind::kGt, {p, f32_constant(g, "zero", {}, {0.0f}, false)});
  return {q, k, v};
}

MaskCase masked_attention(bool all_true, bool constant_first) {
  MaskCase c;
  Graph& g = c.g;
  const auto [q, k, v] = attention_inputs(c);
  Bytes ones(5, 1);
  if (!all_true) ones[2] = 0;
  const ValueId t = g.add_constant("rows", TensorType(DType::kBool, {1, 1, 5, 1}), ones.data(), ones.size(), false);
  const ValueId mask = constant_first ? g.add_node1(OpKind::kLogicalAnd, {t, c.padding_mask})
                                      : g.add_node1(OpKind::kLogicalAnd, {c.padding_mask, t});
  g.mark_output(g.add_node1(OpKind::kSdpa, {q, k, v, mask}, Attrs{}), "y");
  return c;
}

const Node* the_sdpa(const Graph& g) {
  for (const auto& n : g.nodes())
    if (n->op == OpKind::kSdpa) return n.get();
  return nullptr;
}

TEST(SimplifyAttentionMasks, AllTrueAndReadsThePaddingMaskWithTheSameOutputs) {
  for (bool constant_first : {true, false}) {
    MaskCase c = masked_attention(true, constant_first);
    Graph g = c.g;
    const auto inputs = random_inputs(g, 7);
    const auto want = run_plain(c.g, inputs);
    ASSERT_TRUE(simplify_attention_masks(g));
    g.verify();
    EXPECT_EQ(count_ops(g, OpKind::kLogicalAnd), 0);
    const Node* s = the_sdpa(g);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(g.type(s->inputs[3]).shape(), (Shape{2, 1, 1, 5}));
    EXPECT_EQ(g.value(s->inputs[3]).producer->op, OpKind::kGt);
    expect_close(run_plain(g, inputs), want, 1e-6f, 1e-6f);
  }
}

TEST(SimplifyAttentionMasks, LeavesAConstantWithAFalseElementAlone) {
  MaskCase c = masked_attention(false, true);
  Graph g = c.g;
  EXPECT_FALSE(simplify_attention_masks(g));
  EXPECT_EQ(count_ops(g, OpKind::kLogicalAnd), 1);
}

// i64 scalar constant.
ValueId i64_scalar(Graph& g, const std::string& name, int64_t v) {
  return g.add_constant(name, TensorType(DType::kI64, {}), &v, sizeof v, false);
}

// The rows' side of a transformers-style mask as a dynamic block has it: r = arange(start, start
// + 5) + shift, viewed [1, 1, 5, 1], compared with `bound` by `cmp` (operands swapped when
// `bound_first`), and-ed with an all-true scalar; then and-ed with the padding mask. The arange
// is marked sized, as an importer marks it in a dynamic program's block, so nothing folds it.
MaskCase index_masked_attention(OpKind cmp, int64_t start, int64_t shift, int64_t bound, bool bound_first) {
  MaskCase c;
  Graph& g = c.g;
  const auto [q, k, v] = attention_inputs(c);
  const ValueId idx = i64_arange(g, start, start + 5, true);
  const ValueId shifted =
      g.add_node1(shift >= 0 ? OpKind::kAdd : OpKind::kSub, {idx, i64_scalar(g, "shift", shift >= 0 ? shift : -shift)});
  Attrs rows;
  rows.set("shape", Shape{1, 1, 5, 1});
  const ValueId r = g.add_node1(OpKind::kReshape, {shifted}, rows);
  const ValueId b = i64_scalar(g, "bound", bound);
  const ValueId holds = g.add_node1(cmp, bound_first ? std::vector<ValueId>{b, r} : std::vector<ValueId>{r, b});
  const uint8_t yes = 1;
  const ValueId t = g.add_constant("yes", TensorType(DType::kBool, {}), &yes, 1, false);
  const ValueId rows_mask = g.add_node1(OpKind::kLogicalAnd, {t, holds});
  const ValueId mask = g.add_node1(OpKind::kLogicalAnd, {rows_mask, c.padding_mask});
  g.mark_output(g.add_node1(OpKind::kSdpa, {q, k, v, mask}, Attrs{}), "y");
  return c;
}

TEST(SimplifyAttentionMasks, IndexComparisonsThatAlwaysHoldAreAllTrue) {
  struct Case {
    OpKind cmp;
    int64_t start, shift, bound;
    bool bound_first;
  };
  // r >= 0, r > -1, 0 <= r, -1 < r for r = arange(0, 5) + 0; r = arange(3, 8) - 3 >= 0.
  for (const Case& k :
       {Case{OpKind::kGe, 0, 0, 0, false}, Case{OpKind::kGt, 0, 0, -1, false}, Case{OpKind::kLe, 0, 0, 0, true},
        Case{OpKind::kLt, 0, 0, -1, true}, Case{OpKind::kGe, 3, -3, 0, false}}) {
    MaskCase c = index_masked_attention(k.cmp, k.start, k.shift, k.bound, k.bound_first);
    Graph g = c.g;
    const auto inputs = random_inputs(g, 5);
    const auto want = run_plain(c.g, inputs);
    ASSERT_TRUE(simplify_attention_masks(g)) << op_name(k.cmp);
    g.verify();
    EXPECT_EQ(count_ops(g, OpKind::kLogicalAnd), 0) << op_name(k.cmp);
    EXPECT_EQ(count_ops(g, OpKind::kArange), 0) << op_name(k.cmp);
    const Node* s = the_sdpa(g);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->inputs[3], c.padding_mask) << op_name(k.cmp);
    expect_close(run_plain(g, inputs), want, 1e-6f, 1e-6f);
  }
}

TEST(SimplifyAttentionMasks, LeavesIndexComparisonsTheBoundsDoNotDecide) {
  // r >= 1 fails at r = 0; r < 5 holds here but only by the arange's end, which a dynamic
  // program's other sizes move; r - 1 >= 0 fails at r = 0.
  for (const auto& [cmp, shift, bound] :
       {std::tuple{OpKind::kGe, int64_t(0), int64_t(1)}, std::tuple{OpKind::kLt, int64_t(0), int64_t(5)},
        std::tuple{OpKind::kGe, int64_t(-1), int64_t(0)}}) {
    MaskCase c = index_masked_attention(cmp, 0, shift, bound, false);
    Graph g = c.g;
    EXPECT_FALSE(simplify_attention_masks(g)) << op_name(cmp);
    EXPECT_EQ(count_ops(g, OpKind::kLogicalAnd), 2) << op_name(cmp);
  }
}

// q, k, v [2, 3, 5, 8] f32 inputs, cast to `dt`; m = p > 0 for p [2, 1, 1, 5] (about half of the
// keys dropped per batch); two sdpa nodes in `dt` read m, the second taking the first's output
// as its q; the result cast back to f32.
Graph two_sdpa_one_mask(DType dt) {
  Graph g;
  const Shape qs = {2, 3, 5, 8};
  Attrs to;
  to.set("dtype", dt);
  auto in = [&](const char* name, const Shape& s) {
    const ValueId x = g.add_input(name, TensorType(DType::kF32, s));
    return dt == DType::kF32 ? x : g.add_node1(OpKind::kCast, {x}, to);
  };
  const ValueId q = in("q", qs), k = in("k", qs), v = in("v", qs);
  const ValueId p = g.add_input("p", TensorType(DType::kF32, {2, 1, 1, 5}));
  const ValueId m = g.add_node1(OpKind::kGt, {p, f32_constant(g, "zero", {}, {0.0f}, false)});
  const ValueId a = g.add_node1(OpKind::kSdpa, {q, k, v, m}, Attrs{}, "first");
  ValueId y = g.add_node1(OpKind::kSdpa, {a, k, v, m}, Attrs{}, "second");
  if (dt != DType::kF32) {
    Attrs back;
    back.set("dtype", DType::kF32);
    y = g.add_node1(OpKind::kCast, {y}, back);
  }
  g.mark_output(y, "y");
  return g;
}

TEST(AdditiveAttentionMasks, OneAdditiveMaskForTheSharedBoolMaskWithTheSameOutputs) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const Graph before = two_sdpa_one_mask(dt);
    Graph g = before;
    const auto inputs = random_inputs(g, 11);
    ASSERT_TRUE(additive_attention_masks(g));
    g.verify();
    EXPECT_EQ(count_ops(g, OpKind::kWhere), 1);
    ValueId shared = kNoValue;
    for (const auto& n : g.nodes()) {
      if (n->op != OpKind::kSdpa) continue;
      const ValueId mask = n->inputs[3];
      EXPECT_EQ(g.type(mask), TensorType(dt, {2, 1, 1, 5})) << n->name;
      EXPECT_EQ(g.value(mask).producer->op, OpKind::kWhere) << n->name;
      if (shared == kNoValue) shared = mask;
      EXPECT_EQ(mask, shared) << n->name << " reads its own additive mask";
    }
    // Exact: a dropped key is -inf either way, a kept one adds 0.
    expect_close(run_plain(g, inputs), run_plain(before, inputs), 0.0f, 0.0f);
    EXPECT_FALSE(additive_attention_masks(g));
  }
}

TEST(AdditiveAttentionMasks, LeavesF32AttentionAlone) {
  Graph g = two_sdpa_one_mask(DType::kF32);
  EXPECT_FALSE(additive_attention_masks(g));
  EXPECT_EQ(count_ops(g, OpKind::kWhere), 0);
}

}  // namespace
