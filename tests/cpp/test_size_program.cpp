// SizeProgram (kiln/size_program.h) and Engine::instance: plans optimized at a few batch sizes are
// fitted, evaluated at another size, and run there on the first engine's constants; the result
// matches an engine built for that size. Plans that differ in more than sizes (a weight's name,
// not the name of a constant that is no weight), sizes that are no multilinear function and
// instances whose parent was refitted are refused with their cause.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <span>

#include "kiln/bundle.h"
#include "kiln/kiln.h"
#include "kiln/refit.h"
#include "kiln/size_program.h"
#include "tests/cpp/error_test_util.h"
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using kiln::test::expect_error;
using kiln::test::random_floats;
using Floats = std::vector<float>;

constexpr int64_t kCols = 8;

// y = relu(reshape(reshape(x, [2b, 4]) + c, [b, 8]) * w) + the row index of x (an index constant
// an importer would compute from b): x [b, 8], c [4] a constant, w [8] a weight.
Graph network(int64_t b, const Floats& c, const Floats& w) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {b, kCols}));
  const ValueId cv = g.add_constant("c", TensorType(DType::kF32, {4}), c.data(), c.size() * 4);
  const ValueId wv = g.add_constant("w", TensorType(DType::kF32, {kCols}), w.data(), w.size() * 4, true);
  const std::vector<int64_t> last = {b - 1};
  const ValueId idx = g.add_constant("last", TensorType(DType::kI64, {1}), last.data(), 8);
  Attrs to2, back, axis;
  to2.set("shape", std::vector<int64_t>{2 * b, 4});
  back.set("shape", std::vector<int64_t>{b, kCols});
  axis.set("axis", int64_t(0));
  const ValueId r = g.add_node1(OpKind::kReshape, {x}, to2);
  const ValueId y = g.add_node1(OpKind::kReshape, {g.add_node1(OpKind::kAdd, {r, cv})}, back);
  const ValueId act = g.add_node1(OpKind::kRelu, {g.add_node1(OpKind::kMul, {y, wv})});
  g.mark_output(act, "y");
  g.mark_output(g.add_node1(OpKind::kIndexSelect, {x, idx}, axis), "last_row");
  return g;
}

struct Fixture {
  Floats c = random_floats(4, 1), w = random_floats(kCols, 2);
  BuilderConfig config;
  Graph plan(int64_t b) const { return Builder(config).optimize(network(b, c, w)); }
  SizeSample sample(int64_t b) const { return {{{"b", b}}, plan(b)}; }
};

std::vector<Floats> run(const Engine& e, const Floats& x, int64_t b, std::shared_ptr<SharedArena> arena = nullptr,
                        bool* shared = nullptr) {
  auto ctx = e.create_execution_context(true, std::move(arena));
  if (shared) *shared = ctx->shares_arena();
  std::vector<Floats> out = {Floats(size_t(b * kCols)), Floats(size_t(kCols))};
  ctx->execute({x.data()}, {out[0].data(), out[1].data()});
  return out;
}

TEST(SizeProgram, AnInstanceAtAnotherSizeComputesWhatAnEngineBuiltForItDoes) {
  Fixture f;
  std::shared_ptr<Engine> parent = Builder(f.config).build(network(3, f.c, f.w));
  const SizeProgram p = SizeProgram::fit({{{{"b", 3}}, Graph(parent->graph())}, f.sample(5), f.sample(7), f.sample(2)});
  EXPECT_EQ(p.symbols(), std::vector<std::string>{"b"});
  EXPECT_GT(p.fitted(), 0u);
  for (int64_t b : {1, 11, 64}) {
    const Graph plan = p.evaluate(parent->graph(), {{"b", b}});
    EXPECT_EQ(plan.type(plan.inputs()[0]).shape(), (std::vector<int64_t>{b, kCols}));
    std::shared_ptr<Engine> inst = parent->instance(plan, parent->kernel_options());
    ASSERT_EQ(inst->instance_of(), parent.get());
    std::shared_ptr<Engine> built = Builder(f.config).build(network(b, f.c, f.w));
    const Floats x = random_floats(size_t(b * kCols), uint32_t(b));
    const std::vector<Floats> got = run(*inst, x, b), want = run(*built, x, b);
    for (size_t o = 0; o < 2; ++o)
      for (size_t i = 0; i < want[o].size(); ++i) ASSERT_EQ(got[o][i], want[o][i]) << "b=" << b << " output " << o;
  }
}

