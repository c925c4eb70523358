// The memory planner's alias rule (src/passes/memory_plan.cpp): a reshape or copy whose input
// and output are both arena intermediates puts its output on its input's bytes, and the shared
// bytes stay live until the last use of every alias. Checked here: the offsets and lifetimes of
// hand-built graphs (single reshapes, chains and fan-outs, reshapes from graph inputs and
// constants and into graph outputs, which still copy), a plan checker that knows the alias
// groups (values of different groups that are ever live together never share a byte), and CPU
// engines that must compute exactly what a node-by-node run with a private buffer per value
// computes (the reference here, which uses no memory plan at all), with an arena no larger than
// the plan without aliasing. On a GPU (skipped without one): the CUDA reshape / copy kernels
// launch nothing and capture no graph node when aliased, and a CUDA engine matches the CPU one
// with and without CUDA graphs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "kiln/kiln.h"
#include "tests/cpp/pass_test_util.h"

#ifdef KILN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using namespace kiln;
using Shape = std::vector<int64_t>;
using Floats = std::vector<float>;

using test::permute;
using test::random_floats;
using test::random_inputs;
using test::reshape;

ValueId f32_constant(Graph& g, const Shape& shape, uint32_t seed) {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  const Floats v = random_floats(n, seed);
  return g.add_constant("", TensorType(DType::kF32, shape), v.data(), v.size() * 4);
}

// ---- an independent check of a plan -------------------------------------------------------

struct Lifetimes {
  std::vector<int> first, last;  // node indices, inclusive; -1 for values no node produces
  std::vector<ValueId> root;     // the alias group: the value whose bytes an alias shares
};

// Lifetimes from the graph alone; a value's group root is followed through every reshape / copy
// that the plan placed on its input's offset (the checker then verifies the group's lifetime).
Lifetimes lifetimes(const Graph& g, const MemoryPlan& p) {
  Lifetimes L;
  const size_t nv = size_t(g.num_values());
  L.first.assign(nv, -1), L.last.assign(nv, -1), L.root.resize(nv);
  for (ValueId v = 0; v < g.num_values(); ++v) L.root[size_t(v)] = v;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = *g.nodes()[i];
    for (ValueId in : n.inputs)
      if (in != kNoValue) L.last[size_t(in)] = int(i);
    for (ValueId out : n.outputs) L.first[size_t(out)] = L.last[size_t(out)] = int(i);
    if (output_reinterprets_input(n, g) && p.offsets[size_t(n.outputs[0])] >= 0 &&
        p.offsets[size_t(n.outputs[0])] == p.offsets[size_t(n.inputs[0])] && g.type(n.outputs[0]).nbytes() > 0)
      L.root[size_t(n.outputs[0])] = L.root[size_t(n.inputs[0])];
  }
  return L;
}

// Every planned value is aligned and inside the arena; graph inputs, outputs and constants are
// not planned; aliases sit exactly on their input; and two values of different groups whose
// group lifetimes (from the root's producer to the last use of any member) intersect never
// share a byte. Returns the number of aliased values.
size_t check_plan(const Graph& g, const MemoryPlan& p) {
  const size_t nv = size_t(g.num_values());
  EXPECT_EQ(p.offsets.size(), nv);
  if (p.offsets.size() != nv) return 0;
  const Lifetimes L = lifetimes(g, p);
  std::vector<char> is_out(nv, 0);
  for (ValueId o : g.outputs()) is_out[size_t(o)] = 1;
  std::map<ValueId, std::pair<int, int>> group_life;  // root -> [first, last]
  size_t aliases = 0, naive = 0;
  for (ValueId v = 0; v < g.num_values(); ++v) {
    const size_t i = size_t(v);
    const bool planned = L.first[i] >= 0 && !is_out[i] && !g.value(v).is_constant();
    if (!planned) {
      EXPECT_EQ(p.offsets[i], -1) << "%" << v << " is an input, output or constant";
      continue;
    }
    EXPECT_GE(p.offsets[i], 0) << "%" << v;
    EXPECT_EQ(size_t(p.offsets[i]) % p.alignment, 0u) << "%" << v;
    const size_t bytes = g.type(v).nbytes();
    EXPECT_LE(size_t(p.offsets[i]) + bytes, p.arena_bytes) << "%" << v;
    naive += (bytes + p.alignment - 1) / p.alignment * p.alignment;
    if (bytes == 0) continue;
    const ValueId r = L.root[i];
    aliases += r != v;
    auto it = group_life.find(r);
    if (it == group_life.end()) group_life[r] = {L.first[i], L.last[i]};
    else it->second = {std::min(it->second.first, L.first[i]), std::max(it->second.second, L.last[i])};
  }
  EXPECT_EQ(p.naive_bytes, naive);
  EXPECT_EQ(p.aliased_values, aliases);
  EXPECT_LE(p.arena_bytes, p.naive_bytes);
  for (const auto& [a, la] : group_life)
    for (const auto& [b, lb] : group_life) {
      if (a >= b || la.second < lb.first || lb.second < la.first) continue;  // never live together
      const int64_t a0 = p.offsets[size_t(a)], a1 = a0 + int64_t(g.type(a).nbytes());
      const int64_t b0 = p.offsets[size_t(b)], b1 = b0 + int64_t(g.type(b).nbytes());
      EXPECT_TRUE(a1 <= b0 || b1 <= a0) << "groups of %" << a << " [" << a0 << "," << a1 << ") and %" << b << " ["
                                        << b0 << "," << b1 << ") are live together and overlap";
    }
  return aliases;
}

