// sign, floor, ceil, round and trunc (the CPU kernels against libm, special values included; the
// shape rule's dtypes; their importers, round.decimals and float div rounding_mode="trunc"), and
// aten._unsafe_index, which the Core ATen decomposition of bilinear interpolation indexes with:
// its import as one index_select and an imported bilinear resize against a reference on the CPU.
// With CUDA: the new ops' generated pointwise kernels, and every kernel of a bilinear resize
// engine's graph after the builder's passes, compile with NVRTC for sm_90 (no device needed).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/passes.h"
#include "tests/cpp/import_test_util.h"

#ifdef KILN_WITH_CUDA
#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/codegen/pointwise_program.h"
#include "src/backends/cuda/kernels.h"
#endif

using namespace kiln;
using namespace kiln::import_test;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

const OpKind kRoundingOps[] = {OpKind::kSign, OpKind::kFloor, OpKind::kCeil, OpKind::kRound, OpKind::kTrunc};

double reference(OpKind op, double x) {
  switch (op) {
    case OpKind::kSign: return double((x > 0) - (x < 0));  // NaN and -0 give +0, as PyTorch
    case OpKind::kFloor: return std::floor(x);
    case OpKind::kCeil: return std::ceil(x);
    case OpKind::kRound: return std::nearbyint(x);
    default: return std::trunc(x);
  }
}

// A value as stored in dtype dt, and back.
double round_to(double v, DType dt) {
  switch (dt) {
    case DType::kF32: return double(float(v));
    case DType::kF16: return half_to_float(float_to_half(float(v)));
    case DType::kBF16: return bf16_to_float(float_to_bf16(float(v)));
    default: return v;
  }
}

Bytes encode(const std::vector<double>& v, DType dt) {
  Bytes b(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    uint8_t* p = b.data() + i * dtype_size(dt);
    switch (dt) {
      case DType::kF32: {
        const float f = float(v[i]);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::kF64: std::memcpy(p, &v[i], 8); break;
      case DType::kF16: {
        const uint16_t h = float_to_half(float(v[i]));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kBF16: {
        const uint16_t h = float_to_bf16(float(v[i]));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kI64: {
        const int64_t x = int64_t(v[i]);
        std::memcpy(p, &x, 8);
        break;
      }
      case DType::kI32: {
        const int32_t x = int32_t(v[i]);
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::kI8: {
        const int8_t x = int8_t(v[i]);
        std::memcpy(p, &x, 1);
        break;
      }
      default: {
        const uint8_t x = uint8_t(v[i]);
        std::memcpy(p, &x, 1);
        break;
      }
    }
  }
  return b;
}

std::vector<double> decode(const Bytes& b, DType dt) {
  std::vector<double> v(b.size() / dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    const uint8_t* p = b.data() + i * dtype_size(dt);
    switch (dt) {
      case DType::kF32: {
        float f;
        std::memcpy(&f, p, 4);
        v[i] = f;
        break;
      }
      case DType::kF64: std::memcpy(&v[i], p, 8); break;
      case DType::kF16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        v[i] = half_to_float(h);
        break;
      }
      case DType::kBF16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        v[i] = bf16_to_float(h);
        break;
      }
      case DType::kI64: {
        int64_t x;
        std::memcpy(&x, p, 8);
        v[i] = double(x);
        break;
      }
      case DType::kI32: {
        int32_t x;
        std::memcpy(&x, p, 4);
        v[i] = x;
        break;
      }
      case DType::kI8: {
        int8_t x;
        std::memcpy(&x, p, 1);
        v[i] = x;
        break;
      }
      default: v[i] = *p; break;
    }
  }
  return v;
}

// Builds g for the CPU and runs it on one input.
std::vector<double> run_graph(const Graph& g, const Bytes& in, DType out_dt) {
  std::shared_ptr<Engine> e = Builder().build(g);
  Bytes out(e->outputs()[0].type.nbytes());
  const void* ins[] = {in.data()};
  void* outs[] = {out.data()};
  e->create_execution_context()->execute(std::vector<const void*>(ins, ins + 1), std::vector<void*>(outs, outs + 1));
  return decode(out, out_dt);
}

// Halves (ties for round), signed zeros, values next to integers, huge values, infinities, NaN,
// then random values of both signs.
std::vector<double> special_values(size_t random_count) {
  std::vector<double> v = {0.5,  1.5,        2.5,         -0.5,      -1.5,       -2.5,      0.0,
                           -0.0, 0.49999997, -0.49999997, 1.0000001, -3.9999998, 8388609.0, -8388609.5,
                           1e30, -1e30,      kInf,        -kInf,     kNaN,       7.0,       -7.0};
  std::mt19937 rng(35);
  std::uniform_real_distribution<double> d(-20, 20);
  for (size_t i = 0; i < random_count; ++i) v.push_back(d(rng));
  return v;
}

// Equal as values, with NaN equal to NaN and the signs of zeros compared.
void expect_same(double got, double want, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what;
    return;
  }
  EXPECT_EQ(got, want) << what;
  EXPECT_EQ(std::signbit(got), std::signbit(want)) << what << ": sign of " << got;
}

}  // namespace

