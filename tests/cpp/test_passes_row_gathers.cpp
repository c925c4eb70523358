// Row gathers (src/passes/row_gathers.cpp): a chain of reshapes and permutes that moves whole
// rows becomes one index_select of the rows and computes what the chain computed; chains of one
// copy, and chains that split a row, stay; the layout propagation gathers through a reshape no
// other rule passes (MaxViT's window partition read as a grid), so that a conv region with
// window and grid partitions between its convs stays channels-last.
#include <numeric>

#include "src/passes/pass_util.h"
#include "src/passes/sink_permutes.h"
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;
using passes::Perm;

int64_t moving_permutes(const Graph& g) {
  int64_t n = 0;
  for (const auto& node : g.nodes()) n += node->op == OpKind::kPermute && !g.value(node->inputs[0]).is_constant();
  return n;
}

ValueId relu(Graph& g, ValueId x) { return g.add_node1(OpKind::kRelu, {x}); }

// MaxViT between its block and grid attention: tokens of 4 x 4 windows of 3 x 3 pixels
// ([B, 16, 9, C]) to an image (through channels-first, as the model writes it), and the image's
// grid partition (3 x 3 cells of 4 x 4 pixels) back to tokens.
ValueId window_to_grid(Graph& g, ValueId tokens, int64_t b, int64_t c) {
  ValueId v = reshape(g, tokens, {b, 4, 4, 3, 3, c});
  v = reshape(g, permute(g, v, {0, 5, 1, 3, 2, 4}), {b, c, 12, 12});
  v = reshape(g, permute(g, reshape(g, v, {b, c, 3, 4, 3, 4}), {0, 2, 4, 3, 5, 1}), {b, 9, 16, c});
  return permute(g, v, {0, 2, 1, 3});
}

TEST(RowGathers, AWindowPartitionReadAsAGridIsOneGather) {
  for (int64_t b : {1, 2}) {
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {b, 16, 9, 8}));
    g.mark_output(relu(g, window_to_grid(g, relu(g, x), b, 8)), "y");
    ASSERT_EQ(moving_permutes(g), 3);
    Graph f = pass_applied(g, chains_to_row_gathers, 1 + uint32_t(b), 0.0f);
    EXPECT_EQ(moving_permutes(f), 0) << f.to_string();
    EXPECT_EQ(count_ops(f, OpKind::kIndexSelect), 1) << f.to_string();
    for (const auto& n : f.nodes())
      if (n->op == OpKind::kIndexSelect) {  // rows of 8 channels, one block per batch row
        EXPECT_EQ(f.type(n->inputs[0]).shape(), (Shape{b, 144, 8}));
        EXPECT_EQ(n->attrs.get_int("axis"), 1);
      }
  }
}

// Swin's shifted windows: a roll of H and W (two index_selects) and the window partition, whose
// output merges the batch with the windows ([B * 4, 9, C]): one gather per batch row.
TEST(RowGathers, AShiftedWindowPartitionGathersPerBatchRow) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 6, 6, 8}));
  const std::vector<int64_t> roll = {2, 3, 4, 5, 0, 1};
  ValueId shift = g.add_constant("", TensorType(DType::kI64, {6}), roll.data(), roll.size() * 8);
  ValueId v = relu(g, x);
  for (int64_t axis : {1, 2}) {
    Attrs a;
    a.set("axis", axis);
    v = g.add_node1(OpKind::kIndexSelect, {v, shift}, a);
  }
  v = permute(g, reshape(g, v, {2, 2, 3, 2, 3, 8}), {0, 1, 3, 2, 4, 5});
  g.mark_output(relu(g, reshape(g, v, {8, 9, 8})), "y");
  Graph f = pass_applied(g, chains_to_row_gathers, 5, 0.0f);
  EXPECT_EQ(moving_permutes(f), 0) << f.to_string();
  ASSERT_EQ(count_ops(f, OpKind::kIndexSelect), 1) << f.to_string();
  for (const auto& n : f.nodes())
    if (n->op == OpKind::kIndexSelect) {
      EXPECT_EQ(f.type(n->inputs[0]).shape(), (Shape{2, 36, 8}));
    }
}

