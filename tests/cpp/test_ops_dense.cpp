// The dense op families (matmul, linear, conv, conv_transpose, max/avg/adaptive pools, sdpa):
// shape rules on good and bad inputs, and the CPU kernels against naive reference loops
// (double accumulation) on random inputs, plus the SGEMM underneath them.
//
// Each kernel test builds a one-node graph (inputs or constants), asks the CPU backend for the
// node's kernel and runs it directly, with the workspace and output pre-filled with NaN bytes
// so that a kernel reading scratch it never wrote shows up as a mismatch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "kiln/kiln.h"
#include "src/backends/cpu/gemm.h"
#include "tests/cpp/error_test_util.h"

namespace {

using namespace kiln;
using Shape = std::vector<int64_t>;

// ---- tensors ------------------------------------------------------------------------------

struct Tensor {
  TensorType type;
  std::vector<float> v;  // values as floats (bool: 0 / 1)
  bool constant = false;
  bool absent = false;
};

Bytes encode(const std::vector<float>& v, DType dt) {
  Bytes b(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dt) {
      case DType::kF32: std::memcpy(&b[i * 4], &v[i], 4); break;
      case DType::kF64: {
        double d = v[i];
        std::memcpy(&b[i * 8], &d, 8);
        break;
      }
      case DType::kF16: {
        uint16_t h = float_to_half(v[i]);
        std::memcpy(&b[i * 2], &h, 2);
        break;
      }
      case DType::kBF16: {
        uint16_t h = float_to_bf16(v[i]);
        std::memcpy(&b[i * 2], &h, 2);
        break;
      }
      case DType::kBool: b[i] = v[i] != 0.0f; break;
      default: ADD_FAILURE() << "test encodes no " << dtype_name(dt); break;
    }
  }
  return b;
}

std::vector<float> decode(const uint8_t* p, DType dt, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    switch (dt) {
      case DType::kF32: std::memcpy(&v[i], p + i * 4, 4); break;
      case DType::kF64: {
        double d;
        std::memcpy(&d, p + i * 8, 8);
        v[i] = float(d);
        break;
      }
      case DType::kF16: std::memcpy(&h, p + i * 2, 2), v[i] = half_to_float(h); break;
      case DType::kBF16: std::memcpy(&h, p + i * 2, 2), v[i] = bf16_to_float(h); break;
      default: ADD_FAILURE() << "test decodes no " << dtype_name(dt); break;
    }
  }
  return v;
}

// Random values in [-1, 1), rounded to what dtype `dt` holds so references see the same inputs.
Tensor rand_t(DType dt, const Shape& shape, uint32_t seed, bool constant = false) {
  Tensor t;
  t.type = TensorType(dt, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  t.v.resize(size_t(t.type.numel()));
  for (float& x : t.v) x = d(rng);
  Bytes b = encode(t.v, dt);
  t.v = decode(b.data(), dt, t.type.numel());
  t.constant = constant;
  return t;
}

Tensor bool_t(const Shape& shape, uint32_t seed, double p_true = 0.7) {
  Tensor t;
  t.type = TensorType(DType::kBool, shape);
  std::mt19937 rng(seed);
  std::bernoulli_distribution d(p_true);
  t.v.resize(size_t(t.type.numel()));
  for (float& x : t.v) x = d(rng) ? 1.0f : 0.0f;
  return t;
}

Tensor none() {
  Tensor t;
  t.absent = true;
  return t;
}

struct Result {
  TensorType type;
  std::vector<float> v;
  std::string desc;
};

// Builds a one-node graph, makes its CPU kernel and runs it once.
Result run_op(OpKind op, const std::vector<Tensor>& ins, const Attrs& attrs = {}) {
  Graph g;
  std::vector<ValueId> ids;
  std::vector<Bytes> bufs;
  for (size_t i = 0; i < ins.size(); ++i) {
    if (ins[i].absent) {
      ids.push_back(kNoValue);
      bufs.emplace_back();
      continue;
    }
    Bytes b = encode(ins[i].v, ins[i].type.dtype);
    std::string name("t");
    name += std::to_string(i);
    ids.push_back(ins[i].constant ? g.add_constant(name, ins[i].type, b.data(), b.size())
                                  : g.add_input(name, ins[i].type));
    bufs.push_back(std::move(b));
  }
  ValueId y = g.add_node1(op, ids, attrs);
  auto kernel = get_backend(Device{}).make_kernel(*g.nodes().back(), g, {});
  std::vector<const void*> in;
  for (size_t i = 0; i < ins.size(); ++i)
    in.push_back(ins[i].absent ? nullptr : ins[i].constant ? g.value(ids[i]).data->data() : bufs[i].data());
  const size_t ws_size = kernel->workspace_size();
  std::vector<uint8_t> ws(ws_size + 64, 0xFF);
  void* ws_ptr = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.data()) + 63) & ~uintptr_t(63));
  Bytes out(g.type(y).nbytes() + 1, 0xFF);
  void* outs[1] = {out.data()};
  RunContext ctx;
  ctx.workspace = ws_size ? ws_ptr : nullptr;
  ctx.workspace_size = ws_size;
  kernel->run(in.data(), outs, ctx);
  return {g.type(y), decode(out.data(), g.type(y).dtype, g.type(y).numel()), kernel->describe()};
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rtol, double atol) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = atol + rtol * std::abs(want[i]);
    const bool same_nan = std::isnan(want[i]) && std::isnan(got[i]);
    if (!same_nan && !(std::abs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << "element " << i << ": got " << got[i] << ", want " << want[i];
      if (++bad == 5) return;
    }
  }
}

double tol_for(DType dt) { return dt == DType::kF32 ? 2e-5 : dt == DType::kF16 ? 2e-3 : 1e-2; }

using kiln::test::expect_error;

std::vector<TensorType> infer(OpKind op, const std::vector<TensorType>& types, const Attrs& a = {}) {
  std::vector<const TensorType*> ptrs;
  for (const auto& t : types) ptrs.push_back(&t);
  return infer_types(op, ptrs, a);
}

TensorType tt(DType dt, const Shape& s) { return TensorType(dt, s); }

Attrs ints(std::initializer_list<std::pair<const char*, Shape>> kv) {
  Attrs a;
  for (const auto& [k, v] : kv) a.set(k, v);
  return a;
}

// ---- references -----------------------------------------------------------------------------

// Linear index into `shape` of the multi-index `idx` of a broadcast result (right-aligned).
int64_t bcast_index(const Shape& idx, const Shape& shape) {
  int64_t lin = 0;
  const size_t off = idx.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) lin = lin * shape[d] + (shape[d] == 1 ? 0 : idx[off + d]);
  return lin;
}

Shape unravel(int64_t i, const Shape& shape) {
  Shape idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) idx[d] = i % shape[d], i /= shape[d];
  return idx;
}

Shape bcast_shape(const Shape& a, const Shape& b) {
  Shape o(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < o.size(); ++i) {
    int64_t da = i < o.size() - a.size() ? 1 : a[i - (o.size() - a.size())];
    int64_t db = i < o.size() - b.size() ? 1 : b[i - (o.size() - b.size())];
    o[i] = da == 1 ? db : da;
  }
  return o;
}

int64_t prod(const Shape& s) {
  int64_t p = 1;
  for (int64_t e : s) p *= e;
  return p;
}

std::vector<double> ref_matmul(const Tensor& a, const Tensor& b) {
  Shape as = a.type.shape(), bs = b.type.shape();
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2), ob = bcast_shape(ab, bb);
  std::vector<double> y;
  for (int64_t bi = 0; bi < prod(ob); ++bi) {
    Shape idx = unravel(bi, ob);
    const float* A = a.v.data() + bcast_index(idx, ab) * M * K;
    const float* B = b.v.data() + bcast_index(idx, bb) * K * N;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t p = 0; p < K; ++p) s += double(A[i * K + p]) * B[p * N + j];
        y.push_back(s);
      }
  }
  return y;
}