// ---- the CPU kernels --------------------------------------------------------------------------

TEST(RoundingOps, CpuKernelsMatchLibmOnEveryFloatDtype) {
  const std::vector<double> values = special_values(100);
  for (DType dt : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
    for (OpKind op : kRoundingOps) {
      for (bool fused : {false, true}) {  // the op's own kernel, and inside a fused_pointwise chain
        Graph g;
        ValueId x = g.add_input("x", TensorType(dt, {int64_t(values.size())}));
        ValueId y = g.add_node1(op, {x});
        if (fused) y = g.add_node1(OpKind::kNeg, {g.add_node1(OpKind::kNeg, {y})});
        g.mark_output(y, "y");
        const std::vector<double> got = run_graph(g, encode(values, dt), dt);
        for (size_t i = 0; i < values.size(); ++i) {
          const double in = round_to(values[i], dt);
          expect_same(
              got[i], round_to(reference(op, in), dt),
              std::string(op_name(op)) + (fused ? " fused " : " ") + dtype_name(dt) + " of " + std::to_string(in));
        }
      }
    }
  }
}

TEST(RoundingOps, SignOfIntegers) {
  for (DType dt : {DType::kI64, DType::kI32, DType::kI8, DType::kU8}) {
    std::vector<double> values = {0, 1, 2, 100, 127};
    if (dt != DType::kU8) values.insert(values.end(), {-1, -2, -128});
    if (dt == DType::kU8) values.insert(values.end(), {200, 255});
    if (dt == DType::kI64) values.insert(values.end(), {-9.2e18, 9.2e18});
    Graph g;
    ValueId x = g.add_input("x", TensorType(dt, {int64_t(values.size())}));
    g.mark_output(g.add_node1(OpKind::kSign, {x}), "y");
    const std::vector<double> got = run_graph(g, encode(values, dt), dt);
    for (size_t i = 0; i < values.size(); ++i)
      EXPECT_EQ(got[i], double((values[i] > 0) - (values[i] < 0))) << dtype_name(dt) << " " << values[i];
  }
}

