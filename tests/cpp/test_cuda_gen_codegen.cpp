// The CUDA backend's generated-kernel families (reduce, softmax, norm, pool, shape, gather,
// generator) without a GPU: for nodes of many ops, dtypes and shapes (every case of
// tests/python/test_ops.py in these families, plus the large shapes that select the other
// variants), the generator must accept the node, its source must compile with NVRTC for sm_90,
// every launch (and its misaligned-buffer fallback) must name a kernel of that source, and the plan must survive the engine-file
// round trip. A few planning decisions that matter for speed are checked as well (vectorized
// words, the tiled transpose, the register-cached row kernels). Running the kernels and
// comparing with the CPU backend is tests/python/test_cuda_ops.py, on a machine with a GPU.
#ifdef KILN_WITH_CUDA

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <tuple>

#include "kiln/kiln.h"
#include "src/backends/cuda/codegen/plan.h"
#include "tests/cpp/cuda_node_test_util.h"

using namespace kiln;
namespace gen = kiln::cuda::gen;
using namespace kiln::test;

namespace {

using Generator = gen::Generated (*)(const Node&, const Graph&);

// Generates, compiles and round-trips the plan; returns the plan's description.
std::string check(Generator fn, const Built& b) {
  const gen::Generated gn = fn(*b.node, b.g);
  const std::string what = std::string(op_name(b.node->op)) + " " + b.g.type(b.node->inputs.empty() ? b.node->outputs[0] : b.node->inputs[0]).to_string();
  if (!gn.plan.launches.empty()) {
    EXPECT_FALSE(gn.source.empty()) << what;
    const Bytes cubin = gen::compile_for_arch(gn.source, what, 90);
    EXPECT_GT(cubin.size(), 0u) << what;
    for (const gen::Launch& l : gn.plan.launches) {
      EXPECT_NE(gn.source.find("void " + l.kernel + "("), std::string::npos) << what << ": no kernel " << l.kernel;
      EXPECT_GE(l.grid[0], 1u);
      EXPECT_LE(l.block[0] * l.block[1] * l.block[2], 1024u);
      // A vectorized launch carries a narrower fallback for misaligned caller buffers.
      EXPECT_EQ(l.align > 1, l.alt.size() == 1) << what << ": " << l.kernel;
      for (const gen::Launch& a : l.alt)
        EXPECT_NE(gn.source.find("void " + a.kernel + "("), std::string::npos) << what << ": no kernel " << a.kernel;
    }
  }
  const Bytes bytes = gen::serialize(gn.plan);
  const gen::Plan back = gen::deserialize(bytes);
  EXPECT_EQ(gen::serialize(back), bytes) << what;
  EXPECT_EQ(back.describe, gn.plan.describe);
  return gn.plan.describe;
}

const DType kFloats[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64};

}  // namespace