struct Conv2d {
  int64_t N, C, H, W, O, KH, KW, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
  int64_t oph = 0, opw = 0;  // conv_transpose only
  bool one_d = false;        // H == KH == 1, lists of one value
  int64_t OH() const { return (H + 2 * ph - dh * (KH - 1) - 1) / sh + 1; }
  int64_t OW() const { return (W + 2 * pw - dw * (KW - 1) - 1) / sw + 1; }
  int64_t TOH() const { return (H - 1) * sh - 2 * ph + dh * (KH - 1) + oph + 1; }
  int64_t TOW() const { return (W - 1) * sw - 2 * pw + dw * (KW - 1) + opw + 1; }
  Shape x_shape() const { return one_d ? Shape{N, C, W} : Shape{N, C, H, W}; }
  Shape w_shape(bool transpose) const {
    Shape s = transpose ? Shape{C, O / groups} : Shape{O, C / groups};
    if (!one_d) s.push_back(KH);
    s.push_back(KW);
    return s;
  }
  Attrs attrs(bool transpose) const {
    auto pick = [&](int64_t h, int64_t w) { return one_d ? Shape{w} : Shape{h, w}; };
    Attrs a = ints({{"stride", pick(sh, sw)}, {"padding", pick(ph, pw)}, {"dilation", pick(dh, dw)}});
    a.set("groups", groups);
    if (transpose) a.set("output_padding", pick(oph, opw));
    return a;
  }
};

std::vector<double> ref_conv(const Conv2d& q, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t OH = q.OH(), OW = q.OW(), Cg = q.C / q.groups, Og = q.O / q.groups;
  std::vector<double> y(size_t(q.N * q.O * OH * OW));
  for (int64_t n = 0; n < q.N; ++n)
    for (int64_t o = 0; o < q.O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = b.absent ? 0.0 : b.v[size_t(o)];
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t ki = 0; ki < q.KH; ++ki)
              for (int64_t kj = 0; kj < q.KW; ++kj) {
                int64_t ih = oh * q.sh - q.ph + ki * q.dh, iw = ow * q.sw - q.pw + kj * q.dw;
                if (ih < 0 || ih >= q.H || iw < 0 || iw >= q.W) continue;
                int64_t ci = (o / Og) * Cg + c;
                s += double(x.v[size_t(((n * q.C + ci) * q.H + ih) * q.W + iw)]) *
                     w.v[size_t(((o * Cg + c) * q.KH + ki) * q.KW + kj)];
              }
          y[size_t(((n * q.O + o) * OH + oh) * OW + ow)] = s;
        }
  return y;
}

std::vector<double> ref_conv_transpose(const Conv2d& q, const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t OH = q.TOH(), OW = q.TOW(), Cg = q.C / q.groups, Og = q.O / q.groups;
  std::vector<double> y(size_t(q.N * q.O * OH * OW));
  for (int64_t n = 0; n < q.N; ++n)
    for (int64_t o = 0; o < q.O; ++o)
      for (int64_t i = 0; i < OH * OW; ++i) y[size_t((n * q.O + o) * OH * OW + i)] = b.absent ? 0.0 : b.v[size_t(o)];
  for (int64_t n = 0; n < q.N; ++n)
    for (int64_t c = 0; c < q.C; ++c)
      for (int64_t ih = 0; ih < q.H; ++ih)
        for (int64_t iw = 0; iw < q.W; ++iw)
          for (int64_t o = 0; o < Og; ++o)
            for (int64_t ki = 0; ki < q.KH; ++ki)
              for (int64_t kj = 0; kj < q.KW; ++kj) {
                int64_t oh = ih * q.sh - q.ph + ki * q.dh, ow = iw * q.sw - q.pw + kj * q.dw;
                if (oh < 0 || oh >= OH || ow < 0 || ow >= OW) continue;
                int64_t oc = (c / Cg) * Og + o;
                y[size_t(((n * q.O + oc) * OH + oh) * OW + ow)] +=
                    double(x.v[size_t(((n * q.C + c) * q.H + ih) * q.W + iw)]) *
                    w.v[size_t(((c * Og + o) * q.KH + ki) * q.KW + kj)];
              }
  return y;
}

struct Pool2d {
  int64_t N, C, H, W, KH, KW, sh, sw, ph = 0, pw = 0, dh = 1, dw = 1;
  bool ceil = false, include_pad = true, one_d = false;
  int64_t divisor = 0;
  static int64_t out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil) {
    double v = double(in + 2 * p - d * (k - 1) - 1) / double(s);
    int64_t o = int64_t(ceil ? std::ceil(v) : std::floor(v)) + 1;
    if (ceil && (o - 1) * s >= in + p) --o;  // the last window must start inside input or left padding
    return o;
  }
  int64_t OH() const { return out(H, KH, sh, ph, dh, ceil); }
  int64_t OW() const { return out(W, KW, sw, pw, dw, ceil); }
  Shape x_shape() const { return one_d ? Shape{N, C, W} : Shape{N, C, H, W}; }
  Attrs attrs(bool max) const {
    auto pick = [&](int64_t h, int64_t w) { return one_d ? Shape{w} : Shape{h, w}; };
    Attrs a = ints({{"kernel", pick(KH, KW)}, {"stride", pick(sh, sw)}, {"padding", pick(ph, pw)}});
    a.set("ceil_mode", ceil);
    if (max) {
      a.set("dilation", pick(dh, dw));
    } else {
      a.set("count_include_pad", include_pad);
      a.set("divisor", divisor);
    }
    return a;
  }
};

std::vector<double> ref_max_pool(const Pool2d& q, const Tensor& x) {
  std::vector<double> y;
  for (int64_t p = 0; p < q.N * q.C; ++p)
    for (int64_t oh = 0; oh < q.OH(); ++oh)
      for (int64_t ow = 0; ow < q.OW(); ++ow) {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t ki = 0; ki < q.KH; ++ki)
          for (int64_t kj = 0; kj < q.KW; ++kj) {
            int64_t ih = oh * q.sh - q.ph + ki * q.dh, iw = ow * q.sw - q.pw + kj * q.dw;
            if (ih < 0 || ih >= q.H || iw < 0 || iw >= q.W) continue;
            double v = x.v[size_t((p * q.H + ih) * q.W + iw)];
            if (v > m || std::isnan(v)) m = v;
            if (std::isnan(m)) break;
          }
        y.push_back(m);
      }
  return y;
}

std::vector<double> ref_avg_pool(const Pool2d& q, const Tensor& x) {
  std::vector<double> y;
  for (int64_t p = 0; p < q.N * q.C; ++p)
    for (int64_t oh = 0; oh < q.OH(); ++oh)
      for (int64_t ow = 0; ow < q.OW(); ++ow) {
        int64_t h0 = oh * q.sh - q.ph, w0 = ow * q.sw - q.pw;
        int64_t h1 = std::min(h0 + q.KH, q.H + q.ph), w1 = std::min(w0 + q.KW, q.W + q.pw);
        int64_t padded = (h1 - h0) * (w1 - w0);
        h0 = std::max<int64_t>(h0, 0), w0 = std::max<int64_t>(w0, 0);
        h1 = std::min(h1, q.H), w1 = std::min(w1, q.W);
        if (h0 >= h1 || w0 >= w1) {
          y.push_back(0.0);
          continue;
        }
        double s = 0;
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) s += x.v[size_t((p * q.H + ih) * q.W + iw)];
        int64_t div = q.divisor ? q.divisor : q.include_pad ? padded : (h1 - h0) * (w1 - w0);
        y.push_back(s / double(div));
      }
  return y;
}

std::vector<double> ref_adaptive(const Tensor& x, int64_t P, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  std::vector<double> y;
  for (int64_t p = 0; p < P; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        int64_t h0 = int64_t(std::floor(double(oh * H) / OH)), h1 = int64_t(std::ceil(double((oh + 1) * H) / OH));
        int64_t w0 = int64_t(std::floor(double(ow * W) / OW)), w1 = int64_t(std::ceil(double((ow + 1) * W) / OW));
        double s = 0;
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) s += x.v[size_t((p * H + ih) * W + iw)];
        y.push_back(s / double((h1 - h0) * (w1 - w0)));
      }
  return y;
}

