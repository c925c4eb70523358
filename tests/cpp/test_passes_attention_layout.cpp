// sdpa's layout "bshd", its operand views (q_view / k_view / v_view, out_perm) and the
// fold_attention_layout pass (src/passes/fold_attention_layout.cpp): the shape rule for
// [B, S, H, D] operands and for views, and their errors; the CPU kernel against the default
// layout on permuted tensors (masks, causal, broadcast heads, odd lengths); the view analysis
// (src/passes/view_chain.h) on torchvision's head split; golden IR for a BERT-like and a
// ViT-like attention block (no permute or slice left between the linears and sdpa); and the
// rewritten graphs computing what the originals compute on random inputs, in f32 and f16,
// also through an engine file.
#include "src/ops/shape_rules.h"
#include "src/passes/view_chain.h"
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

const Shape kSwap = {0, 2, 1, 3};

// The f32 graphs below run on the CPU reference; the default filter (fused_attention_shape)
// would leave their sdpa alone, so these tests fold every sdpa.
bool any_sdpa(const Graph&, const Node&) { return true; }

Attrs bshd() {
  Attrs a;
  a.set("layout", std::string("bshd"));
  return a;
}

ValueId swap(Graph& g, ValueId v) {
  Attrs a;
  a.set("perm", kSwap);
  return g.add_node1(OpKind::kPermute, {v}, a);
}

size_t count_op(const Graph& g, OpKind op) {
  return size_t(std::count_if(g.nodes().begin(), g.nodes().end(), [&](const auto& n) { return n->op == op; }));
}

TEST(AttentionLayout, ShapeRuleTakesSequenceMajorTensors) {
  Graph g;
  ValueId q = g.add_input("q", TensorType(DType::kF32, {2, 10, 8, 16}));
  ValueId k = g.add_input("k", TensorType(DType::kF32, {2, 12, 1, 16}));  // one head, broadcast
  ValueId v = g.add_input("v", TensorType(DType::kF32, {2, 12, 8, 32}));
  EXPECT_EQ(g.type(g.add_node1(OpKind::kSdpa, {q, k, v}, bshd())).shape(), (Shape{2, 10, 8, 32}));
  // The mask indexes the scores [B, H, L, S] in either layout.
  ValueId m = g.add_input("m", TensorType(DType::kF32, {2, 1, 1, 12}));
  EXPECT_EQ(g.type(g.add_node1(OpKind::kSdpa, {q, k, v, m}, bshd())).shape(), (Shape{2, 10, 8, 32}));
  ValueId m_bad = g.add_input("m_bad", TensorType(DType::kF32, {2, 1, 10, 1, 12}));
  expect_error([&] { g.add_node1(OpKind::kSdpa, {q, k, v, m_bad}, bshd()); }, ErrorCode::kShapeMismatch,
               {"sdpa", "mask"});
  ValueId k_seq = g.add_input("k_seq", TensorType(DType::kF32, {2, 11, 8, 16}));
  expect_error([&] { g.add_node1(OpKind::kSdpa, {q, k_seq, v}, bshd()); }, ErrorCode::kShapeMismatch,
               {"sdpa", "sequence dim"});
  ValueId q3 = g.add_input("q3", TensorType(DType::kF32, {10, 8, 16}));
  expect_error([&] { g.add_node1(OpKind::kSdpa, {q3, k, v}, bshd()); }, ErrorCode::kShapeMismatch,
               {"sdpa", "layout \"bshd\"", "rank-4"});
  Attrs bad;
  bad.set("layout", std::string("bsdh"));
  expect_error([&] { g.add_node1(OpKind::kSdpa, {q, k, v}, bad); }, ErrorCode::kInvalidArgument,
               {"sdpa", "'layout'", "\"bsdh\""});
  bad.set("layout", int64_t{1});
  expect_error([&] { g.add_node1(OpKind::kSdpa, {q, k, v}, bad); }, ErrorCode::kInvalidArgument,
               {"sdpa", "'layout'", "string"});
  Attrs dflt;
  dflt.set("layout", std::string("bhsd"));
  EXPECT_EQ(g.type(g.add_node1(OpKind::kSdpa, {q, q, q}, dflt)).shape(), (Shape{2, 10, 8, 16}));
}

