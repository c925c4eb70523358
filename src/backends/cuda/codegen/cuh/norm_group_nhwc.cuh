// Group norm of channels-last x [N, S, C], C = KG_G groups of KG_CG channels (kernels/norm.cpp),
// in two launches over blocks of (sample n, chunk of `chunk` positions):
//   kg_gn_nhwc_stats_v<KG_V>: per group, the chunk's mean and sum of squared deviations from it
//       (two passes over the chunk, in A) into ws[2 * ((n * splits + chunk) * KG_G + group) + 0/1];
//   kg_gn_nhwc_apply_v<KG_V>: combines the sample's chunks per group in double (as norm_split.cuh),
//       rstd = 1 / sqrt(var + eps), then writes its chunk: (x - mean) * (rstd * weight) + bias.
// Thread t reads the word of KG_V channels at column t % KG_Q (KG_Q = C / KG_V words a position)
// of positions t / KG_Q, + KG_R, ...: a warp reads runs of whole rows, and each thread's words
// lie in one group (KG_V divides KG_CG), whose weights it loads once. Both kernels take the same
// buffers, so that they pass or fail the same alignment check (the fallback: norm_group.cuh's
// kernel, then kg_gn_nhwc_none).
//
// Expects T_x, ld_x, st_x, A (the compute type), T_p0 / ld_p0 (weight), T_p1 / ld_p1 (bias),
// and KG_HAS_W, KG_HAS_B, KG_V (1, 2, 4 or 8), KG_VW, KG_CG, KG_G, KG_Q and KG_R (the block is
// KG_Q * KG_R threads; KG_G <= KG_Q * KG_R); undefines them at the end.
#define KG_GN_T (KG_Q * KG_R)
#define KG_GN_WORDS (KG_CG / KG_V)  // a group's words at one position

// The sum over the block of each group's values in red[] (by thread), for threads t < KG_G.
__device__ __forceinline__ A kg_gn_group_sum(const A* red) {
  A t = 0;
  for (int r = 0; r < KG_R; ++r)
#pragma unroll
    for (int c = 0; c < KG_GN_WORDS; ++c) t += red[r * KG_Q + threadIdx.x * KG_GN_WORDS + c];
  return t;
}

