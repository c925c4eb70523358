// fuse_sibling_linears (src/passes/fuse_sibling_linears.cpp) on a BERT-like attention block
// (three linears over one x, each split into heads for sdpa), in f16 with head dim 64 as the
// builder hands it over after lower_precision: q, k and v run as one linear and compute what the
// original computes on random inputs, with and without a mask or biases; fold_attention_layout
// then reads them as strided views of that linear's output; linears with another reader,
// non-constant weights, mixed biases or an epilogue, and attention that stays dense (f32, other
// head dims) keep their own linears; through the builder the concatenations fold, and a refitted
// engine equals a fresh build bit for bit.
#include <algorithm>
#include <cstring>
#include <map>

#include "kiln/refit.h"
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

const Shape kSwap = {0, 2, 1, 3};

struct Block {
  int64_t B = 1, L = 16, H = 2, D = 64;
  bool mask = true;  // an additive [B, 1, 1, L] mask input
  bool bias = true;  // q, k, v linears with biases
  bool weights_are_inputs = false;
  // Another reader of k's output besides its head split: 0 none, 1 an add into the block's
  // output, 2 a graph output, 3 the sdpa mask (split into heads; needs L == D).
  int k_escape = 0;
  int64_t E() const { return H * D; }
};

using Weights = std::map<std::string, Floats>;

const char* const kQkv[3][2] = {{"attn.query.weight", "attn.query.bias"},
                                {"attn.key.weight", "attn.key.bias"},
                                {"attn.value.weight", "attn.value.bias"}};
const char* const kNames[3] = {"attn.query", "attn.key", "attn.value"};

Weights block_weights(const Block& b, uint32_t seed) {
  Weights w;
  const size_t e = size_t(b.E());
  for (int i = 0; i < 3; ++i) {
    w[kQkv[i][0]] = random_floats(e * e, seed++, -0.1f, 0.1f);
    w[kQkv[i][1]] = random_floats(e, seed++, -0.5f, 0.5f);
  }
  w["attn.out.weight"] = random_floats(e * e, seed++, -0.1f, 0.1f);
  return w;
}

// The f32 network: x[B, L, E] -> q, k, v = linear(x).view(B, L, H, D).transpose(1, 2) -> sdpa
// (mask) -> transpose(1, 2).reshape(B, L, E) -> output linear. Inputs: x, the mask, then (when
// weights_are_inputs) the q, k, v weights and biases.
Graph bert_block(const Block& b, const Weights& w) {
  Graph g;
  const int64_t E = b.E();
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {b.B, b.L, E}));
  const ValueId m = b.mask ? g.add_input("mask", TensorType(DType::kF32, {b.B, 1, 1, b.L})) : kNoValue;
  Attrs split, merge, swap;
  split.set("shape", Shape{b.B, b.L, b.H, b.D});
  merge.set("shape", Shape{b.B, b.L, E});
  swap.set("perm", kSwap);
  auto heads_of = [&](ValueId y) { return g.add_node1(OpKind::kPermute, {g.add_node1(OpKind::kReshape, {y}, split)}, swap); };
  std::vector<ValueId> heads, projections;
  for (int i = 0; i < 3; ++i) {
    std::vector<ValueId> ins = {x};
    for (int j = 0; j < (b.bias ? 2 : 1); ++j) {
      const Shape shape = j == 0 ? Shape{E, E} : Shape{E};
      ins.push_back(b.weights_are_inputs ? g.add_input(kQkv[i][j], TensorType(DType::kF32, shape))
                                         : f32_constant(g, kQkv[i][j], shape, w.at(kQkv[i][j]), true));
    }
    projections.push_back(g.add_node1(OpKind::kLinear, ins, {}, kNames[i]));
    heads.push_back(heads_of(projections.back()));
  }
  if (b.k_escape == 3) {
    heads.push_back(heads_of(projections[1]));  // [B, H, L, D] added to the scores [B, H, L, L]
  } else if (m != kNoValue) {
    heads.push_back(m);
  }
  ValueId a = g.add_node1(OpKind::kSdpa, heads, {}, "attn.sdpa");
  a = g.add_node1(OpKind::kReshape, {g.add_node1(OpKind::kPermute, {a}, swap)}, merge);
  ValueId out = g.add_node1(OpKind::kLinear, {a, f32_constant(g, "attn.out.weight", {E, E}, w.at("attn.out.weight"), true)},
                            {}, "attn.out");
  if (b.k_escape == 1) out = g.add_node1(OpKind::kAdd, {out, projections[1]});
  g.mark_output(out, "y");
  if (b.k_escape == 2) g.mark_output(projections[1], "k");
  return g;
}

