// Numerics of ATen importers that decompose one overload into several Kiln ops (index.Tensor,
// integer floor division, nearest upsampling, cropping pads, grouped-query attention, repeat,
// slice_scatter, cumsum, ...): each imported graph runs on the CPU backend against a naive
// reference written here from PyTorch's definition, on random inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/cpp/import_test_util.h"

using namespace kiln;
using namespace kiln::import_test;

namespace {

TEST(ImportNumerics, AdvancedIndexingWithSeveralIndexTensors) {
  std::mt19937 rng(7);
  // x[:, i, j] with i, j broadcasting [2,1] with [3] and negative entries.
  Fx fx;
  int32_t x = fx.input("x", DType::kF32, {3, 5, 6, 2});
  int32_t i = fx.input("i", DType::kI64, {2, 1});
  int32_t j = fx.input("j", DType::kI32, {3});
  fx.output(fx.node("aten.index.Tensor", {T(x), L({N(), T(i), T(j)})}, DType::kF32, {3, 2, 3, 2}), "y");
  std::vector<float> xv = random_floats(3 * 5 * 6 * 2, rng);
  std::vector<int64_t> iv = {-1, 2};
  std::vector<int32_t> jv = {0, -6, 4};
  std::vector<float> y = from_bytes<float>(run(fx, {to_bytes(xv), to_bytes(iv), to_bytes(jv)})[0]);
  ASSERT_EQ(y.size(), size_t(3 * 2 * 3 * 2));
  for (int a = 0; a < 3; ++a)
    for (int p = 0; p < 2; ++p)
      for (int q = 0; q < 3; ++q)
        for (int c = 0; c < 2; ++c) {
          const int64_t r = (iv[size_t(p)] + 5) % 5, s = (jv[size_t(q)] + 6) % 6;
          EXPECT_EQ(y[size_t(((a * 2 + p) * 3 + q) * 2 + c)], xv[size_t(((a * 5 + r) * 6 + s) * 2 + c)]);
        }
}

TEST(ImportNumerics, IntegerFloorDivisionRemainderAndFmod) {
  std::mt19937 rng(3);
  const size_t n = 200;
  std::vector<int64_t> a = random_ints(n, -60, 60, rng), b = random_ints(n, -7, 7, rng);
  for (int64_t& v : b) v = v == 0 ? 3 : v;
  Fx fx;
  int32_t ta = fx.input("a", DType::kI64, {int64_t(n)});
  int32_t tb = fx.input("b", DType::kI64, {int64_t(n)});
  const Shape s = {int64_t(n)};
  fx.output(fx.node("aten.div.Tensor_mode", {T(ta), T(tb)}, DType::kI64, s, {{"rounding_mode", S("floor")}}), "floor");
  fx.output(fx.node("aten.div.Tensor_mode", {T(ta), T(tb)}, DType::kI64, s, {{"rounding_mode", S("trunc")}}), "trunc");
  fx.output(fx.node("aten.remainder.Tensor", {T(ta), T(tb)}, DType::kI64, s), "rem");
  fx.output(fx.node("aten.fmod.Scalar", {T(ta), I(-4)}, DType::kI64, s), "fmod");
  std::vector<Bytes> out = run(fx, {to_bytes(a), to_bytes(b)});
  auto floor_v = from_bytes<int64_t>(out[0]), trunc_v = from_bytes<int64_t>(out[1]);
  auto rem_v = from_bytes<int64_t>(out[2]), fmod_v = from_bytes<int64_t>(out[3]);
  for (size_t k = 0; k < n; ++k) {
    const int64_t fl = int64_t(std::floor(double(a[k]) / double(b[k])));
    EXPECT_EQ(floor_v[k], fl) << a[k] << " // " << b[k];
    EXPECT_EQ(trunc_v[k], a[k] / b[k]) << a[k] << " / " << b[k];
    EXPECT_EQ(rem_v[k], a[k] - fl * b[k]) << a[k] << " % " << b[k];
    EXPECT_EQ(fmod_v[k], a[k] % -4) << a[k];
  }
}

TEST(ImportNumerics, NearestUpsamplingPicksPyTorchsSourcePixels) {
  std::mt19937 rng(5);
  Fx fx;
  int32_t x = fx.input("x", DType::kF32, {1, 2, 3, 5});
  fx.output(fx.node("aten.upsample_nearest2d.vec", {T(x), Ints({7, 9}), N()}, DType::kF32, {1, 2, 7, 9}), "sized");
  fx.output(fx.node("aten.upsample_nearest2d.vec", {T(x), N(), L({F(2.0), F(2.0)})}, DType::kF32, {1, 2, 6, 10}), "x2");
  std::vector<float> xv = random_floats(30, rng);
  std::vector<Bytes> out = run(fx, {to_bytes(xv)});
  auto check = [&](const std::vector<float>& y, int64_t oh, int64_t ow) {
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t h = 0; h < oh; ++h)
        for (int64_t w = 0; w < ow; ++w) {
          // floor(dst * in / out) in float arithmetic, clamped.
          const int64_t sh = std::min<int64_t>(int64_t(std::floor(float(h) * (3.0f / float(oh)))), 2);
          const int64_t sw = std::min<int64_t>(int64_t(std::floor(float(w) * (5.0f / float(ow)))), 4);
          EXPECT_EQ(y[size_t((c * oh + h) * ow + w)], xv[size_t((c * 3 + sh) * 5 + sw)]) << oh << "x" << ow;
        }
  };
  check(from_bytes<float>(out[0]), 7, 9);
  check(from_bytes<float>(out[1]), 6, 10);
}