TEST(CudaGenCodegen, Reduce) {
  const OpKind ops[] = {OpKind::kReduceSum, OpKind::kReduceMean, OpKind::kReduceMax, OpKind::kReduceMin,
                        OpKind::kReduceVar};
  const std::vector<std::vector<int64_t>> axes = {{1}, {0, 2}, {}, {2}, {0, 1, 2}};
  for (DType dt : kFloats)
    for (OpKind op : ops)
      for (const auto& ax : axes)
        for (bool keep : {false, dt == DType::kF32}) {
          Attrs a = attrs({{"axes", ax}, {"keepdim", keep}});
          if (op == OpKind::kReduceVar) a.set("correction", 1.0);
          check(gen::generate_reduce, one_node(op, {tt(dt, {3, 4, 5})}, a));
          if (op != OpKind::kReduceSum && op != OpKind::kReduceMean) continue;
          a.set("square", true);  // a sum / mean of squares, in rows and columns
          EXPECT_NE(check(gen::generate_reduce, one_node(op, {tt(dt, {3, 4, 5})}, a)).find(" of squares "),
                    std::string::npos);
        }
  // Integers (sum, max, min) and bool (max / min).
  for (DType dt : {DType::kI64, DType::kI32, DType::kI8, DType::kU8})
    for (OpKind op : {OpKind::kReduceSum, OpKind::kReduceMax, OpKind::kReduceMin})
      check(gen::generate_reduce, one_node(op, {tt(dt, {4, 6})}, attrs({{"axes", std::vector<int64_t>{1}}})));
  check(gen::generate_reduce, one_node(OpKind::kReduceMax, {tt(DType::kBool, {4, 6})},
                                       attrs({{"axes", std::vector<int64_t>{0}}})));
  // Long rows take the block kernel with 16-byte loads; columns the column kernel.
  const std::string rows = check(gen::generate_reduce, one_node(OpKind::kReduceMean, {tt(DType::kF16, {8, 4096})},
                                                                attrs({{"axes", std::vector<int64_t>{1}}})));
  EXPECT_NE(rows.find("block per output, 8-wide"), std::string::npos) << rows;
  // A short run takes the lanes that cover its words, several outputs per warp.
  const std::pair<Shape, std::string> short_rows[] = {{{389, 32}, "(4 lanes per output, 8-wide"},
                                                      {{50, 7}, "(8 lanes per output, 1-wide"},
                                                      {{9, 8}, "(1 lane per output, 8-wide"},
                                                      {{4, 600}, "(warp per output, 8-wide"}};
  for (const auto& [shape, want] : short_rows) {
    const std::string d = check(gen::generate_reduce, one_node(OpKind::kReduceSum, {tt(DType::kF16, shape)},
                                                               attrs({{"axes", std::vector<int64_t>{1}}})));
    EXPECT_NE(d.find(want), std::string::npos) << d;
  }
  const std::string cols = check(gen::generate_reduce, one_node(OpKind::kReduceSum, {tt(DType::kF32, {64, 3, 100})},
                                                                attrs({{"axes", std::vector<int64_t>{0}}})));
  EXPECT_NE(cols.find("columns"), std::string::npos) << cols;
  // Columns whose runs are whole 16-byte words: the vector kernel, the scalar one as its fallback
  // (a global average pool at batch 1, a variance, integer and bool columns, a short reduction).
  const std::pair<DType, Shape> vec_cols[] = {{DType::kF16, {1, 784, 72}}, {DType::kF32, {2, 49, 64}},
                                              {DType::kI32, {4, 6, 16}},   {DType::kI8, {4, 3, 32}},
                                              {DType::kF64, {3, 10, 4}},   {DType::kBF16, {2, 3, 8}}};
  for (const auto& [dt, shape] : vec_cols)
    for (OpKind op : {OpKind::kReduceSum, OpKind::kReduceMean, OpKind::kReduceVar, OpKind::kReduceMax}) {
      if (!is_floating(dt) && (op == OpKind::kReduceMean || op == OpKind::kReduceVar)) continue;
      Attrs a = attrs({{"axes", std::vector<int64_t>{1}}});
      if (op == OpKind::kReduceVar) a.set("correction", 1.0);
      const std::string d = check(gen::generate_reduce, one_node(op, {tt(dt, shape)}, a));
      const std::string wide = std::to_string(16 / dtype_size(dt)) + "-wide";
      EXPECT_NE(d.find("columns, " + wide), std::string::npos) << d;
    }
  const std::string bools = check(gen::generate_reduce, one_node(OpKind::kReduceMax, {tt(DType::kBool, {4, 6, 16})},
                                                                 attrs({{"axes", std::vector<int64_t>{1}}})));
  EXPECT_NE(bools.find("columns, 16-wide"), std::string::npos) << bools;
  // Empty reduction: a fill.
  check(gen::generate_reduce, one_node(OpKind::kReduceMean, {tt(DType::kF32, {3, 0})},
                                       attrs({{"axes", std::vector<int64_t>{1}}})));
  for (DType dt : {DType::kF32, DType::kF16, DType::kI64, DType::kBool})
    for (int64_t axis : {0, 1, 2})
      check(gen::generate_reduce, one_node(OpKind::kArgmax, {tt(dt, {3, 5, 7})}, attrs({{"axis", axis}, {"keepdim", true}})));
}