TEST(SizeProgram, InstancesShareAnArenaSizedForTheLargestPlan) {
  Fixture f;
  std::shared_ptr<Engine> parent = Builder(f.config).build(network(3, f.c, f.w));
  const SizeProgram p = SizeProgram::fit({{{{"b", 3}}, Graph(parent->graph())}, f.sample(5), f.sample(7)});
  const size_t bound = Engine::arena_bound(p.evaluate(parent->graph(), {{"b", 64}}), 64);
  std::shared_ptr<SharedArena> arena = parent->allocate_arena(bound);
  ASSERT_EQ(arena->bytes, bound);
  for (int64_t b : {64, 9}) {
    std::shared_ptr<Engine> inst = parent->instance(p.evaluate(parent->graph(), {{"b", b}}), parent->kernel_options());
    EXPECT_LE(inst->memory_plan().arena_bytes, bound);
    const Floats x = random_floats(size_t(b * kCols), uint32_t(b));
    bool shared = false;
    EXPECT_EQ(run(*inst, x, b, arena, &shared), run(*inst, x, b));
    EXPECT_TRUE(shared) << "b=" << b;
  }
  // A plan larger than the arena: the context allocates its own.
  std::shared_ptr<Engine> big = parent->instance(p.evaluate(parent->graph(), {{"b", 200}}), parent->kernel_options());
  bool shared = true;
  run(*big, random_floats(200 * kCols, 5), 200, arena, &shared);
  EXPECT_FALSE(shared);
}

TEST(SizeProgram, RefusesPlansThatDifferInMoreThanSizes) {
  Fixture f, g;
  g.c = random_floats(4, 9);  // another constant: not a size
  SizeSample other = g.sample(7);
  try {
    SizeProgram::fit({f.sample(3), f.sample(5), other});
    FAIL() << "fitted plans with different constants";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("the plan at sample 2 differs from sample 0 in value"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("the constant's bytes"), std::string::npos) << e.what();
  }
}

TEST(SizeProgram, ConstantsThatAreNoWeightsMayBeNamedApartWeightsMayNot) {
  Fixture f;
  // Sample 2's plan with the constant `name` renamed (a refittable engine's build renames the
  // constants it derives from weights; the samples' plans keep the passes' names).
  auto renamed = [&](const std::string& name) {
    SizeSample s = f.sample(7);
    int found = 0;
    for (ValueId c : s.plan.constants())
      if (s.plan.value(c).name == name) {
        s.plan.value(c).name = name + ".renamed";
        ++found;
      }
    EXPECT_EQ(found, 1) << name;
    return s;
  };
  const SizeProgram p = SizeProgram::fit({f.sample(3), f.sample(5), renamed("c")});
  EXPECT_GT(p.fitted(), 0u);
  expect_error([&] { SizeProgram::fit({f.sample(3), f.sample(5), renamed("w")}); }, ErrorCode::kUnsupported,
               {"the plan at sample 2 differs from sample 0 in value", "('w'): name or role"});
}

TEST(SizeProgram, RefusesASizeThatIsNoMultilinearFunction) {
  // x [b, b] flattened: b * b fits the corners b = 3, 5 as 8b - 15, which the check at 7 refutes.
  auto square = [](int64_t b) {
    Graph g;
    const ValueId x = g.add_input("x", TensorType(DType::kF32, {b, b}));
    Attrs a;
    a.set("shape", std::vector<int64_t>{b * b});
    g.mark_output(g.add_node1(OpKind::kRelu, {g.add_node1(OpKind::kReshape, {x}, a)}), "y");
    return SizeSample{{{"b", b}}, Builder().optimize(g)};
  };
  try {
    SizeProgram::fit({square(3), square(5), square(7)});
    FAIL() << "fitted b * b";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("is 49 at b=7, not the multilinear function of the grid samples (41)"),
              std::string::npos)
        << e.what();
  }
}