#if KG_V == 1
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_stats_v1(
#elif KG_V == 2
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_stats_v2(
#elif KG_V == 4
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_stats_v4(
#elif KG_V == 8
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_stats_v8(
#else
#error "KG_V must be 1, 2, 4 or 8"
#endif
    const T_x* __restrict__ x, const T_p0* __restrict__ w, const T_p1* __restrict__ b, A* __restrict__ ws,
    T_x* __restrict__ y, long long N, long long S, long long splits, long long chunk, double eps) {
  __shared__ A red[KG_GN_T];
  __shared__ A mean_g[KG_G];
  const int q = threadIdx.x % KG_Q, r0 = threadIdx.x / KG_Q;
  const int g = q * KG_V / KG_CG;
  for (long long item = blockIdx.x; item < N * splits; item += gridDim.x) {
    const long long n = item / splits, lo = (item % splits) * chunk;
    const long long hi = lo + chunk < S ? lo + chunk : S;
    const T_x* xs = x + n * S * (KG_Q * KG_V) + q * KG_V;
    A s = 0;
    for (long long p = lo + r0; p < hi; p += KG_R) {
      const KG_VW u = *reinterpret_cast<const KG_VW*>(xs + p * (KG_Q * KG_V));
      const T_x* e = reinterpret_cast<const T_x*>(&u);
#pragma unroll
      for (int j = 0; j < KG_V; ++j) s += ld_x(e[j]);
    }
    red[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x < KG_G) mean_g[threadIdx.x] = (A)((double)kg_gn_group_sum(red) / (double)((hi - lo) * KG_CG));
    __syncthreads();
    const A mean = mean_g[g];
    A m2 = 0;
    for (long long p = lo + r0; p < hi; p += KG_R) {
      const KG_VW u = *reinterpret_cast<const KG_VW*>(xs + p * (KG_Q * KG_V));
      const T_x* e = reinterpret_cast<const T_x*>(&u);
#pragma unroll
      for (int j = 0; j < KG_V; ++j) {
        const A d = ld_x(e[j]) - mean;
        m2 += d * d;
      }
    }
    red[threadIdx.x] = m2;
    __syncthreads();
    if (threadIdx.x < KG_G) {
      ws[2 * (item * KG_G + threadIdx.x)] = mean_g[threadIdx.x];
      ws[2 * (item * KG_G + threadIdx.x) + 1] = kg_gn_group_sum(red);
    }
    __syncthreads();
  }
  (void)w, (void)b, (void)y, (void)eps;
}

#if KG_V == 1
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_apply_v1(
#elif KG_V == 2
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_apply_v2(
#elif KG_V == 4
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_apply_v4(
#else
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_apply_v8(
#endif
    const T_x* __restrict__ x, const T_p0* __restrict__ w, const T_p1* __restrict__ b, A* __restrict__ ws,
    T_x* __restrict__ y, long long N, long long S, long long splits, long long chunk, double eps) {
  __shared__ A mean_g[KG_G];
  __shared__ A rstd_g[KG_G];
  const int q = threadIdx.x % KG_Q, r0 = threadIdx.x / KG_Q;
  const int g = q * KG_V / KG_CG;
  for (long long item = blockIdx.x; item < N * splits; item += gridDim.x) {
    const long long n = item / splits, lo = (item % splits) * chunk;
    const long long hi = lo + chunk < S ? lo + chunk : S;
    if (threadIdx.x < KG_G) {
      const A* st = ws + 2 * (n * splits * KG_G + threadIdx.x);
      const double count = (double)S * KG_CG;
      double t = 0;
      for (long long k = 0; k < splits; ++k) {
        const long long nk = S - k * chunk < chunk ? S - k * chunk : chunk;
        t += (double)(nk * KG_CG) * (double)st[2 * k * KG_G];
      }
      const double mean = t / count;
      t = 0;
      for (long long k = 0; k < splits; ++k) {
        const long long nk = S - k * chunk < chunk ? S - k * chunk : chunk;
        const double d = (double)st[2 * k * KG_G] - mean;
        t += (double)st[2 * k * KG_G + 1] + (double)(nk * KG_CG) * d * d;
      }
      mean_g[threadIdx.x] = (A)mean;
      rstd_g[threadIdx.x] = (A)(1.0 / sqrt(t / count + eps));
    }
    __syncthreads();
    const A mean = mean_g[g], rstd = rstd_g[g];
    A sc[KG_V], sh[KG_V];
#pragma unroll
    for (int j = 0; j < KG_V; ++j) {
#if KG_HAS_W
      sc[j] = rstd * (A)ld_p0(w[q * KG_V + j]);
#else
      sc[j] = rstd * (A)1;
#endif
#if KG_HAS_B
      sh[j] = (A)ld_p1(b[q * KG_V + j]);
#else
      sh[j] = (A)0;
#endif
    }
    const long long at = n * S * (KG_Q * KG_V) + q * KG_V;
    for (long long p = lo + r0; p < hi; p += KG_R) {
      const KG_VW u = *reinterpret_cast<const KG_VW*>(x + at + p * (KG_Q * KG_V));
      const T_x* e = reinterpret_cast<const T_x*>(&u);
      KG_VW o;
      T_x* f = reinterpret_cast<T_x*>(&o);
#pragma unroll
      for (int j = 0; j < KG_V; ++j) f[j] = st_x((ld_x(e[j]) - mean) * sc[j] + sh[j]);
      *reinterpret_cast<KG_VW*>(y + at + p * (KG_Q * KG_V)) = o;
    }
    __syncthreads();
  }
}

// The second launch's fallback where the first one's (norm_group.cuh's kernel) did all the work.
extern "C" __global__ void kg_gn_nhwc_none() {}
#undef KG_GN_T
#undef KG_GN_WORDS
#undef KG_CG
#undef KG_G
#undef KG_Q
#undef KG_R
#undef KG_HAS_W
#undef KG_HAS_B
#undef KG_V
#undef KG_VW