TEST(CudaGenCodegen, Softmax) {
  for (DType dt : kFloats)
    for (OpKind op : {OpKind::kSoftmax, OpKind::kLogSoftmax})
      for (const auto& [shape, axis] : std::vector<std::pair<Shape, int64_t>>{
               {{2, 5, 7}, 2}, {{2, 5, 7}, 1}, {{4, 3}, 0}, {{3, 130}, 1}, {{4, 1000}, 1}, {{2, 4096}, 1},
               {{2, 50000}, 1}, {{8, 128}, 1}})
        check(gen::generate_softmax, one_node(op, {tt(dt, shape)}, attrs({{"axis", axis}})));
  const std::string warp =
      check(gen::generate_softmax, one_node(OpKind::kSoftmax, {tt(DType::kF16, {64, 512})}, attrs({{"axis", int64_t(1)}})));
  EXPECT_NE(warp.find("warp per row in registers, 8-wide"), std::string::npos) << warp;
  const std::string block =
      check(gen::generate_softmax, one_node(OpKind::kSoftmax, {tt(DType::kF32, {4, 4096})}, attrs({{"axis", int64_t(1)}})));
  EXPECT_NE(block.find("block per row in registers, 4-wide"), std::string::npos) << block;
}

TEST(CudaGenCodegen, Norm) {
  for (DType dt : kFloats) {
    const std::vector<DType> pdts = dt == DType::kF16 ? std::vector<DType>{dt, DType::kF32} : std::vector<DType>{dt};
    for (DType pd : pdts) {
      for (const auto& [shape, k] : std::vector<std::pair<Shape, int64_t>>{
               {{2, 5, 8}, 1}, {{3, 4, 6}, 2}, {{4, 10}, 1}, {{2, 768}, 1}, {{2, 4096}, 1}, {{2, 40000}, 1}}) {
        const Shape ps(shape.end() - k, shape.end());
        Attrs a = attrs({{"normalized_rank", k}, {"eps", 1e-5}});
        check(gen::generate_norm, one_node(OpKind::kLayerNorm, {tt(dt, shape), tt(pd, ps), tt(pd, ps)}, a));
        check(gen::generate_norm, one_node(OpKind::kLayerNorm, {tt(dt, shape), std::nullopt, std::nullopt}, a));
        check(gen::generate_norm, one_node(OpKind::kLayerNorm, {tt(dt, shape), tt(pd, ps), std::nullopt}, a));
      }
      check(gen::generate_norm, one_node(OpKind::kGroupNorm, {tt(dt, {2, 6, 3, 3}), tt(pd, {6}), tt(pd, {6})},
                                         attrs({{"groups", int64_t(2)}, {"eps", 1e-5}})));
      check(gen::generate_norm, one_node(OpKind::kGroupNorm, {tt(dt, {3, 4, 5}), std::nullopt, std::nullopt},
                                         attrs({{"groups", int64_t(4)}, {"eps", 1e-5}})));
      const std::string last =
          check(gen::generate_norm,
                one_node(OpKind::kGroupNorm, {tt(dt, {32, 4, 4, 64}), tt(pd, {64}), tt(pd, {64})},
                         attrs({{"groups", int64_t(16)}, {"eps", 1e-5}, {"layout", std::string("nhwc")}})));
      EXPECT_NE(last.find("(channels last: "), std::string::npos) << last;
      // Channels last in groups of 40 (Stable Diffusion's 1280 / 32) and of 3 (one channel a
      // word), and more words a position than a block has threads (the block-per-group kernel).
      for (const auto& [shape, groups, want] : std::vector<std::tuple<Shape, int64_t, std::string>>{
               {{8, 8, 8, 1280}, 32, "(channels last: "},
               {{1, 5, 7, 9}, 3, "(channels last: "},
               {{2, 4, 4, 3072}, 1024, "(block per group, channels last)"}}) {
        const std::string s = check(
            gen::generate_norm, one_node(OpKind::kGroupNorm, {tt(dt, shape), tt(pd, {shape[3]}), std::nullopt},
                                         attrs({{"groups", groups}, {"eps", 1e-5}, {"layout", std::string("nhwc")}})));
        EXPECT_NE(s.find(want), std::string::npos) << s;
      }
      for (const Shape& s : std::vector<Shape>{{2, 3, 4, 5}, {4, 3}, {2, 3, 7}}) {
        check(gen::generate_norm, one_node(OpKind::kBatchNorm, {tt(dt, s), tt(pd, {3}), tt(pd, {3}), tt(pd, {3}), tt(pd, {3})},
                                           attrs({{"eps", 1e-5}})));
        check(gen::generate_norm, one_node(OpKind::kBatchNorm, {tt(dt, s), tt(pd, {3}), tt(pd, {3})}, attrs({{"eps", 1e-3}})));
      }
    }
  }
  const std::string ln = check(gen::generate_norm, one_node(OpKind::kLayerNorm, {tt(DType::kBF16, {16, 768}),
                                                                                   tt(DType::kBF16, {768}), tt(DType::kBF16, {768})},
                                                           attrs({{"normalized_rank", int64_t(1)}, {"eps", 1e-5}})));
  EXPECT_NE(ln.find("warp per row in registers, 8-wide"), std::string::npos) << ln;
  // Short rows: the power of two of lanes that covers a row's words, several rows a warp.
  for (const auto& [d, lanes] : std::vector<std::pair<int64_t, std::string>>{
           {32, "4 lanes"}, {64, "8 lanes"}, {96, "16 lanes"}, {160, "warp"}, {7, "8 lanes"}, {8, "1 lane"}}) {
    const std::string s =
        check(gen::generate_norm,
              one_node(OpKind::kLayerNorm, {tt(DType::kF16, {1000, d}), tt(DType::kF16, {d}), std::nullopt},
                       attrs({{"normalized_rank", int64_t(1)}, {"eps", 1e-5}})));
    EXPECT_NE(s.find("(" + lanes + " per row in registers"), std::string::npos) << s;
  }
}

