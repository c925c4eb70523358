// Reduction whose innermost run is kept, KG_V columns at a time (kernels/reduce.cpp; every run
// starts on a 16-byte word): each thread loads KG_V consecutive outputs' elements of a row as
// one 16-byte word. A block (blockDim.x threads, a power of two from 32 to 256, splitting the
// reduction) makes one group of KG_V outputs, so a reduction over few columns (a global average
// pool at batch 1: [1, 784, 72] is 9 groups) still spreads over several blocks, and each
// thread has up to four words in flight at once: the whole reduction is about one load latency.
// Warp shuffles, then shared memory across the warps, combine the threads. KG_MODE: 0 the
// combination, 1 the mean, 2 the variance (two passes). The kernel is kg_reduce_cols_v<KG_V>.
//
// Expects reduce_common.cuh, KG_MODE and KG_V (2, 4, 8 or 16).
#if KG_V == 2
extern "C" __global__ void kg_reduce_cols_v2(const T_x* __restrict__ x, T_x* __restrict__ y, Side g, long long rows,
                                             long long inner, long long count, double correction) {
#elif KG_V == 4
extern "C" __global__ void kg_reduce_cols_v4(const T_x* __restrict__ x, T_x* __restrict__ y, Side g, long long rows,
                                             long long inner, long long count, double correction) {
#elif KG_V == 8
extern "C" __global__ void kg_reduce_cols_v8(const T_x* __restrict__ x, T_x* __restrict__ y, Side g, long long rows,
                                             long long inner, long long count, double correction) {
#elif KG_V == 16
extern "C" __global__ void kg_reduce_cols_v16(const T_x* __restrict__ x, T_x* __restrict__ y, Side g, long long rows,
                                              long long inner, long long count, double correction) {
#else
#error "KG_V must be 2, 4, 8 or 16"
#endif
  __shared__ A sm[8][KG_V];
  __shared__ A res[KG_V];
  const int t = threadIdx.x, ways = blockDim.x, lane = t & 31, wid = t >> 5, nw = ways >> 5;
  const long long groups = inner / KG_V;
  for (long long b = blockIdx.x; b < rows * groups; b += gridDim.x) {
    const long long row = b / groups, j = (b % groups) * KG_V;
    long long base = j;
    kg_kept_offset(base, row, g);
    {
      A acc[KG_V];
#pragma unroll
      for (int c = 0; c < KG_V; ++c) acc[c] = KG_IDENTITY;
      for (long long r = t; r < count; r += 4 * ways) {
        uint4 u[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (r + k * ways < count) {
            long long off = base;
            kg_red_offset(off, r + k * ways, g);
            u[k] = *reinterpret_cast<const uint4*>(x + off);
          }
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (r + k * ways < count) {
            const T_x* e = reinterpret_cast<const T_x*>(&u[k]);
#pragma unroll
            for (int c = 0; c < KG_V; ++c) {
              const A v = kg_ld(e[c]);
              acc[c] = kg_comb(acc[c], v);
            }
          }
        }
      }
      // res[c] = the combination of every thread's acc[c].
#pragma unroll
      for (int c = 0; c < KG_V; ++c) {
        const A w = kg_wred(acc[c]);
        if (lane == 0) sm[wid][c] = w;
      }
      __syncthreads();
      if (t < KG_V) {
        A w = sm[0][t];
        for (int i = 1; i < nw; ++i) w = kg_comb(w, sm[i][t]);
        res[t] = w;
      }
      __syncthreads();
    }
#if KG_MODE == 2
    A mean[KG_V];
#pragma unroll
    for (int c = 0; c < KG_V; ++c) mean[c] = res[c] / (A)count;
    __syncthreads();
    {
      A acc[KG_V];
#pragma unroll
      for (int c = 0; c < KG_V; ++c) acc[c] = (A)0;
      for (long long r = t; r < count; r += 4 * ways) {
        uint4 u[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (r + k * ways < count) {
            long long off = base;
            kg_red_offset(off, r + k * ways, g);
            u[k] = *reinterpret_cast<const uint4*>(x + off);
          }
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (r + k * ways < count) {
            const T_x* e = reinterpret_cast<const T_x*>(&u[k]);
#pragma unroll
            for (int c = 0; c < KG_V; ++c) {
              const A v = kg_ld(e[c]);
              acc[c] += (v - mean[c]) * (v - mean[c]);
            }
          }
        }
      }
#pragma unroll
      for (int c = 0; c < KG_V; ++c) {
        const A w = kg_wred(acc[c]);
        if (lane == 0) sm[wid][c] = w;
      }
      __syncthreads();
      if (t < KG_V) {
        A w = sm[0][t];
        for (int i = 1; i < nw; ++i) w = kg_comb(w, sm[i][t]);
        res[t] = w;
      }
      __syncthreads();
    }
    const A r = t < KG_V ? (A)((double)res[t] / ((double)count - correction)) : (A)0;
#elif KG_MODE == 1
    const A r = t < KG_V ? res[t] / (A)count : (A)0;
#else
    const A r = t < KG_V ? res[t] : (A)0;
#endif
    if (t < KG_V) y[row * inner + j + t] = KG_STORE(r);
    __syncthreads();
  }
}
#undef KG_V
