// Borrowed weights (kiln/engine.h BorrowedWeight): an engine reads a plan weight where its owner
// keeps it when the bytes fit, copies it when they do not, keeps the owner alive, never writes
// into it (a refit makes the weight the engine's own again), and serializes the weights it was
// built with. On the CPU, where the plan's bytes are the engine's copy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "kiln/kiln.h"
#include "kiln/refit.h"
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using kiln::test::random_floats;
using Floats = std::vector<float>;

constexpr int64_t kRows = 4, kCols = 8;
const TensorType kType(DType::kF32, {kRows, kCols});

// y = (x + w) * s: w [4, 8] and s [8] are weights.
Graph add_mul(const Floats& w, const Floats& s) {
  Graph g;
  const ValueId x = g.add_input("x", kType);
  const ValueId wv = g.add_constant("w", kType, w.data(), w.size() * 4, true);
  const ValueId sv = g.add_constant("s", TensorType(DType::kF32, {kCols}), s.data(), s.size() * 4, true);
  g.mark_output(g.add_node1(OpKind::kMul, {g.add_node1(OpKind::kAdd, {x, wv}), sv}), "y");
  return g;
}

std::shared_ptr<Engine> build(const Graph& g, const BorrowedWeights& borrowed) {
  BuilderConfig c;
  c.fuse_pointwise = false;
  return Builder(c).build(g, borrowed);
}

Floats run(ExecutionContext& ctx, const Floats& x) {
  Floats y(size_t(kRows * kCols), std::nanf(""));
  ctx.execute({x.data()}, {y.data()});
  return y;
}

Floats expected(const Floats& x, const Floats& w, const Floats& s) {
  Floats y(x.size());
  for (size_t i = 0; i < y.size(); ++i) y[i] = (x[i] + w[i]) * s[i % size_t(kCols)];
  return y;
}

// A weight buffer (aligned for any backend) whose owner the engine may keep.
struct Owned {
  struct alignas(256) Data {
    float v[kRows * kCols];
  };
  std::shared_ptr<Data> data = std::make_shared<Data>();
  explicit Owned(uint32_t seed) { set(random_floats(size_t(kRows * kCols), seed)); }
  Floats values() const { return Floats(data->v, data->v + kRows * kCols); }
  void set(const Floats& f) { std::memcpy(data->v, f.data(), sizeof(data->v)); }
  void add_one() {
    for (float& x : data->v) x += 1.0f;
  }
  BorrowedWeight borrow(size_t offset_floats = 0, size_t size = kType.nbytes()) const {
    return {data->v + offset_floats, size, data};
  }
};

TEST(BorrowedWeights, ReadInPlaceAndOwnerKeptAlive) {
  Owned w(1);
  const Floats s = random_floats(kCols, 2), x = random_floats(size_t(kRows * kCols), 3);
  auto e = build(add_mul(w.values(), s), {{"w", w.borrow()}});
  EXPECT_EQ(e->borrowed_bytes(), kType.nbytes());
  EXPECT_NE(e->build_log().find("weights read in place"), std::string::npos) << e->build_log();
  EXPECT_GT(w.data.use_count(), 1) << "the engine must keep the owner alive";
  auto ctx = e->create_execution_context();
  EXPECT_EQ(run(*ctx, x), expected(x, w.values(), s));
  // The engine reads the owner's bytes, not a copy: a change there shows in the next call.
  w.add_one();
  EXPECT_EQ(run(*ctx, x), expected(x, w.values(), s));
}

TEST(BorrowedWeights, CopiedWhenTheBytesDoNotFit) {
  Owned w(4);
  const Floats s = random_floats(kCols, 5), x = random_floats(size_t(kRows * kCols), 6);
  const Floats original = w.values();
  // The wrong size, an unaligned address, a name that is no weight of the plan, a null address.
  const std::vector<BorrowedWeights> offers = {{{"w", w.borrow(0, kType.nbytes() - 4)}},
                                               {{"w", w.borrow(1)}},
                                               {{"x", w.borrow()}},
                                               {{"w", BorrowedWeight{nullptr, kType.nbytes(), w.data}}}};
  for (const BorrowedWeights& offer : offers) {
    auto e = build(add_mul(w.values(), s), offer);
    EXPECT_EQ(e->borrowed_bytes(), 0u);
    auto ctx = e->create_execution_context();
    w.add_one();  // the engine's copy does not change
    EXPECT_EQ(run(*ctx, x), expected(x, original, s));
    w.set(original);
  }
}

TEST(BorrowedWeights, RefitNeverWritesIntoTheOwnersBytes) {
  Owned w(7);
  const Floats s = random_floats(kCols, 8), x = random_floats(size_t(kRows * kCols), 9);
  const Floats original = w.values(), fresh = random_floats(size_t(kRows * kCols), 10);
  auto e = build(add_mul(w.values(), s), {{"w", w.borrow()}});
  auto before = e->create_execution_context();  // made before the refit: takes the weight's new address
  EXPECT_EQ(run(*before, x), expected(x, original, s));
  Refitter r(e);
  r.set_weight("w", kType, fresh.data());
  r.refit();
  EXPECT_EQ(w.values(), original) << "a refit wrote into a borrowed weight";
  EXPECT_EQ(e->borrowed_bytes(), 0u);
  EXPECT_EQ(run(*before, x), expected(x, fresh, s));
  w.add_one();  // no longer read
  EXPECT_EQ(run(*before, x), expected(x, fresh, s));
  EXPECT_EQ(run(*e->create_execution_context(), x), expected(x, fresh, s));
}

TEST(BorrowedWeights, SerializeWritesTheWeightsTheEngineWasBuiltWith) {
  Owned w(11);
  const Floats s = random_floats(kCols, 12), x = random_floats(size_t(kRows * kCols), 13);
  const Floats original = w.values();
  auto e = build(add_mul(w.values(), s), {{"w", w.borrow()}});
  const Bytes file = e->serialize();
  auto loaded = Engine::deserialize(file.data(), file.size());
  EXPECT_EQ(loaded->borrowed_bytes(), 0u);
  w.add_one();  // the loaded engine owns its weights
  EXPECT_EQ(run(*loaded->create_execution_context(), x), expected(x, original, s));
}

}  // namespace