// ---- running graphs -------------------------------------------------------------------------

std::vector<Floats> run_engine(const Graph& g, const std::vector<Floats>& inputs, MemoryPlan* plan = nullptr) {
  auto e = Engine::create(g, Device{}, KernelOptions{});  // runs no passes: the graph as given
  if (plan) *plan = e->memory_plan();
  std::vector<const void*> in;
  for (const Floats& x : inputs) in.push_back(x.data());
  std::vector<Floats> outs;
  for (const IOTensor& o : e->outputs()) outs.emplace_back(size_t(o.type.numel()), std::nanf(""));
  std::vector<void*> out;
  for (Floats& o : outs) out.push_back(o.data());
  auto ctx = e->create_execution_context();
  ctx->execute(in, out);
  ctx->execute(in, out);  // twice: a second run over a used arena gives the same answer
  return outs;
}

// The reference: every node's CPU kernel run in order, every value in its own buffer.
std::vector<Floats> run_unplanned(const Graph& g, const std::vector<Floats>& inputs) {
  Backend& be = get_backend(Device{});
  std::vector<std::vector<uint8_t>> buf(size_t(g.num_values()));
  std::vector<const void*> ptr(size_t(g.num_values()), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) ptr[size_t(g.inputs()[i])] = inputs[i].data();
  for (ValueId c : g.constants()) ptr[size_t(c)] = g.value(c).data->data();
  for (const auto& n : g.nodes()) {
    auto k = be.make_kernel(*n, g, KernelOptions{});
    std::vector<uint8_t> ws(k->workspace_size() + 64);
    std::vector<const void*> in;
    for (ValueId v : n->inputs) in.push_back(v == kNoValue ? nullptr : ptr[size_t(v)]);
    std::vector<void*> out;
    for (ValueId v : n->outputs) {
      buf[size_t(v)].assign(g.type(v).nbytes() + 1, 0);
      out.push_back(buf[size_t(v)].data());
      ptr[size_t(v)] = buf[size_t(v)].data();
    }
    RunContext rc;
    rc.workspace = ws.data();
    rc.workspace_size = ws.size();
    k->run(in.data(), out.data(), rc);
  }
  std::vector<Floats> outs;
  for (ValueId o : g.outputs()) {
    outs.emplace_back(size_t(g.type(o).numel()));
    std::memcpy(outs.back().data(), ptr[size_t(o)], outs.back().size() * 4);
  }
  return outs;
}

void expect_same(const std::vector<Floats>& got, const std::vector<Floats>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    ASSERT_EQ(got[k].size(), want[k].size()) << "output " << k;
    for (size_t i = 0; i < got[k].size(); ++i)
      ASSERT_NEAR(got[k][i], want[k][i], 1e-6f * (1.0f + std::fabs(want[k][i]))) << "output " << k << " element " << i;
  }
}

// ---- hand-built plans -----------------------------------------------------------------------

