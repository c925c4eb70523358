// The CUDA conv family without (and, where present, with) a GPU: the saved tactic format
// round-trips and refuses damage, supports_conv answers with reasons, a damaged engine state is
// refused before any device call, and on a GPU a conv with bias + residual + activation matches
// the CPU backend and remakes identically from its state.
#ifdef KILN_WITH_CUDA

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "kiln/kiln.h"
#include "src/backends/cuda/kernels.h"
#include "src/backends/cuda/kernels/conv_graph.h"
#include "src/backends/cuda/kernels/conv_state.h"
#include "tests/cpp/cudnn_state_test_util.h"
#include "tests/cpp/error_test_util.h"

namespace kiln::cuda {
Bytes pack_state(const Bytes& cubin, const Bytes& params);  // nvrtc.h (which needs CUDA headers)
}

namespace {

using namespace kiln;
using kiln::test::code_of;
using cuda::ConvChoice;

ConvChoice random_choice(std::mt19937& rng) {
  ConvChoice c;
  c.fused = rng() % 2 == 0;
  c.signature = (uint64_t(rng()) << 32) | rng();
  const uint32_t pick = rng() % 4;
  if (pick == 0) {  // the generated depthwise kernel: a source hash, no cuDNN engine
    c.tactic = cuda::ConvTactic::kDepthwise;
    c.kernel_hash = ((uint64_t(rng()) << 32) | rng()) | 1;
    c.engine = -1;
    return c;
  }
  if (pick == 1) {  // the GEMM: nothing but the signature
    c.tactic = cuda::ConvTactic::kGemm;
    c.engine = -1;
    return c;
  }
  c.engine = int64_t(rng() % 100);
  c.knobs = kiln::test::random_knobs(rng);
  c.plan_json = kiln::test::random_plan_json(rng);
  return c;
}

TEST(CudaConvState, RoundTrips) {
  std::mt19937 rng(7);
  for (int i = 0; i < 50; ++i) {
    const ConvChoice c = random_choice(rng);
    EXPECT_EQ(cuda::decode_conv_choice(cuda::encode_conv_choice(c)), c);
  }
}

TEST(CudaConvState, RefusesEveryFlippedByteTruncationAndTrailingBytes) {
  std::mt19937 rng(11);
  const ConvChoice c = random_choice(rng);
  const Bytes good = cuda::encode_conv_choice(c);
  for (size_t i = 0; i < good.size(); ++i) {
    Bytes bad = good;
    bad[i] ^= uint8_t(1 + rng() % 255);
    EXPECT_EQ(code_of([&] { cuda::decode_conv_choice(bad); }), ErrorCode::kCorrupted) << "byte " << i;
  }
  for (size_t n = 0; n < good.size(); ++n) {
    const Bytes cut(good.begin(), good.begin() + long(n));
    EXPECT_EQ(code_of([&] { cuda::decode_conv_choice(cut); }), ErrorCode::kCorrupted) << n << " bytes";
  }
  Bytes longer = good;
  longer.push_back(0);
  EXPECT_EQ(code_of([&] { cuda::decode_conv_choice(longer); }), ErrorCode::kCorrupted);
}

TEST(CudaConvState, RefusesDamagedBytesOfADepthwiseChoice) {
  ConvChoice c;
  c.tactic = cuda::ConvTactic::kDepthwise;
  c.signature = 99, c.kernel_hash = 1234, c.engine = -1;
  const Bytes good = cuda::encode_conv_choice(c);
  EXPECT_EQ(cuda::decode_conv_choice(good), c);
  for (size_t i = 0; i < good.size(); ++i) {
    Bytes bad = good;
    bad[i] ^= 0x10;
    EXPECT_EQ(code_of([&] { cuda::decode_conv_choice(bad); }), ErrorCode::kCorrupted) << "byte " << i;
  }
}

// A state written before the tactic byte existed (format version 1, otherwise well formed) is
// refused as kCorrupted, not read as a cuDNN choice with shifted fields.
TEST(CudaConvState, RefusesTheVersionOneLayout) {
  Bytes v1{'K', 'C', 'V', '1', 1, 1};  // magic, version 1, fused
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) v1.push_back(uint8_t(v >> (8 * i)));
  };
  put(0x1234, 8);  // signature
  put(7, 8);       // engine
  put(0, 4);       // no knobs
  put(cuda::fnv1a(v1.data(), v1.size()), 8);
  try {
    cuda::decode_conv_choice(v1);
    ADD_FAILURE() << "a version-1 state was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupted);
    EXPECT_NE(std::string(e.what()).find("version 1"), std::string::npos) << e.what();
  }
}