// The bshd sdpa on x against permute(sdpa(permute(x))) on the same inputs: every mask kind,
// causal, k and v shared by all heads, lengths that are not multiples of anything.
TEST(AttentionLayout, CpuBshdMatchesDefaultLayout) {
  struct Case {
    int64_t B, L, S, H, Hkv, D;
    int mask;  // 0 none, 1 additive [B, 1, 1, S], 2 bool [L, S]
    bool causal;
  };
  for (const Case& c : {Case{2, 7, 9, 3, 3, 8, 0, false}, Case{2, 5, 5, 4, 4, 16, 1, false},
                        Case{1, 6, 11, 2, 1, 8, 2, false}, Case{3, 13, 13, 2, 2, 4, 0, true},
                        Case{2, 9, 9, 3, 3, 8, 1, true}}) {
    Graph ref, f;
    for (Graph* g : {&ref, &f}) {
      ValueId q = g->add_input("q", TensorType(DType::kF32, {c.B, c.L, c.H, c.D}));
      ValueId k = g->add_input("k", TensorType(DType::kF32, {c.B, c.S, c.Hkv, c.D}));
      ValueId v = g->add_input("v", TensorType(DType::kF32, {c.B, c.S, c.Hkv, c.D}));
      std::vector<ValueId> ins = {q, k, v};
      if (c.mask == 1) ins.push_back(g->add_input("m", TensorType(DType::kF32, {c.B, 1, 1, c.S})));
      if (c.mask == 2) {
        std::vector<uint8_t> keep(size_t(c.L * c.S));
        for (size_t i = 0; i < keep.size(); ++i) keep[i] = (i * 7 + 3) % 5 != 0;
        ins.push_back(g->add_constant("m", TensorType(DType::kBool, {c.L, c.S}), keep.data(), keep.size()));
      }
      Attrs a = g == &f ? bshd() : Attrs();
      a.set("causal", c.causal);
      if (g == &f) {
        g->mark_output(g->add_node1(OpKind::kSdpa, ins, a), "y");
      } else {
        for (size_t i = 0; i < 3; ++i) ins[i] = swap(*g, ins[i]);
        g->mark_output(swap(*g, g->add_node1(OpKind::kSdpa, ins, a)), "y");
      }
    }
    auto in = random_inputs(ref, 11);
    expect_close(run_plain(f, in), run_plain(ref, in), 1e-5f, 1e-6f);
  }
}

// BERT's self-attention: q, k, v = linear(x).view(B, S, H, D).transpose(1, 2), sdpa with an
// additive [B, 1, 1, S] mask, out.transpose(1, 2).reshape(B, S, H * D), an output linear.
Graph bert_block(int64_t B, int64_t S, int64_t H, int64_t D) {
  Graph g;
  const int64_t E = H * D;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {B, S, E}));
  ValueId m = g.add_input("mask", TensorType(DType::kF32, {B, 1, 1, S}));
  Attrs split, merge;
  split.set("shape", Shape{B, S, H, D});
  merge.set("shape", Shape{B, S, E});
  std::vector<ValueId> qkv;
  const char* const names[3][2] = {{"w0", "b0"}, {"w1", "b1"}, {"w2", "b2"}};
  for (int i = 0; i < 3; ++i) {
    ValueId w = f32_weight(g, names[i][0], {E, E}, uint32_t(i + 1), -0.3f, 0.3f);
    ValueId y = g.add_node1(OpKind::kLinear, {x, w, f32_weight(g, names[i][1], {E}, uint32_t(i + 5))});
    qkv.push_back(swap(g, g.add_node1(OpKind::kReshape, {y}, split)));
  }
  ValueId a = g.add_node1(OpKind::kSdpa, {qkv[0], qkv[1], qkv[2], m});
  a = g.add_node1(OpKind::kReshape, {swap(g, a)}, merge);
  g.mark_output(g.add_node1(OpKind::kLinear, {a, f32_weight(g, "wo", {E, E}, 9, -0.3f, 0.3f)}), "y");
  return g;
}

TEST(FoldAttentionLayout, BertBlockLosesEveryPermuteGolden) {
  const Graph g = bert_block(2, 5, 2, 4);
  Graph f = g;
  EXPECT_TRUE(fold_attention_layout(f, any_sdpa));
  f.verify();
  EXPECT_EQ(count_op(f, OpKind::kPermute), 0u) << f.to_string();
  EXPECT_EQ(f.to_string(),
            "graph(%0 \"x\": f32[2,5,8], %1 \"mask\": f32[2,1,1,5]) {\n"
            "  %2 \"w0\": f32[8,8] = weight\n"
            "  %3 \"b0\": f32[8] = weight\n"
            "  %6 \"w1\": f32[8,8] = weight\n"
            "  %7 \"b1\": f32[8] = weight\n"
            "  %10 \"w2\": f32[8,8] = weight\n"
            "  %11 \"b2\": f32[8] = weight\n"
            "  %15 \"wo\": f32[8,8] = weight\n"
            "  %4: f32[2,5,8] = linear(%0, %2, %3)\n"
            "  %5: f32[2,5,2,4] = reshape(%4) {shape=[2,5,2,4]}\n"
            "  %8: f32[2,5,8] = linear(%0, %6, %7)\n"
            "  %9: f32[2,5,2,4] = reshape(%8) {shape=[2,5,2,4]}\n"
            "  %12: f32[2,5,8] = linear(%0, %10, %11)\n"
            "  %13: f32[2,5,2,4] = reshape(%12) {shape=[2,5,2,4]}\n"
            "  %17: f32[2,5,2,4] = sdpa(%5, %9, %13, %1) {layout=\"bshd\"}\n"
            "  %14: f32[2,5,8] = reshape(%17) {shape=[2,5,8]}\n"
            "  %16: f32[2,5,8] = linear(%14, %15)\n"
            "  return %16 \"y\"\n"
            "}\n");
  EXPECT_FALSE(fold_attention_layout(f, any_sdpa));
}