TEST(MemoryPlanAlias, ReshapeBetweenIntermediatesSharesItsInputsBytesUntilTheLastUse) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 8}));  // 128 bytes
  ValueId a = g.add_node1(OpKind::kExp, {x});       // 0
  ValueId r = reshape(g, a, {32});                   // 1: a's last use; r lives to node 5
  ValueId b = g.add_node1(OpKind::kNeg, {x});        // 2: would take a's dead bytes without the rule
  ValueId c = g.add_node1(OpKind::kSin, {b});        // 3
  ValueId cr = reshape(g, c, {32});                  // 4
  ValueId y = g.add_node1(OpKind::kAdd, {r, cr});    // 5
  g.mark_output(y, "y");
  const MemoryPlan p = plan_memory(g, 64);
  EXPECT_EQ(check_plan(g, p), 2u);
  EXPECT_EQ(p.offsets[size_t(r)], p.offsets[size_t(a)]);
  EXPECT_EQ(p.offsets[size_t(cr)], p.offsets[size_t(c)]);
  // b and c are made while r (a's bytes) is still to be read by node 5.
  EXPECT_NE(p.offsets[size_t(b)], p.offsets[size_t(a)]);
  EXPECT_NE(p.offsets[size_t(c)], p.offsets[size_t(a)]);
  EXPECT_EQ(p.naive_bytes, 5u * 128u);  // aliases still count in the no-reuse sum
  EXPECT_EQ(p.arena_bytes, 3u * 128u);  // {a, r}, b, {c, cr}: b and c are live together

  const MemoryPlan unaliased = plan_memory(g, 64, false);
  EXPECT_EQ(unaliased.aliased_values, 0u);
  EXPECT_NE(unaliased.offsets[size_t(r)], unaliased.offsets[size_t(a)]);
  EXPECT_LE(p.arena_bytes, unaliased.arena_bytes);

  // exp(x) + sin(-x), by hand.
  const auto in = random_inputs(g, 1);
  MemoryPlan engine_plan;
  const auto got = run_engine(g, in, &engine_plan);
  EXPECT_EQ(engine_plan.aliased_values, 2u);
  ASSERT_EQ(got.size(), 1u);
  for (size_t i = 0; i < 32; ++i) EXPECT_NEAR(got[0][i], std::exp(in[0][i]) + std::sin(-in[0][i]), 1e-5f) << i;
}

TEST(MemoryPlanAlias, ChainsAndFanOutsShareOneBlockLiveOverEveryMember) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 4}));  // 96 bytes -> 128
  ValueId a = g.add_node1(OpKind::kRelu, {x});                 // 0
  ValueId r1 = reshape(g, a, {6, 4});                          // 1
  ValueId r2 = reshape(g, r1, {24});                           // 2
  ValueId cp = g.add_node1(OpKind::kCopy, {r2});               // 3: a copy keeps the type: an alias too
  ValueId f = reshape(g, a, {4, 6});                           // 4: a second view of a
  ValueId t = g.add_node1(OpKind::kTanh, {x});                 // 5: made while the group is live
  ValueId u = g.add_node1(OpKind::kMul, {reshape(g, t, {24}), cp});  // 6 (reshape), 7
  ValueId v = g.add_node1(OpKind::kAdd, {reshape(g, u, {4, 6}), f});  // 8 (reshape), 9: last use of f
  g.mark_output(v, "y");
  const MemoryPlan p = plan_memory(g, 64);
  EXPECT_EQ(check_plan(g, p), 6u);  // r1, r2, cp, f, t's and u's reshapes
  for (ValueId m : {r1, r2, cp, f}) EXPECT_EQ(p.offsets[size_t(m)], p.offsets[size_t(a)]) << "%" << m;
  // The group {a, r1, r2, cp, f} is live from node 0 to node 9: nothing else may use its bytes.
  for (ValueId w = 0; w < g.num_values(); ++w) {
    if (p.offsets[size_t(w)] < 0 || w == a || w == r1 || w == r2 || w == cp || w == f) continue;
    EXPECT_NE(p.offsets[size_t(w)], p.offsets[size_t(a)]) << "%" << w << " is written while a's aliases are live";
  }
  EXPECT_LE(p.arena_bytes, plan_memory(g, 64, false).arena_bytes);

  const auto in = random_inputs(g, 2);
  const auto got = run_engine(g, in);
  ASSERT_EQ(got.size(), 1u);
  // y[i, j] viewed flat: tanh(x) * relu(x) + relu(x), elementwise in the flat order.
  for (size_t i = 0; i < 24; ++i) {
    const float rx = std::max(in[0][i], 0.0f);
    EXPECT_NEAR(got[0][i], std::tanh(in[0][i]) * rx + rx, 1e-5f) << i;
  }
  expect_same(got, run_unplanned(g, in));
}