TEST(SizeProgram, SamplesMustBeAGridAndAChecks) {
  Fixture f;
  EXPECT_THROW(SizeProgram::fit({f.sample(3), f.sample(5)}), Error);                 // no check sample
  EXPECT_THROW(SizeProgram::fit({f.sample(3), f.sample(3), f.sample(5)}), Error);    // one value for b
  const SizeProgram p = SizeProgram::fit({f.sample(3), f.sample(5), f.sample(9)});
  EXPECT_THROW(p.evaluate(f.plan(3), {{"batch", 4}}), Error);                       // another symbol
  try {
    p.evaluate(f.plan(3), {{"b", 0}});  // the row index b - 1 is negative
    FAIL() << "evaluated at b = 0";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("is not a whole, non-negative number at b=0"), std::string::npos) << e.what();
  }
}

TEST(SizeProgram, AnInstanceRefusesToRunOnceItsParentWasRefitted) {
  Fixture f;
  std::shared_ptr<Engine> parent = Builder(f.config).build(network(3, f.c, f.w));
  const SizeProgram p = SizeProgram::fit({{{{"b", 3}}, Graph(parent->graph())}, f.sample(5), f.sample(7)});
  std::shared_ptr<Engine> inst = parent->instance(p.evaluate(parent->graph(), {{"b", 4}}), parent->kernel_options());
  const Floats x = random_floats(4 * kCols, 3);
  run(*inst, x, 4);
  Graph foreign = f.plan(4);  // the same plan, but the constants are not the engine's
  EXPECT_THROW(parent->instance(foreign, parent->kernel_options()), Error);
  EXPECT_THROW(inst->instance(Graph(inst->graph()), parent->kernel_options()), Error);  // an instance of an instance
  Refitter r(parent);
  const Floats w2 = random_floats(kCols, 4);
  r.set_weight("w", TensorType(DType::kF32, {kCols}), w2.data());
  r.refit();
  try {
    run(*inst, x, 4);
    FAIL() << "a stale instance ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("whose weights changed since"), std::string::npos) << e.what();
  }
  // Made again, it reads the new weight.
  std::shared_ptr<Engine> again = parent->instance(p.evaluate(parent->graph(), {{"b", 4}}), parent->kernel_options());
  f.w = w2;
  std::shared_ptr<Engine> built = Builder(f.config).build(network(4, f.c, f.w));
  EXPECT_EQ(run(*again, x, 4), run(*built, x, 4));
}

// y = linear(x, w): x [b, 32], w [16, 32] a weight, which the CPU backend packs for its GEMM.
Graph linear_network(int64_t b, const Floats& w) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {b, 32}));
  const ValueId wv = g.add_constant("w", TensorType(DType::kF32, {16, 32}), w.data(), w.size() * 4, true);
  g.mark_output(g.add_node1(OpKind::kLinear, {x, wv, kNoValue}), "y");
  return g;
}