TEST(ImportNumerics, ConstantPadWithNegativePadsCrops) {
  std::mt19937 rng(11);
  Fx fx;
  int32_t x = fx.input("x", DType::kF32, {2, 3, 4});
  // last dim: 1 before, -2 after (crop); middle dim: -1 before (crop), 2 after.
  fx.output(fx.node("aten.constant_pad_nd.default", {T(x), Ints({1, -2, -1, 2}), F(0.5)}, DType::kF32, {2, 4, 3}),
            "y");
  std::vector<float> xv = random_floats(24, rng);
  std::vector<float> y = from_bytes<float>(run(fx, {to_bytes(xv)})[0]);
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 4; ++b)
      for (int c = 0; c < 3; ++c) {
        const int sb = b + 1, sc = c - 1;  // source indices
        const float want = (sb < 3 && sc >= 0 && sc < 2) ? xv[size_t((a * 3 + sb) * 4 + sc)] : 0.5f;
        EXPECT_EQ(y[size_t((a * 4 + b) * 3 + c)], want) << a << "," << b << "," << c;
      }
}

TEST(ImportNumerics, GroupedQueryAttentionWithAMaskMatchesRepeatedHeads) {
  std::mt19937 rng(13);
  const int64_t H = 4, Hkv = 2, L = 3, S = 5, E = 4;
  Fx fx;
  int32_t q = fx.input("q", DType::kF32, {1, H, L, E});
  int32_t k = fx.input("k", DType::kF32, {1, Hkv, S, E});
  int32_t v = fx.input("v", DType::kF32, {1, Hkv, S, E});
  int32_t m = fx.input("m", DType::kBool, {1, H, L, S});
  fx.output(fx.node("aten.scaled_dot_product_attention.default", {T(q), T(k), T(v), T(m)}, DType::kF32,
                    {1, H, L, E}, {{"enable_gqa", B(true)}}),
            "y");
  std::vector<float> qv = random_floats(size_t(H * L * E), rng), kv = random_floats(size_t(Hkv * S * E), rng),
                     vv = random_floats(size_t(Hkv * S * E), rng);
  std::vector<uint8_t> mv(size_t(H * L * S));
  for (size_t i = 0; i < mv.size(); ++i) mv[i] = (i % 5 == 0) ? 1 : uint8_t(rng() % 2);
  std::vector<float> y = from_bytes<float>(run(fx, {to_bytes(qv), to_bytes(kv), to_bytes(vv), to_bytes(mv)})[0]);
  const double scale = 1.0 / std::sqrt(double(E));
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / (H / Hkv);  // the kv head of query head h
    for (int64_t l = 0; l < L; ++l) {
      std::vector<double> w(static_cast<size_t>(S));
      double mx = -1e300, sum = 0;
      for (int64_t s = 0; s < S; ++s) {
        double d = 0;
        for (int64_t e = 0; e < E; ++e) d += qv[size_t((h * L + l) * E + e)] * kv[size_t((g * S + s) * E + e)];
        w[size_t(s)] = mv[size_t((h * L + l) * S + s)] ? d * scale : -1e300;
        mx = std::max(mx, w[size_t(s)]);
      }
      for (double& x : w) sum += (x = x <= -1e299 ? 0.0 : std::exp(x - mx));
      for (int64_t e = 0; e < E; ++e) {
        double o = 0;
        for (int64_t s = 0; s < S; ++s) o += w[size_t(s)] / sum * vv[size_t((g * S + s) * E + e)];
        EXPECT_NEAR(y[size_t((h * L + l) * E + e)], o, 1e-5) << h << "," << l << "," << e;
      }
    }
  }
}