// A version-2 state (written before plans were serialized: no plan length) still loads, with
// no serialized plan, so engines saved by earlier builds keep loading.
TEST(CudaConvState, ReadsTheVersionTwoLayoutWithoutAPlan) {
  Bytes v2{'K', 'C', 'V', '1', 2, 0, 1};  // magic, version 2, tactic cuDNN, fused
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) v2.push_back(uint8_t(v >> (8 * i)));
  };
  put(0x1234, 8);  // signature
  put(0, 8);       // kernel hash
  put(7, 8);       // engine
  put(1, 4);       // one knob
  put(3, 4), put(uint64_t(-2), 8);
  put(cuda::fnv1a(v2.data(), v2.size()), 8);
  const ConvChoice c = cuda::decode_conv_choice(v2);
  EXPECT_EQ(c.signature, 0x1234u);
  EXPECT_EQ(c.engine, 7);
  ASSERT_EQ(c.knobs.size(), 1u);
  EXPECT_EQ(c.knobs[0], std::make_pair(int32_t(3), int64_t(-2)));
  EXPECT_TRUE(c.plan_json.empty());
  EXPECT_EQ(cuda::decode_conv_choice(cuda::encode_conv_choice(c)), c);  // written again as version 3
}

TEST(CudaConvState, RefusesASerializedPlanOnTheDepthwiseTactic) {
  ConvChoice c;
  c.tactic = cuda::ConvTactic::kDepthwise;
  c.signature = 5, c.kernel_hash = 77, c.engine = -1, c.plan_json = "{}";
  try {
    cuda::decode_conv_choice(cuda::encode_conv_choice(c));
    ADD_FAILURE() << "a depthwise choice with a cuDNN plan was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupted);
    EXPECT_NE(std::string(e.what()).find("serialized plan"), std::string::npos) << e.what();
  }
}

// The GEMM tactic carries no cuDNN engine, knobs, plan or kernel hash: bytes that give it one
// are refused, naming the field.
TEST(CudaConvState, RefusesCudnnFieldsOnTheGemmTactic) {
  ConvChoice c;
  c.tactic = cuda::ConvTactic::kGemm;
  c.signature = 42;
  EXPECT_EQ(cuda::decode_conv_choice(cuda::encode_conv_choice(c)), c);
  auto refused = [](const ConvChoice& bad, const char* field) {
    try {
      cuda::decode_conv_choice(cuda::encode_conv_choice(bad));
      ADD_FAILURE() << "a GEMM choice with " << field << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorrupted);
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("GEMM"), std::string::npos) << e.what();
    }
  };
  ConvChoice engine = c;
  engine.engine = 4;
  refused(engine, "engine index");
  ConvChoice hash = c;
  hash.kernel_hash = 9;
  refused(hash, "kernel hash");
  ConvChoice knobs = c;
  knobs.knobs = {{1, 2}};
  refused(knobs, "knobs");
  ConvChoice plan = c;
  plan.plan_json = "{}";
  refused(plan, "serialized plan");
}

TEST(CudaConvState, SignatureSeparatesParts) {
  EXPECT_EQ(cuda::conv_signature({"conv", "x=1,2"}), cuda::conv_signature({"conv", "x=1,2"}));
  EXPECT_NE(cuda::conv_signature({"conv", "x=1,2"}), cuda::conv_signature({"conv", "x=1,3"}));
  EXPECT_NE(cuda::conv_signature({"conv", "ab"}), cuda::conv_signature({"conva", "b"}));
}

