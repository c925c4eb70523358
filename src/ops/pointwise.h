// The semantics of Kiln's pointwise ops (unary, binary, where, cast), in one place: the CPU
// kernels, constant folding and the CUDA code generator all follow what is written here.
//
//   - scalar forms: unary_value<K>(x, p), binary_value<K>(a, b) and their run-time switches
//     apply_unary / apply_binary, for float and double (and integer types where the op takes
//     integers). Floating ops compute in f32 (f64 for double); f16/bf16 go through f32.
//   - cast_value: what `cast` makes of a value (float -> integer truncates toward zero,
//     saturating at the i64 range, NaN -> 0, then wraps to the narrower type; -> bool is != 0).
//   - element types: Elem<dtype> (storage and compute types) and visit_dtype.
//   - how inputs broadcast: broadcast_dims (with symbols) and BroadcastPlan (element strides
//     with mergeable dims collapsed), shared by every pointwise kernel.
//   - array forms (pointwise.cpp): the loops the CPU kernels run, y[i] = f(a[i*sa], b[i*sb]),
//     fast for strides 0 and 1, with results that do not depend on an element's position.
//   - read_attrs: attribute reads that name the op in errors, for every family's shape rule.
//
// Integer semantics: add/sub/mul/neg/abs wrap (two's complement, as PyTorch); div truncates
// toward zero and x / 0 == 0 (hardware would trap; PyTorch raises); the most negative value
// divided by -1 wraps. clamp on integers clamps to the integers inside [min, max].
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/errors.h"
#include "kiln/ir.h"

// The scalar forms must inline into the array loops for those to vectorize; GCC's size
// heuristics would otherwise keep exp_f32 out of line in the larger ops.
#if defined(__GNUC__)
#define KILN_PW_INLINE inline __attribute__((always_inline))
#else
#define KILN_PW_INLINE inline
#endif

namespace kiln::pw {

// ---- attributes ---------------------------------------------------------------------------

// Runs f (which reads attributes) and rethrows any Error as kInvalidArgument naming op, so
// "missing attribute 'axis'" becomes "softmax: missing attribute 'axis'". Used by the shape
// rules of every family in src/ops/.
template <typename F>
auto read_attrs(OpKind op, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    std::string msg = e.what();
    const size_t cut = msg.find("] ");  // drop the "[code] " prefix
    if (!msg.empty() && msg[0] == '[' && cut != std::string::npos) msg = msg.substr(cut + 2);
    KILN_FAIL(kInvalidArgument, op_name(op), ": ", msg);
  }
}

struct UnaryParams {
  bool gelu_tanh = false;  // gelu approximate == "tanh"
  double lo = -std::numeric_limits<double>::infinity();  // clamp bounds (infinite when absent)
  double hi = std::numeric_limits<double>::infinity();
  double slope = 0.01;  // leaky_relu negative_slope
  // Reads and validates op's attributes; throws kInvalidArgument naming op and attribute.
  static UnaryParams from(OpKind op, const Attrs& a);
};

// ---- f32 transcendentals ------------------------------------------------------------------
// Branch-free so that loops over them vectorize (libm calls do not); within about 2 ulp.

// exp(x) = 2^n exp(r), n = round(x / ln2), |r| <= ln2 / 2, exp(r) by its degree-7 Taylor
// polynomial. 2^n is applied in two halves so overflow gives inf and subnormals survive.
KILN_PW_INLINE float exp_f32(float x) {
  x = x < -104.0f ? -104.0f : x;  // comparisons let NaN through
  x = x > 89.0f ? 89.0f : x;
  float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest integer
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // ln2 split: first part exact
  n = n == n ? n : 0.0f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t ni = static_cast<int32_t>(n);
  const int32_t n1 = ni / 2, n2 = ni - n1;
  return p * std::bit_cast<float>((n1 + 127) << 23) * std::bit_cast<float>((n2 + 127) << 23);
}