TEST(ImportNumerics, RepeatEmbeddingArgminAndAny) {
  std::mt19937 rng(17);
  Fx fx;
  int32_t x = fx.input("x", DType::kF32, {2, 3});
  int32_t ids = fx.input("ids", DType::kI64, {2, 2});
  int32_t table = fx.weight("emb.weight", {5, 3}, rng);
  fx.output(fx.node("aten.repeat.default", {T(x), Ints({2, 1, 2})}, DType::kF32, {2, 2, 6}), "rep");
  fx.output(fx.node("aten.embedding.default", {T(table), T(ids)}, DType::kF32, {2, 2, 3}), "emb");
  fx.output(fx.node("aten.argmin.default", {T(x), I(1)}, DType::kI64, {2}), "argmin");
  int32_t pos = fx.node("aten.gt.Scalar", {T(x), F(0.5)}, DType::kBool, {2, 3});
  fx.output(fx.node("aten.any.dim", {T(pos), I(-1), B(true)}, DType::kBool, {2, 1}), "any");
  std::vector<float> xv = random_floats(6, rng);
  std::vector<int64_t> iv = {4, 0, 2, 4};
  std::vector<Bytes> out = run(fx, {to_bytes(xv), to_bytes(iv)});
  std::vector<float> rep = from_bytes<float>(out[0]), emb = from_bytes<float>(out[1]);
  std::vector<int64_t> amin = from_bytes<int64_t>(out[2]);
  for (int r = 0; r < 2; ++r)
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 6; ++b) EXPECT_EQ(rep[size_t((r * 2 + a) * 6 + b)], xv[size_t(a * 3 + b % 3)]);
  const float* tv = reinterpret_cast<const float*>(fx.g.constants[0].data->data());
  for (int p = 0; p < 4; ++p)
    for (int d = 0; d < 3; ++d) EXPECT_EQ(emb[size_t(p * 3 + d)], tv[iv[size_t(p)] * 3 + d]);
  for (int a = 0; a < 2; ++a) {
    const int64_t want = std::min_element(xv.begin() + a * 3, xv.begin() + a * 3 + 3) - (xv.begin() + a * 3);
    EXPECT_EQ(amin[size_t(a)], want);
    const bool any = xv[size_t(a * 3)] > 0.5f || xv[size_t(a * 3 + 1)] > 0.5f || xv[size_t(a * 3 + 2)] > 0.5f;
    EXPECT_EQ(out[3][size_t(a)], any ? 1 : 0);
  }
}