// Naive attention; a row with every key masked gives zeros.
std::vector<double> ref_sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                             double scale) {
  Shape qs = q.type.shape(), ks = k.type.shape(), vs = v.type.shape();
  const int64_t L = qs[qs.size() - 2], E = qs.back(), S = ks[ks.size() - 2], Ev = vs.back();
  Shape qb(qs.begin(), qs.end() - 2), kb(ks.begin(), ks.end() - 2), vb(vs.begin(), vs.end() - 2);
  Shape ob = bcast_shape(bcast_shape(qb, kb), vb);
  std::vector<double> y;
  for (int64_t bi = 0; bi < prod(ob); ++bi) {
    Shape idx = unravel(bi, ob);
    const float* Q = q.v.data() + bcast_index(idx, qb) * L * E;
    const float* K = k.v.data() + bcast_index(idx, kb) * S * E;
    const float* V = v.v.data() + bcast_index(idx, vb) * S * Ev;
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> sc(static_cast<size_t>(S));
      std::vector<bool> keep(size_t(S), true);
      for (int64_t j = 0; j < S; ++j) {
        double s = 0;
        for (int64_t e = 0; e < E; ++e) s += double(Q[i * E + e]) * K[j * E + e];
        s *= scale;
        if (causal && j > i) keep[size_t(j)] = false;
        if (!mask.absent) {
          Shape full = idx;
          full.push_back(i);
          full.push_back(j);
          double m = mask.v[size_t(bcast_index(full, mask.type.shape()))];
          if (mask.type.dtype == DType::kBool) keep[size_t(j)] = keep[size_t(j)] && m != 0.0;
          else s += m;
        }
        sc[size_t(j)] = keep[size_t(j)] ? s : -std::numeric_limits<double>::infinity();
      }
      double mx = -std::numeric_limits<double>::infinity(), sum = 0;
      for (double s : sc) mx = std::max(mx, s);
      for (double& s : sc) sum += (s = std::isinf(mx) ? 0.0 : std::exp(s - mx));
      for (int64_t e = 0; e < Ev; ++e) {
        double o = 0;
        for (int64_t j = 0; j < S; ++j) o += (sum > 0 ? sc[size_t(j)] / sum : 0.0) * V[j * Ev + e];
        y.push_back(o);
      }
    }
  }
  return y;
}

// ============================== shape rules ==============================

TEST(DenseShapes, MatmulBroadcastsBatchDimsAndKeepsSymbols) {
  auto out = infer(OpKind::kMatmul, {tt(DType::kF32, {2, 1, 3, 4}), tt(DType::kF32, {5, 4, 6})});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape(), (Shape{2, 5, 3, 6}));
  EXPECT_EQ(out[0].dtype, DType::kF32);

  TensorType a = tt(DType::kF16, {2, 7, 8});
  a.dims[0].symbol = "B";
  a.dims[0].min = 1, a.dims[0].max = 16;
  auto sym = infer(OpKind::kMatmul, {a, tt(DType::kF16, {8, 3})});
  EXPECT_EQ(sym[0].shape(), (Shape{2, 7, 3}));
  EXPECT_EQ(sym[0].dims[0].symbol, "B");
  EXPECT_EQ(sym[0].dims[0].max, 16);
}

TEST(DenseShapes, MatmulRejectsBadOperands) {
  expect_error([] { infer(OpKind::kMatmul, {tt(DType::kF32, {2, 3}), tt(DType::kF32, {4, 5})}); },
               ErrorCode::kShapeMismatch, {"matmul", "inner dims", "3 vs 4"});
  expect_error([] { infer(OpKind::kMatmul, {tt(DType::kF32, {3}), tt(DType::kF32, {3, 5})}); },
               ErrorCode::kShapeMismatch, {"matmul", "rank >= 2"});
  expect_error([] { infer(OpKind::kMatmul, {tt(DType::kF32, {2, 2, 3}), tt(DType::kF32, {3, 3, 5})}); },
               ErrorCode::kShapeMismatch, {"matmul", "broadcast"});
  expect_error([] { infer(OpKind::kMatmul, {tt(DType::kI32, {2, 3}), tt(DType::kI32, {3, 5})}); },
               ErrorCode::kInvalidArgument, {"matmul", "floating"});
  expect_error([] { infer(OpKind::kMatmul, {tt(DType::kF32, {2, 3}), tt(DType::kF16, {3, 5})}); },
               ErrorCode::kInvalidArgument, {"matmul", "dtype"});
}

TEST(DenseShapes, Linear) {
  EXPECT_EQ(infer(OpKind::kLinear, {tt(DType::kF32, {2, 3, 8}), tt(DType::kF32, {5, 8}), tt(DType::kF32, {5})})[0]
                .shape(),
            (Shape{2, 3, 5}));
  EXPECT_EQ(infer(OpKind::kLinear, {tt(DType::kBF16, {8}), tt(DType::kBF16, {5, 8})})[0].shape(), (Shape{5}));
  expect_error([] { infer(OpKind::kLinear, {tt(DType::kF32, {2, 7}), tt(DType::kF32, {5, 8})}); },
               ErrorCode::kShapeMismatch, {"linear", "7 features"});
  expect_error(
      [] { infer(OpKind::kLinear, {tt(DType::kF32, {2, 8}), tt(DType::kF32, {5, 8}), tt(DType::kF32, {4})}); },
      ErrorCode::kShapeMismatch, {"linear", "bias"});
  expect_error([] { infer(OpKind::kLinear, {tt(DType::kF32, {2, 8}), tt(DType::kF32, {5, 8, 1})}); },
               ErrorCode::kShapeMismatch, {"linear", "weight"});
}

TEST(DenseShapes, ConvFollowsPyTorchFormulas) {
  // ResNet stem: 7x7 stride 2 padding 3 on 224 -> 112.
  Attrs stem = ints({{"stride", {2, 2}}, {"padding", {3, 3}}});
  EXPECT_EQ(infer(OpKind::kConv, {tt(DType::kF32, {1, 3, 224, 224}), tt(DType::kF32, {64, 3, 7, 7})}, stem)[0].shape(),
            (Shape{1, 64, 112, 112}));
  // Defaults: stride 1, no padding, dilation 1, groups 1.
  EXPECT_EQ(infer(OpKind::kConv, {tt(DType::kF32, {2, 4, 10, 9}), tt(DType::kF32, {6, 4, 3, 2})})[0].shape(),
            (Shape{2, 6, 8, 8}));
  Attrs dil = ints({{"padding", {1, 1}}, {"dilation", {2, 2}}});
  dil.set("groups", int64_t{2});
  EXPECT_EQ(infer(OpKind::kConv, {tt(DType::kF32, {1, 4, 10, 10}), tt(DType::kF32, {8, 2, 3, 3})}, dil)[0].shape(),
            (Shape{1, 8, 8, 8}));
  EXPECT_EQ(infer(OpKind::kConv, {tt(DType::kF16, {2, 4, 50}), tt(DType::kF16, {6, 4, 5})}, ints({{"stride", {3}}}))[0]
                .shape(),
            (Shape{2, 6, 16}));
  TensorType x = tt(DType::kF32, {3, 4, 8, 8});
  x.dims[0].symbol = "N";
  x.dims[0].min = 1, x.dims[0].max = 32;
  auto out = infer(OpKind::kConv, {x, tt(DType::kF32, {5, 4, 3, 3}), tt(DType::kF32, {5})});
  EXPECT_EQ(out[0].dims[0].symbol, "N");
  EXPECT_EQ(out[0].shape(), (Shape{3, 5, 6, 6}));
}