Graph bert_block(const Block& b) { return bert_block(b, block_weights(b, 1)); }

// The graph as the builder hands it to fuse_sibling_linears in a build computing in f16.
Graph lowered(Graph g) {
  lower_precision(g, DType::kF16);
  fold_constants(g);
  return g;
}

Node* node_named(const Graph& g, OpKind op, const std::string& name) {
  Node* found = nullptr;
  for (const auto& n : g.nodes())
    if (n->op == op && n->name == name) {
      EXPECT_EQ(found, nullptr) << "two " << op_name(op) << " nodes named " << name;
      found = n.get();
    }
  return found;
}

// The same f16 arithmetic on the same values; only the GEMM's column blocking may differ.
void expect_same_f16(const std::vector<Floats>& got, const std::vector<Floats>& want) {
  expect_close(got, want, 2e-3f, 2e-3f);
}

// ---- the rewrite -----------------------------------------------------------------------

TEST(SiblingLinears, BertBlockRunsOneQkvLinearAndComputesTheSame) {
  for (bool mask : {true, false}) {
    for (bool bias : {true, false}) {
      Block b;
      b.mask = mask, b.bias = bias;
      const Graph network = bert_block(b);
      const Graph g = lowered(network);
      Graph f = g;
      ASSERT_TRUE(fuse_sibling_linears(f));
      f.verify();
      EXPECT_EQ(count_ops(f, OpKind::kLinear), 2) << f.to_string();  // qkv and the output projection
      EXPECT_EQ(count_ops(f, OpKind::kSlice), 3);
      EXPECT_EQ(count_ops(f, OpKind::kConcat), bias ? 2 : 1);  // left to fold_constants
      const Node* qkv = node_named(f, OpKind::kLinear, "attn.query+siblings");
      ASSERT_NE(qkv, nullptr) << f.to_string();
      const int64_t E = b.E();
      EXPECT_EQ(f.type(qkv->outputs[0]).shape(), (Shape{b.B, b.L, 3 * E}));
      EXPECT_EQ(f.type(qkv->inputs[1]).shape(), (Shape{3 * E, E}));
      EXPECT_EQ(qkv->inputs.size(), bias ? 3u : 2u);
      // Each slice keeps its linear's name and takes that linear's columns of the fused output.
      for (int64_t i = 0; i < 3; ++i) {
        const Node* s = node_named(f, OpKind::kSlice, kNames[i]);
        ASSERT_NE(s, nullptr) << f.to_string();
        EXPECT_EQ(s->inputs[0], qkv->outputs[0]);
        EXPECT_EQ(s->attrs.get_int("axis"), 2);
        EXPECT_EQ(s->attrs.get_int("start"), i * E);
        EXPECT_EQ(s->attrs.get_int("end"), (i + 1) * E);
      }
      EXPECT_FALSE(fuse_sibling_linears(f)) << "a second run changes nothing";
      const auto in = random_inputs(network, mask ? 3 : 4);
      const auto want = run_plain(g, in);
      expect_same_f16(run_plain(f, in), want);
      fold_constants(f);  // as the builder does later: the concatenations become constants
      EXPECT_EQ(count_ops(f, OpKind::kConcat), 0) << f.to_string();
      expect_same_f16(run_plain(f, in), want);
    }
  }
}

// After the fusion, fold_attention_layout (default filter) reads q, k and v as views of the
// fused output: no slice or permute is left between the qkv linear and sdpa, nor between sdpa
// and the output projection.
TEST(SiblingLinears, FoldAttentionLayoutReadsTheSlicesAsViews) {
  for (bool mask : {true, false}) {
    Block b;
    b.mask = mask;
    const Graph network = bert_block(b);
    const Graph g = lowered(network);
    Graph f = g;
    ASSERT_TRUE(fuse_sibling_linears(f));
    ASSERT_TRUE(fold_attention_layout(f));
    f.verify();
    EXPECT_EQ(count_ops(f, OpKind::kSlice), 0) << f.to_string();
    EXPECT_EQ(count_ops(f, OpKind::kPermute), 0) << f.to_string();
    const Node* qkv = node_named(f, OpKind::kLinear, "attn.query+siblings");
    const Node* sdpa = node_named(f, OpKind::kSdpa, "attn.sdpa");
    ASSERT_NE(qkv, nullptr) << f.to_string();
    ASSERT_NE(sdpa, nullptr) << f.to_string();
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(sdpa->inputs[i], qkv->outputs[0]) << f.to_string();
    const auto in = random_inputs(network, 7);
    expect_same_f16(run_plain(f, in), run_plain(g, in));
  }
}

