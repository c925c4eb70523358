// Grouped-query attention in fold_attention_layout (rewrite 0, src/passes/fold_attention_layout.cpp)
// and causal_attention_masks (src/passes/attention_mask.cpp): k and v that transformers'
// repeat_kv expands become stride-0 views of the un-expanded heads, with the batch dims of every
// operand, the mask and the output split into [B, KVH, n_rep]; no expand or permute is left and
// the rewritten graph computes what the original does on random inputs, with no mask, masks that
// broadcast over heads or batch, and per-head masks. A constant causal mask (bool or additive)
// becomes causal=true with the same outputs; near-causal constants stay masks.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

bool any_sdpa(const Graph&, const Node&) { return true; }

const Node* the_sdpa(const Graph& g) {
  for (const auto& n : g.nodes())
    if (n->op == OpKind::kSdpa) return n.get();
  return nullptr;
}

// Llama's attention core: q [B, H, L, D] an input; k, v linear outputs [B, S, KVH * D] viewed
// [B, S, KVH, D], transposed, repeated n_rep times (repeat_kv: [:, :, None] expand reshape);
// sdpa; the head merge (transpose, reshape [B, L, H * D]). `mask`: the mask input's shape, or
// none.
Graph grouped_block(int64_t B, int64_t H, int64_t KVH, int64_t L, int64_t S, int64_t D, const Shape& mask = {}) {
  Graph g;
  const ValueId q = g.add_input("q", TensorType(DType::kF32, {B, H, L, D}));
  auto repeated = [&](const char* name) {
    const ValueId x = g.add_input(name, TensorType(DType::kF32, {B, S, KVH * D}));
    const ValueId heads = permute(g, reshape(g, x, {B, S, KVH, D}), {0, 2, 1, 3});
    const ValueId wide = expand(g, reshape(g, heads, {B, KVH, 1, S, D}), {B, KVH, H / KVH, S, D});
    return reshape(g, wide, {B, H, S, D});
  };
  std::vector<ValueId> ins = {q, repeated("k"), repeated("v")};
  if (!mask.empty()) ins.push_back(g.add_input("mask", TensorType(DType::kF32, mask)));
  const ValueId y = g.add_node1(OpKind::kSdpa, ins);
  g.mark_output(reshape(g, permute(g, y, {0, 2, 1, 3}), {B, L, H * D}), "y");
  return g;
}

TEST(GroupedAttention, KAndVAreReadOncePerGroupOfHeads) {
  Graph g = grouped_block(2, 8, 2, 5, 6, 8);
  Graph f = g;
  ASSERT_TRUE(fold_attention_layout(f, any_sdpa));
  f.verify();
  EXPECT_EQ(count_ops(f, OpKind::kExpand), 0) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kPermute), 0) << f.to_string();
  const Node* s = the_sdpa(f);
  ASSERT_NE(s, nullptr);
  // k [B, S, KVH * D] = [2, 6, 16] read as [B, KVH, n_rep, S, D]: n_rep has stride 0.
  EXPECT_EQ(s->attrs.get_ints("k_view"), (Shape{0, 2, 96, 2, 8, 4, 0, 6, 16, 8, 1}));
  EXPECT_EQ(s->attrs.get_ints("v_view"), (Shape{0, 2, 96, 2, 8, 4, 0, 6, 16, 8, 1}));
  EXPECT_EQ(s->attrs.get_ints("out_perm"), (Shape{0, 3, 1, 2, 4}));
  EXPECT_EQ(f.type(s->inputs[0]).shape(), (Shape{2, 2, 4, 5, 8}));  // q reshaped, not copied
  for (uint32_t seed : {1u, 2u}) {
    auto in = random_inputs(g, seed);
    expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-6f);
  }
}

TEST(GroupedAttention, MasksFollowTheSplitHeads) {
  // Broadcast over batch and heads, per batch (padding), per head, and rank 2.
  for (const Shape& mask : {Shape{1, 1, 5, 6}, Shape{2, 1, 1, 6}, Shape{2, 8, 5, 6}, Shape{1, 8, 5, 6}, Shape{5, 6}}) {
    Graph g = grouped_block(2, 8, 2, 5, 6, 8, mask);
    Graph f = g;
    ASSERT_TRUE(fold_attention_layout(f, any_sdpa)) << g.to_string();
    f.verify();
    EXPECT_EQ(count_ops(f, OpKind::kExpand), 0) << f.to_string();
    auto in = random_inputs(g, 3);
    expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-6f);
  }
}