TEST(DenseShapes, ConvRejectsBadInputs) {
  const TensorType x = tt(DType::kF32, {1, 4, 8, 8});
  Attrs g3;
  g3.set("groups", int64_t{3});
  expect_error([&] { infer(OpKind::kConv, {x, tt(DType::kF32, {6, 4, 3, 3})}, g3); }, ErrorCode::kShapeMismatch,
               {"conv", "divisible by groups 3"});
  expect_error([&] { infer(OpKind::kConv, {x, tt(DType::kF32, {6, 3, 3, 3})}); }, ErrorCode::kShapeMismatch,
               {"conv", "input channels"});
  expect_error([&] { infer(OpKind::kConv, {x, tt(DType::kF32, {6, 4, 3, 3})}, ints({{"stride", {1}}})); },
               ErrorCode::kInvalidArgument, {"conv", "'stride'", "one per spatial dim"});
  expect_error([&] { infer(OpKind::kConv, {x, tt(DType::kF32, {6, 4, 3, 3})}, ints({{"stride", {1, 0}}})); },
               ErrorCode::kInvalidArgument, {"conv", "'stride'", ">= 1"});
  expect_error([&] { infer(OpKind::kConv, {x, tt(DType::kF32, {6, 4, 3, 3})}, ints({{"padding", {-1, 0}}})); },
               ErrorCode::kInvalidArgument, {"conv", "'padding'"});
  expect_error([&] { infer(OpKind::kConv, {x, tt(DType::kF32, {6, 4, 9, 9})}); }, ErrorCode::kShapeMismatch,
               {"conv", "smaller than the kernel"});
  // 3 spatial dims: conv takes them (strides, padding and dilation per dim), conv_transpose not.
  Attrs three = ints({{"stride", {2, 1, 3}}, {"padding", {1, 0, 2}}, {"dilation", {1, 2, 1}}});
  three.set("groups", int64_t(2));
  EXPECT_EQ(
      infer(OpKind::kConv, {tt(DType::kF32, {1, 4, 8, 9, 10}), tt(DType::kF32, {6, 2, 3, 1, 2})}, three)[0].shape(),
      (std::vector<int64_t>{1, 6, 4, 9, 5}));
  expect_error([] { infer(OpKind::kConv, {tt(DType::kF32, {1, 4, 8, 8, 8, 8}), tt(DType::kF32, {6, 4, 3, 3, 3, 3})}); },
               ErrorCode::kShapeMismatch, {"conv", "1, 2 or 3 spatial dims"});
  expect_error(
      [] { infer(OpKind::kConvTranspose, {tt(DType::kF32, {1, 4, 8, 8, 8}), tt(DType::kF32, {4, 6, 3, 3, 3})}); },
      ErrorCode::kShapeMismatch, {"conv_transpose", "1 or 2 spatial dims"});
  expect_error([&] { infer(OpKind::kConv, {x, tt(DType::kF32, {6, 4, 3})}); }, ErrorCode::kShapeMismatch,
               {"conv", "rank"});
  expect_error([&] { infer(OpKind::kConv, {x, tt(DType::kF32, {6, 4, 3, 3}), tt(DType::kF32, {5})}); },
               ErrorCode::kShapeMismatch, {"conv", "bias"});
  expect_error([] { infer(OpKind::kConv, {tt(DType::kI64, {1, 4, 8, 8}), tt(DType::kI64, {6, 4, 3, 3})}); },
               ErrorCode::kInvalidArgument, {"conv", "floating"});
  Attrs g0;
  g0.set("groups", int64_t{0});
  expect_error([&] { infer(OpKind::kConv, {x, tt(DType::kF32, {6, 4, 3, 3})}, g0); }, ErrorCode::kInvalidArgument,
               {"conv", "groups"});
  Attrs wrong_type;
  wrong_type.set("stride", int64_t{2});
  expect_error([&] { infer(OpKind::kConv, {x, tt(DType::kF32, {6, 4, 3, 3})}, wrong_type); },
               ErrorCode::kInvalidArgument, {"conv", "'stride'", "list of ints"});
}

TEST(DenseShapes, ConvTranspose) {
  Attrs a = ints({{"stride", {2, 2}}, {"padding", {1, 1}}, {"output_padding", {1, 1}}});
  EXPECT_EQ(infer(OpKind::kConvTranspose, {tt(DType::kF32, {1, 8, 5, 5}), tt(DType::kF32, {8, 4, 3, 3})}, a)[0].shape(),
            (Shape{1, 4, 10, 10}));
  a.set("groups", int64_t{2});
  EXPECT_EQ(infer(OpKind::kConvTranspose, {tt(DType::kF32, {1, 8, 5, 5}), tt(DType::kF32, {8, 3, 3, 3}),
                                           tt(DType::kF32, {6})},
                  a)[0]
                .shape(),
            (Shape{1, 6, 10, 10}));
  expect_error(
      [] {
        infer(OpKind::kConvTranspose, {tt(DType::kF32, {1, 8, 5, 5}), tt(DType::kF32, {8, 4, 3, 3})},
              ints({{"stride", {2, 2}}, {"output_padding", {2, 0}}}));
      },
      ErrorCode::kInvalidArgument, {"conv_transpose", "output_padding", "smaller than stride"});
  expect_error([] { infer(OpKind::kConvTranspose, {tt(DType::kF32, {1, 8, 5, 5}), tt(DType::kF32, {4, 4, 3, 3})}); },
               ErrorCode::kShapeMismatch, {"conv_transpose", "C_in = 8"});
  expect_error(
      [] {
        infer(OpKind::kConv, {tt(DType::kF32, {1, 8, 5, 5}), tt(DType::kF32, {4, 8, 3, 3})},
              ints({{"output_padding", {1, 1}}}));
      },
      ErrorCode::kInvalidArgument, {"conv", "output_padding", "conv_transpose only"});
  EXPECT_EQ(infer(OpKind::kConv, {tt(DType::kF32, {1, 8, 5, 5}), tt(DType::kF32, {4, 8, 3, 3})},
                  ints({{"output_padding", {0, 0}}}))[0]
                .shape(),
            (Shape{1, 4, 3, 3}));
}

TEST(DenseShapes, PoolsFollowPyTorchFormulas) {
  auto pool = [](OpKind op, const Shape& x, const Attrs& a) { return infer(op, {tt(DType::kF32, x)}, a)[0].shape(); };
  // ResNet stem pool: 3x3 stride 2 padding 1 on 112 -> 56.
  EXPECT_EQ(pool(OpKind::kMaxPool, {1, 64, 112, 112}, ints({{"kernel", {3, 3}}, {"stride", {2, 2}}, {"padding", {1, 1}}})),
            (Shape{1, 64, 56, 56}));
  // Stride defaults to the kernel, also when given as an empty list.
  EXPECT_EQ(pool(OpKind::kMaxPool, {1, 2, 9, 8}, ints({{"kernel", {2, 2}}})), (Shape{1, 2, 4, 4}));
  EXPECT_EQ(pool(OpKind::kAvgPool, {1, 2, 9, 8}, ints({{"kernel", {2, 2}}, {"stride", {}}})), (Shape{1, 2, 4, 4}));
  // ceil_mode adds a partial window...
  Attrs c = ints({{"kernel", {3, 3}}, {"stride", {2, 2}}});
  c.set("ceil_mode", true);
  EXPECT_EQ(pool(OpKind::kMaxPool, {1, 1, 6, 6}, c), (Shape{1, 1, 3, 3}));
  // ...unless it would start in the right padding: 5 with k2 s2 p1 gives 3, not 4.
  Attrs d = ints({{"kernel", {2}}, {"stride", {2}}, {"padding", {1}}});
  d.set("ceil_mode", true);
  EXPECT_EQ(pool(OpKind::kAvgPool, {1, 1, 5}, d), (Shape{1, 1, 3}));
  EXPECT_EQ(pool(OpKind::kMaxPool, {1, 1, 10}, ints({{"kernel", {3}}, {"stride", {1}}, {"dilation", {2}}})),
            (Shape{1, 1, 6}));
  EXPECT_EQ(pool(OpKind::kAdaptiveAvgPool, {2, 3, 7, 7}, ints({{"output_size", {1, 1}}})), (Shape{2, 3, 1, 1}));
  EXPECT_EQ(pool(OpKind::kAdaptiveAvgPool, {2, 3, 5}, ints({{"output_size", {8}}})), (Shape{2, 3, 8}));
}

TEST(DenseShapes, PoolsRejectBadAttributes) {
  const TensorType x = tt(DType::kF32, {1, 2, 8, 8});
  expect_error([&] { infer(OpKind::kMaxPool, {x}, ints({{"kernel", {3, 3}}, {"padding", {2, 2}}})); },
               ErrorCode::kInvalidArgument, {"max_pool", "half of the kernel"});
  expect_error([&] { infer(OpKind::kMaxPool, {x}); }, ErrorCode::kInvalidArgument, {"max_pool", "'kernel'"});
  expect_error([&] { infer(OpKind::kAvgPool, {x}, ints({{"kernel", {3}}})); }, ErrorCode::kInvalidArgument,
               {"avg_pool", "'kernel'", "one per spatial dim"});
  expect_error([&] { infer(OpKind::kAvgPool, {x}, ints({{"kernel", {9, 9}}})); }, ErrorCode::kShapeMismatch,
               {"avg_pool", "too small"});
  Attrs neg = ints({{"kernel", {2, 2}}});
  neg.set("divisor", int64_t{-1});
  expect_error([&] { infer(OpKind::kAvgPool, {x}, neg); }, ErrorCode::kInvalidArgument, {"avg_pool", "divisor"});
  Attrs ceil_int = ints({{"kernel", {2, 2}}});
  ceil_int.set("ceil_mode", int64_t{1});
  expect_error([&] { infer(OpKind::kMaxPool, {x}, ceil_int); }, ErrorCode::kInvalidArgument,
               {"max_pool", "'ceil_mode'", "bool"});
  expect_error([&] { infer(OpKind::kAdaptiveAvgPool, {x}); }, ErrorCode::kInvalidArgument,
               {"adaptive_avg_pool", "output_size"});
  expect_error([&] { infer(OpKind::kAdaptiveAvgPool, {x}, ints({{"output_size", {0, 2}}})); },
               ErrorCode::kInvalidArgument, {"adaptive_avg_pool", ">= 1"});
  expect_error([] { infer(OpKind::kMaxPool, {tt(DType::kF32, {8, 8})}, ints({{"kernel", {2, 2}}})); },
               ErrorCode::kShapeMismatch, {"max_pool", "1 or 2 spatial dims"});
  expect_error([] { infer(OpKind::kMaxPool, {tt(DType::kU8, {1, 1, 8, 8})}, ints({{"kernel", {2, 2}}})); },
               ErrorCode::kInvalidArgument, {"max_pool", "floating"});
}