TEST(FoldAttentionLayout, RewrittenGraphsComputeTheSameOnTheCpu) {
  for (uint32_t seed : {1u, 2u}) {
    const Graph g = bert_block(2, 7, 3, 8);
    Graph f = g;
    ASSERT_TRUE(fold_attention_layout(f, any_sdpa));
    auto in = random_inputs(g, seed);
    expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-5f);
  }
  // The attention output is a graph output in both layouts: the permute back to bshd stays
  // too, since a fold never turns a graph output into an alias of another value.
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 6, 3, 8}));
  ValueId y = g.add_node1(OpKind::kSdpa, {swap(g, x), swap(g, x), swap(g, x)});
  g.mark_output(y, "y_bhsd");
  g.mark_output(swap(g, y), "y_bshd");
  Graph f = g;
  ASSERT_TRUE(fold_attention_layout(f, any_sdpa));
  EXPECT_EQ(count_op(f, OpKind::kPermute), 2u) << f.to_string();
  EXPECT_EQ(count_op(f, OpKind::kSdpa), 1u) << f.to_string();
  auto in = random_inputs(g, 3);
  expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-6f);
}

// q of [0, 2, 1, 3] and k of another permute, v a plain [B, H, S, D] input: the bshd rewrite
// needs all three, the views take each permuted operand alone.
TEST(FoldAttentionLayout, MixedOperandsReadThroughViews) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 6, 3, 8}));
  ValueId kv = g.add_input("kv", TensorType(DType::kF32, {2, 3, 6, 8}));  // already [B, H, S, D]
  g.mark_output(g.add_node1(OpKind::kSdpa, {swap(g, x), kv, kv}), "y");
  Attrs other;
  other.set("perm", Shape{2, 1, 0, 3});
  ValueId k = g.add_node1(OpKind::kPermute, {g.add_input("k", TensorType(DType::kF32, {6, 3, 2, 8}))}, other);
  g.mark_output(g.add_node1(OpKind::kSdpa, {swap(g, x), k, swap(g, x)}), "z");
  Graph f = g;
  ASSERT_TRUE(fold_attention_layout(f, any_sdpa));
  f.verify();
  EXPECT_EQ(count_op(f, OpKind::kPermute), 0u) << f.to_string();
  const std::string text = f.to_string();
  EXPECT_NE(text.find("sdpa(%0, %1, %1) {q_view=[0,2,144,3,8,6,24,8,1]}"), std::string::npos) << text;
  EXPECT_NE(text.find("k_view=[0,2,8,3,16,6,48,8,1]"), std::string::npos) << text;
  auto in = random_inputs(g, 4);
  expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-6f);
}

TEST(FoldAttentionLayout, LeavesOtherAttentionAlone) {
  Graph g;
  // Operands that are no view of anything, an output read by something other than a permute.
  ValueId q = g.add_input("q", TensorType(DType::kF32, {2, 3, 6, 8}));
  ValueId y = g.add_node1(OpKind::kSdpa, {q, q, q});
  g.mark_output(g.add_node1(OpKind::kRelu, {y}), "y");
  // Views whose strides are not multiples of 16 bytes (f32 head dim 2), an output permute that
  // moves the head dim.
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 6, 3, 2}));
  Attrs moves_d;
  moves_d.set("perm", Shape{0, 1, 3, 2});
  ValueId v = g.add_input("v", TensorType(DType::kF32, {2, 3, 6, 2}));
  ValueId z = g.add_node1(OpKind::kSdpa, {swap(g, x), swap(g, x), v});
  g.mark_output(g.add_node1(OpKind::kPermute, {z}, moves_d), "z");
  // A reshape of a dense value already costs nothing: no view.
  ValueId flat = g.add_input("flat", TensorType(DType::kF32, {2, 3 * 6 * 8}));
  Attrs split;
  split.set("shape", Shape{2, 3, 6, 8});
  ValueId r = g.add_node1(OpKind::kReshape, {flat}, split);
  g.mark_output(g.add_node1(OpKind::kSdpa, {r, r, r}), "w");
  const std::string before = g.to_string();
  EXPECT_FALSE(fold_attention_layout(g, any_sdpa));
  EXPECT_EQ(g.to_string(), before);
}

// By default only the sdpa fused kernels serve folds: f16 / bf16 with head dim 32, 64, 96 or 128.
TEST(FoldAttentionLayout, DefaultFilterTakesWhatFusedKernelsServe) {
  struct Case {
    DType dt;
    int64_t d;
    bool folds;
  };
  for (const Case& c : {Case{DType::kF16, 64, true}, Case{DType::kBF16, 128, true}, Case{DType::kF32, 64, false},
                        Case{DType::kF16, 40, false}, Case{DType::kF16, 32, true}, Case{DType::kBF16, 96, true},
                        Case{DType::kF16, 160, false}}) {
    Graph g;
    std::vector<ValueId> qkv;
    for (const char* name : {"q", "k", "v"}) qkv.push_back(swap(g, g.add_input(name, TensorType(c.dt, {2, 5, 3, c.d}))));
    g.mark_output(g.add_node1(OpKind::kSdpa, qkv), "y");
    EXPECT_EQ(fold_attention_layout(g), c.folds) << dtype_name(c.dt) << " d=" << c.d;
    EXPECT_EQ(g.to_string().find("bshd") != std::string::npos, c.folds) << g.to_string();
  }
}

