// Group norm of channels-last x [N, S, C], C = KG_G groups of KG_CG channels (kernels/norm.cpp).
// Thread t reads the word of KG_V channels at column t % KG_Q (KG_Q = C / KG_V words a position)
// of positions t / KG_Q, + KG_R, ...: a warp reads runs of whole rows, and each thread's words
// lie in one group (KG_V divides KG_CG), whose weights it loads once.
//   kg_gn_nhwc_v<KG_V>: a block per sample: per group the mean, then the squared deviations
//       from it (two passes, in A), then the write (a third pass over what the block just read);
//   kg_gn_nhwc_stats_v<KG_V> / kg_gn_nhwc_apply_v<KG_V>: blocks of (sample n, chunk of `chunk`
//       positions); the first writes per group the chunk's mean and squared deviations to
//       ws[2 * ((n * splits + chunk) * KG_G + group) + 0/1], the second combines the sample's
//       chunks per group in double (as norm_split.cuh, the block's threads sharing the chunks)
//       and writes its chunk.
// The write is (x - mean) * (rstd * weight) + bias, rstd = 1 / sqrt(var + eps) in double. The
// two split kernels take the same buffers, so that they pass or fail the same alignment check
// (the fallback: norm_group.cuh's kernel, then kg_gn_nhwc_none).
//
// Expects T_x, ld_x, st_x, A (the compute type), KG_ACT (the fused activation of an A value),
// T_p0 / ld_p0 (weight), T_p1 / ld_p1 (bias),
// and KG_HAS_W, KG_HAS_B, KG_V (1, 2, 4 or 8), KG_VW, KG_CG, KG_G, KG_Q and KG_R (the block is
// KG_Q * KG_R threads; KG_G <= KG_Q * KG_R); undefines them at the end.
#define KG_GN_T (KG_Q * KG_R)
#define KG_GN_WORDS (KG_CG / KG_V)  // a group's words at one position
#define KG_GN_ROW (KG_Q * KG_V)     // elements a position

// For threads t < KG_G: the sum of group t's values in red[] (one a thread).
__device__ __forceinline__ A kg_gn_group_sum(const A* red) {
  A t = 0;
  for (int r = 0; r < KG_R; ++r)
#pragma unroll
    for (int c = 0; c < KG_GN_WORDS; ++c) t += red[r * KG_Q + threadIdx.x * KG_GN_WORDS + c];
  return t;
}

// Positions [lo, hi) of the sample at xs (offset to this thread's column): each group's mean
// into mean_g; returns, for threads t < KG_G, group t's sum of squared deviations from it.
__device__ __forceinline__ A kg_gn_chunk_stats(const T_x* xs, long long lo, long long hi, A* red, A* mean_g) {
  const int r0 = threadIdx.x / KG_Q;
  A s = 0;
  for (long long p = lo + r0; p < hi; p += KG_R) {
    const KG_VW u = *reinterpret_cast<const KG_VW*>(xs + p * KG_GN_ROW);
    const T_x* e = reinterpret_cast<const T_x*>(&u);
#pragma unroll
    for (int j = 0; j < KG_V; ++j) s += ld_x(e[j]);
  }
  red[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x < KG_G) mean_g[threadIdx.x] = (A)((double)kg_gn_group_sum(red) / (double)((hi - lo) * KG_CG));
  __syncthreads();
  const A mean = mean_g[(threadIdx.x % KG_Q) * KG_V / KG_CG];
  A m2 = 0;
  for (long long p = lo + r0; p < hi; p += KG_R) {
    const KG_VW u = *reinterpret_cast<const KG_VW*>(xs + p * KG_GN_ROW);
    const T_x* e = reinterpret_cast<const T_x*>(&u);
#pragma unroll
    for (int j = 0; j < KG_V; ++j) {
      const A d = ld_x(e[j]) - mean;
      m2 += d * d;
    }
  }
  red[threadIdx.x] = m2;
  __syncthreads();
  return threadIdx.x < KG_G ? kg_gn_group_sum(red) : (A)0;
}

// Writes positions [lo, hi) of the sample at xs / ys (offset to this thread's column) with its
// group's mean and rstd.
__device__ __forceinline__ void kg_gn_write(const T_x* xs, const T_p0* w, const T_p1* b, T_x* ys, long long lo,
                                            long long hi, A mean, A rstd) {
  const int q = threadIdx.x % KG_Q;
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
  for (long long p = lo + threadIdx.x / KG_Q; p < hi; p += KG_R) {
    const KG_VW u = *reinterpret_cast<const KG_VW*>(xs + p * KG_GN_ROW);
    const T_x* e = reinterpret_cast<const T_x*>(&u);
    KG_VW o;
    T_x* f = reinterpret_cast<T_x*>(&o);
#pragma unroll
    for (int j = 0; j < KG_V; ++j) f[j] = st_x(KG_ACT((ld_x(e[j]) - mean) * sc[j] + sh[j]));
    *reinterpret_cast<KG_VW*>(ys + p * KG_GN_ROW) = o;
  }
}

