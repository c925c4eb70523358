// sdpa's layout "bshd" and the fold_attention_layout pass (src/passes/fold_attention_layout.cpp):
// the shape rule for [B, S, H, D] operands and its errors, the CPU kernel against the default
// layout on permuted tensors (masks, causal, broadcast heads, odd lengths), golden IR for a
// BERT-like attention block (no permute left), and the rewritten graph computing what the
// original computes on random inputs.
#include "src/ops/shape_rules.h"
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

TEST(FoldAttentionLayout, LeavesOtherAttentionAlone) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 6, 3, 8}));
  ValueId kv = g.add_input("kv", TensorType(DType::kF32, {2, 3, 6, 8}));  // already [B, H, S, D]
  g.mark_output(g.add_node1(OpKind::kSdpa, {swap(g, x), kv, kv}), "y");
  Attrs other;
  other.set("perm", Shape{2, 1, 0, 3});
  ValueId k = g.add_node1(OpKind::kPermute, {g.add_input("k", TensorType(DType::kF32, {6, 3, 2, 8}))}, other);
  g.mark_output(g.add_node1(OpKind::kSdpa, {swap(g, x), k, swap(g, x)}), "z");
  const std::string before = g.to_string();
  EXPECT_FALSE(fold_attention_layout(g, any_sdpa));
  EXPECT_EQ(g.to_string(), before);
}

// By default only the sdpa fused kernels serve folds: f16 / bf16 with head dim 64 or 128.
TEST(FoldAttentionLayout, DefaultFilterTakesWhatFusedKernelsServe) {
  struct Case {
    DType dt;
    int64_t d;
    bool folds;
  };
  for (const Case& c : {Case{DType::kF16, 64, true}, Case{DType::kBF16, 128, true}, Case{DType::kF32, 64, false},
                        Case{DType::kF16, 40, false}}) {
    Graph g;
    std::vector<ValueId> qkv;
    for (const char* name : {"q", "k", "v"}) qkv.push_back(swap(g, g.add_input(name, TensorType(c.dt, {2, 5, 3, c.d}))));
    g.mark_output(g.add_node1(OpKind::kSdpa, qkv), "y");
    EXPECT_EQ(fold_attention_layout(g), c.folds) << dtype_name(c.dt) << " d=" << c.d;
    EXPECT_EQ(g.to_string().find("bshd") != std::string::npos, c.folds) << g.to_string();
  }
}

}  // namespace