// ---- what stays -------------------------------------------------------------------------

// k's output also read by an add, as a graph output, or (split into heads) as the sdpa mask:
// k keeps its linear, since its slice would stay a copy; q and v, read only through their head
// splits, still fuse. With k the only sibling of q, nothing changes.
TEST(SiblingLinears, KeepsLinearsWhoseOutputsHaveOtherReaders) {
  for (int escape : {1, 2, 3}) {
    Block b;
    b.L = b.D;  // for the mask made of k (escape 3)
    b.k_escape = escape;
    const Graph network = bert_block(b);
    const Graph g = lowered(network);
    Graph f = g;
    ASSERT_TRUE(fuse_sibling_linears(f)) << "escape " << escape;
    f.verify();
    EXPECT_EQ(count_ops(f, OpKind::kLinear), 3) << f.to_string();
    EXPECT_EQ(count_ops(f, OpKind::kSlice), 2);
    EXPECT_NE(node_named(f, OpKind::kLinear, "attn.key"), nullptr) << f.to_string();
    EXPECT_NE(node_named(f, OpKind::kLinear, "attn.query+siblings"), nullptr) << f.to_string();
    const auto in = random_inputs(network, uint32_t(20 + escape));
    expect_same_f16(run_plain(f, in), run_plain(g, in));

    // Without v's linear (sdpa reads q's heads as v), q and k are no group.
    Graph h = g;
    Node* sdpa = node_named(h, OpKind::kSdpa, "attn.sdpa");
    ASSERT_NE(sdpa, nullptr);
    sdpa->inputs[2] = sdpa->inputs[0];
    eliminate_dead_code(h);
    ASSERT_EQ(count_ops(h, OpKind::kLinear), 3) << h.to_string();
    const std::string before = h.to_string();
    EXPECT_FALSE(fuse_sibling_linears(h)) << "escape " << escape;
    EXPECT_EQ(h.to_string(), before);
  }
}

TEST(SiblingLinears, KeepsLinearsWithoutConstantWeightsOrWithAnEpilogue) {
  Block inputs;
  inputs.weights_are_inputs = true;
  Graph g = lowered(bert_block(inputs));
  EXPECT_FALSE(fuse_sibling_linears(g)) << g.to_string();
  EXPECT_EQ(count_ops(g, OpKind::kLinear), 4);

  // k and v without a bias while q has one; q with an activation; q with a residual: k and v
  // still group, q keeps its linear.
  for (int variant : {0, 1, 2}) {
    Graph h = lowered(bert_block(Block{}));
    Node* q = node_named(h, OpKind::kLinear, "attn.query");
    ASSERT_NE(q, nullptr);
    if (variant == 0) {
      for (const char* name : {"attn.key", "attn.value"}) node_named(h, OpKind::kLinear, name)->inputs.resize(2);
    } else if (variant == 1) {
      q->attrs.set("activation", std::string("relu"));
    } else {
      q->inputs.push_back(h.add_input("r", h.type(q->outputs[0])));
    }
    h.verify();
    ASSERT_TRUE(fuse_sibling_linears(h)) << "variant " << variant;
    h.verify();
    EXPECT_EQ(count_ops(h, OpKind::kLinear), 3) << h.to_string();
    EXPECT_EQ(count_ops(h, OpKind::kSlice), 2);
    EXPECT_NE(node_named(h, OpKind::kLinear, "attn.query"), nullptr) << h.to_string();
    EXPECT_NE(node_named(h, OpKind::kLinear, "attn.key+siblings"), nullptr) << h.to_string();
  }
}

