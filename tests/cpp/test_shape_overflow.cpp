// Shape rules on attributes out of range (from an import or a crafted engine file): every
// computation that would overflow int64 is kInvalidArgument naming the op and the cause, and a
// file carrying such an attribute is refused as kCorrupted. Extreme values that are in range
// (a slice step past the end of its axis) still load and run correctly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "tests/cpp/engine_file_test_util.h"
#include "tests/cpp/error_test_util.h"

using namespace kiln;
using Ints = std::vector<int64_t>;

namespace {

constexpr int64_t kHuge = int64_t(1) << 62;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

Attrs conv_attrs(Ints stride, Ints padding, Ints dilation) {
  Attrs a;
  a.set("stride", std::move(stride));
  a.set("padding", std::move(padding));
  a.set("dilation", std::move(dilation));
  return a;
}

// The message of the kInvalidArgument that adding `op` to a graph of x = f32[shape] (and a
// weight of `wshape` when given) throws.
std::string refusal(OpKind op, const Ints& shape, const Attrs& attrs, const Ints& wshape = {}) {
  Graph g;
  std::vector<ValueId> in = {g.add_input("x", TensorType(DType::kF32, shape))};
  if (!wshape.empty()) in.push_back(engine_file_test::weight(g, "w", wshape, 1));
  std::string msg;
  EXPECT_EQ(test::code_of([&] { g.add_node1(op, in, attrs); }, &msg), ErrorCode::kInvalidArgument) << msg;
  return msg;
}

void expect_overflow(const std::string& msg, const char* op) {
  EXPECT_NE(msg.find(op), std::string::npos) << msg;
  EXPECT_NE(msg.find("overflows int64"), std::string::npos) << msg;
}

Attrs slice_attrs(int64_t start, int64_t end, int64_t step) {
  Attrs a;
  a.set("axis", int64_t{1});
  a.set("start", start);
  a.set("end", end);
  a.set("step", step);
  return a;
}

// The offset of the first i64 of the int-list attribute `key` (key, kind 4, u32 n, i64...).
size_t int_list_at(const Bytes& b, const std::string& key) {
  Bytes want(4 + key.size() + 1);
  engine_file_test::put_le(want, 0, key.size(), 4);
  std::memcpy(want.data() + 4, key.data(), key.size());
  want.back() = 4;
  auto it = std::search(b.begin(), b.end(), want.begin(), want.end());
  EXPECT_NE(it, b.end()) << "no attribute " << key;
  return size_t(it - b.begin()) + want.size() + 4;
}

}  // namespace

TEST(ShapeOverflow, ConvDilationPaddingAndStride) {
  const Ints x = {1, 2, 8, 8}, w = {3, 2, 3, 3};
  expect_overflow(refusal(OpKind::kConv, x, conv_attrs({1, 1}, {0, 0}, {kHuge, 1}), w), "conv");
  expect_overflow(refusal(OpKind::kConv, x, conv_attrs({1, 1}, {1, kHuge}, {1, 1}), w), "conv");
  expect_overflow(refusal(OpKind::kConv, x, conv_attrs({1, 1}, {0, 0}, {kMax, 1}), w), "conv");
  const Ints wt = {2, 3, 3, 3};
  expect_overflow(refusal(OpKind::kConvTranspose, x, conv_attrs({kHuge, 1}, {0, 0}, {1, 1}), wt), "conv_transpose");
  expect_overflow(refusal(OpKind::kConvTranspose, x, conv_attrs({1, 1}, {0, 0}, {1, kMax}), wt), "conv_transpose");
  Attrs groups = conv_attrs({1, 1}, {0, 0}, {1, 1});
  groups.set("groups", kHuge);
  expect_overflow(refusal(OpKind::kConv, {1, 0, 8, 8}, groups, {0, 2, 3, 3}), "conv");
  // In range, the same attributes still work.
  Graph g;
  ValueId in = g.add_input("x", TensorType(DType::kF32, x));
  ValueId y =
      g.add_node1(OpKind::kConv, {in, engine_file_test::weight(g, "w", w, 1)}, conv_attrs({2, 2}, {1, 1}, {2, 2}));
  EXPECT_EQ(g.type(y).shape(), (Ints{1, 3, 3, 3}));
}