TEST(RoundingOps, ShapeRuleNamesTheDtypesItRefuses) {
  auto refusal = [](OpKind op, DType dt) {
    Graph g;
    ValueId x = g.add_input("x", TensorType(dt, {3}));
    try {
      g.add_node1(op, {x});
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal(OpKind::kFloor, DType::kI64).find("floor: x must be floating, got i64[3]"), std::string::npos)
      << refusal(OpKind::kFloor, DType::kI64);
  EXPECT_NE(refusal(OpKind::kRound, DType::kI32).find("round: x must be floating, got i32[3]"), std::string::npos);
  EXPECT_NE(refusal(OpKind::kSign, DType::kBool).find("sign: x must be floating or integer, got bool[3]"),
            std::string::npos)
      << refusal(OpKind::kSign, DType::kBool);
  EXPECT_EQ(refusal(OpKind::kSign, DType::kI8), "accepted");
  EXPECT_EQ(refusal(OpKind::kTrunc, DType::kBF16), "accepted");
}

// ---- importers ----------------------------------------------------------------------------------

TEST(RoundingImport, OverloadsMapToTheOps) {
  const std::pair<const char*, const char*> ops[] = {{"aten.sign.default", "sign"},   {"aten.sgn.default", "sign"},
                                                     {"aten.floor.default", "floor"}, {"aten.ceil.default", "ceil"},
                                                     {"aten.round.default", "round"}, {"aten.trunc.default", "trunc"}};
  for (const auto& [target, op] : ops) {
    Fx fx;
    int32_t x = fx.input("x", DType::kF16, {2, 3});
    fx.node(target, {T(x)}, DType::kF16, {2, 3});
    const std::string text = import_last(fx).to_string();
    EXPECT_NE(text.find(std::string("f16[2,3] = ") + op + "(%0)"), std::string::npos) << target << "\n" << text;
  }
  // Integer tensors: the rounding functions are the identity (the output is a copy of the
  // input, as an input returned as an output is); sign is not.
  for (const char* target : {"aten.floor.default", "aten.ceil.default", "aten.round.default", "aten.trunc.default"}) {
    Fx fx;
    int32_t x = fx.input("x", DType::kI64, {4});
    fx.node(target, {T(x)}, DType::kI64, {4});
    const Graph g = import_last(fx);
    ASSERT_EQ(g.nodes().size(), 1u) << target << "\n" << g.to_string();
    EXPECT_EQ(g.nodes()[0]->op, OpKind::kCopy) << target << "\n" << g.to_string();
  }
  Fx fx;
  int32_t x = fx.input("x", DType::kI32, {4});
  fx.node("aten.sign.default", {T(x)}, DType::kI32, {4});
  EXPECT_NE(import_last(fx).to_string().find("i32[4] = sign(%0)"), std::string::npos);
}

TEST(RoundingImport, RoundDecimalsAndTruncDivisionMatchPyTorchsFormulas) {
  std::mt19937 rng(7);
  // round(x, decimals=2) = rint(x * 100) / 100 and decimals=-1: rint(x / 10) * 10, in f32.
  for (int64_t decimals : {2, -1}) {
    Fx fx;
    int32_t x = fx.input("x", DType::kF32, {64});
    fx.node("aten.round.decimals", {T(x)}, DType::kF32, {64}, {{"decimals", I(decimals)}});
    fx.output(fx.last().outputs[0], "y");
    std::vector<float> in = random_floats(64, rng);
    for (float& v : in) v *= 500;
    in[0] = 0.125f, in[1] = -0.125f, in[2] = 25.0f, in[3] = -35.0f;  // ties both ways
    const std::vector<float> got = from_bytes<float>(run(fx, {to_bytes(in)})[0]);
    const float s = decimals > 0 ? 100.0f : 10.0f;
    for (size_t i = 0; i < in.size(); ++i) {
      const float want = decimals > 0 ? std::nearbyint(in[i] * s) / s : std::nearbyint(in[i] / s) * s;
      EXPECT_EQ(got[i], want) << "decimals " << decimals << " of " << in[i];
    }
  }
  {  // f16 computes in f32: the quotient is truncated before it is rounded to f16.
    Fx fx;
    int32_t a = fx.input("a", DType::kF16, {3});
    int32_t b = fx.input("b", DType::kF16, {3});
    fx.node("aten.div.Tensor_mode", {T(a), T(b)}, DType::kF16, {3}, {{"rounding_mode", S("trunc")}});
    fx.output(fx.last().outputs[0], "y");
    const std::vector<uint16_t> av = {float_to_half(2047.0f), float_to_half(-7.0f), float_to_half(5.0f)};
    const std::vector<uint16_t> bv = {float_to_half(0.6826f), float_to_half(2.0f), float_to_half(-0.0f)};
    const std::vector<uint16_t> got = from_bytes<uint16_t>(run(fx, {to_bytes(av), to_bytes(bv)})[0]);
    for (size_t i = 0; i < 3; ++i) {
      const float want = std::trunc(half_to_float(av[i]) / half_to_float(bv[i]));
      EXPECT_EQ(half_to_float(got[i]), half_to_float(float_to_half(want))) << i;
    }
  }
  Fx fx;  // floor division of floats stays refused (PyTorch's is not floor(a / b))
  int32_t a = fx.input("a", DType::kF32, {3});
  fx.node("aten.div.Tensor_mode", {T(a), T(a)}, DType::kF32, {3}, {{"rounding_mode", S("floor")}});
  EXPECT_NE(unsupported_reason(fx).find("div rounding_mode 'floor' on f32 (only integer division is supported)"),
            std::string::npos)
      << unsupported_reason(fx);
}

namespace {

// PyTorch's bilinear source coordinates for one axis (the Core ATen decomposition's formula in
// f32): the lower index, the upper index (clamped) and the weight of the upper one.
struct Axis {
  std::vector<int64_t> lo, hi;
  std::vector<float> w;
};
Axis bilinear_axis(int64_t in, int64_t out, bool align_corners) {
  Axis a;
  const float scale = align_corners ? (out > 1 ? float(in - 1) / float(out - 1) : 0.0f) : float(in) / float(out);
  for (int64_t i = 0; i < out; ++i) {
    float src = align_corners ? scale * float(i) : scale * (float(i) + 0.5f) - 0.5f;
    src = std::max(src, 0.0f);
    const int64_t lo = int64_t(src);
    a.lo.push_back(lo);
    a.hi.push_back(std::min(lo + 1, in - 1));
    a.w.push_back(std::clamp(src - float(lo), 0.0f, 1.0f));
  }
  return a;
}

// The bilinear resize of x[N,C,H,W] as the decomposition writes it: four _unsafe_index reads
// with index tensors [Ho, 1] and [Wo], then two lerps along W and one along H.
Fx bilinear_fx(const Shape& xs, int64_t ho, int64_t wo, bool align_corners, int32_t* x_id) {
  const Axis ah = bilinear_axis(xs[2], ho, align_corners), aw = bilinear_axis(xs[3], wo, align_corners);
  Fx fx;
  const int32_t x = fx.input("x", DType::kF32, xs);
  *x_id = x;
  const int32_t h0 = fx.constant("h0", DType::kI64, {ho, 1}, to_bytes(ah.lo), false);
  const int32_t h1 = fx.constant("h1", DType::kI64, {ho, 1}, to_bytes(ah.hi), false);
  const int32_t w0 = fx.constant("w0", DType::kI64, {wo}, to_bytes(aw.lo), false);
  const int32_t w1 = fx.constant("w1", DType::kI64, {wo}, to_bytes(aw.hi), false);
  const int32_t lh = fx.constant("lh", DType::kF32, {ho, 1}, to_bytes(ah.w), false);
  const int32_t lw = fx.constant("lw", DType::kF32, {wo}, to_bytes(aw.w), false);
  const Shape out = {xs[0], xs[1], ho, wo};
  auto index = [&](int32_t i, int32_t j) {
    return fx.node("aten._unsafe_index.Tensor", {T(x), L({N(), N(), T(i), T(j)})}, DType::kF32, out);
  };
  auto lerp = [&](int32_t a, int32_t b, int32_t w) {
    const int32_t d = fx.node("aten.sub.Tensor", {T(b), T(a)}, DType::kF32, out);
    return fx.node("aten.add.Tensor", {T(a), T(fx.node("aten.mul.Tensor", {T(d), T(w)}, DType::kF32, out))},
                   DType::kF32, out);
  };
  const int32_t top = lerp(index(h0, w0), index(h0, w1), lw);
  const int32_t bottom = lerp(index(h1, w0), index(h1, w1), lw);
  fx.output(lerp(top, bottom, lh), "y");
  return fx;
}

}  // namespace

TEST(UnsafeIndexImport, IsOneIndexSelectOfTheFlattenedPlane) {
  Fx fx;
  const int32_t x = fx.input("x", DType::kF32, {2, 3, 4, 6});
  const int32_t i = fx.input("i", DType::kI64, {5, 1});
  const int32_t j = fx.input("j", DType::kI64, {7});
  fx.node("aten._unsafe_index.Tensor", {T(x), L({N(), N(), T(i), T(j)})}, DType::kF32, {2, 3, 5, 7});
  const std::string text = import_last(fx).to_string();
  EXPECT_EQ(count(text, "index_select"), 1) << text;
  EXPECT_NE(text.find("f32[2,3,24] = reshape(%0)"), std::string::npos) << text;
  EXPECT_NE(text.find("f32[2,3,35] = index_select("), std::string::npos) << text;
  Fx bool_mask;  // the same refusals as index.Tensor
  const int32_t y = bool_mask.input("y", DType::kF32, {4});
  const int32_t m = bool_mask.input("m", DType::kBool, {4});
  bool_mask.node("aten._unsafe_index.Tensor", {T(y), L({T(m)})}, DType::kF32, {2});
  EXPECT_NE(unsupported_reason(bool_mask).find("integer indices only"), std::string::npos);
}

TEST(UnsafeIndexImport, BilinearResizeMatchesTheReference) {
  struct Resize {
    Shape x;
    int64_t ho, wo;
  };
  const Resize sizes[] = {{{1, 2, 4, 6}, 8, 12}, {{2, 3, 9, 7}, 4, 3}, {{1, 1, 5, 5}, 11, 2}, {{2, 2, 1, 3}, 3, 5}};
  std::mt19937 rng(11);
  for (const Resize& r : sizes) {
    for (bool align : {false, true}) {
      int32_t xid = 0;
      Fx fx = bilinear_fx(r.x, r.ho, r.wo, align, &xid);
      const int64_t n = r.x[0] * r.x[1], h = r.x[2], w = r.x[3];
      const std::vector<float> x = random_floats(size_t(n * h * w), rng);
      const std::vector<float> got = from_bytes<float>(run(fx, {to_bytes(x)})[0]);
      const Axis ah = bilinear_axis(h, r.ho, align), aw = bilinear_axis(w, r.wo, align);
      ASSERT_EQ(got.size(), size_t(n * r.ho * r.wo));
      for (int64_t p = 0; p < n; ++p)
        for (int64_t a = 0; a < r.ho; ++a)
          for (int64_t b = 0; b < r.wo; ++b) {
            auto at = [&](int64_t yy, int64_t xx) { return x[size_t((p * h + yy) * w + xx)]; };
            const size_t ia = size_t(a), ib = size_t(b);
            const float t0 = at(ah.lo[ia], aw.lo[ib]), t1 = at(ah.lo[ia], aw.hi[ib]);
            const float b0 = at(ah.hi[ia], aw.lo[ib]), b1 = at(ah.hi[ia], aw.hi[ib]);
            const float top = t0 + (t1 - t0) * aw.w[ib], bottom = b0 + (b1 - b0) * aw.w[ib];
            const float want = top + (bottom - top) * ah.w[ia];
            EXPECT_NEAR(got[size_t((p * r.ho + a) * r.wo + b)], want, 1e-6f)
                << "x " << TensorType(DType::kF32, r.x).to_string() << " -> " << r.ho << "x" << r.wo << " align "
                << align;
          }
    }
  }
}

#ifdef KILN_WITH_CUDA

namespace {

// The CUDA generator's source for a pointwise node (unary or fused), compiled for sm_90.
void pointwise_compiles(const Node& n, const Graph& g, const std::string& what) {
  std::string why;
  ASSERT_TRUE(cuda::supports_pointwise(n, g, &why)) << what << ": " << why;
  cuda::pwgen::Program p;
  ASSERT_TRUE(cuda::pwgen::program_of(n, g, &p, &why)) << what << ": " << why;
  bool ok = false;
  const cuda::pwgen::Layout l = cuda::pwgen::layout_of(n, g, p, &why, &ok);
  ASSERT_TRUE(ok) << what << ": " << why;
  const std::string source = cuda::pwgen::generate(p, l);
  EXPECT_NO_THROW(EXPECT_GT(cuda::compile_to_cubin(source, what, 90).size(), 0u)) << what << "\n" << source;
}

}  // namespace

TEST(RoundingCuda, EveryNewOpCompilesOnEveryDtypeItTakes) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64}) {
    for (OpKind op : kRoundingOps) {
      Graph g;
      g.mark_output(g.add_node1(op, {g.add_input("x", TensorType(dt, {3, 40}))}), "y");
      pointwise_compiles(*g.nodes().back(), g, std::string(op_name(op)) + " " + dtype_name(dt));
    }
  }
  for (DType dt : {DType::kI64, DType::kI32, DType::kI8, DType::kU8}) {
    Graph g;
    g.mark_output(g.add_node1(OpKind::kSign, {g.add_input("x", TensorType(dt, {7, 9}))}), "y");
    pointwise_compiles(*g.nodes().back(), g, std::string("sign ") + dtype_name(dt));
  }
  for (DType dt : {DType::kF16, DType::kF64}) {  // all five in one fused body
    Graph g;
    ValueId x = g.add_input("x", TensorType(dt, {5, 64}));
    ValueId y = x;
    for (OpKind op : kRoundingOps) y = g.add_node1(OpKind::kAdd, {y, g.add_node1(op, {x})});
    g.mark_output(y, "y");
    ASSERT_TRUE(fuse_pointwise(g));
    ASSERT_EQ(g.nodes().size(), 1u);
    ASSERT_EQ(g.nodes()[0]->op, OpKind::kFusedPointwise);
    pointwise_compiles(*g.nodes()[0], g, std::string("fused rounding ") + dtype_name(dt));
  }
}