// Attention that fold_attention_layout leaves with dense operands would keep the slices as
// copies: f32, or a head dim the fused kernels do not serve.
TEST(SiblingLinears, KeepsLinearsFeedingDenseAttention) {
  Graph f32 = bert_block(Block{});
  EXPECT_FALSE(fuse_sibling_linears(f32));
  Block narrow;
  narrow.H = 4, narrow.D = 40;
  Graph f16 = lowered(bert_block(narrow));
  EXPECT_FALSE(fuse_sibling_linears(f16));
  EXPECT_EQ(count_ops(f16, OpKind::kLinear), 4);
  // An f32 build on the CPU: the pass reports no change and the engine computes the network.
  const Graph network = bert_block(Block{});
  auto e = Builder().build(network);
  EXPECT_NE(e->build_log().find("pass fuse_sibling_linears: no change"), std::string::npos) << e->build_log();
  const auto in = random_inputs(network, 9);
  expect_close(run_engine(e, in), run_plain(network, in), 1e-5f, 1e-5f);
}

// Linears over different values (x, and x2 = a [.., K'] projection of x: K differs) are no
// group, even when each output feeds sdpa through a head split; k and v, both over x2, are.
TEST(SiblingLinears, KeepsLinearsOverDifferentInputs) {
  Graph g;
  const int64_t B = 1, L = 8, H = 2, D = 64, E = H * D, K2 = 96;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {B, L, E}));
  const ValueId x2 = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "p", {K2, E}, 1, -0.1f, 0.1f)}, {}, "proj");
  Attrs split, swap;
  split.set("shape", Shape{B, L, H, D});
  swap.set("perm", kSwap);
  std::vector<ValueId> heads;
  const ValueId srcs[3] = {x, x2, x2};
  const int64_t ks[3] = {E, K2, K2};
  for (int i = 0; i < 3; ++i) {
    const ValueId w = f32_weight(g, kQkv[i][0], {E, ks[i]}, uint32_t(2 + i), -0.1f, 0.1f);
    const ValueId y = g.add_node1(OpKind::kLinear, {srcs[i], w}, {}, kNames[i]);
    heads.push_back(g.add_node1(OpKind::kPermute, {g.add_node1(OpKind::kReshape, {y}, split)}, swap));
  }
  g.mark_output(g.add_node1(OpKind::kSdpa, heads), "y");
  const Graph low = lowered(g);
  Graph f = low;
  ASSERT_TRUE(fuse_sibling_linears(f));
  f.verify();
  EXPECT_EQ(count_ops(f, OpKind::kLinear), 3) << f.to_string();
  EXPECT_EQ(count_ops(f, OpKind::kSlice), 2);
  EXPECT_NE(node_named(f, OpKind::kLinear, "attn.query"), nullptr) << f.to_string();
  EXPECT_NE(node_named(f, OpKind::kLinear, "attn.key+siblings"), nullptr) << f.to_string();
  const auto in = random_inputs(g, 5);
  expect_same_f16(run_plain(f, in), run_plain(low, in));
}

// ---- through the builder ------------------------------------------------------------------

BuilderConfig f16_build() {
  BuilderConfig cfg;
  cfg.enabled_precisions = {DType::kF16};
  return cfg;
}

// A CPU build computing in f16 runs q, k and v as one linear whose weight and bias are folded
// constants, computes what the unfused graph computes, and leaves no slice or permute around
// the attention.
TEST(SiblingLinears, F16BuildRunsOneQkvLinearReadThroughViews) {
  for (bool mask : {true, false}) {
    Block b;
    b.mask = mask;
    const Graph network = bert_block(b);
    auto e = Builder(f16_build()).build(network);
    const Graph& plan = e->graph();
    EXPECT_NE(e->build_log().find("pass fuse_sibling_linears: changed"), std::string::npos) << e->build_log();
    EXPECT_EQ(count_ops(plan, OpKind::kLinear), 2) << plan.to_string();
    EXPECT_EQ(count_ops(plan, OpKind::kConcat), 0) << plan.to_string();
    const Node* qkv = node_named(plan, OpKind::kLinear, "attn.query+siblings");
    ASSERT_NE(qkv, nullptr) << plan.to_string();
    EXPECT_TRUE(plan.value(qkv->inputs[1]).is_constant());
    EXPECT_TRUE(plan.value(qkv->inputs[2]).is_constant());
    EXPECT_EQ(count_ops(plan, OpKind::kSlice), 0) << plan.to_string();
    EXPECT_EQ(count_ops(plan, OpKind::kPermute), 0) << plan.to_string();
    const auto in = random_inputs(network, 11);
    expect_same_f16(run_engine(e, in), run_plain(lowered(network), in));
    expect_close(run_engine(e, in), run_plain(network, in), 2e-2f, 2e-2f);
  }
}

