// The memory planner's in-place rule (src/passes/memory_plan.cpp): a node whose kernel may write
// its output over one of its inputs (Kernel::writes_over_input) gets that input's bytes when the
// input is an arena value read by nothing later and by no other input of the node. Checked here on
// hand-built plans (taken, the first input that qualifies, and refused for a later reader, a second
// input in the same block, a graph input, another size), on the CPU (a fused pointwise node writes
// over an input of its output's type, and the engine matches the graph), and on a GPU (skipped
// without one): a conv with a residual writes over it only where the plan gives the same bytes, a
// residual-block engine matches the CPU one with its output written in place, and the engine's
// first context takes its arena from the engine's own device block while later contexts allocate
// their own. Which contexts join that block (context_joins_block) is checked on its own.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/kiln.h"
#include "src/runtime/device_block.h"
#include "tests/cpp/error_test_util.h"
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using kiln::test::code_of;
using Shape = std::vector<int64_t>;
using test::Floats;

struct Chain {
  Graph g;
  ValueId a = kNoValue, b = kNoValue, c = kNoValue;
};

// a = relu(x); b = neg(a); c = add(b, a) (node 2, which may write over its input 1, a); then
// y = relu(c), or with `reads_a_later` y = add(c, a).
Chain chain(bool reads_a_later, const Shape& shape = {4, 32}) {
  Chain ch;
  Graph& g = ch.g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, shape));
  ch.a = g.add_node1(OpKind::kRelu, {x}, {});
  ch.b = g.add_node1(OpKind::kNeg, {ch.a}, {});
  ch.c = g.add_node1(OpKind::kAdd, {ch.b, ch.a}, {});
  const ValueId y = reads_a_later ? g.add_node1(OpKind::kAdd, {ch.c, ch.a}, {}) : g.add_node1(OpKind::kRelu, {ch.c}, {});
  g.mark_output(y, "y");
  return ch;
}

InPlace only(size_t node, size_t input) {
  return [node, input](size_t n, size_t k) { return n == node && k == input; };
}

TEST(MemoryPlanInPlace, OutputTakesTheInputsBytesAtItsLastUse) {
  const Chain ch = chain(false);
  const MemoryPlan plain = plan_memory(ch.g, 64);
  const MemoryPlan p = plan_memory(ch.g, 64, true, only(2, 1));
  EXPECT_EQ(plain.in_place_values, 0u);
  EXPECT_NE(plain.offsets[size_t(ch.c)], plain.offsets[size_t(ch.a)]);
  EXPECT_EQ(p.in_place_values, 1u);
  EXPECT_EQ(p.offsets[size_t(ch.c)], p.offsets[size_t(ch.a)]);
  // b is live with a (and c) and keeps bytes of its own.
  const int64_t bytes = int64_t(ch.g.type(ch.a).nbytes());
  const int64_t a0 = p.offsets[size_t(ch.a)], b0 = p.offsets[size_t(ch.b)];
  EXPECT_TRUE(a0 + bytes <= b0 || b0 + bytes <= a0);
  EXPECT_EQ(p.arena_bytes, 2 * size_t(bytes));
  EXPECT_LT(p.arena_bytes, plain.arena_bytes);
}

TEST(MemoryPlanInPlace, NotWhenALaterNodeReadsTheInput) {
  const Chain ch = chain(true);
  const MemoryPlan p = plan_memory(ch.g, 64, true, only(2, 1));
  EXPECT_EQ(p.in_place_values, 0u);
  EXPECT_NE(p.offsets[size_t(ch.c)], p.offsets[size_t(ch.a)]);
  EXPECT_EQ(p.offsets, plan_memory(ch.g, 64).offsets);
}

TEST(MemoryPlanInPlace, NotWhenAnotherInputOfTheNodeSharesTheBlock) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 32}));
  const ValueId a = g.add_node1(OpKind::kRelu, {x}, {});
  Attrs shape;
  shape.set("shape", Shape{128});
  const ValueId flat = g.add_node1(OpKind::kReshape, {a}, shape);  // an alias of a: the same block
  Attrs back;
  back.set("shape", Shape{4, 32});
  const ValueId again = g.add_node1(OpKind::kReshape, {flat}, back);
  const ValueId c = g.add_node1(OpKind::kAdd, {a, again}, {});  // may write over input 1
  g.mark_output(g.add_node1(OpKind::kRelu, {c}, {}), "y");
  const MemoryPlan p = plan_memory(g, 64, true, only(3, 1));
  EXPECT_EQ(p.aliased_values, 2u);
  EXPECT_EQ(p.in_place_values, 0u);
  EXPECT_NE(p.offsets[size_t(c)], p.offsets[size_t(a)]);
}

