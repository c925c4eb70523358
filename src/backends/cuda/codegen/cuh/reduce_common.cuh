// What the reduce kernels (kernels/reduce.cpp) share: the by-value struct of kept and reduced
// dims (extents and element strides outside the innermost run), the accumulator A with its
// identity, combine, load and store, warp and block reductions of A, and index -> offset.
//
// Expects T_x, ld_x and st_x, and KG_COMPUTE (x's compute type), KG_FLOATING (x is floating),
// KG_COMBINE (0: a + b, 1: max, 2: min; NaN propagates), KG_INT_SUM (an integer sum: it
// accumulates in unsigned long long, wrapping like the CPU, and stores through long long), and
// KG_KEPT_DIMS and KG_RED_DIMS (the dims of Side in use, up to 4 each), and KG_SQUARE (each
// element squared in A as it is loaded: a sum or mean of squares).
struct Side {
  long long kext[4];
  long long kst[4];
  long long rext[4];
  long long rst[4];
};
#if KG_INT_SUM
typedef unsigned long long A;
#define KG_STORE(r) st_x((long long)r)
#else
typedef KG_COMPUTE A;
#define KG_STORE(r) st_x(r)
#endif
#if KG_COMBINE == 1 && KG_FLOATING
#define KG_IDENTITY -(A)KG_INF
#elif KG_COMBINE == 1
#define KG_IDENTITY (A)(-9223372036854775807LL - 1)
#elif KG_COMBINE == 2 && KG_FLOATING
#define KG_IDENTITY (A) KG_INF
#elif KG_COMBINE == 2
#define KG_IDENTITY (A)9223372036854775807LL
#else
#define KG_IDENTITY (A)0
#endif
__device__ __forceinline__ A kg_comb(A a, A b) {
#if KG_COMBINE == 1
  return kg_max(a, b);
#elif KG_COMBINE == 2
  return kg_min(a, b);
#else
  return a + b;
#endif
}
__device__ __forceinline__ A kg_ld(T_x v) {
#if KG_INT_SUM
  return (unsigned long long)ld_x(v);
#elif KG_SQUARE
  const A a = ld_x(v);
  return a * a;
#else
  return ld_x(v);
#endif
}
__device__ __forceinline__ A kg_wred(A v) {
  for (int o = 16; o > 0; o >>= 1) v = kg_comb(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// The combination over an aligned group of G lanes (a power of two up to 32), in every lane of it;
// the whole warp calls it.
template <int G>
__device__ __forceinline__ A kg_gred(A v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v = kg_comb(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ A kg_bred(A v, A* sm) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = kg_wred(v);
  if (nw == 1) return v;
  if (lane == 0) sm[wid] = v;
  __syncthreads();
  v = lane < nw ? sm[lane] : KG_IDENTITY;
  v = kg_wred(v);
  __syncthreads();
  return v;
}
// var += the element offset of index q_ over the kept (kg_kept_offset) or reduced
// (kg_red_offset) dims of g outside the innermost run, the last dim fastest.
__device__ __forceinline__ void kg_kept_offset(long long& var, long long q_, const Side& g) {
#if KG_KEPT_DIMS > 3
  var += (q_ % g.kext[3]) * g.kst[3];
  q_ /= g.kext[3];
#endif
#if KG_KEPT_DIMS > 2
  var += (q_ % g.kext[2]) * g.kst[2];
  q_ /= g.kext[2];
#endif
#if KG_KEPT_DIMS > 1
  var += (q_ % g.kext[1]) * g.kst[1];
  q_ /= g.kext[1];
#endif
#if KG_KEPT_DIMS > 0
  var += q_ * g.kst[0];
#endif
}
__device__ __forceinline__ void kg_red_offset(long long& var, long long q_, const Side& g) {
#if KG_RED_DIMS > 3
  var += (q_ % g.rext[3]) * g.rst[3];
  q_ /= g.rext[3];
#endif
#if KG_RED_DIMS > 2
  var += (q_ % g.rext[2]) * g.rst[2];
  q_ /= g.rext[2];
#endif
#if KG_RED_DIMS > 1
  var += (q_ % g.rext[1]) * g.rst[1];
  q_ /= g.rext[1];
#endif
#if KG_RED_DIMS > 0
  var += q_ * g.rst[0];
#endif
}
