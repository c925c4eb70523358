// Few long rows split across blocks (plan.h's split_rows) in the generated norm, reduce and
// softmax families, without a GPU:
//   - the rule's choices: a UNet's group_norm at batch 1 splits and at batch 32 does not, BERT's
//     layer_norm rows do not, a long single-row mean does; the device's multiprocessors and the
//     workspace limit change the answer; every split covers its row with whole vectors;
//   - the split kernels: for several shapes and dtypes the plan is two launches over the
//     workspace (their misaligned-buffer fallbacks too), the source compiles with NVRTC for
//     sm_90 and the plan survives the engine-file round trip;
//   - shapes that do not split keep exactly the source and plan they had before the split
//     existed (fingerprints of the generator's output, prelude excluded, taken before it).
// Running the split kernels against PyTorch is tests/python/test_cuda_split_reduce.py.
#ifdef KILN_WITH_CUDA

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "src/backends/cuda/codegen/plan.h"
#include "tests/cpp/cuda_node_test_util.h"

using namespace kiln;
namespace gen = kiln::cuda::gen;
using namespace kiln::test;

namespace {

const gen::Target kH100{132};  // H100 SXM
using Generator = gen::Generated (*)(const Node&, const Graph&, const gen::Target&);

Attrs group_attrs(int64_t groups) { return attrs({{"groups", groups}, {"eps", 1e-5}}); }
Attrs layer_attrs(int64_t k) { return attrs({{"normalized_rank", k}, {"eps", 1e-5}}); }
Attrs reduce_attrs(std::vector<int64_t> axes, bool var = false) {
  Attrs a = attrs({{"axes", std::move(axes)}, {"keepdim", false}});
  if (var) a.set("correction", 1.0);
  return a;
}

Built group_norm(DType dt, const Shape& x, int64_t groups, bool affine, DType pd) {
  const std::optional<TensorType> p = affine ? std::optional<TensorType>(tt(pd, {x[1]})) : std::nullopt;
  return one_node(OpKind::kGroupNorm, {tt(dt, x), p, p}, group_attrs(groups));
}

// The plan's description, after checking a split plan: two launches of 256-thread blocks, both
// on the workspace, each with the scalar kernel (on as many blocks) as its fallback when it loads
// vectors; the source compiles for sm_90 and the plan round-trips.
std::string check_split(Generator fn, const Built& b, const gen::Target& t = kH100) {
  const gen::Generated gn = fn(*b.node, b.g, t);
  const std::string what = std::string(op_name(b.node->op)) + " " + b.g.type(b.node->inputs[0]).to_string();
  EXPECT_NE(gn.plan.describe.find("(split: "), std::string::npos) << what << ": " << gn.plan.describe;
  EXPECT_EQ(gn.plan.launches.size(), 2u) << what;
  EXPECT_GT(gn.plan.workspace, 0u) << what;
  EXPECT_EQ(gn.plan.workspace % 256, 0u) << what;
  for (const gen::Launch& l : gn.plan.launches) {
    EXPECT_NE(gn.source.find("void " + l.kernel + "("), std::string::npos) << what << ": no kernel " << l.kernel;
    EXPECT_EQ(l.block[0], gen::kSplitThreads) << what;
    bool reads_workspace = false;
    for (const gen::Arg& a : l.args) reads_workspace = reads_workspace || a.kind == gen::ArgKind::kWorkspace;
    EXPECT_TRUE(reads_workspace) << what << ": " << l.kernel;
    EXPECT_EQ(l.align > 1, l.alt.size() == 1) << what << ": " << l.kernel;
    for (const gen::Launch& a : l.alt) {
      EXPECT_NE(gn.source.find("void " + a.kernel + "("), std::string::npos) << what << ": no kernel " << a.kernel;
      EXPECT_EQ(a.grid[0], l.grid[0]) << what;
    }
  }
  const Bytes cubin = gen::compile_for_arch(gn.source, what, 90);
  EXPECT_GT(cubin.size(), 0u) << what;
  const Bytes bytes = gen::serialize(gn.plan);
  EXPECT_EQ(gen::serialize(gen::deserialize(bytes)), bytes) << what;
  return gn.plan.describe;
}

// The generator's output without the prelude every source starts with, as a 64-bit FNV-1a of
// the source's remainder followed by the serialized plan.
uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}
uint64_t fingerprint(const gen::Generated& gn) {
  const std::string& head = gen::source_head();
  const size_t skip = gn.source.compare(0, head.size(), head) == 0 ? head.size() : 0;
  const Bytes plan = gen::serialize(gn.plan);
  return fnv1a(fnv1a(14695981039346656037ull, gn.source.data() + skip, gn.source.size() - skip), plan.data(),
               plan.size());
}

}  // namespace