TEST(SizeProgram, InstancesShareTheDataTheirEngineDerivedFromItsWeightsUntilARefit) {
  Floats w = random_floats(16 * 32, 1);
  BuilderConfig config;
  auto plan = [&](int64_t b) { return Builder(config).optimize(linear_network(b, w)); };
  std::shared_ptr<Engine> parent = Builder(config).build(linear_network(64, w));
  ASSERT_NE(parent->kernel_options().derived, nullptr);
  const SizeProgram p =
      SizeProgram::fit({{{{"b", 64}}, Graph(parent->graph())}, {{{"b", 40}}, plan(40)}, {{{"b", 24}}, plan(24)}});
  auto check = [&](int64_t b) {
    std::shared_ptr<Engine> inst = parent->instance(p.evaluate(parent->graph(), {{"b", b}}), parent->kernel_options());
    EXPECT_EQ(inst->kernel_options().derived, parent->kernel_options().derived);
    std::shared_ptr<Engine> built = Builder(config).build(linear_network(b, w));
    EXPECT_NE(built->kernel_options().derived, parent->kernel_options().derived);
    const Floats x = random_floats(size_t(b * 32), uint32_t(b));
    Floats got(size_t(b * 16)), want(size_t(b * 16));
    inst->create_execution_context()->execute({x.data()}, {got.data()});
    built->create_execution_context()->execute({x.data()}, {want.data()});
    EXPECT_EQ(got, want) << "b=" << b;
  };
  check(48);
  // After a refit the packed weight is the new one's, in the engine and in a new instance.
  Refitter r(parent);
  w = random_floats(16 * 32, 2);
  r.set_weight("w", TensorType(DType::kF32, {16, 32}), w.data());
  r.refit();
  check(48);
  check(17);
}

TEST(DerivedConstants, OneDerivationPerBufferAndKindWhileHeldAndNoneAfterAClear) {
  DerivedConstants d;
  int made = 0;
  auto make = [&made] { return std::shared_ptr<const void>(std::make_shared<int>(++made)); };
  auto buffer = std::make_shared<const HostBuffer>(Bytes{1, 2, 3});
  auto twin = std::make_shared<const HostBuffer>(Bytes{1, 2, 3});
  std::shared_ptr<const void> a = d.get(buffer, "pack", make);
  EXPECT_EQ(d.get(buffer, "pack", make), a);
  EXPECT_EQ(made, 1);
  std::shared_ptr<const void> other = d.get(buffer, "pack transposed", make);
  std::shared_ptr<const void> of_twin = d.get(twin, "pack", make);  // keyed by the buffer, not its bytes
  EXPECT_EQ(made, 3);
  EXPECT_NE(other, a);
  EXPECT_NE(of_twin, a);
  a.reset();  // nothing holds it any more: derived again
  EXPECT_EQ(*std::static_pointer_cast<const int>(d.get(buffer, "pack", make)), 4);
  d.clear();  // a refit: derived again although still held
  EXPECT_EQ(*std::static_pointer_cast<const int>(d.get(twin, "pack", make)), 5);
  EXPECT_EQ(*std::static_pointer_cast<const int>(of_twin), 3);
}

TEST(SizeProgram, AnEngineFileHoldsTheKernelsOfAnInstanceAtItsOwnSizes) {
  Fixture f;
  f.config.optimization_level = 0;
  std::shared_ptr<Engine> parent = Builder(f.config).build(network(3, f.c, f.w));
  KernelOptions timed = parent->kernel_options();
  timed.optimization_level = 2;
  std::shared_ptr<Engine> own_sizes = parent->instance(Graph(parent->graph()), timed);
  const Bytes file = parent->serialize_with_kernels_of(*own_sizes);
  std::shared_ptr<Engine> loaded = Engine::deserialize(file.data(), file.size());
  EXPECT_EQ(loaded->kernel_options().optimization_level, 2);
  EXPECT_EQ(loaded->instance_of(), nullptr);  // an engine of its own, the parent's constants copied in
  EXPECT_EQ(loaded->graph().num_values(), parent->graph().num_values());
  const Floats x = random_floats(3 * kCols, 9);
  EXPECT_EQ(run(*loaded, x, 3), run(*parent, x, 3));
  const Bytes plain = parent->serialize();
  EXPECT_EQ(Engine::deserialize(plain.data(), plain.size())->kernel_options().optimization_level, 0);

  const SizeProgram p = SizeProgram::fit({{{{"b", 3}}, Graph(parent->graph())}, f.sample(5), f.sample(7)});
  std::shared_ptr<Engine> other_sizes = parent->instance(p.evaluate(parent->graph(), {{"b", 4}}), timed);
  expect_error([&] { parent->serialize_with_kernels_of(*other_sizes); }, ErrorCode::kInvalidArgument,
               {"an instance at other sizes"});
  std::shared_ptr<Engine> stranger = Builder(f.config).build(network(3, f.c, f.w));
  expect_error([&] { parent->serialize_with_kernels_of(*stranger); }, ErrorCode::kInvalidArgument,
               {"not those of an instance of this engine"});
}

}  // namespace