struct ConvGraph {
  Graph g;
  const Node* node = nullptr;
};

// conv (or conv_transpose) on random-free shapes; `attrs` are added to the node's.
ConvGraph conv_graph(OpKind op, DType dt, std::vector<int64_t> x, std::vector<int64_t> w, bool bias, Attrs attrs,
                     bool residual = false) {
  ConvGraph c;
  std::vector<ValueId> in{c.g.add_input("x", TensorType(dt, x)), c.g.add_input("w", TensorType(dt, w))};
  const int64_t out_c = op == OpKind::kConv ? w[0] : w[1] * attrs.get_int("groups", 1);
  in.push_back(bias ? c.g.add_input("b", TensorType(dt, {out_c})) : kNoValue);
  if (residual) {
    Graph probe;  // the output's shape, from the shape rule
    auto px = probe.add_input("x", TensorType(dt, x)), pw = probe.add_input("w", TensorType(dt, w));
    const auto y = probe.add_node1(op, {px, pw}, attrs);
    in.push_back(c.g.add_input("r", probe.type(y)));
  }
  const ValueId y = c.g.add_node1(op, in, attrs, "conv0");
  c.g.mark_output(y, "y");
  c.node = c.g.nodes().back().get();
  return c;
}

Attrs attrs_2d(int64_t stride, int64_t pad, int64_t dil, int64_t groups) {
  Attrs a;
  a.set("stride", std::vector<int64_t>{stride, stride});
  a.set("padding", std::vector<int64_t>{pad, pad});
  a.set("dilation", std::vector<int64_t>{dil, dil});
  a.set("groups", groups);
  return a;
}