// ---- operand views ----------------------------------------------------------------------

Attrs views(const std::vector<std::pair<std::string, Shape>>& items) {
  Attrs a;
  for (const auto& [k, v] : items) a.set(k, v);
  return a;
}

TEST(AttentionViews, ShapeRuleReadsViewsAndPermutesTheOutput) {
  Graph g;
  // One qkv buffer [S=5, B=2, 3 * H * D] with H = 2, D = 8: q, k, v at 0, 16, 32.
  ValueId qkv = g.add_input("qkv", TensorType(DType::kF16, {5, 2, 48}));
  auto view = [](int64_t off) { return Shape{off, 2, 48, 2, 8, 5, 96, 8, 1}; };  // [B, H, S, D]
  Attrs a = views({{"q_view", view(0)}, {"k_view", view(16)}, {"v_view", view(32)}});
  EXPECT_EQ(g.type(g.add_node1(OpKind::kSdpa, {qkv, qkv, qkv}, a)).shape(), (Shape{2, 2, 5, 8}));
  a.set("out_perm", Shape{2, 0, 1, 3});
  const TensorType& y = g.type(g.add_node1(OpKind::kSdpa, {qkv, qkv, qkv}, a));
  EXPECT_EQ(y.shape(), (Shape{5, 2, 2, 8}));
  EXPECT_EQ(y.dtype, DType::kF16);
  // Mixed: views for k and v only; the mask indexes the logical scores [B, H, L, S].
  ValueId q = g.add_input("q", TensorType(DType::kF16, {2, 2, 7, 8}));
  ValueId m = g.add_input("m", TensorType(DType::kBool, {2, 1, 7, 5}));
  EXPECT_EQ(g.type(g.add_node1(OpKind::kSdpa, {q, qkv, qkv, m}, views({{"k_view", view(16)}, {"v_view", view(32)}})))
                .shape(),
            (Shape{2, 2, 7, 8}));

  // The layout these views describe for a node: sdpa_layout.
  const TensorType t(DType::kF16, {5, 2, 48});
  const SdpaLayout l = sdpa_layout({&t, &t, &t}, a);
  EXPECT_EQ(l.k.offset, 16);
  EXPECT_EQ(l.k.strides, (Shape{48, 8, 96, 1}));
  EXPECT_EQ(l.out.logical.shape(), (Shape{2, 2, 5, 8}));
  EXPECT_EQ(l.out.strides, (Shape{16, 8, 32, 1}));  // [S, B, H, D] dense
  EXPECT_FALSE(l.dense());
  // layout "bshd" is the views it implies.
  const TensorType b(DType::kF16, {2, 5, 3, 8});
  const SdpaLayout lb = sdpa_layout({&b, &b, &b}, bshd());
  EXPECT_EQ(lb.q.logical.shape(), (Shape{2, 3, 5, 8}));
  EXPECT_EQ(lb.q.strides, (Shape{120, 8, 24, 1}));
  EXPECT_EQ(lb.out_perm, (Shape{0, 2, 1, 3}));
  EXPECT_TRUE(sdpa_layout({&b, &b, &b}, Attrs()).dense());
}