// A fused activation reaches every layer_norm / group_norm kernel: warp and block rows, the
// split rows, the block per group, and the channels-last kernels (one launch and chunks).
TEST(CudaGenCodegen, NormActivationInEveryKernel) {
  struct Case {
    OpKind op;
    Shape x;
    Attrs a;
    const char* path;
  };
  const Attrs nhwc = attrs({{"groups", int64_t(32)}, {"eps", 1e-5}, {"layout", std::string("nhwc")}});
  const std::vector<Case> cases = {
      {OpKind::kLayerNorm, {64, 768}, attrs({{"eps", 1e-5}}), "warp per row"},
      {OpKind::kLayerNorm, {64, 4096}, attrs({{"eps", 1e-5}}), "block per row in registers"},
      {OpKind::kLayerNorm, {2, 40000}, attrs({{"eps", 1e-5}}), "per row"},
      {OpKind::kGroupNorm, {2, 64, 8, 8}, attrs({{"groups", int64_t(32)}, {"eps", 1e-5}}), "block per group"},
      {OpKind::kGroupNorm, {1, 64, 64, 64}, attrs({{"groups", int64_t(4)}, {"eps", 1e-5}}), "per group"},
      {OpKind::kGroupNorm, {32, 8, 8, 128}, nhwc, "block per sample"},
      {OpKind::kGroupNorm, {8, 32, 32, 256}, nhwc, "blocks per sample"},
      {OpKind::kGroupNorm, {1, 32, 32, 128}, nhwc, "block per group, channels last"}};
  for (DType dt : {DType::kF16, DType::kF32})
    for (const char* act : {"silu", "clipped_relu", "tanh"})
      for (const Case& c : cases) {
        Attrs a = c.a;
        a.set("activation", std::string(act));
        if (std::string(act) == "clipped_relu") a.set("activation_max", 6.0);
        const int64_t ch = c.op == OpKind::kLayerNorm ? c.x.back() : c.x[a.has("layout") ? 3 : 1];
        const Built b = one_node(c.op, {tt(dt, c.x), tt(dt, {ch}), tt(dt, {ch})}, a);
        const std::string what = std::string(op_name(c.op)) + " " + tt(dt, c.x).to_string() + " + " + act;
        const std::string d = check(gen::generate_norm, b);
        EXPECT_NE(d.find(c.path), std::string::npos) << what << ": " << d;
        EXPECT_NE(d.find(std::string(" + ") + act), std::string::npos) << what << ": " << d;
        const std::string src = gen::generate_norm(*b.node, b.g).source;
        EXPECT_NE(src.find(std::string("#define KG_ACT(v) kiln_") + (std::string(act) == "tanh" ? "tanh" : act)),
                  std::string::npos)
            << what;
      }
}