TEST(DenseShapes, Sdpa) {
  auto q = tt(DType::kF32, {2, 8, 10, 16}), k = tt(DType::kF32, {2, 1, 12, 16}), v = tt(DType::kF32, {2, 1, 12, 32});
  EXPECT_EQ(infer(OpKind::kSdpa, {q, k, v})[0].shape(), (Shape{2, 8, 10, 32}));
  EXPECT_EQ(infer(OpKind::kSdpa, {q, k, v, tt(DType::kBool, {10, 12})})[0].shape(), (Shape{2, 8, 10, 32}));
  EXPECT_EQ(infer(OpKind::kSdpa, {q, k, v, tt(DType::kF32, {2, 1, 1, 12})})[0].shape(), (Shape{2, 8, 10, 32}));
  expect_error([&] { infer(OpKind::kSdpa, {q, k, v, tt(DType::kBool, {3, 12})}); }, ErrorCode::kShapeMismatch,
               {"sdpa", "mask", "does not broadcast"});
  expect_error([&] { infer(OpKind::kSdpa, {q, k, v, tt(DType::kBool, {4, 2, 8, 10, 12})}); },
               ErrorCode::kShapeMismatch, {"sdpa", "mask"});
  expect_error([&] { infer(OpKind::kSdpa, {q, k, v, tt(DType::kI64, {10, 12})}); }, ErrorCode::kInvalidArgument,
               {"sdpa", "mask", "bool"});
  expect_error([&] { infer(OpKind::kSdpa, {q, tt(DType::kF32, {2, 1, 12, 8}), v}); }, ErrorCode::kShapeMismatch,
               {"sdpa", "embedding dim"});
  expect_error([&] { infer(OpKind::kSdpa, {q, k, tt(DType::kF32, {2, 1, 11, 32})}); }, ErrorCode::kShapeMismatch,
               {"sdpa", "sequence dim"});
  expect_error([&] { infer(OpKind::kSdpa, {q, k, tt(DType::kF16, {2, 1, 12, 32})}); }, ErrorCode::kInvalidArgument,
               {"sdpa", "one dtype"});
  Attrs bad;
  bad.set("causal", std::string("yes"));
  expect_error([&] { infer(OpKind::kSdpa, {q, k, v}, bad); }, ErrorCode::kInvalidArgument, {"sdpa", "'causal'"});
}

// ============================== SGEMM ==============================

// Strided A and B, alpha/beta, bias per row or column, relu; sizes crossing the cache blocks
// and the micro-tile edges; serial and split over parts; the few-row and n == 1 paths; B, A
// or both prepacked.
TEST(DenseSgemm, MatchesReferenceWithStridesAndEpilogues) {
  struct Case {
    int64_t m, n, k;
    bool trans_a, trans_b, bias_row;
    float alpha, beta;
    bool bias, relu;
    int parts;
    int packed = 0;  // bit 1: B prepacked (sgemm_pack_b), bit 2: A (sgemm_pack_a_parallel)
  };
  const Case cases[] = {
      {1, 7, 13, false, false, false, 1, 0, false, false, 1},
      {1, 300, 70, false, true, false, 1, 0, true, true, 2},
      {2, 45, 67, false, true, false, 1, 0.5f, true, false, 2},   // few rows, dot products
      {3, 33, 40, false, true, true, 1, 0, true, true, 1},
      {4, 600, 150, false, true, false, 1, 0, false, false, 2},
      {4, 3000, 300, false, true, false, 1, 0, true, true, 2},     // few rows, split over threads
      {2, 5000, 200, false, false, false, 1, 0, true, false, 3},
      {3, 700, 21, false, false, false, 2, 0, true, false, 2},    // few rows, row updates
      {37, 1, 29, false, true, false, 2, 0, false, false, 2},
      {5, 3, 1, false, false, false, 1, 0, false, false, 1},
      {150, 1100, 300, false, false, false, 1, 0, true, false, 2},
      {97, 65, 513, true, false, true, 0.5f, 0, true, true, 3},
      {33, 47, 19, false, true, false, 1, 0.75f, true, false, 1},
      {64, 64, 64, true, true, false, -1, 1, false, true, 4},
      {200, 40, 9, false, false, true, 1, 0, true, false, 2},
      {70, 1700, 300, false, true, false, 1, 0, true, false, 3, 1},  // prepacked, several blocks
      {9, 50, 31, true, false, false, 1, 0.5f, false, true, 1, 1},
      {150, 1100, 300, false, false, true, 1, 0, true, true, 2, 2},  // A prepacked: two depth blocks
      {97, 65, 513, true, false, true, 0.5f, 0, true, true, 3, 2},   // transposed A, ragged panels
      {64, 64, 64, true, true, false, -1, 1, false, true, 4, 3},     // both, four parts
      {33, 47, 19, false, true, false, 1, 0.75f, true, false, 1, 2},
      {5, 3000, 9, false, false, true, 1, 0, true, true, 2, 2},      // one panel of A
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.m << "x" << c.n << "x" << c.k << " ta=" << c.trans_a
                                      << " tb=" << c.trans_b << " parts=" << c.parts);
    Tensor a = rand_t(DType::kF32, {c.m * c.k}, 1), b = rand_t(DType::kF32, {c.k * c.n}, 2);
    Tensor c0 = rand_t(DType::kF32, {c.m * c.n}, 3), bias = rand_t(DType::kF32, {c.bias_row ? c.m : c.n}, 4);
    auto A = [&](int64_t i, int64_t p) { return c.trans_a ? a.v[size_t(p * c.m + i)] : a.v[size_t(i * c.k + p)]; };
    auto B = [&](int64_t p, int64_t j) { return c.trans_b ? b.v[size_t(j * c.k + p)] : b.v[size_t(p * c.n + j)]; };
    std::vector<double> want;
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < c.k; ++p) s += double(A(i, p)) * B(p, j);
        s = c.alpha * s + c.beta * c0.v[size_t(i * c.n + j)];
        if (c.bias) s += bias.v[size_t(c.bias_row ? i : j)];
        if (c.relu) s = std::max(s, 0.0);
        want.push_back(s);
      }
    std::vector<float> out = c.beta != 0 ? c0.v : std::vector<float>(size_t(c.m * c.n), std::nanf(""));
    cpu::GemmArgs g;
    g.m = c.m, g.n = c.n, g.k = c.k;
    g.a = a.v.data(), g.a_rs = c.trans_a ? 1 : c.k, g.a_cs = c.trans_a ? c.m : 1;
    g.b = b.v.data(), g.b_rs = c.trans_b ? 1 : c.n, g.b_cs = c.trans_b ? c.k : 1;
    g.c = out.data(), g.ldc = c.n;
    g.alpha = c.alpha, g.beta = c.beta;
    g.bias = c.bias ? bias.v.data() : nullptr, g.bias_per_row = c.bias_row, g.relu = c.relu;
    std::vector<float> packed(size_t(cpu::sgemm_packed_b_floats(c.n, c.k)), std::nanf(""));
    if (c.packed & 1) {
      cpu::sgemm_pack_b(c.n, c.k, g.b, g.b_rs, g.b_cs, packed.data());
      g.packed_b = packed.data();
    }
    std::vector<float> packed_a(size_t(cpu::sgemm_packed_a_floats(c.m, c.k)), std::nanf(""));
    if (c.packed & 2) {
      cpu::sgemm_pack_a_parallel(c.m, c.k, g.a, g.a_rs, g.a_cs, packed_a.data());
      g.packed_a = packed_a.data();
    }
    std::vector<float> scratch(size_t(cpu::sgemm_scratch_floats(c.m, c.n, c.k, c.parts)) + 16, std::nanf(""));
    cpu::sgemm(g, scratch.data(), c.parts);
    expect_close(out, want, 1e-5, 1e-5);
  }
}