TEST(AttentionViews, ShapeRuleRejectsBadViews) {
  Graph g;
  ValueId qkv = g.add_input("qkv", TensorType(DType::kF16, {5, 2, 48}));
  ValueId f32 = g.add_input("f32", TensorType(DType::kF32, {5, 2, 48}));
  auto view = [](int64_t off) { return Shape{off, 2, 48, 2, 8, 5, 96, 8, 1}; };
  // Good views of every operand, then `key` set to `bad`.
  auto sdpa = [&](const std::string& key, const AttrValue& bad, ValueId k = kNoValue) {
    Attrs a = views({{"q_view", view(0)}, {"k_view", view(16)}, {"v_view", view(32)}});
    a.set(key, bad);
    return [&g, a, qkv, k] { g.add_node1(OpKind::kSdpa, {qkv, k == kNoValue ? qkv : k, qkv}, a); };
  };
  // The last element reached: 40 + 48 + 8 + 4 * 96 + 7 = 487 > 479.
  expect_error(sdpa("q_view", Shape{40, 2, 48, 2, 8, 5, 96, 8, 1}), ErrorCode::kShapeMismatch,
               {"sdpa", "q view", "reaches element 487", "f16[5,2,48]", "480 elements"});
  expect_error(sdpa("v_view", Shape{0, 2, 48, 2, 1, 5, 96, 8, 2}), ErrorCode::kInvalidArgument,
               {"sdpa", "'v_view'", "head dim must be contiguous", "stride 2"});
  expect_error(sdpa("k_view", Shape{0, 2, 48, 2, 8, 5, 96, 8}), ErrorCode::kInvalidArgument,
               {"sdpa", "'k_view'", "[offset, size0, stride0"});
  expect_error(sdpa("k_view", Shape{0, 8, 1}), ErrorCode::kInvalidArgument, {"sdpa", "'k_view'", "rank >= 2"});
  expect_error(sdpa("q_view", Shape{-8, 2, 48, 2, 8, 5, 96, 8, 1}), ErrorCode::kInvalidArgument,
               {"sdpa", "'q_view'", "negative offset"});
  expect_error(sdpa("q_view", Shape{0, 2, -48, 2, 8, 5, 96, 8, 1}), ErrorCode::kInvalidArgument,
               {"sdpa", "'q_view'", "negative size or stride"});
  expect_error(sdpa("q_view", Shape{0, 3, int64_t(1) << 62, 2, 8, 5, 96, 8, 1}), ErrorCode::kInvalidArgument,
               {"sdpa", "'q_view'", "overflows"});
  expect_error(sdpa("q_view", int64_t{3}), ErrorCode::kInvalidArgument, {"sdpa", "'q_view'", "list of ints"});
  // One dtype for q, k and v, whatever buffers the views read.
  expect_error(sdpa("k_view", view(16), f32), ErrorCode::kInvalidArgument, {"sdpa", "one dtype"});
  // The views' logical dims follow the usual rules.
  expect_error(sdpa("k_view", Shape{0, 2, 48, 2, 8, 4, 96, 8, 1}), ErrorCode::kShapeMismatch,
               {"sdpa", "sequence dim"});
  // out_perm: a permutation of the output's dims keeping the head dim last.
  for (const Shape& p : {Shape{2, 0, 3, 1}, Shape{0, 1, 2}, Shape{0, 0, 1, 3}, Shape{0, 1, 2, 4}})
    expect_error(sdpa("out_perm", p), ErrorCode::kInvalidArgument, {"sdpa", "'out_perm'", "head dim"});
  // Views and layout "bshd" exclude each other.
  ValueId b = g.add_input("b", TensorType(DType::kF16, {2, 5, 2, 8}));
  Attrs both = bshd();
  both.set("out_perm", Shape{0, 2, 1, 3});
  expect_error([&] { g.add_node1(OpKind::kSdpa, {b, b, b}, both); }, ErrorCode::kInvalidArgument,
               {"sdpa", "bshd", "exclude"});
  // A view reading nothing may start anywhere up to the end of its buffer.
  Attrs empty = views({{"q_view", {480, 2, 48, 2, 8, 0, 96, 8, 1}}, {"k_view", view(16)}, {"v_view", view(32)}});
  EXPECT_EQ(g.type(g.add_node1(OpKind::kSdpa, {qkv, qkv, qkv}, empty)).shape(), (Shape{2, 2, 0, 8}));
}

// torchvision's MultiheadAttention (F.multi_head_attention_forward, batch_first=False inside
// the ViT encoder): x [B, S, E] -> [S, B, E] -> qkv linear [S, B, 3E] -> unflatten(-1, (3, E))
// -> unsqueeze(0).transpose(0, -2).squeeze(-2) -> q, k, v = slices of [3, S, B, E] -> each
// .view(S, B * H, D).transpose(0, 1) -> .view(B, H, S, D) -> sdpa -> permute(2, 0, 1, 3)
// .view(S * B, E) -> out linear -> [S, B, E] -> [B, S, E]. Exactly the imported graph of one
// block (the layer norms aside), in `dt` (the graph's interface stays f32 through casts).
Graph vit_block(int64_t B, int64_t S, int64_t H, int64_t D, DType dt) {
  Graph g;
  const int64_t E = H * D;
  auto node = [&](OpKind op, std::vector<ValueId> in, Attrs a = {}) { return g.add_node1(op, in, a); };
  auto shape = [&](ValueId v, Shape s) {
    Attrs a;
    a.set("shape", s);
    return node(OpKind::kReshape, {v}, a);
  };
  auto perm = [&](ValueId v, Shape p) {
    Attrs a;
    a.set("perm", p);
    return node(OpKind::kPermute, {v}, a);
  };
  auto cast = [&](ValueId v, DType to) {
    if (dt == DType::kF32) return v;
    Attrs a;
    a.set("dtype", to);
    return node(OpKind::kCast, {v}, a);
  };
  auto weight = [&](const char* name, Shape s, uint32_t seed) {
    return cast(f32_weight(g, name, s, seed, -0.1f, 0.1f), dt);
  };
  ValueId x = cast(g.add_input("x", TensorType(DType::kF32, {B, S, E})), dt);
  ValueId t = perm(x, {1, 0, 2});
  ValueId qkv = node(OpKind::kLinear, {t, weight("in_proj_weight", {3 * E, E}, 1), weight("in_proj_bias", {3 * E}, 2)});
  ValueId p = shape(shape(qkv, {S, B, 3, E}), {1, S, B, 3, E});
  p = shape(perm(p, {3, 1, 2, 0, 4}), {3, S, B, E});
  std::vector<ValueId> heads;
  for (int64_t i = 0; i < 3; ++i) {
    Attrs sl;
    sl.set("axis", int64_t{0}), sl.set("start", i), sl.set("end", i + 1), sl.set("step", int64_t{1});
    ValueId h = shape(node(OpKind::kSlice, {p}, sl), {S, B, E});
    heads.push_back(shape(perm(shape(h, {S, B * H, D}), {1, 0, 2}), {B, H, S, D}));
  }
  ValueId a = node(OpKind::kSdpa, heads);
  a = shape(perm(a, {2, 0, 1, 3}), {S * B, E});
  a = node(OpKind::kLinear, {a, weight("out_proj_weight", {E, E}, 3), weight("out_proj_bias", {E}, 4)});
  g.mark_output(cast(perm(shape(a, {S, B, E}), {1, 0, 2}), DType::kF32), "y");
  return g;
}