// ---- serialized programs and dynamic bundles ------------------------------------------------

TEST(SizeProgram, ASerializedProgramEvaluatesAsTheOriginal) {
  Fixture f;
  const Graph base = f.plan(3);
  const SizeProgram p = SizeProgram::fit({{{{"b", 3}}, Graph(base)}, f.sample(5), f.sample(7), f.sample(2)});
  const Bytes bytes = p.serialize();
  const SizeProgram q = SizeProgram::deserialize(bytes.data(), bytes.size());
  EXPECT_EQ(q.symbols(), p.symbols());
  EXPECT_EQ(q.to_string(), p.to_string());
  for (int64_t b : {1, 11})
    EXPECT_EQ(q.evaluate(base, {{"b", b}}).to_string(), p.evaluate(base, {{"b", b}}).to_string());

  for (size_t n : {size_t(0), size_t(3), bytes.size() - 1})
    expect_error([&] { SizeProgram::deserialize(bytes.data(), n); }, ErrorCode::kTruncated, {"truncated"});
  Bytes longer = bytes;  // what follows the slots is read as square terms
  longer.push_back(0);
  expect_error([&] { SizeProgram::deserialize(longer.data(), longer.size()); }, ErrorCode::kTruncated, {"truncated"});
  Bytes none = bytes;
  none[0] = 0;  // no symbols
  expect_error([&] { SizeProgram::deserialize(none.data(), none.size()); }, ErrorCode::kCorrupted,
               {"a size program of 0 symbols"});
}

// x [b, b] flattened to [b * b]: an extent quadratic in b (T5 gathers its relative position
// buckets so), scaled by a weight.
Graph flattened_square(int64_t b, const Floats& w, int power = 2) {
  Graph g;
  std::vector<int64_t> shape(size_t(power), b);
  int64_t numel = 1;
  for (int64_t e : shape) numel *= e;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, shape));
  const ValueId wv = g.add_constant("w", TensorType(DType::kF32, {1}), w.data(), 4, true);
  Attrs flat;
  flat.set("shape", std::vector<int64_t>{numel});
  g.mark_output(g.add_node1(OpKind::kMul, {g.add_node1(OpKind::kReshape, {x}, flat), wv}), "y");
  return g;
}

TEST(SizeProgram, FitsASizeQuadraticInASymbolAndRefusesACubicOne) {
  const Floats w = random_floats(1, 3);
  BuilderConfig config;
  const auto samples = [&](int power) {
    std::vector<SizeSample> all;
    for (int64_t b : {3, 5, 7, 2, 11})
      all.push_back({{{"b", b}}, Builder(config).optimize(flattened_square(b, w, power))});
    return all;
  };
  std::shared_ptr<Engine> parent = Builder(config).build(flattened_square(3, w));
  std::vector<SizeSample> square = samples(2);
  square[0].plan = parent->graph();
  const SizeProgram p = SizeProgram::fit(square);
  EXPECT_NE(p.to_string().find("(b - 3)(b - 5)"), std::string::npos) << p.to_string();
  const Bytes bytes = p.serialize();
  const SizeProgram q = SizeProgram::deserialize(bytes.data(), bytes.size());
  EXPECT_EQ(q.to_string(), p.to_string());
  for (int64_t b : {9, 1, 40}) {
    std::shared_ptr<Engine> inst = parent->instance(q.evaluate(parent->graph(), {{"b", b}}), parent->kernel_options());
    std::shared_ptr<Engine> built = Builder(config).build(flattened_square(b, w));
    const Floats x = random_floats(size_t(b * b), uint32_t(b));
    Floats got(size_t(b * b)), want(size_t(b * b));
    inst->create_execution_context()->execute({x.data()}, {got.data()});
    built->create_execution_context()->execute({x.data()}, {want.data()});
    EXPECT_EQ(got, want) << "b=" << b;
  }
  Bytes bad = bytes;  // the square term's denominator (the last 8 bytes) zeroed
  std::fill(bad.end() - 8, bad.end(), uint8_t(0));
  expect_error([&] { SizeProgram::deserialize(bad.data(), bad.size()); }, ErrorCode::kCorrupted, {"denominator of 0"});
  expect_error([&] { SizeProgram::fit(samples(3)); }, ErrorCode::kUnsupported,
               {"not the multilinear function of the grid samples plus a square of a symbol"});
}