TEST(ImportNumerics, SliceScatterCopyAndCumsum) {
  std::mt19937 rng(19);
  Fx fx;
  int32_t x = fx.input("x", DType::kF32, {4, 6});
  int32_t src = fx.input("src", DType::kF32, {4, 2});
  int32_t mask = fx.input("mask", DType::kBool, {2, 5});
  // x[:, 3:5] = src, written functionally; x[-1] = 0 via select_scatter of a copy.
  fx.output(fx.node("aten.slice_scatter.default", {T(x), T(src), I(1), I(3), I(5)}, DType::kF32, {4, 6}), "sliced");
  int32_t row = fx.node("aten.copy.default", {T(fx.input("row", DType::kF32, {6})), T(fx.input("z", DType::kF32, {}))},
                        DType::kF32, {6});
  fx.output(fx.node("aten.select_scatter.default", {T(x), T(row), I(0), I(-1)}, DType::kF32, {4, 6}), "selected");
  fx.output(fx.node("aten.cumsum.default", {T(x), I(0)}, DType::kF32, {4, 6}), "cumsum_f");
  fx.output(fx.node("aten.cumsum.default", {T(mask), I(-1)}, DType::kI64, {2, 5}), "cumsum_i");
  std::vector<float> xv = random_floats(24, rng), sv = random_floats(8, rng), rowv = random_floats(6, rng);
  std::vector<uint8_t> mv(10);
  for (uint8_t& m : mv) m = uint8_t(rng() % 2);
  std::vector<float> zv = {0.25f};
  std::vector<Bytes> out = run(fx, {to_bytes(xv), to_bytes(sv), to_bytes(mv), to_bytes(rowv), to_bytes(zv)});
  std::vector<float> sliced = from_bytes<float>(out[0]), selected = from_bytes<float>(out[1]);
  std::vector<float> cf = from_bytes<float>(out[2]);
  std::vector<int64_t> ci = from_bytes<int64_t>(out[3]);
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 6; ++c) {
      const size_t at = size_t(r * 6 + c);
      EXPECT_EQ(sliced[at], (c >= 3 && c < 5) ? sv[size_t(r * 2 + c - 3)] : xv[at]);
      EXPECT_EQ(selected[at], r == 3 ? 0.25f : xv[at]);
      double sum = 0;
      for (int k = 0; k <= r; ++k) sum += xv[size_t(k * 6 + c)];
      EXPECT_NEAR(cf[at], sum, 1e-5);
    }
  }
  for (int r = 0; r < 2; ++r) {
    int64_t sum = 0;
    for (int c = 0; c < 5; ++c) EXPECT_EQ(ci[size_t(r * 5 + c)], sum += mv[size_t(r * 5 + c)]);
  }
}

// An integer cumsum sums in f32 where its inputs are small integers (a mask cast to int, as
// position ids are made from a padding mask), in f64 otherwise; both give exact sums.
TEST(ImportNumerics, IntegerCumsumOfAMaskSumsInF32) {
  auto matmul_dtypes = [](const Graph& g) {
    std::vector<DType> found;
    for (const auto& n : g.nodes())
      if (n->op == OpKind::kMatmul) found.push_back(g.value(n->outputs[0]).type.dtype);
    return found;
  };
  Fx masked;
  int32_t ids = masked.input("ids", DType::kI64, {2, 7});
  int32_t ne = masked.node("aten.ne.Scalar", {T(ids), I(1)}, DType::kBool, {2, 7});
  int32_t as_int = masked.node("aten._to_copy.default", {T(ne)}, DType::kI32, {2, 7}, {{"dtype", D(DType::kI32)}});
  masked.output(masked.node("aten.cumsum.default", {T(as_int), I(1)}, DType::kI64, {2, 7}), "positions");
  EXPECT_EQ(matmul_dtypes(import_aten(masked.g)), std::vector<DType>{DType::kF32});
  std::vector<int64_t> idv(14);
  std::mt19937 rng(3);
  for (int64_t& v : idv) v = int64_t(rng() % 3);
  std::vector<int64_t> pos = from_bytes<int64_t>(run(masked, {to_bytes(idv)})[0]);
  for (int r = 0; r < 2; ++r) {
    int64_t sum = 0;
    for (int c = 0; c < 7; ++c) EXPECT_EQ(pos[size_t(r * 7 + c)], sum += idv[size_t(r * 7 + c)] != 1 ? 1 : 0);
  }

  Fx wide;
  int32_t big = wide.input("x", DType::kI64, {2, 7});
  wide.output(wide.node("aten.cumsum.default", {T(big), I(1)}, DType::kI64, {2, 7}), "sums");
  EXPECT_EQ(matmul_dtypes(import_aten(wide.g)), std::vector<DType>{DType::kF64});
}

}  // namespace