// tanh(x) = sign(x) e / (e + 2) with e = expm1(2|x|): a Taylor series of expm1 near 0 (where
// exp(2|x|) - 1 would cancel), exp_f32 elsewhere.
KILN_PW_INLINE float tanh_f32(float x) {
  const float ax = std::fabs(x);
  const float t = ax > 20.0f ? 40.0f : 2.0f * ax;
  float s = 1.0f / 3628800.0f;
  s = s * t + 1.0f / 362880.0f;
  s = s * t + 1.0f / 40320.0f;
  s = s * t + 1.0f / 5040.0f;
  s = s * t + 1.0f / 720.0f;
  s = s * t + 1.0f / 120.0f;
  s = s * t + 1.0f / 24.0f;
  s = s * t + 1.0f / 6.0f;
  s = s * t + 0.5f;
  s = s * t + 1.0f;
  const float e = t < 0.7f ? s * t : exp_f32(t) - 1.0f;
  return std::copysign(e / (e + 2.0f), x);
}

// erf: |x| < 1 by the Taylor series of erf(x) / x in x^2 (10 terms); otherwise
// 1 - exp(-x^2) g(|x|) with g(x) = erfc(x) exp(x^2) fitted on [1, 4] by a degree-11 Chebyshev
// interpolant (relative error 2e-7, written in s = (|x| - 2.5) / 1.5); beyond 4, erf is 1 in f32.
KILN_PW_INLINE float erf_f32(float x) {
  constexpr double k = 1.1283791670955126;  // 2 / sqrt(pi); the series terms are k / (n! (2n + 1))
  const float z = x * x;
  float p = float(-k / 6894720);
  p = p * z + float(k / 685440);
  p = p * z + float(-k / 75600);
  p = p * z + float(k / 9360);
  p = p * z + float(-k / 1320);
  p = p * z + float(k / 216);
  p = p * z + float(-k / 42);
  p = p * z + float(k / 10);
  p = p * z + float(-k / 3);
  p = p * z + float(k);
  const float ax = std::fabs(x);
  const float c = ax > 4.0f ? 4.0f : ax;
  const float s = (c - 2.5f) * (1.0f / 1.5f);
  float q = -3.692872359e-05f;
  q = q * s + 9.640451526e-05f;
  q = q * s + -1.439485979e-04f;
  q = q * s + 3.678686724e-04f;
  q = q * s + -1.017117774e-03f;
  q = q * s + 2.425885101e-03f;
  q = q * s + -5.567332910e-03f;
  q = q * s + 1.248403569e-02f;
  q = q * s + -2.700572529e-02f;
  q = q * s + 5.611095841e-02f;
  q = q * s + -1.115210047e-01f;
  q = q * s + 2.108063575e-01f;
  const float tail = 1.0f - exp_f32(-(c * c)) * q;
  return ax < 1.0f ? x * p : std::copysign(tail, x);
}

// ---- scalar semantics -------------------------------------------------------------------

template <typename T>
inline bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return v != v;
  else return false;
}

// A floating value truncated toward zero to int64, saturating; NaN gives 0.
inline int64_t to_int64_saturated(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775807.0) return std::numeric_limits<int64_t>::max();
  if (v <= -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(v);
}

// A clamp bound for integer type T: the integers inside [lo, hi] are ceil(lo)..floor(hi),
// saturated to T's range; a NaN bound is no bound.
template <typename T>
inline T int_bound(double v, bool lower) {
  constexpr T kMin = std::numeric_limits<T>::min(), kMax = std::numeric_limits<T>::max();
  const double r = lower ? std::ceil(v) : std::floor(v);
  if (r != r) return lower ? kMin : kMax;
  if (r <= static_cast<double>(kMin)) return kMin;
  if (r >= static_cast<double>(kMax)) return kMax;
  return static_cast<T>(r);
}

inline constexpr double kSqrt2OverPi = 0.79788456080286535588;
inline constexpr double kInvSqrt2 = 0.70710678118654752440;