TEST(CudaSplitReduce, RuleSplitsFewLongRowsOnly) {
  // A UNet's GroupNorm(32) over 64x64x320 at batch 1: 32 groups of 40960 elements, f16 (8 a load).
  const gen::SplitPlan unet = gen::split_rows(32, 40960, 8, 8, kH100);
  EXPECT_EQ(unet.splits, 17);  // 4 blocks per multiprocessor: 528 / 32 rows
  EXPECT_EQ(unet.chunk, 2416);
  EXPECT_EQ(unet.workspace, 4352u);  // 32 * 17 chunks of two f32
  // The same at batch 32 (1024 groups); from two groups per multiprocessor on, one block each.
  EXPECT_FALSE(gen::split_rows(1024, 40960, 8, 8, kH100).split());
  EXPECT_FALSE(gen::split_rows(264, 40960, 8, 8, kH100).split());
  EXPECT_EQ(gen::split_rows(263, 40960, 8, 8, kH100).splits, 3);
  // GroupNorm(8): 8 groups of 163840, limited by the blocks wanted.
  EXPECT_EQ(gen::split_rows(8, 163840, 8, 8, kH100).splits, 66);
  // Short groups (8x8x1280 over 32 groups: 2560 elements) and BERT rows (768) keep one block.
  EXPECT_FALSE(gen::split_rows(32, 2560, 8, 8, kH100).split());
  EXPECT_FALSE(gen::split_rows(128, 768, 8, 8, kH100).split());
  EXPECT_FALSE(gen::split_rows(1, gen::kSplitMinRow - 8, 8, 8, kH100).split());
  // Chunks of at least kSplitMinChunk: 16x16x1280 over 32 groups (10240) in 5.
  EXPECT_EQ(gen::split_rows(32, 10240, 8, 8, kH100).splits, 5);
  // A mean over one row of 2^20: 512 chunks of 2048.
  const gen::SplitPlan mean = gen::split_rows(1, 1 << 20, 4, 4, kH100);
  EXPECT_EQ(mean.splits, 512);
  EXPECT_EQ(mean.chunk, 2048);
  EXPECT_EQ(mean.workspace, 2048u);
  // The device's multiprocessors: an H100 PCIe (114) wants fewer blocks; none known, no split.
  EXPECT_EQ(gen::split_rows(32, 40960, 8, 8, gen::Target{114}).splits, 15);
  EXPECT_FALSE(gen::split_rows(228, 40960, 8, 8, gen::Target{114}).split());
  EXPECT_FALSE(gen::split_rows(32, 40960, 8, 8, gen::Target{0}).split());
  // Statistics over the workspace limit: no split.
  EXPECT_FALSE(gen::split_rows(32, 40960, 8, 8, gen::Target{132, 4095}).split());
  EXPECT_TRUE(gen::split_rows(32, 40960, 8, 8, gen::Target{132, 4352}).split());
  // Every split covers its row with chunks of whole vectors, none empty, each of at least
  // kSplitMinChunk elements, and asks for about four blocks per multiprocessor at most.
  for (int64_t sms : {1, 16, 114, 132, 144})
    for (int64_t rows : {1, 2, 3, 7, 32, 100, 200, 287})
      for (int64_t len : {8192, 8193, 10240, 40960, 65535, 163840, 1000003})
        for (int64_t q : {1, 2, 4, 8, 16}) {
          const gen::SplitPlan p = gen::split_rows(rows, len, q, 8, gen::Target{sms});
          SCOPED_TRACE(testing::Message() << "sms " << sms << ", rows " << rows << ", len " << len << ", q " << q);
          EXPECT_EQ(p.split(), rows < 2 * sms);  // every length here is at least kSplitMinRow
          if (!p.split()) {
            EXPECT_EQ(p.workspace, 0u);
            continue;
          }
          EXPECT_EQ(p.chunk % q, 0);
          EXPECT_GE(p.chunk, gen::kSplitMinChunk);
          EXPECT_GE(p.splits * p.chunk, len);
          EXPECT_LT((p.splits - 1) * p.chunk, len);
          EXPECT_LE(rows * (p.splits - 1), 4 * sms);
          EXPECT_GE(p.workspace, uint64_t(rows * p.splits * 8));
        }
}