// The imported head split is one strided view of the qkv linear's output per operand, at any
// batch: [B, H, S, D] reads element (s, b, i * E + h * D + d) of [S, B, 3E]. With B > 1 the
// chain's [S, B * H, D] step is no strided view of it (B and H are not adjacent in memory);
// the composite is.
TEST(ViewChain, TorchvisionHeadSplitIsOneViewOfTheQkvOutput) {
  for (int64_t B : {1, 2, 3}) {
    const int64_t S = 7, H = 4, D = 8, E = H * D;
    const Graph g = vit_block(B, S, H, D, DType::kF32);
    const Node* sdpa = nullptr;
    for (const auto& n : g.nodes())
      if (n->op == OpKind::kSdpa) sdpa = n.get();
    ASSERT_NE(sdpa, nullptr);
    for (int64_t i = 0; i < 3; ++i) {
      const passes::ValueView v = passes::strided_view_of(g, sdpa->inputs[size_t(i)]);
      ASSERT_NE(g.value(v.base).producer, nullptr);
      EXPECT_EQ(g.value(v.base).producer->op, OpKind::kLinear) << "B=" << B;
      EXPECT_EQ(v.offset, i * E);
      EXPECT_EQ(v.sizes, (Shape{B, H, S, D}));
      EXPECT_EQ(v.strides, (Shape{B == 1 ? 0 : 3 * E, D, B * 3 * E, 1})) << "B=" << B;
      EXPECT_FALSE(v.whole_base(g));
    }
  }
}

TEST(ViewChain, StopsWhereNoViewComposes) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 6}));
  Attrs t;
  t.set("perm", Shape{1, 0});
  ValueId xt = g.add_node1(OpKind::kPermute, {x}, t);  // [6, 4], strides [1, 6]
  Attrs flat;
  flat.set("shape", Shape{24});
  ValueId f = g.add_node1(OpKind::kReshape, {xt}, flat);  // no view of x: a copy
  Attrs back;
  back.set("shape", Shape{3, 8});
  ValueId r = g.add_node1(OpKind::kReshape, {f}, back);
  passes::ValueView v = passes::strided_view_of(g, r);
  EXPECT_EQ(v.base, xt);  // the longest chain that is a view: two reshapes of xt
  EXPECT_EQ(v.strides, (Shape{8, 1}));
  EXPECT_TRUE(v.whole_base(g));
  // A strided slice of a slice; a value with no view producer is itself.
  Attrs s1, s2;
  s1.set("axis", int64_t{1}), s1.set("start", int64_t{1}), s1.set("end", int64_t{6}), s1.set("step", int64_t{2});
  s2.set("axis", int64_t{0}), s2.set("start", int64_t{1}), s2.set("end", int64_t{3}), s2.set("step", int64_t{1});
  ValueId sl = g.add_node1(OpKind::kSlice, {g.add_node1(OpKind::kSlice, {x}, s1)}, s2);  // [2, 3]
  v = passes::strided_view_of(g, sl);
  EXPECT_EQ(v.base, x);
  EXPECT_EQ(v.offset, 7);
  EXPECT_EQ(v.strides, (Shape{6, 2}));
  v = passes::strided_view_of(g, x);
  EXPECT_EQ(v.base, x);
  EXPECT_TRUE(v.whole_base(g));
}

// GPT-2's head split: one qkv linear [B, S, 3E] split along its last dim into q, k, v, each viewed as [B, S, H, D] and transposed. Every operand is a view of the qkv
// output (output i of the split starts at column i * E), so sdpa reads it there: no split, no
// permute is left, and the values are the original graph's on the CPU.
TEST(FoldAttentionLayout, SplitQkvIsReadThroughViews) {
  const int64_t B = 2, S = 5, H = 2, D = 8, E = H * D;
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {B, S, E}));
  ValueId qkv = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "w", {3 * E, E}, 1, -0.3f, 0.3f)});
  Attrs split, heads, merge;
  split.set("axis", int64_t{2});
  split.set("sizes", Shape{E, E, E});
  heads.set("shape", Shape{B, S, H, D});
  merge.set("shape", Shape{B, S, E});
  const std::vector<ValueId> parts = g.add_node(OpKind::kSplit, {qkv}, split, "split");
  std::vector<ValueId> ops;
  for (ValueId p : parts) ops.push_back(swap(g, g.add_node1(OpKind::kReshape, {p}, heads)));
  ValueId a = g.add_node1(OpKind::kSdpa, {ops[0], ops[1], ops[2]});
  g.mark_output(g.add_node1(OpKind::kReshape, {swap(g, a)}, merge), "y");
  for (int64_t i = 0; i < 3; ++i) {
    const passes::ValueView v = passes::strided_view_of(g, ops[size_t(i)]);
    EXPECT_EQ(v.base, qkv);
    EXPECT_EQ(v.offset, i * E);
    EXPECT_EQ(v.strides, (Shape{S * 3 * E, D, 3 * E, 1}));
  }
  Graph f = g;
  ASSERT_TRUE(fold_attention_layout(f, any_sdpa));
  f.verify();
  EXPECT_EQ(count_op(f, OpKind::kSplit), 0u) << f.to_string();
  EXPECT_EQ(count_op(f, OpKind::kPermute), 0u) << f.to_string();
  auto in = random_inputs(g, 5);
  expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-6f);
}