// ---- refit --------------------------------------------------------------------------------

void expect_bits_equal(const Floats& got, const Floats& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
}

// The concatenated weight and bias are derived constants: a refit with new q, k, v weights and
// biases re-derives them, and the engine equals a fresh build with those weights, bit for bit.
TEST(SiblingLinears, RefitEqualsAFreshBuildBitForBit) {
  Block b;
  const Weights a = block_weights(b, 10), c = block_weights(b, 30);
  auto e = Builder(f16_build()).build(bert_block(b, a));
  ASSERT_EQ(count_ops(e->graph(), OpKind::kLinear), 2) << e->graph().to_string();
  ASSERT_TRUE(e->refittable());
  EXPECT_EQ(count_ops(*e->refit_program(), OpKind::kConcat), 2) << e->refit_program()->to_string();

  const auto in = random_inputs(bert_block(b, a), 40);
  const Floats old_y = run_engine(e, in)[0];
  Refitter r(e);
  const int64_t E = b.E();
  auto shape_of = [&](const Floats& v) { return v.size() == size_t(E) ? Shape{E} : Shape{E, E}; };
  for (const auto& [name, v] : c) r.set_weight(name, TensorType(DType::kF32, shape_of(v)), v.data());
  EXPECT_TRUE(r.missing_weights().empty());
  r.refit();
  auto fresh = Builder(f16_build()).build(bert_block(b, c));
  const Floats want = run_engine(fresh, in)[0];
  ASSERT_NE(std::memcmp(old_y.data(), want.data(), want.size() * 4), 0) << "the weights did not change the output";
  expect_bits_equal(run_engine(e, in)[0], want);
  // The fused weight is derived from all three: a new q weight alone needs k's and v's too.
  r.set_weight(kQkv[0][0], TensorType(DType::kF32, {E, E}), a.at(kQkv[0][0]).data());
  const std::vector<std::string> missing = r.missing_weights();
  EXPECT_NE(std::find(missing.begin(), missing.end(), kQkv[1][0]), missing.end());
  EXPECT_NE(std::find(missing.begin(), missing.end(), kQkv[2][0]), missing.end());
  EXPECT_EQ(std::find(missing.begin(), missing.end(), kQkv[1][1]), missing.end());
}

}  // namespace

// ---- readers that take views --------------------------------------------------------------

// SwiGLU (silu(gate(x)) * up(x)) and a rotated half of a third projection (rotate_half's slices
// and concat): with pointwise fusion following, the three linears run as one and, after
// fuse_pointwise and fold_input_views, the fused kernels and the concat read the slices where
// they lie; without it, each keeps its own linear.
TEST(SiblingLinears, PointwiseReadersTakeSlicesAsViews) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 6, 32}));
  const ValueId gate = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "gate", {48, 32}, 1)});
  const ValueId up = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "up", {48, 32}, 2)});
  g.mark_output(g.add_node1(OpKind::kMul, {g.add_node1(OpKind::kSilu, {gate}), up}), "mlp");
  const ValueId r = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "rot", {16, 32}, 3)});
  auto half = [&](int64_t start) {
    Attrs a;
    a.set("axis", int64_t{2});
    a.set("start", start);
    a.set("end", start + 8);
    a.set("step", int64_t{1});
    return g.add_node1(OpKind::kSlice, {r}, a);
  };
  Attrs last;
  last.set("axis", int64_t{2});
  const ValueId rotated = g.add_node1(OpKind::kConcat, {g.add_node1(OpKind::kNeg, {half(8)}), half(0)}, last);
  g.mark_output(g.add_node1(OpKind::kAdd, {r, rotated}), "rot");

  Graph plain = g;
  EXPECT_FALSE(fuse_sibling_linears(plain, fused_attention_shape, false));

  Graph f = g;
  ASSERT_TRUE(fuse_sibling_linears(f, fused_attention_shape, true));
  f.verify();
  EXPECT_EQ(count_ops(f, OpKind::kLinear), 1) << f.to_string();
  fold_constants(f);
  fuse_pointwise(f);
  fold_input_views(f);
  f.verify();
  EXPECT_EQ(count_ops(f, OpKind::kSlice), 0) << f.to_string();
  const auto in = random_inputs(g, 9);
  expect_close(run_plain(f, in), run_plain(g, in), 1e-5f, 1e-6f);
}