TEST(CudaSplitReduce, GeneratorsChooseByShape) {
  auto describe = [](Generator fn, const Built& b, const gen::Target& t) { return fn(*b.node, b.g, t).plan.describe; };
  const Built unet1 = group_norm(DType::kF16, {1, 320, 64, 64}, 32, true, DType::kF16);
  EXPECT_EQ(describe(gen::generate_norm, unet1, kH100),
            "cuda group_norm f16[1,320,64,64] (split: 17 blocks per group of 2416 elements, 8-wide loads)");
  const Built unet32 = group_norm(DType::kF16, {32, 320, 64, 64}, 32, true, DType::kF16);
  EXPECT_EQ(describe(gen::generate_norm, unet32, kH100), "cuda group_norm f16[32,320,64,64] (block per group)");
  // Without the device's count (tests, Target{}), an H100's.
  EXPECT_EQ(gen::generate_norm(*unet1.node, unet1.g).plan.describe, describe(gen::generate_norm, unet1, kH100));
  // BERT-base rows: a warp per row in registers, as before.
  const Built bert =
      one_node(OpKind::kLayerNorm, {tt(DType::kF16, {1, 128, 768}), tt(DType::kF16, {768}), tt(DType::kF16, {768})},
               layer_attrs(1));
  EXPECT_EQ(describe(gen::generate_norm, bert, kH100),
            "cuda layer_norm f16[1,128,768] (warp per row in registers, 8-wide loads)");
  // Rows that one block holds in registers (up to 16384 elements) keep that kernel however few.
  const Built ln16k =
      one_node(OpKind::kLayerNorm, {tt(DType::kF32, {1, 16384}), std::nullopt, std::nullopt}, layer_attrs(1));
  EXPECT_EQ(describe(gen::generate_norm, ln16k, kH100),
            "cuda layer_norm f32[1,16384] (block per row in registers, 4-wide loads)");
  const Built mean = one_node(OpKind::kReduceMean, {tt(DType::kF32, {1 << 20})}, reduce_attrs({0}));
  EXPECT_EQ(describe(gen::generate_reduce, mean, kH100),
            "cuda reduce_mean f32[1048576] (split: 512 blocks per output of 2048 elements, 4-wide loads)");
  EXPECT_EQ(describe(gen::generate_reduce, mean, gen::Target{0}),
            "cuda reduce_mean f32[1048576] (block per output, 4-wide loads)");
  const Built vocab = one_node(OpKind::kSoftmax, {tt(DType::kF16, {1, 50257})}, attrs({{"axis", int64_t(1)}}));
  EXPECT_EQ(describe(gen::generate_softmax, vocab, kH100),
            "cuda softmax f16[1,50257] (split: 24 blocks per row of 2095 elements, 1-wide loads)");
  // The workspace the plan asks for is the split's.
  const gen::Generated g1 = gen::generate_norm(*unet1.node, unet1.g, kH100);
  EXPECT_EQ(g1.plan.workspace, gen::split_rows(32, 40960, 8, 8, kH100).workspace);
  EXPECT_EQ(g1.plan.launches.at(0).grid[0], 32u * 17);
}