TEST(CudaConvSupports, AnswersWithReasons) {
  std::string why;
  auto c = conv_graph(OpKind::kConv, DType::kF16, {2, 4, 9, 9}, {6, 2, 3, 3}, true, attrs_2d(2, 1, 2, 2));
  EXPECT_TRUE(cuda::supports_conv(*c.node, c.g, &why)) << why;

  Attrs a1;
  a1.set("stride", std::vector<int64_t>{2});
  a1.set("activation", std::string("gelu_tanh"));
  c = conv_graph(OpKind::kConv, DType::kBF16, {2, 3, 10}, {4, 3, 3}, true, a1, true);
  EXPECT_TRUE(cuda::supports_conv(*c.node, c.g, &why)) << why;

  Attrs t = attrs_2d(2, 1, 1, 1);
  t.set("output_padding", std::vector<int64_t>{1, 1});
  c = conv_graph(OpKind::kConvTranspose, DType::kF32, {2, 4, 5, 5}, {4, 3, 3, 3}, true, t);
  EXPECT_TRUE(cuda::supports_conv(*c.node, c.g, &why)) << why;

  c = conv_graph(OpKind::kConv, DType::kF64, {1, 3, 8, 8}, {4, 3, 3, 3}, false, attrs_2d(1, 1, 1, 1));
  why.clear();
  EXPECT_FALSE(cuda::supports_conv(*c.node, c.g, &why));
  EXPECT_NE(why.find("f64"), std::string::npos) << why;

  Attrs nhwc = attrs_2d(1, 1, 1, 1);
  nhwc.set("layout", std::string("nhwc"));
  c = conv_graph(OpKind::kConv, DType::kF16, {1, 8, 8, 3}, {4, 3, 3, 3}, true, nhwc);  // x [N,H,W,C], w [O,KH,KW,C]
  why.clear();
  EXPECT_TRUE(cuda::supports_conv(*c.node, c.g, &why)) << why;
  Attrs bad = nhwc;
  bad.set("layout", std::string("nwhc"));  // the shape rule rejects it before any backend sees it
  try {
    conv_graph(OpKind::kConv, DType::kF32, {1, 3, 8, 8}, {4, 3, 3, 3}, false, bad);
    ADD_FAILURE() << "layout nwhc was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("layout"), std::string::npos) << e.what();
  }

  // output_padding >= stride (allowed by the shape rule when below the dilation): not on cuDNN.
  Attrs op = attrs_2d(1, 0, 2, 1);
  op.set("output_padding", std::vector<int64_t>{1, 1});
  c = conv_graph(OpKind::kConvTranspose, DType::kF32, {1, 2, 4, 4}, {2, 2, 3, 3}, false, op);
  why.clear();
  EXPECT_FALSE(cuda::supports_conv(*c.node, c.g, &why));
  EXPECT_NE(why.find("output_padding"), std::string::npos) << why;

  // A conv over 3 spatial dims runs (5-D cuDNN descriptors), its geometry with the depth's
  // extents first; its transpose does not.
  Attrs three;
  three.set("stride", std::vector<int64_t>{1, 2, 2});
  three.set("padding", std::vector<int64_t>{1, 0, 1});
  three.set("dilation", std::vector<int64_t>{2, 1, 1});
  c = conv_graph(OpKind::kConv, DType::kF16, {1, 4, 5, 6, 7}, {8, 4, 3, 2, 3}, true, three);
  why.clear();
  EXPECT_TRUE(cuda::supports_conv(*c.node, c.g, &why)) << why;
  const cuda::ConvGeom q = cuda::conv_geometry(*c.node, c.g);
  EXPECT_TRUE(q.three_d);
  EXPECT_EQ(std::vector<int64_t>({q.D, q.H, q.W, q.OD, q.OH, q.OW, q.KD, q.KH, q.KW}),
            std::vector<int64_t>({5, 6, 7, 3, 3, 4, 3, 2, 3}));
  EXPECT_EQ(std::vector<int64_t>({q.sd, q.sh, q.sw, q.pd, q.ph, q.pw, q.dd, q.dh, q.dw}),
            std::vector<int64_t>({1, 2, 2, 1, 0, 1, 2, 1, 1}));
  EXPECT_EQ(cuda::conv_key_parts(q)[0], "conv3d");
  // A 5-D conv_transpose never reaches a backend: its shape rule takes 1 or 2 spatial dims.
  Attrs three_t;
  three_t.set("padding", std::vector<int64_t>{0, 0, 0});
  EXPECT_EQ(code_of([&] {
              conv_graph(OpKind::kConvTranspose, DType::kF16, {1, 4, 3, 6, 6}, {4, 4, 3, 3, 3}, true, three_t);
            }),
            ErrorCode::kShapeMismatch);
}

TEST(CudaConvState, DamagedEngineStateIsRefusedBeforeTheDevice) {
  auto c = conv_graph(OpKind::kConv, DType::kF32, {2, 4, 9, 9}, {6, 4, 3, 3}, true, attrs_2d(1, 1, 1, 1));
  const KernelOptions opt;
  const Bytes junk{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28};
  EXPECT_EQ(code_of([&] { cuda::make_conv_kernel(*c.node, c.g, opt, &junk); }), ErrorCode::kCorrupted);
  const Bytes not_conv = cuda::pack_state({}, junk);
  EXPECT_EQ(code_of([&] { cuda::make_conv_kernel(*c.node, c.g, opt, &not_conv); }), ErrorCode::kCorrupted);
  ConvChoice other;
  other.signature = 12345;  // made for some other conv
  other.engine = 3;
  const Bytes foreign = cuda::pack_state({}, cuda::encode_conv_choice(other));
  EXPECT_EQ(code_of([&] { cuda::make_conv_kernel(*c.node, c.g, opt, &foreign); }), ErrorCode::kCorrupted);
}

// ---- on a GPU ----------------------------------------------------------------------------