TEST(MemoryPlanAlias, ReshapesFromInputsAndConstantsAndIntoOutputsStillCopy) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 4}));
  ValueId k = f32_constant(g, {2, 8}, 3);
  ValueId rx = reshape(g, x, {16});           // 0: from a graph input
  ValueId rk = reshape(g, k, {16});           // 1: from a constant
  ValueId s = g.add_node1(OpKind::kAdd, {rx, rk});  // 2
  ValueId ry = reshape(g, s, {2, 8});         // 3: into a graph output
  g.mark_output(ry, "y");
  ValueId e = g.add_node1(OpKind::kExp, {x}); // 4: a graph output that is also reshaped
  g.mark_output(e, "e");
  ValueId re = reshape(g, e, {16});           // 5: from a graph output
  g.mark_output(g.add_node1(OpKind::kNeg, {re}), "z");  // 6
  const MemoryPlan p = plan_memory(g, 64);
  EXPECT_EQ(check_plan(g, p), 0u);
  for (ValueId v : {x, k, ry, e}) EXPECT_EQ(p.offsets[size_t(v)], -1) << "%" << v;
  for (ValueId v : {rx, rk, s, re}) EXPECT_GE(p.offsets[size_t(v)], 0) << "%" << v;
  EXPECT_NE(p.offsets[size_t(rx)], p.offsets[size_t(rk)]);
  EXPECT_NE(p.offsets[size_t(s)], p.offsets[size_t(rx)]);
  EXPECT_NE(p.offsets[size_t(s)], p.offsets[size_t(rk)]);
  EXPECT_EQ(p.offsets, plan_memory(g, 64, false).offsets);  // nothing here may alias

  // The engine copies: the caller's input is left as it was and the outputs are right.
  auto in = random_inputs(g, 4);
  const Floats x0 = in[0];
  const auto got = run_engine(g, in);
  EXPECT_EQ(in[0], x0);
  Floats kv(16);
  std::memcpy(kv.data(), g.value(k).data->data(), 64);
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 16; ++i) {
    EXPECT_NEAR(got[0][i], in[0][i] + kv[i], 1e-6f) << i;
    EXPECT_NEAR(got[1][i], std::exp(in[0][i]), 1e-6f) << i;
    EXPECT_NEAR(got[2][i], -std::exp(in[0][i]), 1e-6f) << i;
  }
}

TEST(MemoryPlanAlias, OnlyByteIdenticalReshapeAndCopyAlias) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 6}));
  ValueId a = g.add_node1(OpKind::kRelu, {x});
  ValueId p1 = permute(g, a, {1, 0});  // moves bytes
  Attrs cast;
  cast.set("dtype", DType::kI32);      // same size, other bytes
  ValueId c = g.add_node1(OpKind::kCast, {p1}, cast);
  ValueId r = reshape(g, c, {24});
  ValueId y = g.add_node1(OpKind::kAbs, {r});
  g.mark_output(y, "y");
  EXPECT_FALSE(output_reinterprets_input(*g.value(p1).producer, g));
  EXPECT_FALSE(output_reinterprets_input(*g.value(c).producer, g));
  EXPECT_TRUE(output_reinterprets_input(*g.value(r).producer, g));
  EXPECT_FALSE(output_reinterprets_input(*g.value(y).producer, g));
  const MemoryPlan p = plan_memory(g, 64);
  EXPECT_EQ(check_plan(g, p), 1u);
  EXPECT_EQ(p.offsets[size_t(r)], p.offsets[size_t(c)]);
  EXPECT_NE(p.offsets[size_t(p1)], p.offsets[size_t(a)]);
  EXPECT_NE(p.offsets[size_t(c)], p.offsets[size_t(p1)]);
}