TEST(CudaSplitReduce, SplitKernelsCompile) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64}) {
    check_split(gen::generate_norm, group_norm(dt, {1, 320, 64, 64}, 32, true, dt));
    check_split(gen::generate_norm, group_norm(dt, {2, 64, 32, 32}, 8, false, dt));
    check_split(gen::generate_norm, group_norm(dt, {1, 15, 47, 47}, 3, true, dt));  // odd: 1-wide only
    for (const auto& [shape, k] :
         std::vector<std::pair<Shape, int64_t>>{{{2, 40000}, 1}, {{3, 20001}, 1}, {{1, 4, 96, 96}, 3}}) {
      const Shape ps(shape.end() - k, shape.end());
      check_split(gen::generate_norm,
                  one_node(OpKind::kLayerNorm, {tt(dt, shape), tt(dt, ps), tt(dt, ps)}, layer_attrs(k)));
      check_split(gen::generate_norm,
                  one_node(OpKind::kLayerNorm, {tt(dt, shape), std::nullopt, std::nullopt}, layer_attrs(k)));
    }
    for (OpKind op :
         {OpKind::kReduceSum, OpKind::kReduceMean, OpKind::kReduceVar, OpKind::kReduceMax, OpKind::kReduceMin}) {
      const bool var = op == OpKind::kReduceVar;
      check_split(gen::generate_reduce, one_node(op, {tt(dt, {1 << 20})}, reduce_attrs({0}, var)));
      if (op != OpKind::kReduceMean && !var) continue;
      // Reduced runs around a kept dim: whole runs of 4096, and runs of 7 that chunks cut.
      check_split(gen::generate_reduce, one_node(op, {tt(dt, {64, 2, 4096})}, reduce_attrs({0, 2}, var)));
      check_split(gen::generate_reduce, one_node(op, {tt(dt, {4096, 2, 7})}, reduce_attrs({0, 2}, var)));
    }
    // Sums and means of squares (reduce {square}) in the split form.
    for (OpKind op : {OpKind::kReduceSum, OpKind::kReduceMean}) {
      Attrs sq = reduce_attrs({0});
      sq.set("square", true);
      const std::string got = check_split(gen::generate_reduce, one_node(op, {tt(dt, {1 << 20})}, sq));
      EXPECT_NE(got.find(" of squares "), std::string::npos) << got;
    }
    for (OpKind op : {OpKind::kSoftmax, OpKind::kLogSoftmax}) {
      check_split(gen::generate_softmax, one_node(op, {tt(dt, {1, 50257})}, attrs({{"axis", int64_t(1)}})));
      check_split(gen::generate_softmax, one_node(op, {tt(dt, {4, 100000})}, attrs({{"axis", int64_t(1)}})));
    }
  }
  // f16 with f32 weight and bias.
  check_split(gen::generate_norm, group_norm(DType::kF16, {1, 96, 37, 41}, 4, true, DType::kF32));
  check_split(gen::generate_norm,
              one_node(OpKind::kLayerNorm, {tt(DType::kF16, {2, 40000}), tt(DType::kF32, {40000}), std::nullopt},
                       layer_attrs(1)));
  // Integer sums (64-bit, wrapping) and bool / integer max.
  for (DType dt : {DType::kI32, DType::kI64, DType::kU8})
    check_split(gen::generate_reduce, one_node(OpKind::kReduceSum, {tt(dt, {2, 100000})}, reduce_attrs({1})));
  check_split(gen::generate_reduce, one_node(OpKind::kReduceMax, {tt(DType::kBool, {2, 100000})}, reduce_attrs({1})));
}

