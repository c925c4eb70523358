// form_attention (src/passes/form_attention.cpp): attention written as matmul, scale, biases,
// batch reshapes, softmax and matmul becomes one sdpa computing the same on random inputs;
// patterns it must not touch stay as they are.
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

ValueId scalar(Graph& g, float x) { return f32_constant(g, "", {}, {x}, false); }

ValueId softmax(Graph& g, ValueId v, int64_t axis) {
  Attrs a;
  a.set("axis", axis);
  return g.add_node1(OpKind::kSoftmax, {v}, a);
}

Graph formed(const Graph& g, uint32_t seed) {
  Graph f = pass_applied(g, form_attention, seed, 1e-5f);
  EXPECT_EQ(count_ops(f, OpKind::kSdpa), 1) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kMatmul), 0) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kSoftmax), 0) << f.to_string();
  return f;
}

// Swin's window attention: q scaled first, k transposed by a permute, a relative-position bias,
// and a shift mask added with the batch split into [images, windows].
TEST(FormAttention, SwinWindowAttentionWithBiasAndShiftMask) {
  Graph g;
  const Shape qs = {4, 3, 5, 8};
  ValueId q = g.add_node1(OpKind::kMul, {g.add_input("q", TensorType(DType::kF32, qs)), scalar(g, 0.35f)});
  ValueId k = g.add_input("k", TensorType(DType::kF32, qs));
  ValueId v = g.add_input("v", TensorType(DType::kF32, qs));
  ValueId s = g.add_node1(OpKind::kMatmul, {q, permute(g, k, {0, 1, 3, 2})});
  s = g.add_node1(OpKind::kAdd, {s, f32_weight(g, "bias", {3, 5, 5}, 1)});
  s = reshape(g, s, {2, 2, 3, 5, 5});
  s = g.add_node1(OpKind::kAdd, {s, f32_weight(g, "mask", {1, 2, 1, 5, 5}, 2, -4.0f, 0.0f)});
  s = reshape(g, s, {4, 3, 5, 5});
  g.mark_output(g.add_node1(OpKind::kMatmul, {softmax(g, s, 3), v}), "y");
  Graph f = formed(g, 3);
  const Node& sdpa = *f.value(f.outputs()[0]).producer;
  EXPECT_NEAR(sdpa.attrs.get_float("scale"), 0.35, 1e-6);
  EXPECT_EQ(sdpa.inputs.size(), 4u);
}

// In a dynamic program's plan the scores have the symbols' batch (Value::sized): the bias
// expanded to them stays a node that fold_constants leaves, not a constant of one batch's size.
// Where nothing is sized, the same bias folds into a constant.
TEST(FormAttention, ABiasExpandedToSizedScoresStaysANode) {
  for (const bool sized : {false, true}) {
    Graph g;
    const auto mark = [&](ValueId v) {
      g.value(v).sized = sized;
      return v;
    };
    const Shape qs = {4, 3, 5, 8};
    ValueId q = mark(g.add_input("q", TensorType(DType::kF32, qs)));
    ValueId k = mark(g.add_input("k", TensorType(DType::kF32, qs)));
    ValueId v = mark(g.add_input("v", TensorType(DType::kF32, qs)));
    ValueId s = mark(g.add_node1(OpKind::kMatmul, {q, permute(g, k, {0, 1, 3, 2})}));
    s = mark(g.add_node1(OpKind::kAdd, {s, f32_weight(g, "bias", {3, 5, 5}, 1)}));
    s = mark(reshape(g, s, {2, 2, 3, 5, 5}));
    s = mark(g.add_node1(OpKind::kAdd, {s, f32_weight(g, "mask", {1, 2, 1, 5, 5}, 2, -4.0f, 0.0f)}));
    s = mark(reshape(g, s, {4, 3, 5, 5}));
    g.mark_output(g.add_node1(OpKind::kMatmul, {softmax(g, s, 3), v}), "y");
    Graph f = formed(g, 3);
    fold_constants(f);
    const Node& sdpa = *f.value(f.outputs()[0]).producer;
    ASSERT_EQ(sdpa.op, OpKind::kSdpa) << f.to_string();
    EXPECT_EQ(f.value(sdpa.inputs[3]).is_constant(), !sized) << f.to_string();
  }
}