TEST(RowGathers, ChainsOfOneCopyOrOfSplitRowsStay) {
  {  // one permute that keeps the channels innermost: already one copy
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4, 3, 4, 3, 8}));
    g.mark_output(relu(g, reshape(g, permute(g, relu(g, x), {0, 1, 3, 2, 4, 5}), {2, 16, 9, 8})), "y");
    Graph f = g;
    EXPECT_FALSE(chains_to_row_gathers(f));
  }
  {  // two permutes that leave the rows of the innermost dim in another dim
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 8, 6, 8}));
    ValueId v = permute(g, relu(g, x), {0, 3, 1, 2});
    g.mark_output(relu(g, permute(g, reshape(g, v, {2, 8, 3, 16}), {0, 2, 1, 3})), "y");
    Graph f = g;
    EXPECT_FALSE(chains_to_row_gathers(f));
  }
  {  // rows of 3 f32 (12 bytes): no whole 16-byte word
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4, 4, 3}));
    ValueId v = permute(g, permute(g, relu(g, x), {0, 2, 1, 3}), {1, 0, 2, 3});
    g.mark_output(relu(g, v), "y");
    Graph f = g;
    EXPECT_FALSE(chains_to_row_gathers(f));
  }
}

TEST(RowGathers, ACompositeThatMovesNothingIsAReshape) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 6, 5, 4}));
  ValueId v = permute(g, permute(g, relu(g, x), {0, 2, 1, 3}), {0, 2, 1, 3});
  g.mark_output(relu(g, v), "y");
  Graph f = pass_applied(g, chains_to_row_gathers, 7, 0.0f);
  EXPECT_EQ(moving_permutes(f), 0);
  EXPECT_EQ(count_ops(f, OpKind::kIndexSelect), 0) << f.to_string();
}

// The reshape rule with row gathers: reshape(permute(v, P), S) whose permute moves v's channels
// from innermost reads a gather of v's rows, and a permute that puts the channels where S has
// them follows.
TEST(RowGathers, AReshapeNoOtherRulePassesReadsAGatherOfRows) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4, 4, 3, 3, 8}));
  ValueId p = permute(g, relu(g, x), {0, 5, 1, 3, 2, 4});
  g.mark_output(relu(g, reshape(g, p, {2, 8, 12, 12})), "y");
  Graph f = g;
  size_t pos = 0;
  while (f.nodes()[pos]->op != OpKind::kReshape) ++pos;
  EXPECT_FALSE(passes::sink_permute(f, pos, true)) << "no rule without row gathers";
  ASSERT_TRUE(passes::sink_permute(f, pos, true, true));
  eliminate_dead_code(f);
  f.verify();
  const auto in = random_inputs(g, 9);
  expect_close(run_plain(f, in), run_plain(g, in), 0.0f, 0.0f);
  EXPECT_EQ(count_ops(f, OpKind::kIndexSelect), 1) << f.to_string();
  ASSERT_EQ(moving_permutes(f), 1) << f.to_string();
  for (const auto& n : f.nodes())
    if (n->op == OpKind::kPermute) {
      EXPECT_EQ(passes::perm_of(*n), (Perm{0, 3, 1, 2})) << f.to_string();  // [2, 12, 12, 8] -> NCHW
    }
}

