// The conv family's generated depthwise kernel without a GPU: for every dtype and fused epilogue
// (bias, residual, each activation) and for kernel sizes, strides, dilations and channel counts
// that select each variant, the source must compile with NVRTC for sm_90 and name the kernels
// the launch uses. Also checked: the work split that matters for speed (16-byte vectors over C,
// adjacent pixels per thread, channel tiles whose weights fit shared memory; smaller blocks and one
// pixel per thread for convs too small to fill the GPU), that batch, spatial
// sizes and padding are arguments (one source per kernel shape and channel count), which convs
// are refused, and that a saved depthwise state made for another conv or another source is
// kCorrupted before any device call. The generated epilogue a cuDNN conv runs when cuDNN cannot
// fuse its activation compiles for every activation and dtype.
// Running the kernel against the CPU backend is tests/python/test_cuda_depthwise.py (GPU).
#ifdef KILN_WITH_CUDA

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/kernels.h"
#include "src/backends/cuda/kernels/depthwise.h"
#include "tests/cpp/error_test_util.h"

using namespace kiln;
using kiln::test::code_of;
using cuda::ConvGeom;
using cuda::DepthwiseSource;

namespace {

struct Spec {
  DType dt = DType::kF16;
  int64_t n = 2, h = 9, w = 11, c = 32, kh = 3, kw = 3, stride = 1, pad = 1, dil = 1;
  bool bias = false, residual = false;
  std::string act = "none";
  int64_t groups = 0, out_c = 0;  // 0: depthwise (groups = out_c = c)
  std::string layout = "nhwc";
};

struct Built {
  Graph g;
  const Node* node = nullptr;
};

// One conv node; x [N, H, W, C] and w [O, KH, KW, C/groups] (nhwc) or channels-first.
Built conv(const Spec& s) {
  Built b;
  const int64_t groups = s.groups ? s.groups : s.c, o = s.out_c ? s.out_c : s.c;
  const bool cl = s.layout == "nhwc";
  const std::vector<int64_t> xs = cl ? std::vector<int64_t>{s.n, s.h, s.w, s.c} : std::vector<int64_t>{s.n, s.c, s.h, s.w};
  const std::vector<int64_t> ws = cl ? std::vector<int64_t>{o, s.kh, s.kw, s.c / groups}
                                     : std::vector<int64_t>{o, s.c / groups, s.kh, s.kw};
  Attrs a;
  a.set("stride", std::vector<int64_t>{s.stride, s.stride});
  a.set("padding", std::vector<int64_t>{s.pad, s.pad});
  a.set("dilation", std::vector<int64_t>{s.dil, s.dil});
  a.set("groups", groups);
  a.set("layout", s.layout);
  if (s.act != "none") a.set("activation", s.act);
  if (s.act == "clipped_relu") a.set("activation_max", 0.75);
  std::vector<ValueId> in{b.g.add_input("x", TensorType(s.dt, xs)), b.g.add_input("w", TensorType(s.dt, ws))};
  in.push_back(s.bias ? b.g.add_input("b", TensorType(s.dt, {o})) : kNoValue);
  if (s.residual) {
    Graph probe;  // the output's shape, from the shape rule
    const auto y = probe.add_node1(OpKind::kConv, {probe.add_input("x", TensorType(s.dt, xs)),
                                                   probe.add_input("w", TensorType(s.dt, ws))}, a);
    in.push_back(b.g.add_input("r", probe.type(y)));
  }
  b.g.mark_output(b.g.add_node1(OpKind::kConv, in, a, "dw0"), "y");
  b.node = b.g.nodes().back().get();
  return b;
}

ConvGeom geom(const Spec& s) {
  const Built b = conv(s);
  return cuda::conv_geometry(*b.node, b.g);
}

// Generates and compiles; checks that each launched kernel is in the source.
DepthwiseSource compiles(const Spec& s, const std::string& what) {
  const ConvGeom q = geom(s);
  std::string why;
  EXPECT_TRUE(cuda::depthwise_eligible(q, &why)) << what << ": " << why;
  const DepthwiseSource src = cuda::generate_depthwise(q);
  EXPECT_NO_THROW({
    const Bytes cubin = cuda::compile_to_cubin(src.source, what, 90);
    EXPECT_GT(cubin.size(), 0u) << what;
  }) << what << "\n" << src.source;
  for (const auto* v : {&src.wide, &src.scalar}) {
    if (v->kernel.empty()) continue;
    EXPECT_NE(src.source.find("void __launch_bounds__(256) " + v->kernel + "("), std::string::npos) << what;
    EXPECT_LE(v->groups * v->tile, cuda::kDepthwiseThreads) << what;
    EXPECT_GE(v->groups, 1) << what;
    EXPECT_GE(int64_t(v->tiles) * v->tile * v->vec, q.C) << what;
    EXPECT_LE(q.KH * q.KW * v->tile * v->vec * 4, 32 * 1024) << what << ": weights over 32 KB of shared memory";
  }
  EXPECT_EQ(src.scalar.vec, 1) << what;
  EXPECT_NE(src.hash, 0u);
  return src;
}

}  // namespace

