// The prelude every generated CUDA source starts with (codegen/prelude.h): the 16-bit storage
// types and their conversions, and the activation and reduction helpers generated code calls.
// ---- Kiln prelude -------------------------------------------------------------------------
struct __align__(2) kiln_half {
  unsigned short bits;
};
struct __align__(2) kiln_bf16 {
  unsigned short bits;
};

__device__ __forceinline__ float to_float(kiln_half h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}
__device__ __forceinline__ float to_float(kiln_bf16 h) { return __uint_as_float(((unsigned)h.bits) << 16); }
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(double v) { return (float)v; }
__device__ __forceinline__ float to_float(long long v) { return (float)v; }
__device__ __forceinline__ float to_float(int v) { return (float)v; }
__device__ __forceinline__ float to_float(signed char v) { return (float)v; }
__device__ __forceinline__ float to_float(unsigned char v) { return (float)v; }
__device__ __forceinline__ float to_float(bool v) { return v ? 1.0f : 0.0f; }

// to_double: exact for every storage type but i64 beyond 2^53 (as on the CPU).
__device__ __forceinline__ double to_double(kiln_half h) { return (double)to_float(h); }
__device__ __forceinline__ double to_double(kiln_bf16 h) { return (double)to_float(h); }
__device__ __forceinline__ double to_double(float v) { return (double)v; }
__device__ __forceinline__ double to_double(double v) { return v; }
__device__ __forceinline__ double to_double(long long v) { return (double)v; }
__device__ __forceinline__ double to_double(int v) { return (double)v; }
__device__ __forceinline__ double to_double(signed char v) { return (double)v; }
__device__ __forceinline__ double to_double(unsigned char v) { return (double)v; }
__device__ __forceinline__ double to_double(bool v) { return v ? 1.0 : 0.0; }

template <typename T>
__device__ __forceinline__ T from_float(float f);
template <>
__device__ __forceinline__ kiln_half from_float<kiln_half>(float f) {
  kiln_half h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
template <>
__device__ __forceinline__ kiln_bf16 from_float<kiln_bf16>(float f) {
  kiln_bf16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
template <>
__device__ __forceinline__ float from_float<float>(float f) {
  return f;
}
template <>
__device__ __forceinline__ double from_float<double>(float f) {
  return (double)f;
}

// from_double: f64 -> f16/bf16 goes through f32, as the CPU's Elem<>::store does.
template <typename T>
__device__ __forceinline__ T from_double(double d);
template <>
__device__ __forceinline__ kiln_half from_double<kiln_half>(double d) {
  return from_float<kiln_half>((float)d);
}
template <>
__device__ __forceinline__ kiln_bf16 from_double<kiln_bf16>(double d) {
  return from_float<kiln_bf16>((float)d);
}
template <>
__device__ __forceinline__ float from_double<float>(double d) {
  return (float)d;
}
template <>
__device__ __forceinline__ double from_double<double>(double d) {
  return d;
}

// Raw 16-bit views, for vectorized loads and stores through uint4.
__device__ __forceinline__ unsigned short kiln_bits(kiln_half h) { return h.bits; }
__device__ __forceinline__ unsigned short kiln_bits(kiln_bf16 h) { return h.bits; }

template <typename T>
__device__ __forceinline__ bool kiln_isnan(T v) {
  return v != v;
}

// ---- activations (src/ops/pointwise.h) ----------------------------------------------------
__device__ __forceinline__ float kiln_relu(float x) { return x < 0.0f ? 0.0f : x; }
__device__ __forceinline__ double kiln_relu(double x) { return x < 0.0 ? 0.0 : x; }
__device__ __forceinline__ float kiln_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f)); }
__device__ __forceinline__ double kiln_gelu(double x) { return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440)); }
__device__ __forceinline__ float kiln_gelu_tanh(float x) {
  const float u = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ double kiln_gelu_tanh(double x) {
  const double u = 0.79788456080286535588 * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + tanh(u));
}
__device__ __forceinline__ float kiln_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ double kiln_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
__device__ __forceinline__ float kiln_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ double kiln_silu(double x) { return x / (1.0 + exp(-x)); }
__device__ __forceinline__ float kiln_hardsigmoid(float x) {
  float r = x + 3.0f;
  r = r < 0.0f ? 0.0f : r;
  r = r > 6.0f ? 6.0f : r;  // NaN stays NaN
  return r / 6.0f;
}
__device__ __forceinline__ double kiln_hardsigmoid(double x) {
  double r = x + 3.0;
  r = r < 0.0 ? 0.0 : r;
  r = r > 6.0 ? 6.0 : r;
  return r / 6.0;
}
__device__ __forceinline__ float kiln_hardswish(float x) {
  float r = x + 3.0f;
  r = r < 0.0f ? 0.0f : r;
  r = r > 6.0f ? 6.0f : r;
  return x * r / 6.0f;
}
__device__ __forceinline__ double kiln_hardswish(double x) {
  double r = x + 3.0;
  r = r < 0.0 ? 0.0 : r;
  r = r > 6.0 ? 6.0 : r;
  return x * r / 6.0;
}
__device__ __forceinline__ float kiln_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double kiln_tanh(double x) { return tanh(x); }
// clamp(x, 0, hi) as the CPU's clamp: hi rounded to x's type, NaN stays NaN.
template <typename F>
__device__ __forceinline__ F kiln_clipped_relu(F x, double hi) {
  const F t = x < F(0) ? F(0) : x;
  return t > F(hi) ? F(hi) : t;
}
__device__ __forceinline__ float kiln_leaky_relu(float x, float slope) { return x < 0.0f ? x * slope : x; }
__device__ __forceinline__ double kiln_leaky_relu(double x, double slope) { return x < 0.0 ? x * slope : x; }
// NaN-propagating maximum / minimum (NaN in a wins; then a > b ? a : b, as the CPU).
template <typename T>
__device__ __forceinline__ T kiln_max(T a, T b) {
  return (a != a || a > b) ? a : b;
}
template <typename T>
__device__ __forceinline__ T kiln_min(T a, T b) {
  return (a != a || a < b) ? a : b;
}

// ---- warp reductions (float) --------------------------------------------------------------
__device__ __forceinline__ float kiln_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float kiln_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// ---- end of prelude -----------------------------------------------------------------------