const Node* find_op(const Graph& g, OpKind op) {
  for (const auto& n : g.nodes())
    if (n->op == op) return n.get();
  return nullptr;
}

// (a) nothing between the qkv linear and sdpa, nor between sdpa and the out linear but a
// reshape; (b) the same values as the original on the CPU; at batch 1 and 2, with sequence
// lengths that are and are not multiples of 64, in f16 through the default filter.
TEST(FoldAttentionLayout, VitBlockReadsTheQkvLinearThroughViews) {
  struct Case {
    int64_t B, S;
  };
  for (const Case& c : {Case{1, 197}, Case{2, 197}, Case{2, 64}, Case{3, 50}}) {
    const int64_t H = 12, D = 64, E = H * D;
    const Graph g = vit_block(c.B, c.S, H, D, DType::kF16);
    Graph f = g;
    ASSERT_TRUE(fold_attention_layout(f));
    f.verify();
    EXPECT_EQ(count_op(f, OpKind::kSlice), 0u) << f.to_string();
    EXPECT_EQ(count_op(f, OpKind::kPermute), 2u) << f.to_string();  // the block's own [B, S] <-> [S, B]
    const Node* sdpa = find_op(f, OpKind::kSdpa);
    ASSERT_NE(sdpa, nullptr);
    const Node* qkv = f.value(sdpa->inputs[0]).producer;
    ASSERT_NE(qkv, nullptr);
    EXPECT_EQ(qkv->op, OpKind::kLinear);
    EXPECT_EQ(sdpa->inputs, (std::vector<ValueId>{qkv->outputs[0], qkv->outputs[0], qkv->outputs[0]}));
    const int64_t b0 = c.B == 1 ? 0 : 3 * E;
    EXPECT_EQ(sdpa->attrs.get_ints("q_view"), (Shape{0, c.B, b0, H, D, c.S, c.B * 3 * E, D, 1}));
    EXPECT_EQ(sdpa->attrs.get_ints("k_view")[0], E);
    EXPECT_EQ(sdpa->attrs.get_ints("v_view")[0], 2 * E);
    EXPECT_EQ(sdpa->attrs.get_ints("out_perm"), (Shape{2, 0, 1, 3}));
    EXPECT_EQ(f.type(sdpa->outputs[0]).shape(), (Shape{c.S, c.B, H, D}));
    const auto users = f.users()[size_t(sdpa->outputs[0])];
    ASSERT_EQ(users.size(), 1u);
    const Node& merge = *f.nodes()[size_t(users[0])];
    EXPECT_EQ(merge.op, OpKind::kReshape);
    const auto merge_users = f.users()[size_t(merge.outputs[0])];
    ASSERT_EQ(merge_users.size(), 1u);
    EXPECT_EQ(f.nodes()[size_t(merge_users[0])]->op, OpKind::kLinear);
    EXPECT_FALSE(fold_attention_layout(f));

    auto in = random_inputs(g, uint32_t(c.B * 1000 + c.S));
    // The same f16 arithmetic on the same values: the views only skip copies.
    expect_close(run_plain(f, in), run_plain(g, in), 1e-3f, 1e-4f);
  }
}