// Scores divided by sqrt(d) (BERT-style code), k given already transposed: a permute is inserted.
TEST(FormAttention, DividedScoresAndATransposedKey) {
  Graph g;
  ValueId q = g.add_input("q", TensorType(DType::kF32, {2, 2, 6, 4}));
  ValueId kt = g.add_input("kt", TensorType(DType::kF32, {2, 2, 4, 7}));
  ValueId v = g.add_input("v", TensorType(DType::kF32, {2, 2, 7, 3}));
  ValueId s = g.add_node1(OpKind::kDiv, {g.add_node1(OpKind::kMatmul, {q, kt}), scalar(g, 2.0f)});
  g.mark_output(g.add_node1(OpKind::kMatmul, {softmax(g, s, 3), v}), "y");
  Graph f = formed(g, 4);
  EXPECT_EQ(count_ops(f, OpKind::kPermute), 1);
  EXPECT_NEAR(f.value(f.outputs()[0]).producer->attrs.get_float("scale"), 0.5, 1e-9);
}

// Swin V2: cosine scores scaled per head by a [H, 1, 1] tensor, then a bias.
TEST(FormAttention, APerHeadScaleMultipliesQ) {
  Graph g;
  const Shape qs = {2, 3, 5, 4};
  ValueId q = g.add_input("q", TensorType(DType::kF32, qs));
  ValueId k = g.add_input("k", TensorType(DType::kF32, qs));
  ValueId v = g.add_input("v", TensorType(DType::kF32, qs));
  ValueId s = g.add_node1(OpKind::kMatmul, {q, permute(g, k, {0, 1, 3, 2})});
  s = g.add_node1(OpKind::kMul, {s, g.add_input("logit_scale", TensorType(DType::kF32, {3, 1, 1}))});
  s = g.add_node1(OpKind::kAdd, {s, f32_weight(g, "bias", {1, 3, 5, 5}, 5)});
  g.mark_output(g.add_node1(OpKind::kMatmul, {softmax(g, s, 3), v}), "y");
  Graph f = formed(g, 6);
  EXPECT_EQ(f.value(f.outputs()[0]).producer->attrs.get_float("scale"), 1.0);
}

// MaxViT: q and k split into heads by a reshape and a permute each, k scaled after its split and
// q before: both scales go into sdpa's scale and no multiply is left, so the head splits can be
// read as views of the projection.
TEST(FormAttention, ScalesOfSplitHeadsGoIntoTheScale) {
  for (bool scale_q : {false, true}) {
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 5, 8}));
    auto heads = [&](ValueId v) { return permute(g, reshape(g, v, {2, 5, 2, 4}), {0, 2, 1, 3}); };
    ValueId q = scale_q ? heads(g.add_node1(OpKind::kMul, {x, scalar(g, 0.5f)})) : heads(x);
    ValueId k =
        g.add_node1(OpKind::kMul, {heads(g.add_input("k", TensorType(DType::kF32, {2, 5, 8}))), scalar(g, 0.25f)});
    ValueId v = heads(g.add_input("v", TensorType(DType::kF32, {2, 5, 8})));
    ValueId s = g.add_node1(OpKind::kMatmul, {q, permute(g, k, {0, 1, 3, 2})});
    g.mark_output(g.add_node1(OpKind::kMatmul, {softmax(g, s, 3), v}), "y");
    Graph f = formed(g, 8 + uint32_t(scale_q));
    EXPECT_EQ(count_ops(f, OpKind::kMul), 0) << f.to_string();
    EXPECT_NEAR(f.value(f.outputs()[0]).producer->attrs.get_float("scale"), scale_q ? 0.125 : 0.25, 1e-9);
  }
}

TEST(FormAttention, LeavesOtherPatternsAlone) {
  for (int variant = 0; variant < 3; ++variant) {
    Graph g;
    ValueId q = g.add_input("q", TensorType(DType::kF32, {2, 5, 4}));
    ValueId k = g.add_input("kt", TensorType(DType::kF32, {2, 4, 5}));
    ValueId v = g.add_input("v", TensorType(DType::kF32, {2, 5, 3}));
    ValueId s = g.add_node1(OpKind::kMatmul, {q, k});
    if (variant == 1) s = g.add_node1(OpKind::kMul, {s, g.add_input("m", TensorType(DType::kF32, {2, 5, 5}))});
    ValueId p = softmax(g, s, variant == 2 ? 1 : 2);
    if (variant == 0) g.mark_output(s, "scores");  // the scores are read twice
    g.mark_output(g.add_node1(OpKind::kMatmul, {p, v}), "y");
    const std::string before = g.to_string();
    EXPECT_FALSE(form_attention(g)) << variant;
    EXPECT_EQ(g.to_string(), before);
  }
}

}  // namespace