TEST(CudaDepthwiseCodegen, CompilesForEveryDtypeAndEpilogue) {
  struct Epi {
    bool bias, residual;
    const char* act;
  };
  const Epi epis[] = {{false, false, "none"},     {true, false, "none"},  {true, true, "relu"},
                      {false, true, "gelu_tanh"}, {true, false, "silu"},  {false, false, "sigmoid"},
                      {true, true, "tanh"},       {false, false, "gelu"}, {true, false, "clipped_relu"}};
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
    for (const Epi& e : epis) {
      Spec s;
      s.dt = dt, s.bias = e.bias, s.residual = e.residual, s.act = e.act;
      const std::string what = std::string(dtype_name(dt)) + (e.bias ? " bias" : "") + (e.residual ? " residual" : "") +
                               " " + e.act;
      const DepthwiseSource src = compiles(s, what);
      EXPECT_EQ(src.wide.vec, int(16 / dtype_size(dt))) << what << ": 16-byte vectors when C % vec == 0";
      EXPECT_NE(src.describe.find("depthwise"), std::string::npos) << src.describe;
      if (e.bias) {
        EXPECT_NE(src.describe.find("bias"), std::string::npos) << src.describe;
      }
      if (std::string(e.act) != "none") {
        EXPECT_NE(src.describe.find(e.act), std::string::npos) << src.describe;
      }
    }
}

TEST(CudaDepthwiseCodegen, CompilesForKernelShapesStridesDilationsAndChannelCounts) {
  struct Shape {
    int64_t c, kh, kw, stride, pad, dil, h, w;
    DType dt;
  };
  const Shape shapes[] = {
      {72, 5, 5, 2, 2, 1, 15, 17, DType::kF16},  {12, 3, 3, 1, 2, 2, 10, 9, DType::kF16},   // vec 4 (8-byte loads)
      {7, 7, 7, 1, 3, 1, 12, 13, DType::kBF16},  {960, 3, 3, 1, 1, 1, 7, 7, DType::kF16},   // scalar only; 2 tiles
      {16, 1, 1, 1, 0, 1, 5, 6, DType::kF32},    {24, 3, 1, 2, 1, 3, 20, 9, DType::kF32},
      {40, 11, 11, 1, 5, 1, 14, 14, DType::kF16}, {32, 9, 9, 2, 4, 2, 31, 29, DType::kF32},  // 1 px, kh not unrolled
      {6, 2, 2, 2, 0, 1, 8, 8, DType::kF32},     {480, 5, 5, 1, 2, 1, 7, 7, DType::kBF16}};
  for (const Shape& sh : shapes) {
    Spec s;
    s.dt = sh.dt, s.c = sh.c, s.kh = sh.kh, s.kw = sh.kw, s.stride = sh.stride, s.pad = sh.pad, s.dil = sh.dil;
    s.h = sh.h, s.w = sh.w, s.bias = true, s.residual = sh.c % 2 == 0, s.act = "relu";
    compiles(s, std::string(dtype_name(sh.dt)) + " C=" + std::to_string(sh.c) + " k=" + std::to_string(sh.kh) + "x" +
                    std::to_string(sh.kw) + " s" + std::to_string(sh.stride) + " d" + std::to_string(sh.dil));
  }
}