TEST(MemoryPlanAlias, ViewsThatKeepTheElementOrderAliasOthersDoNot) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {1, 6, 4}));
  ValueId a = g.add_node1(OpKind::kRelu, {x});
  ValueId unit = permute(g, a, {1, 0, 2});   // [6, 1, 4]: moves only the size-1 dim
  ValueId moved = permute(g, unit, {2, 1, 0});  // [4, 1, 6]: moves bytes
  Attrs whole, part;
  whole.set("axis", int64_t(0)), whole.set("start", int64_t(0)), whole.set("end", int64_t(4));
  whole.set("step", int64_t(1));
  part = whole;
  part.set("end", int64_t(3));
  ValueId all = g.add_node1(OpKind::kSlice, {moved}, whole);  // every row: the same bytes
  ValueId some = g.add_node1(OpKind::kSlice, {all}, part);    // drops a row
  Attrs same_shape;
  same_shape.set("shape", Shape{3, 1, 6});
  ValueId same = g.add_node1(OpKind::kExpand, {some}, same_shape);  // broadcasts nothing
  Attrs wider;
  wider.set("shape", Shape{3, 2, 6});
  ValueId y = g.add_node1(OpKind::kExpand, {same}, wider);  // broadcasts the size-1 dim
  g.mark_output(g.add_node1(OpKind::kAbs, {y}), "y");
  EXPECT_TRUE(output_reinterprets_input(*g.value(unit).producer, g));
  EXPECT_FALSE(output_reinterprets_input(*g.value(moved).producer, g));
  EXPECT_TRUE(output_reinterprets_input(*g.value(all).producer, g));
  EXPECT_FALSE(output_reinterprets_input(*g.value(some).producer, g));
  EXPECT_TRUE(output_reinterprets_input(*g.value(same).producer, g));
  EXPECT_FALSE(output_reinterprets_input(*g.value(y).producer, g));
  const MemoryPlan p = plan_memory(g, 64);
  EXPECT_EQ(check_plan(g, p), 3u);
  EXPECT_EQ(p.offsets[size_t(unit)], p.offsets[size_t(a)]);
  EXPECT_EQ(p.offsets[size_t(all)], p.offsets[size_t(moved)]);
  EXPECT_EQ(p.offsets[size_t(same)], p.offsets[size_t(some)]);
  // The planned engine computes what a private buffer per value computes.
  const auto in = random_inputs(g, 17);
  EXPECT_EQ(run_engine(g, in), run_unplanned(g, in));
}

TEST(MemoryPlanAlias, CpuReshapeAndCopyKernelsLeaveAliasedBytesAlone) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {3, 5}));
  ValueId r = reshape(g, x, {15});
  ValueId c = g.add_node1(OpKind::kCopy, {r});
  g.mark_output(permute(g, reshape(g, c, {1, 15}), {1, 0}), "y");  // a permute of a size-1 dim
  Backend& be = get_backend(Device{});
  const Floats v = random_floats(15, 5);
  for (const auto& n : g.nodes()) {
    auto k = be.make_kernel(*n, g, KernelOptions{});
    Floats buf = v;
    const void* in[1] = {buf.data()};
    void* out[1] = {buf.data()};
    k->run(in, out, RunContext{});  // one buffer for both: the planner's alias
    EXPECT_EQ(buf, v) << op_name(n->op);
    Floats dst(15, 0.0f);
    out[0] = dst.data();
    k->run(in, out, RunContext{});  // distinct buffers still copy
    EXPECT_EQ(dst, v) << op_name(n->op);
  }
}

// ---- engines ----------------------------------------------------------------------------------

// Attention-shaped: reshapes around linear / permute / matmul / softmax, as in a transformer
// layer, with reshapes from a graph input, into a graph output and in a chain.
Graph attention_block() {
  const int64_t B = 2, S = 5, H = 8, heads = 2, d = H / heads;
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {B, S, H}));
  auto linear = [&](ValueId in, uint32_t seed) {
    return g.add_node1(OpKind::kLinear, {in, f32_constant(g, {H, H}, seed), f32_constant(g, {H}, seed + 1)});
  };
  auto split_heads = [&](ValueId v) { return permute(g, reshape(g, v, {B, S, heads, d}), {0, 2, 1, 3}); };
  ValueId x2 = reshape(g, x, {B * S, H});  // from a graph input: a copy
  ValueId h = reshape(g, linear(x2, 10), {B, S, H});
  ValueId q = split_heads(linear(h, 20)), k = split_heads(linear(h, 30)), v = split_heads(linear(h, 40));
  ValueId kt = permute(g, k, {0, 1, 3, 2});
  Attrs sm;
  sm.set("axis", int64_t(3));
  ValueId att = g.add_node1(OpKind::kSoftmax, {g.add_node1(OpKind::kMatmul, {q, kt})}, sm);
  ValueId ctx = permute(g, g.add_node1(OpKind::kMatmul, {att, v}), {0, 2, 1, 3});
  ValueId merged = reshape(g, reshape(g, ctx, {B, S, H}), {B * S, H});  // a chain
  ValueId o = linear(merged, 50);
  ValueId res = g.add_node1(OpKind::kAdd, {reshape(g, o, {B, S, H}), h});
  g.mark_output(reshape(g, res, {B, S * H}), "y");  // into a graph output: a copy
  return g;
}