std::vector<float> random_values(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Runs `k` on `backend` with f32 inputs; returns the f32 output. With `over_input` >= 0 the
// output is written over that input's buffer.
std::vector<float> run_kernel(Backend& be, const Kernel& k, const std::vector<std::vector<float>>& ins, size_t out_n,
                              int over_input = -1) {
  std::vector<std::shared_ptr<void>> bufs;
  std::vector<const void*> in_ptrs;
  for (const auto& v : ins) {
    bufs.push_back(be.allocate(v.size() * 4));
    be.copy_from_host(bufs.back().get(), v.data(), v.size() * 4, nullptr);
    in_ptrs.push_back(bufs.back().get());
  }
  auto out = over_input >= 0 ? bufs[size_t(over_input)] : be.allocate(out_n * 4);
  auto ws = be.allocate(std::max<size_t>(k.workspace_size(), 1));
  void* outs[] = {out.get()};
  RunContext rc;
  rc.workspace = ws.get();
  rc.workspace_size = k.workspace_size();
  k.run(in_ptrs.data(), outs, rc);
  std::vector<float> y(out_n);
  be.copy_to_host(y.data(), out.get(), out_n * 4, nullptr);
  be.synchronize(nullptr);
  return y;
}

TEST(CudaConvDevice, FusedEpilogueMatchesCpuAndStateRemakesTheSamePlan) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  Attrs a = attrs_2d(1, 1, 1, 1);
  a.set("activation", std::string("silu"));
  auto c = conv_graph(OpKind::kConv, DType::kF32, {2, 8, 9, 9}, {16, 8, 3, 3}, true, a, true);
  std::mt19937 rng(3);
  std::vector<std::vector<float>> ins;
  for (ValueId v : c.node->inputs) ins.push_back(random_values(size_t(c.g.type(v).numel()), rng));
  const size_t out_n = size_t(c.g.type(c.node->outputs[0]).numel());

  Backend& gpu = get_backend(Device::parse("cuda:0"));
  Backend& cpu = get_backend(Device::parse("cpu"));
  KernelOptions opt;
  opt.policy.allow_tf32 = false;  // strict FP32, to compare with the CPU closely
  auto k = gpu.make_kernel(*c.node, c.g, opt);
  auto ref = cpu.make_kernel(*c.node, c.g, opt);
  const auto y = run_kernel(gpu, *k, ins, out_n), r = run_kernel(cpu, *ref, ins, out_n);
  double err = 0, norm = 0;
  for (size_t i = 0; i < out_n; ++i) err += (y[i] - r[i]) * double(y[i] - r[i]), norm += double(r[i]) * r[i];
  EXPECT_GT(norm, 1.0);
  EXPECT_LT(std::sqrt(err / norm), 1e-5) << k->describe();

  const Bytes state = k->state();
  auto again = gpu.make_kernel(*c.node, c.g, opt, &state);
  EXPECT_EQ(again->state(), state);
  EXPECT_EQ(run_kernel(gpu, *again, ins, out_n), y);
}