// ============================== matmul / linear kernels ==============================

TEST(DenseKernels, MatmulBatchedWithBroadcast) {
  struct Case {
    Shape a, b;
  };
  const Case cases[] = {
      {{1, 13}, {13, 7}},             {{5, 3, 17}, {17, 9}},        {{2, 1, 4, 5}, {3, 5, 6}},
      {{4, 33, 65}, {4, 65, 31}},     {{7, 2, 3}, {1, 3, 2}},       {{3, 40}, {2, 40, 70}},
      {{1, 130, 200}, {1, 200, 90}},  {{2, 3, 1, 8}, {2, 3, 8, 1}},
  };
  uint32_t seed = 10;
  for (const Case& c : cases) {
    for (bool constant_b : {false, true}) {
      SCOPED_TRACE(::testing::Message() << tt(DType::kF32, c.a).to_string() << " @ " << tt(DType::kF32, c.b).to_string()
                                        << (constant_b ? " (constant b)" : ""));
      Tensor a = rand_t(DType::kF32, c.a, seed++), b = rand_t(DType::kF32, c.b, seed++, constant_b);
      Result r = run_op(OpKind::kMatmul, {a, b});
      expect_close(r.v, ref_matmul(a, b), 1e-5, 1e-5);
    }
  }
}

TEST(DenseKernels, MatmulHalfAndBfloatComputeInF32) {
  for (DType dt : {DType::kF16, DType::kBF16, DType::kF64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = rand_t(dt, {3, 20, 31}, 1), b = rand_t(dt, {31, 11}, 2);
    Result r = run_op(OpKind::kMatmul, {a, b});
    EXPECT_EQ(r.type.dtype, dt);
    expect_close(r.v, ref_matmul(a, b), tol_for(dt), tol_for(dt));
  }
}

TEST(DenseKernels, LinearWithAndWithoutBias) {
  struct Case {
    Shape x;
    int64_t n;
    bool bias, constant;
    DType dt;
  };
  const Case cases[] = {
      {{3, 5, 13}, 7, true, false, DType::kF32},  {{1, 300}, 129, true, true, DType::kF32},
      {{300}, 1, false, false, DType::kF32},      {{64, 96}, 200, false, true, DType::kF32},
      {{2, 9, 24}, 17, true, true, DType::kF16},  {{4, 40}, 33, true, false, DType::kBF16},
  };
  uint32_t seed = 100;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << tt(c.dt, c.x).to_string() << " n=" << c.n);
    const int64_t K = c.x.back();
    Tensor x = rand_t(c.dt, c.x, seed++), w = rand_t(c.dt, {c.n, K}, seed++, c.constant);
    Tensor b = c.bias ? rand_t(c.dt, {c.n}, seed++, c.constant) : none();
    Result r = run_op(OpKind::kLinear, {x, w, b});
    Shape want_shape = c.x;
    want_shape.back() = c.n;
    EXPECT_EQ(r.type.shape(), want_shape);
    std::vector<double> want;
    for (int64_t i = 0; i < x.type.numel() / K; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double s = c.bias ? b.v[size_t(j)] : 0.0;
        for (int64_t p = 0; p < K; ++p) s += double(x.v[size_t(i * K + p)]) * w.v[size_t(j * K + p)];
        want.push_back(s);
      }
    expect_close(r.v, want, tol_for(c.dt), tol_for(c.dt));
  }
}

// ============================== conv kernels ==============================

struct ConvCase {
  Conv2d q;
  bool bias;
  const char* path;  // the implementation the kernel must pick (describe())
};

void check_conv(const ConvCase& c, DType dt, bool constant, uint32_t seed) {
  const Conv2d& q = c.q;
  SCOPED_TRACE(::testing::Message() << "N" << q.N << " C" << q.C << " " << q.H << "x" << q.W << " O" << q.O << " k"
                                    << q.KH << "x" << q.KW << " s" << q.sh << "," << q.sw << " p" << q.ph << ","
                                    << q.pw << " d" << q.dh << "," << q.dw << " g" << q.groups << " "
                                    << dtype_name(dt) << (constant ? " constant weights" : ""));
  Tensor x = rand_t(dt, q.x_shape(), seed), w = rand_t(dt, q.w_shape(false), seed + 1, constant);
  Tensor b = c.bias ? rand_t(dt, {q.O}, seed + 2, constant) : none();
  Result r = run_op(OpKind::kConv, {x, w, b}, q.attrs(false));
  Shape want_shape = q.one_d ? Shape{q.N, q.O, q.OW()} : Shape{q.N, q.O, q.OH(), q.OW()};
  EXPECT_EQ(r.type.shape(), want_shape);
  EXPECT_NE(r.desc.find(c.path), std::string::npos) << r.desc;
  expect_close(r.v, ref_conv(q, x, w, b), tol_for(dt), tol_for(dt));
}

TEST(DenseKernels, ConvAllPaths) {
  // {N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, groups}
  const ConvCase cases[] = {
      {{2, 3, 9, 11, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1}, true, "im2col"},
      {{1, 5, 13, 10, 7, 3, 3, 2, 2, 0, 0, 1, 1, 1}, false, "im2col"},
      {{1, 4, 12, 12, 6, 3, 3, 1, 1, 2, 2, 2, 2, 2}, true, "im2col"},    // dilation, groups
      {{1, 3, 23, 19, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1}, true, "im2col"},    // a ResNet stem
      {{1, 6, 8, 9, 4, 3, 1, 1, 1, 1, 0, 1, 1, 1}, true, "im2col"},      // 3x1 kernel
      {{2, 8, 7, 7, 8, 1, 1, 1, 1, 0, 0, 1, 1, 1}, true, "1x1"},         // pointwise
      {{1, 8, 5, 6, 12, 1, 1, 1, 1, 0, 0, 1, 1, 4}, true, "1x1"},        // grouped pointwise
      {{1, 8, 9, 9, 16, 1, 1, 2, 2, 0, 0, 1, 1, 1}, false, "im2col"},    // 1x1 stride 2 (downsample)
      {{2, 8, 10, 11, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8}, true, "depthwise"}, // MobileNet depthwise
      {{1, 6, 15, 14, 6, 3, 3, 2, 2, 1, 1, 1, 1, 6}, true, "depthwise"}, // depthwise stride 2
      {{1, 4, 12, 13, 8, 5, 5, 1, 2, 4, 3, 2, 1, 4}, false, "depthwise"},// multiplier 2, dilation
      {{1, 1, 9, 8, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1}, true, "depthwise"},   // one input channel
      {{1, 32, 4, 40, 48, 3, 3, 1, 1, 1, 1, 1, 1, 1}, true, "im2col"},   // K = 288 crosses a block
  };
  uint32_t seed = 1000;
  for (const ConvCase& c : cases) {
    check_conv(c, DType::kF32, false, seed);
    seed += 3;
  }
}

TEST(DenseKernels, Conv1d) {
  Conv2d a{2, 3, 1, 20, 5, 1, 4};
  a.sw = 2, a.pw = 1, a.one_d = true;
  Conv2d dw{1, 6, 1, 17, 6, 1, 3};
  dw.pw = 2, dw.dw = 2, dw.groups = 6, dw.one_d = true;
  Conv2d pw{3, 4, 1, 9, 2, 1, 1};
  pw.one_d = true;
  check_conv({a, true, "im2col"}, DType::kF32, false, 1);
  check_conv({dw, true, "depthwise"}, DType::kF32, false, 2);
  check_conv({pw, false, "1x1"}, DType::kF32, true, 3);
}

TEST(DenseKernels, ConvHalfAndBfloat) {
  const ConvCase cases[] = {
      {{1, 4, 7, 8, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2}, true, "im2col"},
      {{1, 6, 9, 9, 6, 3, 3, 2, 2, 1, 1, 1, 1, 6}, true, "depthwise"},
      {{2, 5, 4, 4, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1}, true, "1x1"},
  };
  uint32_t seed = 50;
  for (DType dt : {DType::kF16, DType::kBF16})
    for (const ConvCase& c : cases)
      for (bool constant : {false, true}) check_conv(c, dt, constant, seed += 3);
}