// Channels-last group_norm: blocks of a position's words times the rows a step. A small sample
// (or a batch that fills the GPU) is one launch of a block per sample; a larger one two launches
// over (sample, chunk of positions) blocks whose chunks cover every position once. The fallback
// for misaligned buffers is the block-per-group kernel (then an empty launch). Few
// multiprocessors give fewer chunks; statistics over the workspace limit, and fewer groups than
// multiprocessors that would not split, keep the block-per-group kernel.
TEST(CudaSplitReduce, ChannelsLastGroupNormChunksPositions) {
  auto nhwc = [](const Shape& x, int64_t groups) {
    Attrs a = group_attrs(groups);
    a.set("layout", std::string("nhwc"));
    return one_node(OpKind::kGroupNorm, {tt(DType::kF16, x), tt(DType::kF16, {x[3]}), std::nullopt}, a);
  };
  struct Want {
    Shape x;
    int64_t groups, vec, threads;
    bool split;
  };
  for (const Want& w : std::vector<Want>{{{1, 64, 64, 320}, 32, 2, 160, true},
                                         {{32, 32, 32, 128}, 32, 4, 256, true},
                                         {{32, 4, 4, 256}, 32, 8, 256, false},
                                         {{8, 8, 8, 1280}, 32, 8, 160, true},
                                         {{1024, 16, 16, 256}, 32, 8, 256, false}}) {
    const Built b = nhwc(w.x, w.groups);
    const gen::Generated gn = gen::generate_norm(*b.node, b.g, kH100);
    const std::string what = b.g.type(b.node->inputs[0]).to_string();
    const std::string v = std::to_string(w.vec);
    ASSERT_EQ(gn.plan.launches.size(), w.split ? 2u : 1u) << what;
    const gen::Launch& first = gn.plan.launches[0];
    EXPECT_EQ(first.kernel, (w.split ? "kg_gn_nhwc_stats_v" : "kg_gn_nhwc_v") + v) << what;
    EXPECT_EQ(first.block[0], uint32_t(w.threads)) << what;
    ASSERT_EQ(first.alt.size(), 1u) << what;
    EXPECT_EQ(first.alt[0].kernel, "kg_group_norm") << what;
    EXPECT_EQ(first.alt[0].grid[0], gen::blocks_for(w.x[0] * w.groups, 1)) << what;
    const Bytes cubin = gen::compile_for_arch(gn.source, what, 90);
    EXPECT_GT(cubin.size(), 0u) << what;
    if (!w.split) {
      EXPECT_EQ(first.grid[0], gen::blocks_for(w.x[0], 1)) << what;
      EXPECT_EQ(gn.plan.workspace, 0u) << what;
      continue;
    }
    const gen::Launch& apply = gn.plan.launches[1];
    EXPECT_EQ(apply.kernel, "kg_gn_nhwc_apply_v" + v) << what;
    EXPECT_EQ(first.grid[0], apply.grid[0]) << what;
    ASSERT_EQ(apply.alt.size(), 1u) << what;
    EXPECT_EQ(apply.alt[0].kernel, "kg_gn_nhwc_none") << what;
    // N, S, splits, chunk are the launch's values after its five buffers.
    auto value = [&](size_t i) {
      int64_t x = 0;
      std::memcpy(&x, first.args.at(5 + i).value.data(), sizeof(x));
      return x;
    };
    const int64_t S = w.x[1] * w.x[2], splits = value(2), chunk = value(3);
    EXPECT_EQ(value(0), w.x[0]) << what;
    EXPECT_EQ(value(1), S) << what;
    EXPECT_EQ(chunk % (w.threads / (w.x[3] / w.vec)), 0) << what;  // whole steps of rows
    EXPECT_TRUE(splits > 1 && splits <= 128 && (splits - 1) * chunk < S && splits * chunk >= S) << what;
    EXPECT_GE(chunk * w.x[3], 4096) << what;
    EXPECT_EQ(first.grid[0], gen::blocks_for(w.x[0] * splits, 1)) << what;
    EXPECT_EQ(gn.plan.workspace, uint64_t(w.x[0] * splits * w.groups * 8 + 255) / 256 * 256) << what;
  }
  const Built unet = nhwc({1, 64, 64, 320}, 32);
  const auto blocks = [&](const gen::Target& t) {
    return gen::generate_norm(*unet.node, unet.g, t).plan.launches[0].grid[0];
  };
  EXPECT_LT(blocks(gen::Target{8}), blocks(kH100));
  const gen::Generated tight = gen::generate_norm(*unet.node, unet.g, gen::Target{132, 1024});
  EXPECT_NE(tight.plan.describe.find("(block per group, channels last)"), std::string::npos) << tight.plan.describe;
  // Fewer groups than multiprocessors, short enough that they would not split: one launch of a
  // block per group rather than two over chunks.
  for (const Shape& x : std::vector<Shape>{{1, 32, 32, 128}, {2, 8, 8, 1280}}) {
    const Built few = nhwc(x, 32);
    const std::string d = gen::generate_norm(*few.node, few.g, kH100).plan.describe;
    EXPECT_NE(d.find("(block per group, channels last)"), std::string::npos) << d;
  }
}