TEST(GroupedAttention, MultiQueryAndCausal) {
  // One k / v head for every query head (MQA), causal, L != S.
  Graph g;
  const int64_t B = 1, H = 4, L = 3, S = 7, D = 8;
  const ValueId q = g.add_input("q", TensorType(DType::kF32, {B, H, L, D}));
  const ValueId k = g.add_input("k", TensorType(DType::kF32, {B, 1, S, D}));
  const ValueId v = g.add_input("v", TensorType(DType::kF32, {B, 1, S, D}));
  Attrs causal;
  causal.set("causal", true);
  const ValueId y = g.add_node1(OpKind::kSdpa, {q, expand(g, k, {B, H, S, D}), expand(g, v, {B, H, S, D})}, causal);
  g.mark_output(y, "y");
  Graph f = g;
  ASSERT_TRUE(fold_attention_layout(f, any_sdpa));
  f.verify();
  EXPECT_EQ(count_ops(f, OpKind::kExpand), 0) << f.to_string();
  EXPECT_TRUE(the_sdpa(f)->attrs.get_bool("causal", false));
  auto in = random_inputs(g, 4);
  expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-6f);
}

TEST(GroupedAttention, LeavesUngroupedAttentionToTheOtherRewrites) {
  // No expand: the bshd rewrite takes it, as before.
  Graph g;
  std::vector<ValueId> qkv;
  for (const char* name : {"q", "k", "v"})
    qkv.push_back(permute(g, g.add_input(name, TensorType(DType::kF32, {2, 5, 3, 8})), {0, 2, 1, 3}));
  g.mark_output(g.add_node1(OpKind::kSdpa, qkv), "y");
  ASSERT_TRUE(fold_attention_layout(g, any_sdpa));
  EXPECT_EQ(the_sdpa(g)->attrs.get_string("layout"), "bshd") << g.to_string();
  EXPECT_FALSE(the_sdpa(g)->attrs.has("k_view"));
}

// ---- causal masks -------------------------------------------------------------------------

// q, k, v [2, 3, L, 8] (S = L) and the constant mask `values` of shape `shape`.
Graph with_constant_mask(int64_t L, const Shape& shape, DType dt, const std::vector<float>& values) {
  Graph g;
  const Shape qs = {2, 3, L, 8};
  const ValueId q = g.add_input("q", TensorType(DType::kF32, qs));
  const ValueId k = g.add_input("k", TensorType(DType::kF32, qs));
  const ValueId v = g.add_input("v", TensorType(DType::kF32, qs));
  Bytes bytes;
  if (dt == DType::kBool) {
    for (float x : values) bytes.push_back(x != 0.0f ? 1 : 0);
  } else {
    bytes.resize(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
  }
  const ValueId m = g.add_constant("mask", TensorType(dt, shape), bytes.data(), bytes.size(), false);
  g.mark_output(g.add_node1(OpKind::kSdpa, {q, k, v, m}), "y");
  return g;
}

// The [L, L] causal pattern, `times` times over: `keep` where j <= i, `drop` above.
std::vector<float> triangle(int64_t L, float keep, float drop, int64_t times = 1) {
  std::vector<float> out;
  for (int64_t t = 0; t < times; ++t)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < L; ++j) out.push_back(j <= i ? keep : drop);
  return out;
}

TEST(CausalAttentionMasks, ConstantTrianglesBecomeCausal) {
  const float lowest = std::numeric_limits<float>::lowest(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    Shape shape;
    DType dt;
    std::vector<float> values;
  };
  const int64_t L = 5;
  for (const Case& c :
       {Case{{1, 1, L, L}, DType::kF32, triangle(L, 0.0f, lowest)}, Case{{L, L}, DType::kF32, triangle(L, 0.0f, -inf)},
        Case{{2, 1, L, L}, DType::kF32, triangle(L, 0.0f, lowest, 2)},
        Case{{1, 1, L, L}, DType::kBool, triangle(L, 1.0f, 0.0f)}}) {
    Graph g = with_constant_mask(L, c.shape, c.dt, c.values);
    Graph f = g;
    ASSERT_TRUE(causal_attention_masks(f)) << g.to_string();
    f.verify();
    const Node* s = the_sdpa(f);
    EXPECT_TRUE(s->attrs.get_bool("causal", false));
    EXPECT_EQ(s->inputs.size(), 3u) << f.to_string();
    auto in = random_inputs(g, 5);
    expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-6f);
  }
}