TEST(CudaGenCodegen, RowSplitCoversARowWithTheFewestWholeVectors) {
  for (int esz : {1, 2, 4, 8})
    for (int lanes : {32, 512})
      for (int64_t n : {1, 3, 4, 24, 100, 768, 1000, 1023, 1024, 3072, 4096, 16384}) {
        const gen::RowSplit r = gen::split_row(n, lanes, esz);
        SCOPED_TRACE(testing::Message() << "n " << n << ", lanes " << lanes << ", esz " << esz);
        EXPECT_EQ(n % r.vec, 0);
        EXPECT_LE(r.vec * esz, 16);
        EXPECT_EQ(r.per_lane % r.vec, 0);
        EXPECT_GE(int64_t(r.per_lane) * lanes, n);                // the row is covered
        EXPECT_LT(int64_t(r.per_lane - r.vec) * lanes, n);         // by the fewest vectors
        if (n % (16 / esz) == 0) {
          EXPECT_EQ(r.vec * esz, 16);  // the widest load that divides the row
        }
      }
  const gen::RowSplit bert = gen::split_row(768, 32, 2);  // a BERT-base f16 row over one warp
  EXPECT_EQ(bert.vec, 8);
  EXPECT_EQ(bert.per_lane, 24);
}

TEST(CudaGenCodegen, Pool) {
  for (DType dt : kFloats) {
    for (const auto& [shape, k, s, p, d, ceil] : std::vector<std::tuple<Shape, Shape, Shape, Shape, Shape, bool>>{
             {{2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false}, {{1, 2, 9, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
             {{1, 2, 8, 8}, {3, 3}, {2, 2}, {0, 0}, {1, 1}, true}, {{1, 2, 9, 9}, {2, 3}, {1, 2}, {1, 1}, {2, 1}, false},
             {{2, 3, 11}, {3}, {2}, {1}, {1}, false}}) {
      check(gen::generate_pool, one_node(OpKind::kMaxPool, {tt(dt, shape)},
                                         attrs({{"kernel", k}, {"stride", s}, {"padding", p}, {"dilation", d}, {"ceil_mode", ceil}})));
      check(gen::generate_pool, one_node(OpKind::kAvgPool, {tt(dt, shape)},
                                         attrs({{"kernel", k}, {"stride", s}, {"padding", p}, {"ceil_mode", ceil},
                                                {"count_include_pad", false}, {"divisor", int64_t(0)}})));
    }
    check(gen::generate_pool, one_node(OpKind::kAdaptiveAvgPool, {tt(dt, {2, 3, 8, 8})}, attrs({{"output_size", Shape{1, 1}}})));
    check(gen::generate_pool, one_node(OpKind::kAdaptiveAvgPool, {tt(dt, {1, 2, 7, 5})}, attrs({{"output_size", Shape{3, 2}}})));
    check(gen::generate_pool, one_node(OpKind::kAdaptiveAvgPool, {tt(dt, {2, 3, 10})}, attrs({{"output_size", Shape{4}}})));
  }
}

TEST(CudaGenCodegen, Shape) {
  const DType dts[] = {DType::kF32, DType::kF16, DType::kI64, DType::kBool, DType::kF64};
  for (DType dt : dts) {
    check(gen::generate_shape, one_node(OpKind::kReshape, {tt(dt, {2, 3, 4})}, attrs({{"shape", Shape{6, 4}}})));
    check(gen::generate_shape, one_node(OpKind::kCopy, {tt(dt, {3, 4})}, {}));
    check(gen::generate_shape, one_node(OpKind::kPermute, {tt(dt, {2, 3, 4})}, attrs({{"perm", Shape{2, 0, 1}}})));
    check(gen::generate_shape, one_node(OpKind::kPermute, {tt(dt, {2, 3, 4, 5})}, attrs({{"perm", Shape{0, 2, 3, 1}}})));
    check(gen::generate_shape, one_node(OpKind::kPermute, {tt(dt, {2, 12, 64, 64})}, attrs({{"perm", Shape{0, 2, 1, 3}}})));
    check(gen::generate_shape, one_node(OpKind::kExpand, {tt(dt, {3, 1, 4})}, attrs({{"shape", Shape{3, 5, 4}}})));
    check(gen::generate_shape, one_node(OpKind::kExpand, {tt(dt, {1, 4})}, attrs({{"shape", Shape{3, 4}}})));
    check(gen::generate_shape, one_node(OpKind::kSlice, {tt(dt, {3, 7})},
                                        attrs({{"axis", int64_t(1)}, {"start", int64_t(1)}, {"end", int64_t(6)}, {"step", int64_t(2)}})));
    check(gen::generate_shape, one_node(OpKind::kSlice, {tt(dt, {5, 2, 3})},
                                        attrs({{"axis", int64_t(0)}, {"start", int64_t(0)}, {"end", int64_t(2)}, {"step", int64_t(1)}})));
    check(gen::generate_shape, one_node(OpKind::kConcat, {tt(dt, {2, 3}), tt(dt, {2, 5}), tt(dt, {2, 1})}, attrs({{"axis", int64_t(1)}})));
    check(gen::generate_shape, one_node(OpKind::kSplit, {tt(dt, {3, 6})}, attrs({{"axis", int64_t(1)}, {"sizes", Shape{2, 3, 1}}})));
    for (const char* mode : {"constant", "reflect", "replicate"})
      check(gen::generate_shape, one_node(OpKind::kPad, {tt(dt, {1, 2, 5, 5})},
                                          attrs({{"pads", Shape{0, 0, 0, 0, 2, 1, 1, 3}}, {"mode", std::string(mode)}, {"value", 0.5}})));
  }
  const std::string nhwc = check(gen::generate_shape, one_node(OpKind::kPermute, {tt(DType::kF16, {8, 64, 56, 56})},
                                                               attrs({{"perm", Shape{0, 2, 3, 1}}})));
  EXPECT_NE(nhwc.find("tiled transpose of pairs"), std::string::npos) << nhwc;
  const std::string odd = check(gen::generate_shape, one_node(OpKind::kPermute, {tt(DType::kF16, {4, 33, 18})},
                                                              attrs({{"perm", Shape{0, 2, 1}}})));
  EXPECT_NE(odd.find("tiled transpose"), std::string::npos) << odd;
  EXPECT_EQ(odd.find("pairs"), std::string::npos) << odd;
  const std::string heads = check(gen::generate_shape, one_node(OpKind::kPermute, {tt(DType::kF16, {2, 128, 12, 64})},
                                                                attrs({{"perm", Shape{0, 2, 1, 3}}})));
  EXPECT_NE(heads.find("16-byte words"), std::string::npos) << heads;
  // A concat writes up to 8 parts per launch, in the widest word that divides every part's width:
  // DenseNet's channels-last concat of 1 + 11 parts is two launches of 16-byte words.
  std::vector<std::optional<TensorType>> dense = {tt(DType::kF16, {2, 3, 3, 64})};
  for (int i = 0; i < 11; ++i) dense.push_back(tt(DType::kF16, {2, 3, 3, 32}));
  const Built joined = one_node(OpKind::kConcat, dense, attrs({{"axis", int64_t(3)}}));
  EXPECT_EQ(check(gen::generate_shape, joined), "cuda concat 12 parts in 2 launch(es) of 16-byte words");
  EXPECT_EQ(gen::generate_shape(*joined.node, joined.g).plan.launches.at(0).kernel, "kg_concat_w16_i");
  EXPECT_EQ(check(gen::generate_shape, one_node(OpKind::kConcat, {tt(DType::kF16, {4, 3}), tt(DType::kF16, {4, 0}),
                                                                 tt(DType::kF16, {4, 2})},
                                                attrs({{"axis", int64_t(1)}}))),
            "cuda concat 2 parts in 1 launch(es) of 2-byte words");
  // A part read through a view (GPT-NeoX's passing half of q, [b, h, s, 48] of a [b, s, h * 192]
  // projection) is a strided copy of its own; the parts on either side of it are two launches.
  const std::string viewed = check(
      gen::generate_shape,
      one_node(OpKind::kConcat,
               {tt(DType::kF16, {1, 12, 128, 16}), tt(DType::kF16, {1, 128, 2304}), tt(DType::kF16, {1, 12, 128, 8})},
               attrs({{"axis", int64_t(3)}, {"view1", Shape{16, 1, 0, 12, 192, 128, 2304, 48, 1}}})));
  EXPECT_EQ(viewed,
            "cuda concat 2 parts in 2 launch(es) of 16-byte words, a part by copy of 16-byte words over 3 dims");
  // A part read through a dense view (the first channels of a shuffled [1, 4, 2, 3, 5] buffer:
  // row-major from its start, the batch dim of 1 at stride 0) is a part of the concat kernel.
  EXPECT_EQ(check(gen::generate_shape,
                  one_node(OpKind::kConcat, {tt(DType::kF16, {1, 4, 2, 3, 5}), tt(DType::kF16, {1, 4, 3, 5})},
                           attrs({{"axis", int64_t(1)}, {"view0", Shape{0, 1, 0, 4, 15, 3, 5, 5, 1}}}))),
            "cuda concat 2 parts in 1 launch(es) of 8-byte words");
  const std::string flat = check(gen::generate_shape, one_node(OpKind::kCopy, {tt(DType::kF32, {1000, 8})}, {}));
  EXPECT_NE(flat.find("16-byte words over 1 dims"), std::string::npos) << flat;
  // A pad walks its padded dims and each run of unpadded ones merged into one dim, with 32-bit
  // indices while they fit: the channels-last stem's 3 -> 4 channel pad is [N*H*W, C].
  // The kernel names of the launch and of its unaligned fallback ("" when it has none).
  auto pad_kernel = [](const Shape& x, const Shape& pads, const char* mode, const Shape& perm = {}) {
    Attrs a = attrs({{"pads", pads}, {"mode", std::string(mode)}});
    if (!perm.empty()) a.set("input_perm", perm);
    const Built b = one_node(OpKind::kPad, {tt(DType::kF16, x)}, a);
    check(gen::generate_shape, b);
    const gen::Launch l = gen::generate_shape(*b.node, b.g).plan.launches.at(0);
    return l.kernel + "|" + (l.alt.empty() ? "" : l.alt[0].kernel);
  };
  // The stem's image read through input_perm (NCHW -> NHWC while padding C): H and W merge (they
  // are contiguous in x), N and C do not; a thread writes a pixel's 4 channels as one 8-byte word.
  EXPECT_EQ(pad_kernel({32, 3, 224, 224}, {0, 0, 0, 0, 0, 0, 0, 1}, "constant", {0, 2, 3, 1}),
            "kg_pad_rows_constant_r3_w2_c4_i|kg_pad_constant_r3_w2_i");
  EXPECT_EQ(pad_kernel({32, 224, 224, 3}, {0, 0, 0, 0, 0, 0, 0, 1}, "constant"),
            "kg_pad_rows_constant_r2_w2_c4_i|kg_pad_constant_r2_w2_i");
  EXPECT_EQ(pad_kernel({2, 3, 2}, {0, 0, 1, 0, 1, 1}, "reflect"), "kg_pad_rows_reflect_r3_w2_c4_i|kg_pad_reflect_r3_w2_i");
  EXPECT_EQ(pad_kernel({2, 3, 4, 5, 2}, {0, 0, 0, 0, 2, 1, 0, 0, 0, 0}, "reflect"), "kg_pad_reflect_r3_w2_i|");
  EXPECT_EQ(pad_kernel({2, 3, 4}, {1, 0, 0, 2, 3, 1}, "constant"), "kg_pad_rows_constant_r3_w2_c8_i|kg_pad_constant_r3_w2_i");
  EXPECT_EQ(pad_kernel({2, 3, 5}, {1, 0, 0, 2, 3, 1}, "constant"), "kg_pad_constant_r3_w2_i|");  // 9 per row
  EXPECT_EQ(pad_kernel({1100, 1024, 1024}, {0, 0, 0, 0, 0, 1}, "constant"), "kg_pad_constant_r2_w2_l|");
  // Empty tensors make no launch.
  const Built e = one_node(OpKind::kCopy, {tt(DType::kF32, {0, 8})}, {});
  const gen::Generated empty = gen::generate_shape(*e.node, e.g);
  EXPECT_TRUE(empty.plan.launches.empty());
}

TEST(CudaGenCodegen, GatherAndGenerator) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kI64, DType::kBool})
    for (DType it : {DType::kI64, DType::kI32}) {
      check(gen::generate_gather, one_node(OpKind::kGather, {tt(dt, {3, 5}), tt(it, {3, 4})}, attrs({{"axis", int64_t(1)}})));
      check(gen::generate_gather, one_node(OpKind::kGather, {tt(dt, {4, 3}), tt(it, {2, 3})}, attrs({{"axis", int64_t(0)}})));
      check(gen::generate_gather, one_node(OpKind::kGather, {tt(dt, {4, 3, 5}), tt(it, {1, 3, 2})},
                                           attrs({{"axis", int64_t(2)}, {"broadcast", std::vector<int64_t>{0}}})));
      check(gen::generate_gather, one_node(OpKind::kIndexSelect, {tt(dt, {5, 3}), tt(it, {4})}, attrs({{"axis", int64_t(0)}})));
      check(gen::generate_gather, one_node(OpKind::kIndexSelect, {tt(dt, {2, 6, 3}), tt(it, {2})}, attrs({{"axis", int64_t(1)}})));
    }
  const std::string emb = check(gen::generate_gather, one_node(OpKind::kIndexSelect, {tt(DType::kF16, {30000, 768}),
                                                                                     tt(DType::kI64, {128})},
                                                               attrs({{"axis", int64_t(0)}})));
  EXPECT_NE(emb.find("16-byte words"), std::string::npos) << emb;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kI32, DType::kBool, DType::kU8}) {
    Attrs a = attrs({{"start", 0.0}, {"end", 10.0}, {"step", 1.0}, {"dtype", dt}});
    check(gen::generate_generator, one_node(OpKind::kArange, {}, a));
    check(gen::generate_generator, one_node(OpKind::kFull, {}, attrs({{"shape", Shape{2, 3}}, {"value", 1.0}, {"dtype", dt}})));
  }
}

TEST(CudaGenCodegen, CorruptPlanIsRejected) {
  gen::Plan p;
  p.describe = "x";
  gen::Launch l("k", 4, 128);
  l.in(0).out(0).i64(7);
  p.launches.push_back(l);
  Bytes b = gen::serialize(p);
  Bytes cut(b.begin(), b.end() - 3);
  EXPECT_THROW(gen::deserialize(cut), Error);
  Bytes longer = b;
  longer.push_back(0);
  EXPECT_THROW(gen::deserialize(longer), Error);
  b[0] = 99;  // version
  EXPECT_THROW(gen::deserialize(b), Error);
}

#endif  // KILN_WITH_CUDA