TEST(MemoryPlanAlias, AttentionBlockEngineMatchesTheUnplannedRunWithASmallerArena) {
  const Graph g = attention_block();
  const MemoryPlan aliased = plan_memory(g, 64), unaliased = plan_memory(g, 64, false);
  // Every reshape between intermediates: h, three head splits, the merge chain (2), o's.
  EXPECT_EQ(check_plan(g, aliased), 7u);
  check_plan(g, unaliased);
  EXPECT_LE(aliased.arena_bytes, unaliased.arena_bytes);
  EXPECT_EQ(aliased.naive_bytes, unaliased.naive_bytes);
  for (uint32_t seed : {7u, 8u, 9u}) {
    const auto in = random_inputs(g, seed);
    expect_same(run_engine(g, in), run_unplanned(g, in));
  }
}

// Random graphs of 24-element values in several shapes, mixing reshapes and copies (chains,
// fan-outs, from inputs, into outputs) with unary and binary ops: the plan passes the checker
// and the engine computes what the unplanned run computes.
Graph random_graph(uint32_t seed, int nodes) {
  std::mt19937 rng(seed);
  const Shape shapes[] = {{24}, {2, 12}, {4, 6}, {2, 3, 4}, {6, 4}};
  const OpKind unary[] = {OpKind::kRelu, OpKind::kNeg, OpKind::kTanh, OpKind::kSin, OpKind::kAbs};
  const OpKind binary[] = {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kMaximum};
  Graph g;
  std::vector<ValueId> vals = {g.add_input("x0", TensorType(DType::kF32, shapes[seed % 5])),
                               g.add_input("x1", TensorType(DType::kF32, shapes[(seed + 2) % 5]))};
  auto pick = [&] {  // mostly recent values, sometimes any (long lifetimes, fan-outs)
    const size_t back = rng() % 3 == 0 ? rng() % vals.size() : rng() % std::min<size_t>(4, vals.size());
    return vals[vals.size() - 1 - back];
  };
  for (int i = 0; i < nodes; ++i) {
    const unsigned r = rng() % 10;
    ValueId a = pick();
    if (r < 4) {
      vals.push_back(reshape(g, a, shapes[rng() % 5]));
    } else if (r == 4) {
      vals.push_back(g.add_node1(OpKind::kCopy, {a}));
    } else if (r < 7) {
      vals.push_back(g.add_node1(unary[rng() % 5], {a}));
    } else {
      ValueId b = pick();
      if (g.type(b).shape() != g.type(a).shape()) b = reshape(g, b, g.type(a).shape());
      vals.push_back(g.add_node1(binary[rng() % 4], {a, b}));
    }
    if (rng() % 12 == 0) g.mark_output(vals.back(), std::string("o").append(std::to_string(i)));
  }
  g.mark_output(vals.back(), "last");
  return g;
}

TEST(MemoryPlanAlias, RandomGraphsNeverOverlapLiveGroupsAndMatchTheUnplannedRun) {
  size_t total_aliases = 0;
  for (uint32_t seed = 0; seed < 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Graph g = random_graph(seed + 500, 30);
    g.verify();
    for (size_t alignment : {size_t(16), size_t(64)}) {
      const MemoryPlan p = plan_memory(g, alignment);
      total_aliases += check_plan(g, p);
      const MemoryPlan q = plan_memory(g, alignment, false);
      EXPECT_EQ(check_plan(g, q), 0u);
      EXPECT_EQ(p.naive_bytes, q.naive_bytes);
    }
    const auto in = random_inputs(g, seed);
    expect_same(run_engine(g, in), run_unplanned(g, in));
  }
  EXPECT_GT(total_aliases, 100u);  // the generator does exercise the rule
}

