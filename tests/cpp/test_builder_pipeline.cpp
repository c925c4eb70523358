// Which passes Builder::build runs for a config (src/builder/builder.cpp): lowering to f16 /
// bf16 only where the config asks for it (a CPU build keeps f32 whenever f32 is enabled), the
// engine's interface keeping the network's types, and channels-last regions for GPU builds only.
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

// conv -> relu -> global pool -> linear, f32.
Graph small_net() {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 8, 8}));
  ValueId y = g.add_node1(OpKind::kConv, {x, f32_weight(g, "conv.w", {8, 3, 3, 3}, 1), f32_weight(g, "conv.b", {8}, 2)},
                          conv2d_attrs(1, 1, 1));
  y = g.add_node1(OpKind::kRelu, {y});
  Attrs pool;
  pool.set("output_size", Shape{1, 1});
  y = g.add_node1(OpKind::kAdaptiveAvgPool, {y}, pool);
  Attrs flat;
  flat.set("shape", Shape{2, 8});
  y = g.add_node1(OpKind::kReshape, {y}, flat);
  g.mark_output(g.add_node1(OpKind::kLinear, {y, f32_weight(g, "fc.w", {5, 8}, 3)}), "y");
  return g;
}

bool has_dtype(const Graph& g, DType t) {
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (g.type(v).dtype == t) return true;
  return false;
}

TEST(BuilderPipeline, CpuBuildWithOnlyF16EnabledComputesInF16BehindAnF32Interface) {
  const Graph g = small_net();
  BuilderConfig cfg;
  cfg.enabled_precisions = {DType::kF16};
  auto e = Builder(cfg).build(g);
  EXPECT_NE(e->build_log().find("lower_precision(f16)"), std::string::npos) << e->build_log();
  EXPECT_TRUE(has_dtype(e->graph(), DType::kF16)) << e->graph().to_string();
  ASSERT_EQ(e->inputs().size(), 1u);
  EXPECT_EQ(e->inputs()[0].type.dtype, DType::kF32);
  EXPECT_EQ(e->outputs()[0].type.dtype, DType::kF32);
  auto in = random_inputs(g, 4);
  expect_close(run_engine(e, in), run_plain(g, in), 1e-2f, 1e-2f);
}

TEST(BuilderPipeline, CpuBuildKeepsF32WhenEnabledAndStaysChannelsFirst) {
  const Graph g = small_net();
  for (const std::vector<DType>& precisions : {std::vector<DType>{DType::kF32},
                                                std::vector<DType>{DType::kF32, DType::kF16, DType::kBF16}}) {
    BuilderConfig cfg;
    cfg.enabled_precisions = precisions;
    auto e = Builder(cfg).build(g);
    EXPECT_EQ(e->build_log().find("lower_precision"), std::string::npos) << e->build_log();
    EXPECT_FALSE(has_dtype(e->graph(), DType::kF16));
    EXPECT_EQ(e->graph().to_string().find("layout"), std::string::npos) << e->graph().to_string();
    EXPECT_EQ(e->build_log().find("to_channels_last"), std::string::npos) << e->build_log();
    auto in = random_inputs(g, 5);
    expect_close(run_engine(e, in), run_plain(g, in), 1e-5f, 1e-5f);
  }
}

TEST(BuilderPipeline, CpuBuildWithOnlyBf16EnabledComputesInBf16) {
  const Graph g = small_net();
  BuilderConfig cfg;
  cfg.enabled_precisions = {DType::kBF16};
  auto e = Builder(cfg).build(g);
  EXPECT_NE(e->build_log().find("lower_precision(bf16)"), std::string::npos) << e->build_log();
  EXPECT_TRUE(has_dtype(e->graph(), DType::kBF16));
  auto in = random_inputs(g, 6);
  expect_close(run_engine(e, in), run_plain(g, in), 5e-2f, 5e-2f);
}

}  // namespace