TEST(MemoryPlanInPlace, NotOverAGraphInputOrAValueOfAnotherSize) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 32}));
  const ValueId a = g.add_node1(OpKind::kAdd, {x, x}, {});  // may write over input 0, a graph input
  Attrs sum;
  sum.set("axes", Shape{1});
  sum.set("keepdim", true);
  const ValueId s = g.add_node1(OpKind::kReduceSum, {a}, sum);  // may write over a: another size
  g.mark_output(g.add_node1(OpKind::kRelu, {s}, {}), "y");
  const MemoryPlan p = plan_memory(g, 64, true, [](size_t n, size_t k) { return n < 2 && k == 0; });
  EXPECT_EQ(p.in_place_values, 0u);
  EXPECT_EQ(p.offsets, plan_memory(g, 64).offsets);
}

TEST(MemoryPlanInPlace, TakesTheFirstInputThatQualifies) {
  // s = add(a, b) is the last reader of both: it takes a's bytes when it may write over either
  // input, b's when only over b.
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 32}));
  const ValueId a = g.add_node1(OpKind::kRelu, {x}, {});
  const ValueId b = g.add_node1(OpKind::kNeg, {x}, {});
  const ValueId s = g.add_node1(OpKind::kAdd, {a, b}, {});  // node 2: the last reader of a and b
  g.mark_output(g.add_node1(OpKind::kAdd, {s, x}, {}), "y");
  const MemoryPlan both = plan_memory(g, 64, true, [](size_t n, size_t) { return n == 2; });
  EXPECT_EQ(both.offsets[size_t(s)], both.offsets[size_t(a)]);
  const MemoryPlan second = plan_memory(g, 64, true, [](size_t n, size_t k) { return n == 2 && k == 1; });
  EXPECT_EQ(second.offsets[size_t(s)], second.offsets[size_t(b)]);
  EXPECT_EQ(both.in_place_values, 1u);
  EXPECT_EQ(second.in_place_values, 1u);
}

TEST(MemoryPlanInPlace, UnfusedCpuKernelsWriteOverNoInput) {
  const Chain ch = chain(false);
  auto e = Engine::create(ch.g, Device{}, KernelOptions{});
  EXPECT_EQ(e->memory_plan().in_place_values, 0u);
  EXPECT_EQ(e->memory_plan().offsets, plan_memory(ch.g, get_backend(Device{}).alignment()).offsets);
}

TEST(DeviceBlock, AContextJoinsTheEnginesBlockOnlyWhereThatTakesNoExtraPage) {
  constexpr size_t MiB = size_t(1) << 20;
  // A page or more: always, whatever the constants leave in their last page.
  EXPECT_TRUE(context_joins_block(0, 2 * MiB));
  EXPECT_TRUE(context_joins_block(4 * MiB, 2 * MiB + 1));
  EXPECT_TRUE(context_joins_block(47 * MiB, 3 * MiB));
  // Smaller: only into the room the constants leave in their last page (MobileNetV3 b1's block of
  // 5.64 MiB leaves 0.36 MiB: its 1.91 MiB context stays out, a 0.3 MiB one would join).
  EXPECT_TRUE(context_joins_block(5918976, 300000));
  EXPECT_FALSE(context_joins_block(5918976, 2007040));
  EXPECT_TRUE(context_joins_block(3 * MiB, MiB));
  EXPECT_FALSE(context_joins_block(4 * MiB, 1));  // the constants fill their pages
  EXPECT_FALSE(context_joins_block(0, MiB));      // no constants: the context allocates its own
}

// x -> linear = m; a = exp(x); relu(sin(m) + a) -> linear -> y. After fusion the pointwise ops are
// one fused_pointwise node (no linear epilogue takes a sin), the last reader of m, which has its
// output's type: its output takes m's bytes, and the engine still computes what the graph does.
TEST(MemoryPlanInPlace, CpuFusedPointwiseWritesOverAnInputAndMatchesTheGraph) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {8, 64}));
  const ValueId m = g.add_node1(OpKind::kLinear, {x, test::f32_weight(g, "w1", {64, 64}, 1, -0.2f, 0.2f)});
  const ValueId a = g.add_node1(OpKind::kExp, {x});
  const ValueId r = g.add_node1(OpKind::kRelu, {g.add_node1(OpKind::kAdd, {g.add_node1(OpKind::kSin, {m}), a})});
  g.mark_output(g.add_node1(OpKind::kLinear, {r, test::f32_weight(g, "w2", {16, 64}, 2, -0.2f, 0.2f)}), "y");
  const std::vector<Floats> in = test::random_inputs(g, 3);
  const std::vector<Floats> want = test::run_engine(Engine::create(g, Device{}, KernelOptions{}), in);
  auto e = Builder(BuilderConfig{}).build(g);
  EXPECT_EQ(e->memory_plan().in_place_values, 1u) << e->graph().to_string();
  const std::vector<Floats> got = test::run_engine(e, in);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].size(), want[0].size());
  for (size_t i = 0; i < got[0].size(); ++i) EXPECT_NEAR(got[0][i], want[0][i], 1e-5f * (1 + std::fabs(want[0][i])));
}