// Convs over 3 spatial dims (a ResNet3D block with its residual and relu, a strided one with
// uneven dilation, a grouped one): cuDNN's plans against the CPU reference, and remade from state.
TEST(CudaConvDevice, ThreeSpatialDimsMatchTheCpu) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  Attrs block;
  block.set("padding", std::vector<int64_t>{1, 1, 1});
  block.set("activation", std::string("relu"));
  Attrs strided;
  strided.set("stride", std::vector<int64_t>{1, 2, 2});
  strided.set("padding", std::vector<int64_t>{1, 0, 1});
  strided.set("dilation", std::vector<int64_t>{2, 1, 1});
  Attrs grouped;
  grouped.set("padding", std::vector<int64_t>{0, 1, 1});
  grouped.set("groups", int64_t(4));
  std::vector<ConvGraph> convs;
  convs.push_back(conv_graph(OpKind::kConv, DType::kF32, {2, 8, 4, 9, 9}, {8, 8, 3, 3, 3}, true, block, true));
  convs.push_back(conv_graph(OpKind::kConv, DType::kF32, {1, 6, 7, 10, 11}, {12, 6, 3, 2, 3}, true, strided));
  convs.push_back(conv_graph(OpKind::kConv, DType::kF32, {2, 8, 3, 6, 6}, {8, 2, 1, 3, 3}, true, grouped));
  Backend& gpu = get_backend(Device::parse("cuda:0"));
  Backend& cpu = get_backend(Device::parse("cpu"));
  KernelOptions opt;
  opt.policy.allow_tf32 = false;
  std::mt19937 rng(11);
  for (const ConvGraph& c : convs) {
    std::vector<std::vector<float>> ins;
    for (ValueId v : c.node->inputs) ins.push_back(random_values(size_t(c.g.type(v).numel()), rng));
    const size_t out_n = size_t(c.g.type(c.node->outputs[0]).numel());
    auto k = gpu.make_kernel(*c.node, c.g, opt);
    SCOPED_TRACE(k->describe());
    auto ref = cpu.make_kernel(*c.node, c.g, opt);
    const auto y = run_kernel(gpu, *k, ins, out_n), r = run_kernel(cpu, *ref, ins, out_n);
    double err = 0, norm = 0;
    for (size_t i = 0; i < out_n; ++i) err += (y[i] - r[i]) * double(y[i] - r[i]), norm += double(r[i]) * r[i];
    EXPECT_GT(norm, 1.0);
    EXPECT_LT(std::sqrt(err / norm), 1e-5);
    const Bytes state = k->state();
    EXPECT_EQ(run_kernel(gpu, *gpu.make_kernel(*c.node, c.g, opt, &state), ins, out_n), y);
  }
}

TEST(CudaConvDevice, WritesOverItsResidualWhereThePlanGivesTheSameBytes) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  KernelOptions strict;  // strict FP32 for the f32 convs
  strict.policy.allow_tf32 = false;
  Attrs silu = attrs_2d(1, 1, 1, 1);
  silu.set("activation", std::string("silu"));
  Attrs relu = attrs_2d(1, 0, 1, 1);
  relu.set("activation", std::string("relu"));
  relu.set("layout", std::string("nhwc"));
  Attrs plain = attrs_2d(1, 1, 1, 1);
  std::vector<ConvGraph> convs;
  convs.push_back(conv_graph(OpKind::kConv, DType::kF32, {2, 8, 9, 9}, {16, 8, 3, 3}, true, silu, true));
  convs.push_back(conv_graph(OpKind::kConv, DType::kF32, {2, 14, 14, 64}, {256, 1, 1, 64}, true, relu, true));
  convs.push_back(conv_graph(OpKind::kConv, DType::kF32, {2, 8, 9, 9}, {16, 8, 3, 3}, false, plain, false));
  Backend& gpu = get_backend(Device::parse("cuda:0"));
  // A ResNet bottleneck's last conv in FP16, channels-last: cuDNN's fused plan (runs_in_place
  // checked it on random data) or the GEMM reading the residual as C, whichever the timing
  // keeps, runs in place.
  const ConvGraph half = conv_graph(OpKind::kConv, DType::kF16, {2, 14, 14, 64}, {256, 1, 1, 64}, true, relu, true);
  auto hk = gpu.make_kernel(*half.node, half.g, KernelOptions{});
  EXPECT_TRUE(hk->writes_over_input(3)) << hk->describe();
  EXPECT_FALSE(hk->writes_over_input(0));
  std::mt19937 rng(5);
  for (const ConvGraph& c : convs) {
    auto k = gpu.make_kernel(*c.node, c.g, strict);
    SCOPED_TRACE(k->describe());
    for (size_t i = 0; i < 3; ++i) EXPECT_FALSE(k->writes_over_input(i));
    if (c.node->inputs.size() < 4) {
      EXPECT_FALSE(k->writes_over_input(3));  // no residual: nothing to write over
      continue;
    }
    if (!k->writes_over_input(3)) continue;  // e.g. a plan of the conv alone + a separate epilogue
    std::vector<std::vector<float>> ins;
    for (ValueId v : c.node->inputs) ins.push_back(random_values(size_t(c.g.type(v).numel()), rng));
    const size_t out_n = size_t(c.g.type(c.node->outputs[0]).numel());
    EXPECT_EQ(run_kernel(gpu, *k, ins, out_n, 3), run_kernel(gpu, *k, ins, out_n));
  }
}