TEST(CausalAttentionMasks, OtherConstantsStayMasks) {
  const int64_t L = 4;
  const float lowest = std::numeric_limits<float>::lowest();
  std::vector<float> near = triangle(L, 0.0f, lowest);
  near[1 * L + 0] = -1.0f;  // a kept score with a bias
  std::vector<float> shallow = triangle(L, 0.0f, -1e4f);  // not the dtype's lowest: a real bias
  std::vector<float> upper = triangle(L, 0.0f, lowest);
  upper[0 * L + 1] = 0.0f;  // one key too many
  std::vector<float> two = triangle(L, 0.0f, lowest, 2);
  two[L * L + 3 * L + 0] = lowest;  // the second slice differs
  for (const auto& [shape, values] : {std::pair<Shape, std::vector<float>>{{1, 1, L, L}, near},
                                      {{1, 1, L, L}, shallow},
                                      {{1, 1, L, L}, upper},
                                      {{2, 1, L, L}, two}}) {
    Graph g = with_constant_mask(L, shape, DType::kF32, values);
    const std::string before = g.to_string();
    EXPECT_FALSE(causal_attention_masks(g));
    EXPECT_EQ(g.to_string(), before);
  }
  // A mask input is no constant.
  Graph g = grouped_block(1, 2, 1, 3, 3, 8, {1, 1, 3, 3});
  EXPECT_FALSE(causal_attention_masks(g));
}

// q, k, v [2, 3, L, 8]; the padding mask pad [2, 1, 1, L] (a constant that keeps key 0 of every
// batch, so that no query row loses every key); `rows` the causal part; mask = and(rows, pad).
struct PaddedCase {
  Graph g;
  ValueId pad = kNoValue;
};

PaddedCase padded_causal(int64_t L, const std::function<ValueId(Graph&)>& rows, bool rows_first) {
  PaddedCase c;
  Graph& g = c.g;
  const Shape qs = {2, 3, L, 8};
  const ValueId q = g.add_input("q", TensorType(DType::kF32, qs));
  const ValueId k = g.add_input("k", TensorType(DType::kF32, qs));
  const ValueId v = g.add_input("v", TensorType(DType::kF32, qs));
  Bytes keep;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < L; ++j) keep.push_back(j == 0 || (j + b) % 3 != 0 ? 1 : 0);
  c.pad = g.add_constant("pad", TensorType(DType::kBool, {2, 1, 1, L}), keep.data(), keep.size(), false);
  const ValueId r = rows(g);
  const ValueId mask =
      g.add_node1(OpKind::kLogicalAnd, rows_first ? std::vector<ValueId>{r, c.pad} : std::vector<ValueId>{c.pad, r});
  g.mark_output(g.add_node1(OpKind::kSdpa, {q, k, v, mask}), "y");
  return c;
}

// arange(start, start + L) + shift, viewed with its one long dim `from_end` dims from the end of a
// rank-4 shape: transformers' q_idx (from_end 1) and kv_idx (from_end 0).
ValueId index_of(Graph& g, int64_t L, int64_t start, int64_t shift, int from_end) {
  ValueId x = i64_arange(g, start, start + L, false);
  const int64_t c = shift;
  x = g.add_node1(OpKind::kAdd, {x, g.add_constant("shift" + std::to_string(g.num_values()),
                                                   TensorType(DType::kI64, {}), &c, sizeof c, false)});
  Shape shape = {1, 1, 1, 1};
  shape[size_t(3 - from_end)] = L;
  Attrs view;
  view.set("shape", shape);
  return g.add_node1(OpKind::kReshape, {x}, view);
}