#if KG_V == 1
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_v1(
#elif KG_V == 2
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_v2(
#elif KG_V == 4
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_v4(
#elif KG_V == 8
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_v8(
#else
#error "KG_V must be 1, 2, 4 or 8"
#endif
    const T_x* __restrict__ x, const T_p0* __restrict__ w, const T_p1* __restrict__ b, T_x* __restrict__ y, long long N,
    long long S, double eps) {
  __shared__ A red[KG_GN_T];
  __shared__ A mean_g[KG_G];
  __shared__ A rstd_g[KG_G];
  const int col = (threadIdx.x % KG_Q) * KG_V;
  for (long long n = blockIdx.x; n < N; n += gridDim.x) {
    const long long at = n * S * KG_GN_ROW + col;
    const A m2 = kg_gn_chunk_stats(x + at, 0, S, red, mean_g);
    if (threadIdx.x < KG_G) rstd_g[threadIdx.x] = (A)(1.0 / sqrt((double)m2 / ((double)S * KG_CG) + eps));
    __syncthreads();
    const int g = col / KG_CG;
    kg_gn_write(x + at, w, b, y + at, 0, S, mean_g[g], rstd_g[g]);
    __syncthreads();
  }
}

#if KG_V == 1
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_stats_v1(
#elif KG_V == 2
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_stats_v2(
#elif KG_V == 4
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_stats_v4(
#else
extern "C" __global__ __launch_bounds__(KG_GN_T) void kg_gn_nhwc_stats_v8(
#endif
    const T_x* __restrict__ x, const T_p0* __restrict__ w, const T_p1* __restrict__ b, A* __restrict__ ws,
    T_x* __restrict__ y, long long N, long long S, long long splits, long long chunk, double eps) {
  __shared__ A red[KG_GN_T];
  __shared__ A mean_g[KG_G];
  const int col = (threadIdx.x % KG_Q) * KG_V;
  for (long long item = blockIdx.x; item < N * splits; item += gridDim.x) {
    const long long n = item / splits, lo = (item % splits) * chunk;
    const long long hi = lo + chunk < S ? lo + chunk : S;
    const A m2 = kg_gn_chunk_stats(x + n * S * KG_GN_ROW + col, lo, hi, red, mean_g);
    if (threadIdx.x < KG_G) {
      ws[2 * (item * KG_G + threadIdx.x)] = mean_g[threadIdx.x];
      ws[2 * (item * KG_G + threadIdx.x) + 1] = m2;
    }
    __syncthreads();
  }
  (void)w, (void)b, (void)y, (void)eps;
}

// For threads t < KG_G: the sum of group t's values in red[] (by thread, group t % KG_G).
__device__ __forceinline__ double kg_gn_chunks_sum(double v, double* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  double t = 0;
  if (threadIdx.x < KG_G)
    for (int i = threadIdx.x; i < KG_GN_T; i += KG_G) t += red[i];
  __syncthreads();
  return t;
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
  __shared__ double red[KG_GN_T];
  __shared__ double mean_d[KG_G];
  __shared__ A mean_g[KG_G];
  __shared__ A rstd_g[KG_G];
  const int col = (threadIdx.x % KG_Q) * KG_V;
  // Thread t combines chunks t / KG_G, + KG_GN_T / KG_G, ... of group t % KG_G.
  const int cg = threadIdx.x % KG_G;
  for (long long item = blockIdx.x; item < N * splits; item += gridDim.x) {
    const long long n = item / splits, lo = (item % splits) * chunk;
    const long long hi = lo + chunk < S ? lo + chunk : S;
    const A* st = ws + 2 * (n * splits * KG_G + cg);
    const double count = (double)S * KG_CG;
    double t = 0;
    for (long long k = threadIdx.x / KG_G; k < splits; k += KG_GN_T / KG_G) {
      const long long nk = S - k * chunk < chunk ? S - k * chunk : chunk;
      t += (double)(nk * KG_CG) * (double)st[2 * k * KG_G];
    }
    t = kg_gn_chunks_sum(t, red);
    if (threadIdx.x < KG_G) mean_d[threadIdx.x] = t / count;
    __syncthreads();
    const double mean = mean_d[cg];
    t = 0;
    for (long long k = threadIdx.x / KG_G; k < splits; k += KG_GN_T / KG_G) {
      const long long nk = S - k * chunk < chunk ? S - k * chunk : chunk;
      const double d = (double)st[2 * k * KG_G] - mean;
      t += (double)st[2 * k * KG_G + 1] + (double)(nk * KG_CG) * d * d;
    }
    t = kg_gn_chunks_sum(t, red);
    if (threadIdx.x < KG_G) {
      mean_g[threadIdx.x] = (A)mean_d[threadIdx.x];
      rstd_g[threadIdx.x] = (A)(1.0 / sqrt(t / count + eps));
    }
    __syncthreads();
    const long long at = n * S * KG_GN_ROW + col;
    const int g = col / KG_CG;
    kg_gn_write(x + at, w, b, y + at, lo, hi, mean_g[g], rstd_g[g]);
    __syncthreads();
  }
}

// The second launch's fallback where the first one's (norm_group.cuh's kernel) did all the work.
extern "C" __global__ void kg_gn_nhwc_none() {}
#undef KG_GN_T
#undef KG_GN_WORDS
#undef KG_GN_ROW
#undef KG_CG
#undef KG_G
#undef KG_Q
#undef KG_R
#undef KG_HAS_W
#undef KG_HAS_B
#undef KG_V
#undef KG_VW