TEST(ShapeOverflow, PoolPadSplitAndOutputSize) {
  Attrs pool;
  pool.set("kernel", Ints{3, 3});
  pool.set("dilation", Ints{kHuge, 1});
  expect_overflow(refusal(OpKind::kMaxPool, {1, 1, 8, 8}, pool), "max_pool");
  pool.set("dilation", Ints{1, 1});
  pool.set("stride", Ints{kMax, 1});
  pool.set("ceil_mode", true);
  expect_overflow(refusal(OpKind::kMaxPool, {1, 1, 8, 8}, pool), "max_pool");

  Attrs pad;
  pad.set("pads", Ints{0, 0, kMax, 1});
  expect_overflow(refusal(OpKind::kPad, {2, 3}, pad), "pad");
  Attrs split;
  split.set("axis", int64_t{0});
  split.set("sizes", Ints{1, kMax});
  expect_overflow(refusal(OpKind::kSplit, {4, 3}, split), "split");

  // Extents each fine whose byte count is not: f64[2^61] needs 2^64 bytes.
  Attrs full;
  full.set("shape", Ints{int64_t(1) << 61});
  full.set("value", 0.0);
  full.set("dtype", DType::kF64);
  Graph g;
  std::string msg;
  EXPECT_EQ(test::code_of([&] { g.add_node1(OpKind::kFull, {}, full); }, &msg), ErrorCode::kInvalidArgument);
  expect_overflow(msg, "full");
}

TEST(ShapeOverflow, HugeSliceStepsStayCorrect) {
  for (int64_t step : {int64_t(7), kHuge, kMax}) {
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 6}));
    ValueId y = g.add_node1(OpKind::kSlice, {x}, slice_attrs(2, 6, step));
    EXPECT_EQ(g.type(y).shape(), (Ints{2, 1}));
    g.mark_output(g.add_node1(OpKind::kNeg, {y}), "y");
    const Bytes file = Builder().build(g)->serialize();
    auto engine = Engine::deserialize(file.data(), file.size());
    std::vector<float> in(12), out(2);
    for (size_t i = 0; i < in.size(); ++i) in[i] = float(i);
    engine->create_execution_context()->execute({in.data()}, {out.data()});
    EXPECT_EQ(out, (std::vector<float>{-2.0f, -8.0f})) << "step " << step;
  }
}

// A conv engine whose file says dilation 2^62 (checksum recomputed) is refused, not built.
TEST(ShapeOverflow, FilesWithOutOfRangeAttributesAreCorrupted) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {1, 2, 8, 8}));
  ValueId c = g.add_node1(OpKind::kConv, {x, engine_file_test::weight(g, "w", {3, 2, 3, 3}, 1)},
                          conv_attrs({1, 1}, {1, 1}, {1, 1}));
  g.mark_output(c, "y");
  const Bytes file = Builder().build(g)->serialize();
  // Dilation and padding overflow the output size; a huge stride is in range, and its output
  // size differs from the stored one.
  for (const char* key : {"dilation", "padding", "stride"})
    for (int64_t v : {kHuge, kMax}) {
      Bytes b = file;
      engine_file_test::put_le(b, int_list_at(b, key), uint64_t(v), 8);
      engine_file_test::reseal(b);
      std::string msg;
      EXPECT_EQ(engine_file_test::code_of(b, &msg), ErrorCode::kCorrupted) << key << " " << v << ": " << msg;
      const bool overflows = std::string(key) != "stride";
      EXPECT_NE(msg.find(overflows ? "conv: the output size" : "is stored as"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("overflows int64") != std::string::npos, overflows) << msg;
    }
}