TEST(DenseKernels, ConvTranspose) {
  struct Case {
    Conv2d q;
    bool bias;
    DType dt;
  };
  std::vector<Case> cases;
  Conv2d up{1, 4, 5, 5, 3, 3, 3, 2, 2, 1, 1};  // stride 2, output_padding 1: 5 -> 10
  up.oph = up.opw = 1;
  cases.push_back({up, true, DType::kF32});
  Conv2d grouped{2, 6, 4, 3, 4, 3, 2, 2, 1, 0, 1, 2, 1, 2};  // groups 2, dilation 2
  grouped.oph = 1;
  cases.push_back({grouped, false, DType::kF32});
  Conv2d k4{1, 3, 6, 7, 5, 4, 4, 2, 2, 1, 1};  // the common 4x4 stride-2 upsampler
  cases.push_back({k4, true, DType::kF32});
  Conv2d one{2, 5, 3, 4, 6, 1, 1};  // 1x1 stride 1 is a plain channel mix
  cases.push_back({one, true, DType::kF32});
  Conv2d one_d{2, 4, 1, 9, 2, 1, 5, 1, 3, 0, 2, 1, 1};
  one_d.opw = 2, one_d.one_d = true;
  cases.push_back({one_d, true, DType::kF32});
  cases.push_back({up, true, DType::kF16});
  cases.push_back({grouped, true, DType::kBF16});
  uint32_t seed = 300;
  for (const Case& c : cases) {
    const Conv2d& q = c.q;
    SCOPED_TRACE(::testing::Message() << "C" << q.C << " " << q.H << "x" << q.W << " O" << q.O << " k" << q.KH << "x"
                                      << q.KW << " s" << q.sh << "," << q.sw << " g" << q.groups << " "
                                      << dtype_name(c.dt));
    Tensor x = rand_t(c.dt, q.x_shape(), seed++), w = rand_t(c.dt, q.w_shape(true), seed++, true);
    Tensor b = c.bias ? rand_t(c.dt, {q.O}, seed++) : none();
    Result r = run_op(OpKind::kConvTranspose, {x, w, b}, q.attrs(true));
    Shape want_shape = q.one_d ? Shape{q.N, q.O, q.TOW()} : Shape{q.N, q.O, q.TOH(), q.TOW()};
    EXPECT_EQ(r.type.shape(), want_shape);
    expect_close(r.v, ref_conv_transpose(q, x, w, b), tol_for(c.dt), tol_for(c.dt));
  }
}

// ============================== pool kernels ==============================

TEST(DenseKernels, MaxPool) {
  // {N, C, H, W, KH, KW, sh, sw, ph, pw, dh, dw}
  std::vector<Pool2d> cases = {
      {1, 3, 12, 12, 3, 3, 2, 2, 1, 1},        // ResNet stem pool
      {2, 2, 7, 9, 2, 3, 2, 1, 0, 1},          //
      {1, 2, 10, 9, 3, 2, 1, 2, 1, 1, 2, 3},   // dilation
      {1, 1, 6, 6, 3, 3, 2, 2},                // ceil_mode below
      {1, 2, 5, 5, 2, 2, 2, 2, 1, 1},          // ceil_mode drops the window in the padding
  };
  cases[3].ceil = cases[4].ceil = true;
  Pool2d p1{2, 3, 1, 15, 1, 3, 1, 2, 0, 1};
  p1.one_d = true, p1.ceil = true;
  cases.push_back(p1);
  uint32_t seed = 7;
  for (const Pool2d& q : cases)
    for (DType dt : {DType::kF32, DType::kF16}) {
      SCOPED_TRACE(::testing::Message() << q.H << "x" << q.W << " k" << q.KH << "x" << q.KW << " s" << q.sh << ","
                                        << q.sw << " p" << q.ph << "," << q.pw << " ceil " << q.ceil << " "
                                        << dtype_name(dt));
      Tensor x = rand_t(dt, q.x_shape(), seed++);
      Result r = run_op(OpKind::kMaxPool, {x}, q.attrs(true));
      Shape want = q.one_d ? Shape{q.N, q.C, q.OW()} : Shape{q.N, q.C, q.OH(), q.OW()};
      EXPECT_EQ(r.type.shape(), want);
      expect_close(r.v, ref_max_pool(q, x), 0, 0);  // max is exact
    }
}

TEST(DenseKernels, MaxPoolPropagatesNaN) {
  Pool2d q{1, 1, 4, 4, 2, 2, 2, 2};
  Tensor x = rand_t(DType::kF32, q.x_shape(), 3);
  x.v[5] = std::nanf("");  // in the top-left window only
  Result r = run_op(OpKind::kMaxPool, {x}, q.attrs(true));
  ASSERT_EQ(r.v.size(), 4u);
  EXPECT_TRUE(std::isnan(r.v[0]));
  for (int i = 1; i < 4; ++i) EXPECT_FALSE(std::isnan(r.v[size_t(i)]));
}

TEST(DenseKernels, AvgPoolDivisorRules) {
  std::vector<Pool2d> cases;
  Pool2d base{2, 3, 9, 8, 3, 3, 2, 2, 1, 1};
  for (bool include_pad : {true, false})
    for (bool ceil : {false, true})
      for (int64_t divisor : {int64_t{0}, int64_t{5}}) {
        Pool2d q = base;
        q.include_pad = include_pad, q.ceil = ceil, q.divisor = divisor;
        cases.push_back(q);
      }
  Pool2d clipped{1, 1, 5, 5, 2, 2, 2, 2, 1, 1};  // ceil_mode window clipped by the right edge
  clipped.ceil = true;
  cases.push_back(clipped);
  clipped.include_pad = false;
  cases.push_back(clipped);
  Pool2d one_d{2, 2, 1, 11, 1, 4, 1, 3, 0, 2};
  one_d.one_d = true, one_d.ceil = true, one_d.include_pad = false;
  cases.push_back(one_d);
  Pool2d global{1, 4, 7, 7, 7, 7, 7, 7};  // avg_pool2d(7) at the end of a ResNet
  cases.push_back(global);
  uint32_t seed = 70;
  for (const Pool2d& q : cases)
    for (DType dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message() << q.H << "x" << q.W << " k" << q.KH << "x" << q.KW << " p" << q.ph << ","
                                        << q.pw << " ceil " << q.ceil << " include_pad " << q.include_pad
                                        << " divisor " << q.divisor << " " << dtype_name(dt));
      Tensor x = rand_t(dt, q.x_shape(), seed++);
      Result r = run_op(OpKind::kAvgPool, {x}, q.attrs(false));
      Shape want = q.one_d ? Shape{q.N, q.C, q.OW()} : Shape{q.N, q.C, q.OH(), q.OW()};
      EXPECT_EQ(r.type.shape(), want);
      expect_close(r.v, ref_avg_pool(q, x), tol_for(dt), tol_for(dt));
    }
}

TEST(DenseKernels, AdaptiveAvgPool) {
  struct Case {
    Shape x;
    Shape out;
  };
  const Case cases[] = {
      {{2, 8, 7, 7}, {1, 1}},  // global average pool
      {{1, 3, 10, 7}, {3, 4}}, // uneven, overlapping windows
      {{2, 2, 3, 5}, {5, 5}},  // larger than the input
      {{3, 4, 10}, {4}},       // 1-D
  };
  uint32_t seed = 90;
  for (const Case& c : cases)
    for (DType dt : {DType::kF32, DType::kF16}) {
      SCOPED_TRACE(::testing::Message() << tt(dt, c.x).to_string() << " -> " << c.out.size() << " dims");
      Tensor x = rand_t(dt, c.x, seed++);
      Result r = run_op(OpKind::kAdaptiveAvgPool, {x}, ints({{"output_size", c.out}}));
      const bool two = c.x.size() == 4;
      const int64_t H = two ? c.x[2] : 1, OH = two ? c.out[0] : 1;
      Shape want = {c.x[0], c.x[1]};
      want.insert(want.end(), c.out.begin(), c.out.end());
      EXPECT_EQ(r.type.shape(), want);
      expect_close(r.v, ref_adaptive(x, c.x[0] * c.x[1], H, c.x.back(), OH, c.out.back()), tol_for(dt), tol_for(dt));
    }
}