TEST(RoundingCuda, BilinearResizeEngineGraphRunsOnGeneratedKernels) {
  for (bool align : {false, true}) {
    int32_t xid = 0;
    Fx fx = bilinear_fx({2, 8, 33, 17}, 65, 40, align, &xid);
    Graph g = import_aten(fx.g);
    // The builder's passes for a CUDA engine that concern this graph.
    eliminate_dead_code(g);
    fold_constants(g);
    to_channels_last(g);
    collapse_view_chains(g);
    fold_constants(g);
    fuse_pointwise(g);
    eliminate_dead_code(g);
    g.verify();
    int gathers = 0, fused = 0, gathered_leaves = 0;
    for (const auto& n : g.nodes()) {
      if (n->body)
        for (const auto& b : n->body->nodes()) gathered_leaves += b->op == OpKind::kIndexSelect;
      const OpInfo& info = op_info(n->op);
      EXPECT_TRUE(info.pointwise() || info.family == OpFamily::kFused || info.family == OpFamily::kShape ||
                  info.family == OpFamily::kGather)
          << op_name(n->op) << " is not expected in this graph";
      std::string why;
      EXPECT_TRUE(cuda::supports_node(*n, g, &why)) << op_name(n->op) << ": " << why << "\n" << g.to_string();
      const std::string what = std::string(op_name(n->op)) + (align ? " align_corners" : "");
      if (n->op == OpKind::kIndexSelect || op_info(n->op).family == OpFamily::kShape) {
        gathers += n->op == OpKind::kIndexSelect;
        const cuda::gen::Generated gn =
            n->op == OpKind::kIndexSelect ? cuda::gen::generate_gather(*n, g) : cuda::gen::generate_shape(*n, g);
        if (!gn.plan.launches.empty()) {
          EXPECT_GT(cuda::gen::compile_for_arch(gn.source, what, 90).size(), 0u) << what;
        }
      } else if (op_info(n->op).pointwise() || n->op == OpKind::kFusedPointwise) {
        fused += n->op == OpKind::kFusedPointwise;
        pointwise_compiles(*n, g, what);
      }
    }
    // Four gathers of constant linear indices, read inside the one fused kernel of the lerps.
    EXPECT_EQ(gathers, 0) << g.to_string();
    EXPECT_EQ(gathered_leaves, 4) << g.to_string();
    EXPECT_EQ(fused, 1) << g.to_string();
  }
}

#endif  // KILN_WITH_CUDA