// A bundle of one ranged engine (built at b = 3, fitted over b in 1..64): Bundle::at makes its
// instance for a batch and runs what an engine built for that batch computes; shapes outside the
// range, or binding a symbol two ways, are refused naming the input, the dim and the range.
TEST(SizeProgram, ADynamicBundleServesEveryBatchOfItsRange) {
  Fixture f;
  std::shared_ptr<Engine> parent = Builder(f.config).build(network(3, f.c, f.w));
  BundleProgram prog;
  TensorType x(DType::kF32, {3, kCols});
  x.dims[0].symbol = "b", x.dims[0].min = 1, x.dims[0].max = 64;
  prog.inputs.push_back({"x", x});
  prog.steps.push_back({"net", 0, {{-1, 0}}});
  for (uint32_t k = 0; k < 2; ++k)
    prog.outputs.push_back({parent->outputs()[k].name, {0, k}, parent->outputs()[k].type});
  prog.ranges.push_back(
      {0,
       {{"b", 3}},
       SizeProgram::fit({{{{"b", 3}}, Graph(parent->graph())}, f.sample(5), f.sample(7), f.sample(2)}),
       {}});
  const Bytes engine = parent->serialize();
  const Bytes file = write_bundle({std::span<const uint8_t>(engine)}, prog);
  std::shared_ptr<Bundle> bundle = Bundle::deserialize(file.data(), file.size());
  ASSERT_TRUE(bundle->dynamic());
  for (int64_t b : {1, 3, 11, 64}) {
    const SymbolBinding binding = bundle->bind({{b, kCols}});
    EXPECT_EQ(binding, (SymbolBinding{{"b", b}}));
    std::shared_ptr<const Bundle> sized = bundle->at(binding);
    ASSERT_FALSE(sized->dynamic());
    EXPECT_EQ(sized->engines()[0] == bundle->engines()[0], b == 3) << "the engine itself where it was built";
    const Floats xs = random_floats(size_t(b * kCols), uint32_t(b + 100));
    Bytes in(xs.size() * 4);
    std::memcpy(in.data(), xs.data(), in.size());
    const std::vector<Bytes> got = sized->run({in});
    const std::vector<Floats> want = run(*Builder(f.config).build(network(b, f.c, f.w)), xs, b);
    for (size_t o = 0; o < 2; ++o) {
      ASSERT_EQ(got[o].size(), want[o].size() * 4);
      EXPECT_EQ(std::memcmp(got[o].data(), want[o].data(), got[o].size()), 0) << "b=" << b << " output " << o;
    }
  }
  expect_error([&] { bundle->bind({{65, kCols}}); }, ErrorCode::kShapeMismatch,
               {"input 0 'x' dim 0 (b) is 65, outside its range [1, 64]"});
  expect_error([&] { bundle->bind({{4, kCols + 1}}); }, ErrorCode::kShapeMismatch,
               {"input 0 'x' dim 1 is 9; the bundle takes 8 there (a static dim)"});
  expect_error([&] { bundle->at({{"b", 0}}); }, ErrorCode::kShapeMismatch, {"b = 0 is outside its range [1, 64]"});
  expect_error([&] { bundle->at({}); }, ErrorCode::kInvalidArgument, {"lacks b"});
  // A context of the dynamic bundle runs at the sizes it was compiled at.
  EXPECT_EQ(bundle->create_context()->bundle().inputs()[0].type.shape(), (std::vector<int64_t>{3, kCols}));
}