// gelu: 0.5 x (1 + erf(x / sqrt 2)), or with Tanh 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
template <bool Tanh, typename T>
KILN_PW_INLINE T gelu_value(T x) {
  constexpr bool f = std::is_same_v<T, float>;
  if constexpr (Tanh) {
    const T u = T(kSqrt2OverPi) * (x + T(0.044715) * x * x * x);
    if constexpr (f) return 0.5f * x * (1.0f + tanh_f32(u));
    else return 0.5 * x * (1.0 + std::tanh(u));
  } else {
    if constexpr (f) return 0.5f * x * (1.0f + erf_f32(x * float(kInvSqrt2)));
    else return 0.5 * x * (1.0 + std::erf(x * kInvSqrt2));
  }
}

template <OpKind K, typename T>
KILN_PW_INLINE T unary_value(T x, const UnaryParams& p) {
  if constexpr (std::is_floating_point_v<T>) {
    constexpr bool f = std::is_same_v<T, float>;
    if constexpr (K == OpKind::kRelu) return x < T(0) ? T(0) : x;
    if constexpr (K == OpKind::kGelu) return p.gelu_tanh ? gelu_value<true>(x) : gelu_value<false>(x);
    if constexpr (K == OpKind::kSilu) {
      if constexpr (f) return x / (1.0f + exp_f32(-x));
      else return x / (1.0 + std::exp(-x));
    }
    if constexpr (K == OpKind::kSigmoid) {
      if constexpr (f) return 1.0f / (1.0f + exp_f32(-x));
      else return 1.0 / (1.0 + std::exp(-x));
    }
    if constexpr (K == OpKind::kTanh) {
      if constexpr (f) return tanh_f32(x);
      else return std::tanh(x);
    }
    if constexpr (K == OpKind::kExp) {
      if constexpr (f) return exp_f32(x);
      else return std::exp(x);
    }
    if constexpr (K == OpKind::kLog) return std::log(x);
    if constexpr (K == OpKind::kSqrt) return std::sqrt(x);
    if constexpr (K == OpKind::kRsqrt) return T(1) / std::sqrt(x);
    if constexpr (K == OpKind::kNeg) return -x;
    if constexpr (K == OpKind::kAbs) return std::fabs(x);
    if constexpr (K == OpKind::kErf) {
      if constexpr (f) return erf_f32(x);
      else return std::erf(x);
    }
    if constexpr (K == OpKind::kHardswish || K == OpKind::kHardsigmoid) {
      T r = x + T(3);
      r = r < T(0) ? T(0) : r;
      r = r > T(6) ? T(6) : r;  // NaN stays NaN
      if constexpr (K == OpKind::kHardswish) return x * r / T(6);
      else return r / T(6);
    }
    if constexpr (K == OpKind::kReciprocal) return T(1) / x;
    if constexpr (K == OpKind::kSin) return std::sin(x);
    if constexpr (K == OpKind::kCos) return std::cos(x);
    if constexpr (K == OpKind::kLogicalNot) return x == T(0) ? T(1) : T(0);
    if constexpr (K == OpKind::kClamp) {  // min(max(x, lo), hi), as PyTorch: hi wins when lo > hi
      const T t = x < T(p.lo) ? T(p.lo) : x;
      return t > T(p.hi) ? T(p.hi) : t;
    }
    if constexpr (K == OpKind::kLeakyRelu) return x < T(0) ? x * T(p.slope) : x;
    // (0 < x) - (x < 0), as PyTorch: NaN and -0 give +0.
    if constexpr (K == OpKind::kSign) return (x > T(0) ? T(1) : T(0)) - (x < T(0) ? T(1) : T(0));
    if constexpr (K == OpKind::kFloor) return std::floor(x);
    if constexpr (K == OpKind::kCeil) return std::ceil(x);
    if constexpr (K == OpKind::kRound) return std::nearbyint(x);  // half to even (default rounding mode)
    if constexpr (K == OpKind::kTrunc) return std::trunc(x);
  } else {
    using U = std::make_unsigned_t<T>;
    if constexpr (K == OpKind::kRelu || K == OpKind::kAbs) {
      if constexpr (!std::is_signed_v<T>) return x;
      else if constexpr (K == OpKind::kRelu) return x < T(0) ? T(0) : x;
      else return x < T(0) ? static_cast<T>(U(0) - static_cast<U>(x)) : x;
    }
    if constexpr (K == OpKind::kNeg) return static_cast<T>(U(0) - static_cast<U>(x));
    if constexpr (K == OpKind::kLogicalNot) return x == T(0) ? T(1) : T(0);
    if constexpr (K == OpKind::kSign) {
      if constexpr (std::is_signed_v<T>) return static_cast<T>((x > T(0)) - (x < T(0)));
      else return x != T(0) ? T(1) : T(0);
    }
    if constexpr (K == OpKind::kClamp) {
      const T t = x < int_bound<T>(p.lo, true) ? int_bound<T>(p.lo, true) : x;
      return t > int_bound<T>(p.hi, false) ? int_bound<T>(p.hi, false) : t;
    }
  }
  KILN_FAIL(kInternal, op_name(K), " is not a unary op on this type");
}