double relative_error(const std::vector<float>& y, const std::vector<float>& r) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < y.size(); ++i) err += (y[i] - r[i]) * double(y[i] - r[i]), norm += double(r[i]) * r[i];
  EXPECT_GT(norm, 1.0);
  return std::sqrt(err / norm);
}

// A channels-last 1x1 conv is one GEMM: untimed it runs as the linear family's cuBLASLt GEMM
// (odd channel counts, bias + residual + hardswish, and a strided conv over a 1x1 image), timed
// it runs as whichever of the GEMM and cuDNN is faster; every one matches the CPU and remakes
// from its state. A strided 1x1 conv over a larger image skips pixels: cuDNN's.
TEST(CudaConvDevice, OneByOneConvRunsAsAGemmAndRemakesFromItsState) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  Backend& gpu = get_backend(Device::parse("cuda:0"));
  Backend& cpu = get_backend(Device::parse("cpu"));
  Attrs hs = attrs_2d(1, 0, 1, 1);
  hs.set("activation", std::string("hardswish"));
  hs.set("layout", std::string("nhwc"));
  Attrs s2 = attrs_2d(2, 0, 1, 1);
  s2.set("layout", std::string("nhwc"));
  struct Case {
    ConvGraph c;
    bool gemm;
  };
  std::vector<Case> cases;
  cases.push_back({conv_graph(OpKind::kConv, DType::kF32, {3, 7, 5, 29}, {58, 1, 1, 29}, true, hs, true), true});
  cases.push_back({conv_graph(OpKind::kConv, DType::kF32, {4, 1, 1, 24}, {40, 1, 1, 24}, false, s2, false), true});
  cases.push_back({conv_graph(OpKind::kConv, DType::kF32, {2, 5, 5, 16}, {24, 1, 1, 16}, true, s2, false), false});
  std::mt19937 rng(9);
  for (const Case& t : cases) {
    const ConvGraph& c = t.c;
    std::vector<std::vector<float>> ins;
    for (ValueId v : c.node->inputs) {  // an absent input is last: the pointers keep their places
      if (v != kNoValue) ins.push_back(random_values(size_t(c.g.type(v).numel()), rng));
    }
    const size_t out_n = size_t(c.g.type(c.node->outputs[0]).numel());
    KernelOptions opt;
    opt.policy.allow_tf32 = false;  // strict FP32, to compare with the CPU closely
    const auto r = run_kernel(cpu, *cpu.make_kernel(*c.node, c.g, opt), ins, out_n);
    for (const int level : {0, 3}) {
      opt.optimization_level = level;
      auto k = gpu.make_kernel(*c.node, c.g, opt);
      SCOPED_TRACE("level " + std::to_string(level) + ": " + k->describe());
      if (level == 0) {
        EXPECT_EQ(k->describe().find("1x1 conv as a GEMM") != std::string::npos, t.gemm);
      }
      const auto y = run_kernel(gpu, *k, ins, out_n);
      EXPECT_LT(relative_error(y, r), 1e-5);
      const Bytes state = k->state();
      auto again = gpu.make_kernel(*c.node, c.g, opt, &state);
      EXPECT_EQ(again->state(), state);
      EXPECT_EQ(again->describe().find("1x1 conv as a GEMM") != std::string::npos,
                k->describe().find("1x1 conv as a GEMM") != std::string::npos);
      EXPECT_EQ(run_kernel(gpu, *again, ins, out_n), y);
    }
  }
}

}  // namespace

#endif  // KILN_WITH_CUDA
