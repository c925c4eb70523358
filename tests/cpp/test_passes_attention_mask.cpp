// simplify_attention_masks (src/passes/attention_mask.cpp): an sdpa mask that is
// logical_and(all-true constant, m) becomes m, with the and gone and the same outputs on random
// inputs; a constant with one false element, or a non-bool and, is left alone.
// additive_attention_masks: the bool mask two f16 sdpa nodes share becomes one additive f16
// mask they both read, with the same outputs (dropped keys included); f32 nodes keep theirs.
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
MaskCase masked_attention(bool all_true, bool constant_first) {
  MaskCase c;
  Graph& g = c.g;
  const Shape qs = {2, 3, 5, 8};
  const ValueId q = g.add_input("q", TensorType(DType::kF32, qs));
  const ValueId k = g.add_input("k", TensorType(DType::kF32, qs));
  const ValueId v = g.add_input("v", TensorType(DType::kF32, qs));
  const ValueId p = g.add_input("p", TensorType(DType::kF32, {2, 1, 1, 5}));
  const ValueId zero = f32_constant(g, "zero", {}, {0.0f}, false);
  c.padding_mask = g.add_node1(OpKind::kGt, {p, zero});
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