// Random chains of permutes, reshapes (a dim split in two, or two neighbours merged) and
// index_selects over small shapes: wherever the pass or a reshape rule (row gathers included)
// rewrites one, the graph computes exactly what it did (every value is a copy of an input
// element).
TEST(RowGathers, RandomChainsComputeWhatTheyComputed) {
  std::mt19937 rng(17);
  auto pick = [&](int64_t n) { return int64_t(rng() % uint64_t(n)); };
  int rewritten = 0, gathered = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    Graph g;
    Shape shape;
    for (int64_t d = 0, rank = 2 + pick(3); d < rank; ++d) shape.push_back(1 + pick(4));
    shape.push_back(4 * (1 + pick(3)));
    ValueId v = relu(g, g.add_input("x", TensorType(DType::kF32, shape)));
    for (int step = 0, steps = 2 + int(pick(4)); step < steps; ++step) {
      Shape s = g.type(v).shape();
      const auto r = size_t(s.size());
      const int64_t kind = pick(4);
      if (kind == 0 && r > 1) {  // a permute, the last dim moved with probability 1/2
        Perm p(r);
        std::iota(p.begin(), p.end(), 0);
        std::shuffle(p.begin(), p.end() - (pick(2) == 0 ? 1 : 0), rng);
        v = permute(g, v, p);
      } else if (kind == 1 && r > 1) {  // merge dims d and d + 1
        const auto d = size_t(pick(int64_t(r) - 1));
        s[d] *= s[d + 1];
        s.erase(s.begin() + std::ptrdiff_t(d) + 1);
        v = reshape(g, v, s);
      } else if (kind == 2) {  // split a dim by a divisor
        const auto d = size_t(pick(int64_t(r)));
        int64_t f = 1;
        for (int64_t k = 2; k <= s[d]; ++k)
          if (s[d] % k == 0 && (f == 1 || pick(2) == 0)) f = k;
        s[d] /= f;
        s.insert(s.begin() + std::ptrdiff_t(d) + 1, f);
        v = reshape(g, v, s);
      } else if (r > 1) {  // index_select along a dim other than the last
        const auto d = size_t(pick(int64_t(r) - 1));
        std::vector<int64_t> idx;
        for (int64_t k = 0, n = 1 + pick(2 * s[d]); k < n; ++k) idx.push_back(pick(s[d]));
        Attrs a;
        a.set("axis", int64_t(d));
        v = g.add_node1(
            OpKind::kIndexSelect,
            {v, g.add_constant("", TensorType(DType::kI64, {int64_t(idx.size())}), idx.data(), idx.size() * 8)}, a);
      }
    }
    g.mark_output(relu(g, v), "y");
    const auto in = random_inputs(g, uint32_t(trial));
    Graph f = g;
    if (chains_to_row_gathers(f)) {
      ++rewritten;
      f.verify();
      expect_close(run_plain(f, in), run_plain(g, in), 0.0f, 0.0f);
    }
    for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
      const Node& n = *g.nodes()[pos];
      if (n.op != OpKind::kReshape || passes::permute_of(g, n.inputs[0]) == nullptr) continue;
      Graph h = g;
      if (!passes::sink_permute(h, pos, true, true)) continue;
      gathered += count_ops(h, OpKind::kIndexSelect) > count_ops(g, OpKind::kIndexSelect);
      eliminate_dead_code(h);
      h.verify();
      expect_close(run_plain(h, in), run_plain(g, in), 0.0f, 0.0f);
    }
  }
  EXPECT_GT(rewritten, 50);  // the chains exercise the pass and the rule, not only their refusals
  EXPECT_GT(gathered, 20);
}

ValueId conv3x3(Graph& g, ValueId x, int64_t channels, uint32_t seed) {
  Attrs a = conv2d_attrs(1, 1, 1);
  return g.add_node1(
      OpKind::kConv,
      {x, f32_weight(g, std::string("w").append(std::to_string(seed)), {channels, channels, 3, 3}, seed)}, a);
}

// conv -> grid partition -> tokens (a norm) -> window merge -> per-channel scale (batch norm) ->
// conv, written channels-first as MaxViT writes it: only the graph's input and output convert.
TEST(RowGathers, WindowAndGridPartitionsBetweenConvsStayChannelsLast) {
  const int64_t b = 2, c = 8;
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {b, c, 12, 12}));
  ValueId y = conv3x3(g, x, c, 1);
  ValueId t = permute(g, reshape(g, y, {b, c, 3, 4, 3, 4}), {0, 2, 4, 3, 5, 1});  // grid cells
  t = reshape(g, t, {b, 9, 16, c});
  Attrs ln;
  ln.set("eps", 1e-5);
  ln.set("normalized_rank", int64_t{1});
  t = g.add_node1(OpKind::kLayerNorm, {t, f32_weight(g, "lw", {c}, 2), f32_weight(g, "lb", {c}, 3)}, ln);
  ValueId m = permute(g, reshape(g, t, {b, 3, 3, 4, 4, c}), {0, 5, 1, 3, 2, 4});  // back to NCHW
  m = reshape(g, m, {b, c, 12, 12});
  ValueId s = g.add_node1(OpKind::kMul, {m, f32_weight(g, "s", {c, 1, 1}, 4)});
  g.mark_output(conv3x3(g, relu(g, s), c, 5), "z");
  const Graph f = channels_last_applied(g, 11, 1e-4f);
  EXPECT_EQ(moving_permutes(f), 2) << f.to_string();  // x in, z out
  EXPECT_EQ(count_ops(f, OpKind::kIndexSelect), 2) << f.to_string();
}

}  // namespace