template <OpKind K, typename T>
KILN_PW_INLINE T binary_value(T a, T b) {
  if constexpr (K == OpKind::kMaximum) return (is_nan(a) || a > b) ? a : b;  // NaN propagates
  if constexpr (K == OpKind::kMinimum) return (is_nan(a) || a < b) ? a : b;
  if constexpr (std::is_floating_point_v<T>) {
    if constexpr (K == OpKind::kAdd) return a + b;
    if constexpr (K == OpKind::kSub) return a - b;
    if constexpr (K == OpKind::kMul) return a * b;
    if constexpr (K == OpKind::kDiv) return a / b;
    if constexpr (K == OpKind::kPow) return std::pow(a, b);
  } else {
    using U = std::make_unsigned_t<T>;
    if constexpr (K == OpKind::kAdd) return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    if constexpr (K == OpKind::kSub) return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
    if constexpr (K == OpKind::kMul) return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    if constexpr (K == OpKind::kDiv) {
      if constexpr (std::is_signed_v<T>)
        if (b == T(-1)) return static_cast<T>(U(0) - static_cast<U>(a));
      return b == T(0) ? T(0) : static_cast<T>(a / b);
    }
  }
  if constexpr (K == OpKind::kEq) return a == b;
  if constexpr (K == OpKind::kNe) return a != b;
  if constexpr (K == OpKind::kLt) return a < b;
  if constexpr (K == OpKind::kLe) return a <= b;
  if constexpr (K == OpKind::kGt) return a > b;
  if constexpr (K == OpKind::kGe) return a >= b;
  if constexpr (K == OpKind::kLogicalAnd) return a != T(0) && b != T(0);
  if constexpr (K == OpKind::kLogicalOr) return a != T(0) || b != T(0);
  KILN_FAIL(kInternal, op_name(K), " is not a binary op on this type");
}

template <typename T>
inline T where_value(bool cond, T a, T b) { return cond ? a : b; }

// X(kind) for every op of a family; int-capable subsets for integer element types.
// clang-format off
#define KILN_PW_UNARY_OPS(X)                                                                          \
  X(kRelu) X(kGelu) X(kSilu) X(kSigmoid) X(kTanh) X(kExp) X(kLog) X(kSqrt) X(kRsqrt) X(kNeg) X(kAbs) \
  X(kErf) X(kHardswish) X(kHardsigmoid) X(kReciprocal) X(kSin) X(kCos) X(kLogicalNot) X(kClamp)     \
  X(kLeakyRelu) X(kSign) X(kFloor) X(kCeil) X(kRound) X(kTrunc)
// clang-format on
#define KILN_PW_UNARY_INT_OPS(X) X(kRelu) X(kNeg) X(kAbs) X(kClamp) X(kLogicalNot) X(kSign)
#define KILN_PW_ARITH_OPS(X) X(kAdd) X(kSub) X(kMul) X(kDiv) X(kMaximum) X(kMinimum)
#define KILN_PW_COMPARE_OPS(X) X(kEq) X(kNe) X(kLt) X(kLe) X(kGt) X(kGe) X(kLogicalAnd) X(kLogicalOr)

// Run-time forms. Comparisons and logical ops return 1 or 0 in T.
template <typename T>
T apply_unary(OpKind op, T x, const UnaryParams& p);
template <typename T>
T apply_binary(OpKind op, T a, T b);

