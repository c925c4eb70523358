// Helpers of the generated pointwise kernels (codegen/pointwise_source.cpp writes the rest:
// the per-program device function and the kernels that index the inputs and call it).
// Compiled by NVRTC after the prelude; expects no definitions.
template <typename T>
struct kiln_unsigned {
  typedef T type;
};
template <>
struct kiln_unsigned<long long> {
  typedef unsigned long long type;
};
template <>
struct kiln_unsigned<int> {
  typedef unsigned int type;
};
template <>
struct kiln_unsigned<signed char> {
  typedef unsigned char type;
};
// Integer arithmetic wraps (two's complement), through the unsigned type.
template <typename T>
__device__ __forceinline__ T kiln_iadd(T a, T b) {
  typedef typename kiln_unsigned<T>::type U;
  return (T)(U)((U)a + (U)b);
}
template <typename T>
__device__ __forceinline__ T kiln_isub(T a, T b) {
  typedef typename kiln_unsigned<T>::type U;
  return (T)(U)((U)a - (U)b);
}
template <typename T>
__device__ __forceinline__ T kiln_imul(T a, T b) {
  typedef typename kiln_unsigned<T>::type U;
  return (T)(U)((U)a * (U)b);
}
template <typename T>
__device__ __forceinline__ T kiln_ineg(T a) {
  typedef typename kiln_unsigned<T>::type U;
  return (T)(U)((U)0 - (U)a);
}
template <typename T>
__device__ __forceinline__ T kiln_iabs(T a) {
  return a < (T)0 ? kiln_ineg(a) : a;
}
template <>
__device__ __forceinline__ unsigned char kiln_iabs(unsigned char a) {
  return a;
}
// Truncating division; x / 0 == 0 and MIN / -1 wraps, as the CPU kernels.
template <typename T>
__device__ __forceinline__ T kiln_idiv(T a, T b) {
  if (b == (T)0) return (T)0;
  if ((T)-1 < (T)0 && b == (T)-1) return kiln_ineg(a);
  return (T)(a / b);
}
// float -> integer: toward zero, saturating at the i64 range, NaN -> 0 (then wrapped by a cast).
__device__ __forceinline__ long long kiln_f2i(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775807.0) return 9223372036854775807LL;
  if (v <= -9223372036854775808.0) return -9223372036854775807LL - 1;
  return (long long)v;
}
// V elements of T moved as one load / store of sizeof(T) * V bytes (1 to 16).
template <typename T, int V>
struct alignas(sizeof(T) * V) kiln_vec {
  T v[V];
};
template <int B>
struct kiln_raw;
template <>
struct kiln_raw<1> {
  typedef unsigned char type;
};
template <>
struct kiln_raw<2> {
  typedef unsigned short type;
};
template <>
struct kiln_raw<4> {
  typedef unsigned int type;
};
template <>
struct kiln_raw<8> {
  typedef uint2 type;
};
template <>
struct kiln_raw<16> {
  typedef uint4 type;
};
template <typename T, int V, typename I>
__device__ __forceinline__ kiln_vec<T, V> kiln_vload(const T* p, I j) {
  typedef typename kiln_raw<sizeof(T) * V>::type R;
  const R raw = reinterpret_cast<const R*>(p)[j];
  kiln_vec<T, V> out;
  memcpy(&out, &raw, sizeof(R));
  return out;
}
template <typename T, int V, typename I>
__device__ __forceinline__ void kiln_vstore(T* p, I j, const kiln_vec<T, V>& x) {
  typedef typename kiln_raw<sizeof(T) * V>::type R;
  R raw;
  memcpy(&raw, &x, sizeof(R));
  reinterpret_cast<R*>(p)[j] = raw;
}
// A size read from the argument block and divided by: its value and, for 32-bit dividends below
// 2^31, a multiplier (low word of `magic`) and shift (high word) that make the quotient a
// multiply-high, an add and a shift, as a literal divisor compiles to (pwgen::divisor_fields).
struct kiln_divisor {
  long long d;
  long long magic;
};
__device__ __forceinline__ unsigned int kiln_div(unsigned int x, kiln_divisor v) {
  return (__umulhi(x, (unsigned int)v.magic) + x) >> (unsigned int)(v.magic >> 32);
}
__device__ __forceinline__ long long kiln_div(long long x, kiln_divisor v) { return x / v.d; }
// The data offset of element e of a gathered leaf's [outer, count, inner] result:
// (outer * dim + index[(e / inner) % count]) * inner + e % inner, a negative index counted from dim.
template <typename T, typename X>
__device__ __forceinline__ long long kiln_gather(T e, const X* __restrict__ index, kiln_divisor count,
                                                 kiln_divisor inner, long long dim) {
  const T block = kiln_div(e, inner);
  const T outer = kiln_div(block, count);
  long long v = (long long)index[block - outer * (T)count.d];
  if (v < 0) v += dim;
  return ((long long)outer * dim + v) * inner.d + (long long)(e - block * (T)inner.d);
}