#ifdef KILN_WITH_CUDA
// ---- on a GPU (skipped without one) ---------------------------------------------------------

TEST(MemoryPlanAliasCuda, AliasedReshapeAndCopyLaunchNothingAndCaptureNoNode) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {8, 40}));
  ValueId r = reshape(g, x, {320});
  ValueId c = g.add_node1(OpKind::kCopy, {r});
  g.mark_output(permute(g, reshape(g, c, {1, 320}), {1, 0}), "y");  // a permute of a size-1 dim
  Backend& gpu = get_backend(Device::parse("cuda:0"));
  const Floats v = random_floats(320, 11);
  auto a = gpu.allocate(320 * 4), b = gpu.allocate(320 * 4);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (const auto& n : g.nodes()) {
    auto made = gpu.make_kernel(*n, g, KernelOptions{});
    const Bytes state = made->state();
    auto remade = gpu.make_kernel(*n, g, KernelOptions{}, &state);  // as an engine file loads it
    for (const Kernel* k : {made.get(), remade.get()}) {
      SCOPED_TRACE(op_name(n->op));
      auto nodes_captured = [&](void* in, void* out) {
        const void* ins[1] = {in};
        void* outs[1] = {out};
        RunContext rc;
        rc.stream = stream;
        cudaGraph_t graph = nullptr;
        EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        k->run(ins, outs, rc);
        EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
        size_t count = 0;
        EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &count), cudaSuccess);
        cudaGraphDestroy(graph);
        return count;
      };
      EXPECT_EQ(nodes_captured(a.get(), a.get()), 0u);
      EXPECT_GE(nodes_captured(a.get(), b.get()), 1u);
      // Run directly: aliased leaves the bytes, distinct copies them.
      gpu.copy_from_host(a.get(), v.data(), 320 * 4, stream);
      cudaMemsetAsync(b.get(), 0, 320 * 4, stream);
      const void* ins[1] = {a.get()};
      void* same[1] = {a.get()};
      void* other[1] = {b.get()};
      RunContext rc;
      rc.stream = stream;
      k->run(ins, same, rc);
      k->run(ins, other, rc);
      Floats ha(320), hb(320);
      gpu.copy_to_host(ha.data(), a.get(), 320 * 4, stream);
      gpu.copy_to_host(hb.data(), b.get(), 320 * 4, stream);
      gpu.synchronize(stream);
      EXPECT_EQ(ha, v);
      EXPECT_EQ(hb, v);
    }
  }
  cudaStreamDestroy(stream);
}

TEST(MemoryPlanAliasCuda, AttentionBlockEngineMatchesTheCpuEngineWithAndWithoutGraphs) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  const Graph g = attention_block();
  KernelOptions strict;  // strict FP32 (no TF32), to compare with the CPU closely
  strict.policy.allow_tf32 = false;
  auto gpu_engine = Engine::create(g, Device::parse("cuda:0"), strict);
  EXPECT_EQ(gpu_engine->memory_plan().aliased_values, 7u);
  Backend& gpu = get_backend(Device::parse("cuda:0"));
  const auto in = random_inputs(g, 21);
  const auto want = run_engine(g, in);
  const size_t in_bytes = in[0].size() * 4, out_bytes = want[0].size() * 4;
  auto din = gpu.allocate(in_bytes), dout = gpu.allocate(out_bytes);
  gpu.copy_from_host(din.get(), in[0].data(), in_bytes, nullptr);
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "CUDA graph" : "direct");
    auto ctx = gpu_engine->create_execution_context(graphs);
    for (int rep = 0; rep < 3; ++rep) {  // capture, then replays over a used arena
      cudaMemset(dout.get(), 0xff, out_bytes);
      ctx->execute({din.get()}, {dout.get()}, nullptr);
      Floats got(want[0].size());
      gpu.copy_to_host(got.data(), dout.get(), out_bytes, nullptr);
      gpu.synchronize(nullptr);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[0][i], 1e-4f * (1.0f + std::fabs(want[0][i]))) << "rep " << rep << " element " << i;
    }
  }
}
#endif  // KILN_WITH_CUDA

}  // namespace