// What cast produces from `v` (a value of any dtype held in a double) as dtype `to`.
double cast_value(double v, DType to);
// A double value of an integer dtype, wrapped to that dtype's range (v must be integral).
double wrap_integer(double v, DType to);

// ---- element types ------------------------------------------------------------------------
// Elem<D>: how a dtype is stored (S) and what it computes in (C): f16 / bf16 in float,
// integers and bool in int64_t (sums are exact), and the conversions between them.

template <DType D>
struct Elem;
template <>
struct Elem<DType::kF32> {
  using S = float;
  using C = float;
  static C load(S v) { return v; }
  static S store(C v) { return v; }
};
template <>
struct Elem<DType::kF64> {
  using S = double;
  using C = double;
  static C load(S v) { return v; }
  static S store(C v) { return v; }
};
template <>
struct Elem<DType::kF16> {
  using S = uint16_t;
  using C = float;
  static C load(S v) { return half_to_float(v); }
  static S store(C v) { return float_to_half(v); }
};
template <>
struct Elem<DType::kBF16> {
  using S = uint16_t;
  using C = float;
  static C load(S v) { return bf16_to_float(v); }
  static S store(C v) { return float_to_bf16(v); }
};
template <DType D, typename T>
struct IntElem {
  using S = T;
  using C = int64_t;
  static C load(S v) { return v; }
  static S store(C v) { return static_cast<S>(v); }  // wraps (C++20 conversions are modular)
};
template <>
struct Elem<DType::kI64> : IntElem<DType::kI64, int64_t> {};
template <>
struct Elem<DType::kI32> : IntElem<DType::kI32, int32_t> {};
template <>
struct Elem<DType::kI8> : IntElem<DType::kI8, int8_t> {};
template <>
struct Elem<DType::kU8> : IntElem<DType::kU8, uint8_t> {};
template <>
struct Elem<DType::kBool> {
  using S = uint8_t;
  using C = int64_t;
  static C load(S v) { return v != 0; }
  static S store(C v) { return v != 0; }
};

// Calls f(std::integral_constant<DType, dt>{}) with dt known at compile time.
template <typename F>
decltype(auto) visit_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::kF32: return f(std::integral_constant<DType, DType::kF32>{});
    case DType::kF16: return f(std::integral_constant<DType, DType::kF16>{});
    case DType::kBF16: return f(std::integral_constant<DType, DType::kBF16>{});
    case DType::kF64: return f(std::integral_constant<DType, DType::kF64>{});
    case DType::kI64: return f(std::integral_constant<DType, DType::kI64>{});
    case DType::kI32: return f(std::integral_constant<DType, DType::kI32>{});
    case DType::kI8: return f(std::integral_constant<DType, DType::kI8>{});
    case DType::kU8: return f(std::integral_constant<DType, DType::kU8>{});
    case DType::kBool: return f(std::integral_constant<DType, DType::kBool>{});
  }
  KILN_FAIL(kInternal, "unknown dtype code ", int(dt));
}

// ---- broadcasting -------------------------------------------------------------------------

// numpy broadcasting of two types' dims (symbols kept); names op and both types on mismatch.
std::vector<Dim> broadcast_dims(OpKind op, const TensorType& a, const TensorType& b);

// Iteration plan of a pointwise op writing a dense `out` shape from operands broadcast to it.
// Output dims of extent 1 are dropped and neighbours merged wherever every operand is
// contiguous across them, so a same-shape op is one dim and a bias add two.
struct BroadcastPlan {
  std::vector<int64_t> shape;                 // collapsed output dims (at least one)
  std::vector<std::vector<int64_t>> strides;  // per operand, element strides (0 = broadcast)
  int64_t numel = 0;
  int64_t inner() const { return shape.back(); }
  // 0 (broadcast) or 1: an operand's innermost dim is the output's innermost one, or absent.
  int64_t inner_stride(size_t operand) const { return strides[operand].back(); }