// Small f32 blocks (any sdpa folds): golden IR, then numerics at several shapes, and an
// engine file written and read back.
TEST(FoldAttentionLayout, VitBlockGoldenAndF32Numerics) {
  Graph f = vit_block(2, 5, 2, 4, DType::kF32);
  ASSERT_TRUE(fold_attention_layout(f, any_sdpa));
  EXPECT_EQ(f.to_string(),
            "graph(%0 \"x\": f32[2,5,8]) {\n"
            "  %2 \"in_proj_weight\": f32[24,8] = weight\n"
            "  %3 \"in_proj_bias\": f32[24] = weight\n"
            "  %6 \"out_proj_weight\": f32[8,8] = weight\n"
            "  %7 \"out_proj_bias\": f32[8] = weight\n"
            "  %1: f32[5,2,8] = permute(%0) {perm=[1,0,2]}\n"
            "  %4: f32[5,2,24] = linear(%1, %2, %3)\n"
            "  %11: f32[5,2,2,4] = sdpa(%4, %4, %4) {k_view=[8,2,24,2,4,5,48,4,1], out_perm=[2,0,1,3], "
            "q_view=[0,2,24,2,4,5,48,4,1], v_view=[16,2,24,2,4,5,48,4,1]}\n"
            "  %5: f32[10,8] = reshape(%11) {shape=[10,8]}\n"
            "  %8: f32[10,8] = linear(%5, %6, %7)\n"
            "  %9: f32[5,2,8] = reshape(%8) {shape=[5,2,8]}\n"
            "  %10: f32[2,5,8] = permute(%9) {perm=[1,0,2]}\n"
            "  return %10 \"y\"\n"
            "}\n");

  struct Case {
    int64_t B, S, H, D;
  };
  for (const Case& c : {Case{1, 9, 3, 8}, Case{2, 13, 2, 16}, Case{3, 6, 4, 4}}) {
    const Graph g = vit_block(c.B, c.S, c.H, c.D, DType::kF32);
    Graph folded = g;
    ASSERT_TRUE(fold_attention_layout(folded, any_sdpa));
    EXPECT_EQ(count_op(folded, OpKind::kSlice), 0u) << folded.to_string();
    EXPECT_EQ(count_op(folded, OpKind::kPermute), 2u) << folded.to_string();
    auto in = random_inputs(g, uint32_t(c.S));
    const auto want = run_plain(g, in);
    expect_close(run_plain(folded, in), want, 1e-5f, 1e-6f);
    // The view attributes survive an engine file: the reader reruns the shape rule.
    const Bytes file = Engine::create(folded, Device{}, KernelOptions{})->serialize();
    expect_close(run_engine(Engine::deserialize(file.data(), file.size()), in), want, 1e-5f, 1e-6f);
  }
}

// The CPU kernel of a strided sdpa on views chosen by hand (overlapping, broadcast, a mask,
// causal) against the default-layout sdpa on the same tensors gathered by slices and permutes.
TEST(AttentionViews, CpuViewsMatchGatheredOperands) {
  Graph ref, f;
  for (Graph* g : {&ref, &f}) {
    ValueId buf = g->add_input("buf", TensorType(DType::kF32, {4, 5, 24}));  // [S=4 or 5, ., 24]
    ValueId m = g->add_input("m", TensorType(DType::kF32, {1, 1, 4, 4}));
    Attrs a;
    a.set("causal", true);
    if (g == &f) {
      // q: [B=2, H=3, L=4, D=8] at offset 0, rows 24 apart inside one batch, batches 120 apart;
      // k: the same rows shifted by one row (overlapping q); v: one head (stride 0) for all.
      a.set("q_view", Shape{0, 2, 120, 3, 8, 4, 24, 8, 1});
      a.set("k_view", Shape{24, 2, 120, 3, 8, 4, 24, 8, 1});
      a.set("v_view", Shape{8, 2, 120, 3, 0, 4, 24, 8, 1});
      a.set("out_perm", Shape{2, 1, 0, 3});
      g->mark_output(g->add_node1(OpKind::kSdpa, {buf, buf, buf, m}, a), "y");
    } else {
      // buf [4, 5, 24] read as [2 (batch = dim 1 in blocks of 120 = 5 * 24)...]: gather with
      // ops. q[b, h, l, d] = flat[120 b + 8 h + 24 l + d].
      Attrs flat_shape;
      flat_shape.set("shape", Shape{480});
      ValueId flat = g->add_node1(OpKind::kReshape, {buf}, flat_shape);
      auto gather = [&](int64_t off, bool one_head) {
        Attrs s;
        s.set("axis", int64_t{0}), s.set("start", off), s.set("end", off + 240), s.set("step", int64_t{1});
        Attrs r;
        r.set("shape", Shape{2, 5, 24});  // [b, row, 24]: 120 per batch, 24 per row
        ValueId v = g->add_node1(OpKind::kReshape, {g->add_node1(OpKind::kSlice, {flat}, s)}, r);
        Attrs rows;
        rows.set("axis", int64_t{1}), rows.set("start", int64_t{0}), rows.set("end", int64_t{4}),
            rows.set("step", int64_t{1});
        v = g->add_node1(OpKind::kSlice, {v}, rows);  // [2, 4, 24]
        Attrs cols;
        cols.set("axis", int64_t{2}), cols.set("start", int64_t{0}), cols.set("end", int64_t{one_head ? 8 : 24}),
            cols.set("step", int64_t{1});
        v = g->add_node1(OpKind::kSlice, {v}, cols);
        Attrs split;
        split.set("shape", Shape{2, 4, one_head ? 1 : 3, 8});
        return swap(*g, g->add_node1(OpKind::kReshape, {v}, split));  // [2, H, 4, 8]
      };
      ValueId y = g->add_node1(OpKind::kSdpa, {gather(0, false), gather(24, false), gather(8, true), m}, a);
      Attrs p;
      p.set("perm", Shape{2, 1, 0, 3});
      g->mark_output(g->add_node1(OpKind::kPermute, {y}, p), "y");
    }
  }
  auto in = random_inputs(ref, 21);
  expect_close(run_plain(f, in), run_plain(ref, in), 1e-5f, 1e-6f);
}

}  // namespace
