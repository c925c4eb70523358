// The partitioner's question (include/kiln/import.h ImportTrial, include/kiln/builder.h
// BuildTrial): nodes asked in order see what produced their inputs, a refused node's outputs read
// as inputs of the nodes after it, and a trial for CUDA refuses what the CUDA backend cannot run,
// with the backend's reason, where the CPU trial accepts it. No device is needed.
#include <gtest/gtest.h>

#include "kiln/builder.h"
#include "tests/cpp/import_test_util.h"

using namespace kiln;
using namespace kiln::import_test;

namespace {

// x (bool mask) -> int32 -> cumsum over dim 1: the front end's description of RoBERTa's position ids.
struct MaskCumsum {
  Fx fx;
  int32_t mask, ints, sums;
  MaskCumsum() {
    mask = fx.input("mask", DType::kBool, {2, 16});
    ints = fx.node("aten._to_copy.default", {T(mask)}, DType::kI32, {2, 16}, {{"dtype", D(DType::kI32)}});
    sums = fx.node("aten.cumsum.default", {T(ints), I(1)}, DType::kI64, {2, 16});
  }
};

// A conv over 3 spatial dims in `dt`, then a relu of its output.
struct Conv3dRelu {
  Fx fx;
  explicit Conv3dRelu(DType dt) {
    const int32_t x = fx.input("x", dt, {1, 4, 3, 6, 6});
    const int32_t w = fx.input("w", dt, {4, 4, 3, 3, 3});
    const int32_t c =
        fx.node("aten.convolution.default",
                {T(x), T(w), N(), Ints({1, 1, 1}), Ints({1, 1, 1}), Ints({1, 1, 1}), B(false), Ints({0, 0, 0}), I(1)},
                dt, {1, 4, 3, 6, 6});
    fx.node("aten.relu.default", {T(c)}, dt, {1, 4, 3, 6, 6});
  }
};

TEST(ImportTrial, NodesSeeWhatProducedTheirInputs) {
  // After the cast, cumsum knows its input holds small integers and sums in an f32 matmul; asked
  // alone, its int32 input could hold anything and it sums in f64.
  MaskCumsum m;
  std::string matmul;
  const auto note_matmul = [&](const Graph& g, size_t first) {
    for (size_t i = first; i < g.nodes().size(); ++i)
      if (g.nodes()[i]->op == OpKind::kMatmul) matmul = dtype_name(g.type(g.nodes()[i]->inputs[0]).dtype);
    return std::string();
  };
  ImportTrial in_order;
  for (const ImportNode& n : m.fx.g.nodes) EXPECT_TRUE(in_order.add(n, m.fx.g, note_matmul).supported) << n.target;
  EXPECT_EQ(matmul, "f32");
  EXPECT_TRUE(ImportTrial().add(m.fx.g.nodes[1], m.fx.g, note_matmul).supported);
  EXPECT_EQ(matmul, "f64");
}

TEST(ImportTrial, ARefusedNodesOutputsReadAsInputs) {
  Fx fx;
  const int32_t x = fx.input("x", DType::kF32, {4});
  const int32_t y = fx.node("aten.frobnicate.default", {T(x)}, DType::kF32, {4});
  const int32_t z = fx.node("aten.relu.default", {T(y)}, DType::kF32, {4});
  fx.node("aten.add.Tensor", {T(z), T(y)}, DType::kF32, {4});
  ImportTrial trial;
  const ImportSupport refused = trial.add(fx.g.nodes[0], fx.g);
  EXPECT_FALSE(refused.supported);
  EXPECT_NE(refused.reason.find("no importer for aten.frobnicate.default"), std::string::npos) << refused.reason;
  EXPECT_TRUE(trial.add(fx.g.nodes[1], fx.g).supported);
  EXPECT_TRUE(trial.add(fx.g.nodes[2], fx.g).supported);
}

TEST(ImportTrial, AnAcceptRefusalLeavesTheGraphAsItWas) {
  // The callback sees the nodes the relu converted to and refuses them; the add after it reads the
  // relu's output as an input and is accepted, and the callback saw only the add's own nodes then.
  Fx fx;
  const int32_t x = fx.input("x", DType::kF32, {4});
  const int32_t r = fx.node("aten.relu.default", {T(x)}, DType::kF32, {4});
  fx.node("aten.add.Tensor", {T(r), T(x)}, DType::kF32, {4});
  ImportTrial trial;
  std::vector<std::string> seen;
  const auto accept = [&](const Graph& g, size_t first) {
    std::string ops;
    for (size_t i = first; i < g.nodes().size(); ++i) ops += op_name(g.nodes()[i]->op);
    seen.push_back(ops);
    return ops == "relu" ? std::string("no relu today") : std::string();
  };
  const ImportSupport relu = trial.add(fx.g.nodes[0], fx.g, accept);
  EXPECT_FALSE(relu.supported);
  EXPECT_EQ(relu.reason, "no relu today");
  EXPECT_TRUE(trial.add(fx.g.nodes[1], fx.g, accept).supported);
  EXPECT_EQ(seen, (std::vector<std::string>{"relu", "add"}));
}

TEST(BuildTrial, TheCpuRunsWhatItImports) {
  Conv3dRelu c(DType::kF64);
  BuildTrial trial(DeviceType::kCPU);
  for (const ImportNode& n : c.fx.g.nodes) EXPECT_TRUE(trial.add(n, c.fx.g).supported) << n.target;
}

#ifdef KILN_WITH_CUDA
TEST(BuildTrial, CudaRefusesWhatItsBackendCannotRunWithTheReason) {
  Conv3dRelu f32(DType::kF32), f64(DType::kF64);
  BuildTrial trial(DeviceType::kCUDA);
  EXPECT_TRUE(trial.add(f32.fx.g.nodes[0], f32.fx.g).supported);
  BuildTrial doubles(DeviceType::kCUDA);
  const ImportSupport conv = doubles.add(f64.fx.g.nodes[0], f64.fx.g);
  EXPECT_FALSE(conv.supported);
  EXPECT_EQ(conv.reason, "the CUDA backend cannot run conv: conv on CUDA runs f32, f16 and bf16, got f64");
  EXPECT_TRUE(doubles.add(f64.fx.g.nodes[1], f64.fx.g).supported);  // the relu reads the conv's output as an input
}

TEST(BuildTrial, CudaJudgesANodeByWhatItImportsToInOrder) {
  // cumsum's f32 matmul after the cast runs on CUDA; the f64 one it makes alone does not.
  MaskCumsum m;
  BuildTrial in_order(DeviceType::kCUDA);
  for (const ImportNode& n : m.fx.g.nodes) EXPECT_TRUE(in_order.add(n, m.fx.g).supported) << n.target;
  const ImportSupport alone = BuildTrial(DeviceType::kCUDA).add(m.fx.g.nodes[1], m.fx.g);
  EXPECT_FALSE(alone.supported);
  EXPECT_NE(alone.reason.find("f64"), std::string::npos) << alone.reason;
}
#else
TEST(BuildTrial, WithoutACudaBackendCudaRefusesEverythingSayingWhy) {
  Conv3dRelu c(DType::kF32);
  const ImportSupport relu = BuildTrial(DeviceType::kCUDA).add(c.fx.g.nodes[1], c.fx.g);
  EXPECT_FALSE(relu.supported);
  EXPECT_NE(relu.reason.find("no CUDA backend"), std::string::npos) << relu.reason;
}
#endif

}  // namespace