TEST(CausalAttentionMasks, CausalAndPaddingBecomeCausalReadingThePaddingMask) {
  const int64_t L = 5;
  const uint8_t yes = 1;
  std::vector<std::pair<const char*, std::function<ValueId(Graph&)>>> parts = {
      {"constant triangle",
       [&](Graph& g) {
         Bytes tri;
         for (float x : triangle(L, 1.0f, 0.0f)) tri.push_back(x != 0.0f ? 1 : 0);
         return g.add_constant("tri", TensorType(DType::kBool, {1, 1, L, L}), tri.data(), tri.size(), false);
       }},
      {"kv <= q",
       [&](Graph& g) { return g.add_node1(OpKind::kLe, {index_of(g, L, 0, 0, 0), index_of(g, L, 0, 0, 1)}); }},
      {"q >= kv, equal offsets",
       [&](Graph& g) { return g.add_node1(OpKind::kGe, {index_of(g, L, 2, 1, 1), index_of(g, L, 1, 2, 0)}); }},
      {"true and (kv <= q)", [&](Graph& g) {
         const ValueId t = g.add_constant("yes", TensorType(DType::kBool, {}), &yes, 1, false);
         return g.add_node1(OpKind::kLogicalAnd,
                            {t, g.add_node1(OpKind::kLe, {index_of(g, L, 0, 0, 0), index_of(g, L, 0, 0, 1)})});
       }}};
  for (const auto& [what, rows] : parts) {
    for (bool rows_first : {true, false}) {
      PaddedCase c = padded_causal(L, rows, rows_first);
      Graph f = c.g;
      ASSERT_TRUE(causal_attention_masks(f)) << what;
      f.verify();
      const Node* s = the_sdpa(f);
      EXPECT_TRUE(s->attrs.get_bool("causal", false)) << what;
      ASSERT_EQ(s->inputs.size(), 4u) << what;
      EXPECT_EQ(s->inputs[3], c.pad) << what;
      EXPECT_EQ(count_ops(f, OpKind::kArange), 0) << what;
      auto in = random_inputs(c.g, 9);
      expect_close(run_plain(f, in), run_plain(c.g, in), 1e-5f, 1e-6f);
    }
  }
}

TEST(CausalAttentionMasks, AnIndexComparisonAloneBecomesCausalUnmasked) {
  const int64_t L = 6;
  Graph g;
  const Shape qs = {1, 2, L, 8};
  const ValueId q = g.add_input("q", TensorType(DType::kF32, qs));
  const ValueId k = g.add_input("k", TensorType(DType::kF32, qs));
  const ValueId v = g.add_input("v", TensorType(DType::kF32, qs));
  const ValueId m = g.add_node1(OpKind::kLe, {index_of(g, L, 0, 0, 0), index_of(g, L, 0, 0, 1)});
  g.mark_output(g.add_node1(OpKind::kSdpa, {q, k, v, m}), "y");
  Graph f = g;
  ASSERT_TRUE(causal_attention_masks(f));
  EXPECT_TRUE(the_sdpa(f)->attrs.get_bool("causal", false));
  EXPECT_EQ(the_sdpa(f)->inputs.size(), 3u);
  auto in = random_inputs(g, 4);
  expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-6f);
}

TEST(CausalAttentionMasks, IndexComparisonsOfOtherPatternsStayMasks) {
  const int64_t L = 5;
  // q sees one key ahead (offsets differ), the upper triangle (q <= kv), kv on the rows' dim.
  for (const auto& rows : std::vector<std::function<ValueId(Graph&)>>{
           [&](Graph& g) { return g.add_node1(OpKind::kLe, {index_of(g, L, 0, 0, 0), index_of(g, L, 0, 1, 1)}); },
           [&](Graph& g) { return g.add_node1(OpKind::kLe, {index_of(g, L, 0, 0, 1), index_of(g, L, 0, 0, 0)}); },
           [&](Graph& g) { return g.add_node1(OpKind::kLe, {index_of(g, L, 0, 0, 1), index_of(g, L, 0, 0, 1)}); }}) {
    PaddedCase c = padded_causal(L, rows, true);
    const std::string before = c.g.to_string();
    EXPECT_FALSE(causal_attention_masks(c.g)) << before;
    EXPECT_EQ(c.g.to_string(), before);
  }
}

}  // namespace