// ============================== sdpa kernel ==============================

struct SdpaCase {
  Shape q, k, v;
  bool causal = false;
  int mask = 0;  // 0: none, 1: bool, 2: float
  Shape mask_shape = {};
  double scale = 0;  // 0: default 1/sqrt(E)
  DType dt = DType::kF32;
};

void check_sdpa(const SdpaCase& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << tt(c.dt, c.q).to_string() << " " << tt(c.dt, c.k).to_string() << " "
                                    << tt(c.dt, c.v).to_string() << " causal " << c.causal << " mask " << c.mask
                                    << " scale " << c.scale);
  Tensor q = rand_t(c.dt, c.q, seed), k = rand_t(c.dt, c.k, seed + 1), v = rand_t(c.dt, c.v, seed + 2);
  // Scale q up so that the softmax is far from uniform and masking errors show.
  for (float& x : q.v) x = float(decode(encode({x * 3.0f}, c.dt).data(), c.dt, 1)[0]);
  Tensor m = none();
  if (c.mask == 1) m = bool_t(c.mask_shape, seed + 3);
  if (c.mask == 2) m = rand_t(c.dt, c.mask_shape, seed + 3);
  Attrs a;
  a.set("causal", c.causal);
  if (c.scale != 0) a.set("scale", c.scale);
  Result r = run_op(OpKind::kSdpa, {q, k, v, m}, a);
  const double scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(double(c.q.back()));
  expect_close(r.v, ref_sdpa(q, k, v, m, c.causal, scale), tol_for(c.dt) * 2, tol_for(c.dt) * 2);
}

TEST(DenseKernels, SdpaMasksAndBroadcasts) {
  std::vector<SdpaCase> cases = {
      {{2, 3, 7, 16}, {2, 3, 9, 16}, {2, 3, 9, 8}},
      {{1, 4, 6, 8}, {1, 1, 6, 8}, {1, 1, 6, 5}, true},           // causal, k/v shared by heads
      {{1, 2, 5, 8}, {1, 2, 9, 8}, {1, 2, 9, 8}, true},           // causal with S > L
      {{1, 2, 9, 8}, {1, 2, 5, 8}, {1, 2, 5, 8}, true},           // causal with L > S
      {{2, 2, 7, 12}, {2, 2, 10, 12}, {2, 2, 10, 6}, false, 1, {7, 10}},
      {{2, 2, 7, 12}, {2, 2, 10, 12}, {2, 2, 10, 6}, false, 2, {2, 1, 1, 10}},  // padding mask
      {{2, 3, 7}, {2, 4, 7}, {2, 4, 7}, false, 2, {2, 3, 1}},    // column-broadcast float mask
      {{1, 5, 16}, {1, 5, 16}, {1, 5, 16}, true, 1, {1, 5, 5}, 0.5},
      {{1, 300, 8}, {1, 40, 8}, {1, 40, 8}},                      // several row blocks
      {{2, 270, 4}, {2, 270, 4}, {2, 270, 4}, true},               // causal over several row blocks
      {{1, 1, 16}, {1, 33, 16}, {1, 33, 3}, false, 2, {1, 33}},    // one query (decoding)
  };
  uint32_t seed = 500;
  for (const SdpaCase& c : cases) check_sdpa(c, seed += 4);
}

TEST(DenseKernels, SdpaHalfAndBfloat) {
  for (DType dt : {DType::kF16, DType::kBF16}) {
    SdpaCase a{{2, 2, 6, 16}, {2, 2, 8, 16}, {2, 2, 8, 16}, true, 2, {6, 8}};
    a.dt = dt;
    check_sdpa(a, 20);
    SdpaCase b{{1, 3, 5, 8}, {1, 3, 5, 8}, {1, 3, 5, 4}, false, 1, {1, 1, 5, 5}};
    b.dt = dt;
    check_sdpa(b, 30);
  }
}

TEST(DenseKernels, SdpaFullyMaskedRowGivesZeros) {
  Tensor q = rand_t(DType::kF32, {1, 3, 4}, 1), k = rand_t(DType::kF32, {1, 5, 4}, 2), v = rand_t(DType::kF32, {1, 5, 2}, 3);
  Tensor m = bool_t({3, 5}, 4, 1.0);
  for (int j = 0; j < 5; ++j) m.v[size_t(5 + j)] = 0.0f;  // query 1 sees no key
  Attrs a;
  Result r = run_op(OpKind::kSdpa, {q, k, v, m}, a);
  ASSERT_EQ(r.v.size(), 6u);
  EXPECT_EQ(r.v[2], 0.0f);
  EXPECT_EQ(r.v[3], 0.0f);
  expect_close(r.v, ref_sdpa(q, k, v, m, false, 0.5), 1e-5, 1e-5);
  EXPECT_NE(r.v[0], 0.0f);
}

// ============================== kernel contract ==============================

// run() is const and thread-safe: several threads with their own workspaces get the same result.
TEST(DenseKernels, ConcurrentRunsWithSeparateWorkspaces) {
  Graph g;
  Tensor xs = rand_t(DType::kF32, {2, 8, 12, 12}, 1), ws = rand_t(DType::kF32, {16, 8, 3, 3}, 2, true);
  Bytes xb = encode(xs.v, DType::kF32), wb = encode(ws.v, DType::kF32);
  ValueId x = g.add_input("x", xs.type);
  ValueId w = g.add_constant("w", ws.type, wb.data(), wb.size());
  Attrs a = ints({{"padding", {1, 1}}});
  ValueId y = g.add_node1(OpKind::kConv, {x, w}, a);
  ValueId z = g.add_node1(OpKind::kMaxPool, {y}, ints({{"kernel", {2, 2}}}));
  Tensor qt = rand_t(DType::kF32, {2, 4, 9, 8}, 3);
  Bytes qb = encode(qt.v, DType::kF32);
  ValueId q = g.add_input("q", qt.type);
  ValueId s = g.add_node1(OpKind::kSdpa, {q, q, q}, {});
  Backend& be = get_backend(Device{});
  auto conv = be.make_kernel(*g.nodes()[0], g, {});
  auto attn = be.make_kernel(*g.nodes()[2], g, {});
  auto run_both = [&](std::vector<float>& conv_out, std::vector<float>& attn_out) {
    std::vector<float> ws_buf(std::max(conv->workspace_size(), attn->workspace_size()) / 4 + 16);
    RunContext ctx;
    ctx.workspace = ws_buf.data();
    ctx.workspace_size = ws_buf.size() * 4;
    conv_out.assign(size_t(g.type(y).numel()), 0.0f);
    attn_out.assign(size_t(g.type(s).numel()), 0.0f);
    for (int rep = 0; rep < 20; ++rep) {
      const void* cin[2] = {xb.data(), g.value(w).data->data()};
      void* cout[1] = {conv_out.data()};
      conv->run(cin, cout, ctx);
      const void* ain[3] = {qb.data(), qb.data(), qb.data()};
      void* aout[1] = {attn_out.data()};
      attn->run(ain, aout, ctx);
    }
  };
  std::vector<float> c0, a0, c1, a1, c2, a2;
  run_both(c0, a0);
  std::thread t1([&] { run_both(c1, a1); });
  std::thread t2([&] { run_both(c2, a2); });
  t1.join();
  t2.join();
  EXPECT_EQ(c0, c1);
  EXPECT_EQ(c0, c2);
  EXPECT_EQ(a0, a1);
  EXPECT_EQ(a0, a2);
  (void)z;
}

TEST(DenseKernels, RejectsTooSmallWorkspace) {
  Graph g;
  ValueId a = g.add_input("a", tt(DType::kF16, {64, 64}));
  ValueId b = g.add_input("b", tt(DType::kF16, {64, 64}));
  g.add_node1(OpKind::kMatmul, {a, b});
  auto k = get_backend(Device{}).make_kernel(*g.nodes()[0], g, {});
  ASSERT_GT(k->workspace_size(), 0u);
  std::vector<uint16_t> in(64 * 64), out(64 * 64);
  const void* ins[2] = {in.data(), in.data()};
  void* outs[1] = {out.data()};
  RunContext ctx;  // no workspace
  expect_error([&] { k->run(ins, outs, ctx); }, ErrorCode::kInternal, {"matmul", "workspace"});
}

}  // namespace
