// interleave_concats (src/passes/interleave_concats.cpp): a permute that moves the part axis of a
// concat's output (a channel shuffle over channels-last tensors) becomes one concat along the
// new axis that computes what the graph computed; permutes that also reorder other dims, parts
// of unequal extents and concats that something else reads stay.
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

TEST(InterleaveConcats, AShuffleAfterAConcatIsOneConcat) {
  for (int64_t parts : {2, 3}) {
    Graph g;
    std::vector<ValueId> ins;
    for (int64_t i = 0; i < parts; ++i)  // (GCC 12 warns on "p" + std::to_string(...))
      ins.push_back(g.add_input(std::string("p").append(std::to_string(i)), TensorType(DType::kF32, {2, 3, 4, 5})));
    ValueId c = concat(g, ins, 3);                                                 // [2, 3, 4, parts * 5]
    ValueId t = permute(g, reshape(g, c, {2, 3, 4, parts, 5}), {0, 1, 2, 4, 3});  // [.., 5, parts]
    g.mark_output(g.add_node1(OpKind::kRelu, {reshape(g, t, {2, 3, 4, parts * 5})}), "y");
    Graph f = pass_applied(g, interleave_concats, 1 + uint32_t(parts), 0.0f);
    EXPECT_EQ(count_ops(f, OpKind::kPermute), 0) << f.to_string();
    ASSERT_EQ(count_ops(f, OpKind::kConcat), 1) << f.to_string();
    for (const auto& n : f.nodes())
      if (n->op == OpKind::kConcat) {
        EXPECT_EQ(n->attrs.get_int("axis"), 4);
      }
  }
  {  // the parts dim moved to the front of others that keep their order
    Graph g;
    ValueId a = g.add_input("a", TensorType(DType::kF32, {3, 4})),
            b = g.add_input("b", TensorType(DType::kF32, {3, 4}));
    g.mark_output(permute(g, reshape(g, concat(g, {a, b}, 1), {3, 2, 4}), {1, 0, 2}), "y");
    Graph f = pass_applied(g, interleave_concats, 4, 0.0f);
    EXPECT_EQ(count_ops(f, OpKind::kPermute), 0) << f.to_string();
  }
}

TEST(InterleaveConcats, OtherPermutesAndConcatsStay) {
  auto unchanged = [](const Graph& g) {
    Graph f = g;
    EXPECT_FALSE(interleave_concats(f)) << g.to_string();
  };
  {  // the permute also swaps two other dims
    Graph g;
    ValueId a = g.add_input("a", TensorType(DType::kF32, {2, 3, 4})),
            b = g.add_input("b", TensorType(DType::kF32, {2, 3, 4}));
    g.mark_output(permute(g, reshape(g, concat(g, {a, b}, 2), {2, 3, 2, 4}), {1, 0, 3, 2}), "y");
    unchanged(g);
  }
  {  // parts of unequal extents
    Graph g;
    ValueId a = g.add_input("a", TensorType(DType::kF32, {3, 2})),
            b = g.add_input("b", TensorType(DType::kF32, {3, 6}));
    g.mark_output(permute(g, reshape(g, concat(g, {a, b}, 1), {3, 2, 4}), {0, 2, 1}), "y");
    unchanged(g);
  }
  {  // the concat is a graph output too
    Graph g;
    ValueId a = g.add_input("a", TensorType(DType::kF32, {3, 4})),
            b = g.add_input("b", TensorType(DType::kF32, {3, 4}));
    ValueId c = concat(g, {a, b}, 1);
    g.mark_output(c, "c");
    g.mark_output(permute(g, reshape(g, c, {3, 2, 4}), {0, 2, 1}), "y");
    unchanged(g);
  }
}

}  // namespace