  // Calls fn(offsets, out_offset, len) for each run of output elements [begin, end) along the
  // innermost dim; offsets[k] is operand k's element offset at the run's start.
  template <typename F>
  void for_each_run(int64_t begin, int64_t end, F&& fn) const;
};
BroadcastPlan plan_broadcast(const std::vector<int64_t>& out, const std::vector<std::vector<int64_t>>& operands);
// The same with operands read through element strides per dim (`strides[k]`, one per dim of
// operands[k]: a strided view; empty: row-major).
BroadcastPlan plan_broadcast(const std::vector<int64_t>& out, const std::vector<std::vector<int64_t>>& operands,
                             const std::vector<std::vector<int64_t>>& strides);

template <typename F>
void BroadcastPlan::for_each_run(int64_t begin, int64_t end, F&& fn) const {
  if (begin >= end) return;
  const size_t rank = shape.size(), ops = strides.size();
  int64_t idx[16] = {}, off[16] = {};
  int64_t rest = begin;
  for (size_t d = rank; d-- > 0;) idx[d] = rest % shape[d], rest /= shape[d];
  for (size_t k = 0; k < ops; ++k)
    for (size_t d = 0; d < rank; ++d) off[k] += idx[d] * strides[k][d];
  int64_t pos = begin;
  while (pos < end) {
    const int64_t len = std::min(shape[rank - 1] - idx[rank - 1], end - pos);
    fn(static_cast<const int64_t*>(off), pos, len);
    pos += len;
    for (size_t k = 0; k < ops; ++k) off[k] += len * strides[k][rank - 1];
    idx[rank - 1] += len;
    for (size_t d = rank - 1; d > 0 && idx[d] == shape[d]; --d) {  // carry
      for (size_t k = 0; k < ops; ++k) off[k] += strides[k][d - 1] - shape[d] * strides[k][d];
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
}

// ---- array forms (CPU loops) --------------------------------------------------------------
// T is float, double or an integer storage type (int64_t, int32_t, int8_t, uint8_t; bool is
// uint8_t). Strides are in elements; 0 and 1 take vectorized paths.

template <typename T>
void unary_array(OpKind op, const UnaryParams& p, const T* x, T* y, int64_t n);
template <typename T>
void binary_array(OpKind op, const T* a, int64_t sa, const T* b, int64_t sb, T* y, int64_t n);
// Comparisons and logical ops, writing bool bytes.
template <typename T>
void compare_array(OpKind op, const T* a, int64_t sa, const T* b, int64_t sb, uint8_t* y, int64_t n);
// maximum / minimum folded over n contiguous values (T: float or double): NaN propagates as in
// the binary ops; -inf / +inf for n == 0.
template <typename T>
T max_array(const T* x, int64_t n);
template <typename T>
T min_array(const T* x, int64_t n);

// ---- gathered leaves of a fused_pointwise body ---------------------------------------------
// (fuse_pointwise.cpp: an index_select by a node input, read at the kernel's own positions.)

// Per body input: whether only index_select nodes read it (as data or index), so a kernel
// reads it through the gathers and never element by element.
std::vector<char> gather_only_inputs(const Graph& body);
// The position of value v among body's inputs (the fused node's input it stands for), or -1.
int input_position(const Graph& body, ValueId v);
// The shape the gathered leaf `gather` (an index_select of `body`) is read in: that of the
// reshape that alone reads it, if any, else its own.
std::vector<int64_t> gathered_shape(const Graph& body, const Node& gather);

// ---- a fused_pointwise body that ends in a concat --------------------------------------------
// (fuse_pointwise_concats, src/passes/pointwise_concats.cpp: each output element is computed by
// the part its column along `axis` falls in.)
struct ConcatBody {
  int64_t axis = 0;
  std::vector<ValueId> parts;        // the concat's inputs, body values
  std::vector<int64_t> start;        // first column of each part along axis, then the total
  std::vector<int> part_of;          // per body value: its part, -1 for a constant or none
  std::vector<std::vector<int64_t>> shape;  // per part: the output's shape, axis narrowed
};
// The parts of `body` when its one output is a concat's; nullopt otherwise. kUnsupported when a
// value other than a constant feeds two parts (fuse_pointwise_concats gives each its own).
std::optional<ConcatBody> concat_body(const Graph& body);

}  // namespace kiln::pw