TEST(CudaDepthwiseCodegen, WorkSplit) {
  Spec s;  // f16, C = 32, 3x3, stride 1, and enough outputs to fill a large GPU
  s.n = 32, s.h = s.w = 56;
  DepthwiseSource src = cuda::generate_depthwise(geom(s));
  EXPECT_EQ(src.wide.kernel, "kiln_dw_vec8");
  EXPECT_EQ(src.wide.vec, 8);
  EXPECT_EQ(src.wide.pixels, 4);
  EXPECT_EQ(src.wide.tile, 4);  // 32 channels = 4 vectors, one tile
  EXPECT_EQ(src.wide.tiles, 1);
  EXPECT_EQ(src.wide.groups, 64);
  EXPECT_EQ(src.wide.threads, 256);
  s.stride = 2;
  EXPECT_EQ(cuda::generate_depthwise(geom(s)).wide.pixels, 2);
  s.stride = 1, s.c = 7;  // C not a multiple of 2: scalar only
  src = cuda::generate_depthwise(geom(s));
  EXPECT_TRUE(src.wide.kernel.empty());
  EXPECT_EQ(src.scalar.kernel, "kiln_dw_scalar");
  s.c = 12, s.dt = DType::kF32;  // 4 floats = 16 bytes
  EXPECT_EQ(cuda::generate_depthwise(geom(s)).wide.vec, 4);
  s.c = 960, s.dt = DType::kF16;  // 120 vectors: two tiles of 60
  src = cuda::generate_depthwise(geom(s));
  EXPECT_EQ(src.wide.tiles, 2);
  EXPECT_EQ(src.wide.tile, 60);
  s.kh = s.kw = 5, s.pad = 2;  // 25 taps x 8 x 4 bytes: at most 40 vectors per tile in 32 KB
  src = cuda::generate_depthwise(geom(s));
  EXPECT_EQ(src.wide.tiles, 3);
  EXPECT_EQ(src.wide.tile, 40);
  s.kh = s.kw = 11, s.pad = 5, s.c = 32;  // a row's weights (11 x 8) would crowd the registers
  EXPECT_EQ(cuda::generate_depthwise(geom(s)).wide.pixels, 1);
}

// A conv too small to fill the GPU with 256-thread blocks (batch 1, 7x7) is cut into smaller
// blocks and one output per thread, never wider than its channel tile allows.
TEST(CudaDepthwiseCodegen, SmallConvsSpreadOverMoreBlocks) {
  Spec s;
  s.n = 1, s.h = s.w = 7, s.c = 960, s.kh = s.kw = 5, s.pad = 2;
  const DepthwiseSource src = cuda::generate_depthwise(geom(s));
  EXPECT_EQ(src.wide.pixels, 1);
  EXPECT_LT(src.wide.threads, 256);
  EXPECT_EQ(src.wide.threads % 32, 0);
  EXPECT_GE(src.wide.threads, src.wide.tile * src.wide.groups);
  EXPECT_LE(src.wide.tile, src.wide.threads);
  EXPECT_GE(src.wide.tile * src.wide.tiles * 8, 960);
  const int64_t blocks = (49 + src.wide.groups - 1) / src.wide.groups * src.wide.tiles;
  EXPECT_GE(blocks, 132) << "threads " << src.wide.threads << " tile " << src.wide.tile;
  compiles(s, "small 5x5 x960");
}

TEST(CudaDepthwiseCodegen, SizesAndPaddingAreArgumentsNotSource) {
  Spec a, b;  // both large enough for the default work split (a small conv gets its own)
  a.n = 32, a.h = a.w = 56;
  b.n = 8, b.h = 130, b.w = 141, b.pad = 0;  // C sets the channel tile, which is in the source
  EXPECT_EQ(cuda::generate_depthwise(geom(a)).source, cuda::generate_depthwise(geom(b)).source);
  b.kw = 5;
  EXPECT_NE(cuda::generate_depthwise(geom(a)).hash, cuda::generate_depthwise(geom(b)).hash);
  Spec c = a;
  c.bias = true;
  EXPECT_NE(cuda::generate_depthwise(geom(a)).hash, cuda::generate_depthwise(geom(c)).hash);
}

