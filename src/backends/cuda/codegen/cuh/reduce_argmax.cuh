// argmax over one axis (kernels/reduce.cpp), x viewed as [outer, R, inner]: the first index of
// the largest value, a NaN counting as largest. kg_argmax_rows: a warp per row (inner == 1),
// shuffles combine the lanes; kg_argmax_cols: a thread per column.
// Expects T_x and ld_x, and KG_COMPUTE (x's compute type) and KG_FLOATING (x is floating).
typedef KG_COMPUTE A;
#if KG_FLOATING
#define KG_LOWEST (-(A)KG_INF)
#else
#define KG_LOWEST ((A)(-9223372036854775807LL - 1))
#endif
// b beats a: larger, or NaN over a number, or equal (both NaN) with a smaller index.
__device__ __forceinline__ bool kg_better(A bv, long long bi, A av, long long ai) {
  const bool bn = bv != bv, an = av != av;
  if (bn != an) return bn;
  if (!bn && bv != av) return bv > av;
  return bi < ai;
}
extern "C" __global__ void kg_argmax_rows(const T_x* __restrict__ x, long long* __restrict__ y, long long outer,
                                          long long R) {
  const long long w0 = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5,
                  nw = ((long long)gridDim.x * blockDim.x) >> 5;
  const int lane = threadIdx.x & 31;
  for (long long o = w0; o < outer; o += nw) {
    const T_x* p = x + o * R;
    A bv = KG_LOWEST;
    long long bi = 9223372036854775807LL;
    for (long long r = lane; r < R; r += 32) {
      const A v = ld_x(p[r]);
      if (kg_better(v, r, bv, bi)) bv = v, bi = r;
    }
    for (int off = 16; off > 0; off >>= 1) {
      const A ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const long long oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (kg_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (lane == 0) y[o] = bi;
  }
}
extern "C" __global__ void kg_argmax_cols(const T_x* __restrict__ x, long long* __restrict__ y, long long outer,
                                          long long R, long long inner) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < outer * inner;
       i += (long long)gridDim.x * blockDim.x) {
    const long long o = i / inner, j = i % inner;
    const T_x* p = x + o * R * inner + j;
    A bv = ld_x(p[0]);
    long long bi = 0;
    for (long long r = 1; r < R; ++r) {
      const A v = ld_x(p[r * inner]);
      if (kg_better(v, r, bv, bi)) bv = v, bi = r;
    }
    y[i] = bi;
  }
}