#ifdef KILN_WITH_CUDA
// x -> conv 3x3 + relu = a -> conv 1x1 + relu = b -> conv 1x1 + residual a + relu = y2 -> neg: the
// last conv is a's last reader and takes b, not a, as its x, so it may write over a.
Graph residual_block() {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 32, 64, 64}));  // 2 MiB a tensor
  auto conv = [&](std::vector<ValueId> in, int64_t k, uint32_t seed) {
    std::string w = "w", b = "b";
    w += std::to_string(seed), b += std::to_string(seed);
    in.insert(in.begin() + 1, test::f32_weight(g, w, {32, 32, k, k}, seed, -0.1f, 0.1f));
    in.insert(in.begin() + 2, test::f32_weight(g, b, {32}, seed + 100, -0.1f, 0.1f));
    Attrs a = test::conv2d_attrs(1, k / 2, 1);
    a.set("activation", std::string("relu"));
    return g.add_node1(OpKind::kConv, in, a);
  };
  const ValueId a = conv({x}, 3, 1);
  const ValueId b = conv({a}, 1, 2);
  const ValueId y2 = conv({b, a}, 1, 3);
  g.mark_output(g.add_node1(OpKind::kNeg, {y2}, {}), "y");
  return g;
}

std::vector<float> run_on(const Engine& e, ExecutionContext& ctx, const std::vector<float>& x) {
  Backend& gpu = get_backend(e.device());
  const size_t out_n = size_t(e.outputs()[0].type.numel());
  auto din = gpu.allocate(x.size() * 4), dout = gpu.allocate(out_n * 4);
  gpu.copy_from_host(din.get(), x.data(), x.size() * 4, nullptr);
  ctx.execute({din.get()}, {dout.get()}, nullptr);
  std::vector<float> y(out_n);
  gpu.copy_to_host(y.data(), dout.get(), out_n * 4, nullptr);
  gpu.synchronize(nullptr);
  return y;
}

TEST(MemoryPlanInPlaceCuda, ResidualBlockWritesOverItsResidualAndMatchesTheCpuInEveryContext) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  const Graph g = residual_block();
  KernelOptions strict;  // strict FP32 (no TF32), to compare with the CPU closely
  strict.policy.allow_tf32 = false;
  auto cpu = Engine::create(g, Device{}, KernelOptions{});
  auto gpu = Engine::create(g, Device::parse("cuda:0"), strict);
  EXPECT_EQ(cpu->memory_plan().in_place_values, 0u);
  // In strict FP32 cuDNN may run the last conv as the conv alone plus a separate epilogue, which
  // may not write over its residual; either way the answers must match.
  EXPECT_LE(gpu->memory_plan().in_place_values, 1u) << gpu->build_log();
  const std::vector<float> x = test::random_floats(size_t(g.type(g.inputs()[0]).numel()), 5);
  std::vector<float> want(size_t(cpu->outputs()[0].type.numel()));
  auto cctx = cpu->create_execution_context();
  cctx->execute({x.data()}, {want.data()});
  auto expect_close = [&](const std::vector<float>& got, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    double err = 0, norm = 0;
    for (size_t i = 0; i < got.size(); ++i) err += (got[i] - want[i]) * double(got[i] - want[i]), norm += double(want[i]) * want[i];
    EXPECT_GT(norm, 1.0) << what;
    EXPECT_LT(std::sqrt(err / norm), 1e-5) << what;
  };
  // The arena (4 MiB) shares the engine's device block: the first context takes that room, the
  // second, alive with it, allocates its own; once the first is gone, a third takes the room
  // again. Each runs twice over its used arena.
  EXPECT_GE(gpu->memory_plan().arena_bytes, size_t(2) << 20);
  EXPECT_NE(gpu->build_log().find("(with one context)"), std::string::npos) << gpu->build_log();
  auto first = gpu->create_execution_context(false);
  auto second = gpu->create_execution_context(true);
  for (int rep = 0; rep < 2; ++rep) {
    expect_close(run_on(*gpu, *first, x), "first context (direct)");
    expect_close(run_on(*gpu, *second, x), "second context (CUDA graph)");
  }
  first.reset();
  auto third = gpu->create_execution_context(true);
  for (int rep = 0; rep < 2; ++rep) {
    expect_close(run_on(*gpu, *third, x), "third context (CUDA graph)");
    expect_close(run_on(*gpu, *second, x), "second context again");
  }
}
#endif

}  // namespace