// The generated epilogue a cuDNN conv runs after the plan when cuDNN cannot fuse the activation
// (hardswish, hardsigmoid): every activation and dtype compiles, with both kernels.
TEST(CudaConvEpilogue, SourcesCompileForEveryActivationAndDtype) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
    for (const char* act :
         {"none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "hardswish", "hardsigmoid", "clipped_relu"}) {
      Spec s;
      s.dt = dt, s.act = act, s.bias = true, s.residual = true, s.groups = 1, s.out_c = 16;
      const std::string src = cuda::conv_epilogue_source(geom(s));
      for (const char* k : {"void kiln_conv_epilogue(", "void kiln_conv_epilogue_vec("})
        EXPECT_NE(src.find(k), std::string::npos) << k;
      const std::string what = std::string("conv epilogue ") + dtype_name(dt) + " " + act;
      EXPECT_GT(cuda::compile_to_cubin(src, what, 90).size(), 0u) << what;
    }
}

TEST(CudaDepthwiseCodegen, RefusesWhatIsNotDepthwiseWithReasons) {
  std::string why;
  Spec s;
  s.groups = 1, s.c = 4, s.out_c = 4;  // an ordinary conv
  EXPECT_FALSE(cuda::depthwise_eligible(geom(s), &why));
  EXPECT_NE(why.find("depthwise"), std::string::npos) << why;
  s = Spec{};
  s.groups = 8, s.c = 8, s.out_c = 16;  // channel multiplier 2
  EXPECT_FALSE(cuda::depthwise_eligible(geom(s), &why));
  s = Spec{};
  s.layout = "nchw";
  EXPECT_FALSE(cuda::depthwise_eligible(geom(s), &why));
  EXPECT_NE(why.find("nhwc"), std::string::npos) << why;
  s = Spec{};
  s.dt = DType::kF64;
  EXPECT_FALSE(cuda::depthwise_eligible(geom(s), &why));
  s = Spec{};
  s.kh = s.kw = 33, s.pad = 16;
  EXPECT_FALSE(cuda::depthwise_eligible(geom(s), &why));
  EXPECT_EQ(code_of([&] { cuda::generate_depthwise(geom(s)); }), ErrorCode::kUnsupported);
}

TEST(CudaDepthwiseState, ForeignOrStaleStatesAreRefusedBeforeTheDevice) {
  const KernelOptions opt;
  Spec s;
  s.bias = true;
  const Built b = conv(s);
  const ConvGeom q = cuda::conv_geometry(*b.node, b.g);
  const uint64_t sig = cuda::conv_signature(cuda::conv_key_parts(q));
  const DepthwiseSource src = cuda::generate_depthwise(q);
  const Bytes cubin{1, 2, 3};  // never loaded: the checks come first

  cuda::ConvChoice c = cuda::depthwise_choice(src, sig);
  EXPECT_EQ(cuda::decode_conv_choice(cuda::encode_conv_choice(c)), c);
  c.kernel_hash ^= 1;  // a cubin of another generator
  Bytes state = cuda::pack_state(cubin, cuda::encode_conv_choice(c));
  EXPECT_EQ(code_of([&] { cuda::make_conv_kernel(*b.node, b.g, opt, &state); }), ErrorCode::kCorrupted);
  c = cuda::depthwise_choice(src, sig + 1);  // made for another conv
  state = cuda::pack_state(cubin, cuda::encode_conv_choice(c));
  EXPECT_EQ(code_of([&] { cuda::make_conv_kernel(*b.node, b.g, opt, &state); }), ErrorCode::kCorrupted);
  c = cuda::depthwise_choice(src, sig);  // no cubin
  state = cuda::pack_state({}, cuda::encode_conv_choice(c));
  EXPECT_EQ(code_of([&] { cuda::make_conv_kernel(*b.node, b.g, opt, &state); }), ErrorCode::kCorrupted);

  Spec o;  // a depthwise state on a conv the kernel cannot run
  o.groups = 1, o.c = 4, o.out_c = 4;
  const Built ob = conv(o);
  const ConvGeom oq = cuda::conv_geometry(*ob.node, ob.g);
  c = cuda::depthwise_choice(src, cuda::conv_signature(cuda::conv_key_parts(oq)));
  state = cuda::pack_state(cubin, cuda::encode_conv_choice(c));
  EXPECT_EQ(code_of([&] { cuda::make_conv_kernel(*ob.node, ob.g, opt, &state); }), ErrorCode::kCorrupted);
}

#endif  // KILN_WITH_CUDA