TEST(CudaSplitReduce, ShapesThatDoNotSplitKeepTheirKernels) {
  // Rows that fill the GPU, and few rows that are short or that one block holds in registers.
  // Fingerprints of these shapes' generated source and plan (first taken before the split
  // existed; group_norm's and the long rows' since channels-last group_norm shares their source;
  // the reductions' since reduce_common.cuh has the lane-group combination and the rows kernel
  // its lanes per output, and again since the load squares on request; the layer_norm rows'
  // since that kernel has lane groups too, and again since a row's statistics are f32 for f32).
  struct Pinned {
    const char* what;
    Generator fn;
    Built b;
    uint64_t fingerprint;
  };
  const Pinned pinned[] = {
      {"group_norm f16 [32,320,64,64] g32 (a UNet's at batch 32)", gen::generate_norm,
       group_norm(DType::kF16, {32, 320, 64, 64}, 32, true, DType::kF16), 0x497f1d4b24f7fc1dull},
      {"group_norm f32 [2,6,3,3] g2", gen::generate_norm, group_norm(DType::kF32, {2, 6, 3, 3}, 2, true, DType::kF32),
       0x1c894d1ad94505a8ull},
      {"group_norm f16 [1,1280,8,8] g32 (few groups, short)", gen::generate_norm,
       group_norm(DType::kF16, {1, 1280, 8, 8}, 32, true, DType::kF16), 0x3822f3b1695ee9bbull},
      {"layer_norm f16 [1,128,768] (BERT)", gen::generate_norm,
       one_node(OpKind::kLayerNorm, {tt(DType::kF16, {1, 128, 768}), tt(DType::kF16, {768}), tt(DType::kF16, {768})},
                layer_attrs(1)),
       0x3580648577f9255full},
      {"layer_norm f32 [4,4096]", gen::generate_norm,
       one_node(OpKind::kLayerNorm, {tt(DType::kF32, {4, 4096}), tt(DType::kF32, {4096}), std::nullopt},
                layer_attrs(1)),
       0xc16fdf0e4f7b2acbull},
      {"layer_norm bf16 [1,16384] (one row, in registers)", gen::generate_norm,
       one_node(OpKind::kLayerNorm,
                {tt(DType::kBF16, {1, 16384}), tt(DType::kBF16, {16384}), tt(DType::kBF16, {16384})}, layer_attrs(1)),
       0x5919c6faba24b8e4ull},
      {"layer_norm f32 [512,40000] (many long rows)", gen::generate_norm,
       one_node(OpKind::kLayerNorm, {tt(DType::kF32, {512, 40000}), tt(DType::kF32, {40000}), tt(DType::kF32, {40000})},
                layer_attrs(1)),
       0x55b675e1d3076e1cull},
      {"batch_norm f16 [2,3,4,5]", gen::generate_norm,
       one_node(OpKind::kBatchNorm,
                {tt(DType::kF16, {2, 3, 4, 5}), tt(DType::kF32, {3}), tt(DType::kF32, {3}), tt(DType::kF32, {3}),
                 tt(DType::kF32, {3})},
                attrs({{"eps", 1e-5}})),
       0xecb38bf3352139caull},
      {"reduce_mean f16 [8,4096] axis 1", gen::generate_reduce,
       one_node(OpKind::kReduceMean, {tt(DType::kF16, {8, 4096})}, reduce_attrs({1})), 0x67f6511564344171ull},
      {"reduce_sum f32 [3,4,5] axis 1", gen::generate_reduce,
       one_node(OpKind::kReduceSum, {tt(DType::kF32, {3, 4, 5})}, reduce_attrs({1})), 0xa7ccfc0208b1645dull},
      {"reduce_var f32 [300,10000] axis 1 (many long rows)", gen::generate_reduce,
       one_node(OpKind::kReduceVar, {tt(DType::kF32, {300, 10000})}, reduce_attrs({1}, true)), 0x4b33a1771f23b3d4ull},
      {"reduce_mean f16 [1,784,72] axis 1 (columns)", gen::generate_reduce,
       one_node(OpKind::kReduceMean, {tt(DType::kF16, {1, 784, 72})}, reduce_attrs({1})), 0x8a5dbea09c1568c4ull},
      {"softmax f16 [64,512]", gen::generate_softmax,
       one_node(OpKind::kSoftmax, {tt(DType::kF16, {64, 512})}, attrs({{"axis", int64_t(1)}})), 0x712573a1d0f1c681ull},
      {"softmax f32 [2,4096] (few rows, in registers)", gen::generate_softmax,
       one_node(OpKind::kSoftmax, {tt(DType::kF32, {2, 4096})}, attrs({{"axis", int64_t(1)}})), 0xfe51bbc5d1a43a1eull},
      {"log_softmax f32 [300,50000] (many long rows)", gen::generate_softmax,
       one_node(OpKind::kLogSoftmax, {tt(DType::kF32, {300, 50000})}, attrs({{"axis", int64_t(1)}})),
       0x7b9b2127caf2b229ull},
  };
  for (const Pinned& p : pinned)
    for (int64_t sms : {132, 114, 144}) {  // H100 SXM, H100 PCIe, a larger GPU: the same
      const gen::Generated gn = p.fn(*p.b.node, p.b.g, gen::Target{sms});
      EXPECT_EQ(gn.plan.describe.find("split"), std::string::npos) << p.what;
      EXPECT_EQ(gn.plan.workspace, p.b.node->op == OpKind::kBatchNorm ? 256u : 0u) << p.what;
      EXPECT_EQ(fingerprint(gn), p.fingerprint) << p.what << " on " << sms << " multiprocessors: " << gn.plan.describe;
    }
}

#endif  // KILN_WITH_CUDA
