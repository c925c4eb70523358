// Normalization of few long rows split across blocks (kernels/norm.cpp; the split: plan.h's
// split_rows). Row r (a group of group_norm, a row of layer_norm: n contiguous elements) is cut
// into `splits` chunks of `chunk` elements (the last may be shorter), chunk c of row r being
// work item r * splits + c, one block each:
//   kg_norm_split_stats_v<KG_V>: the chunk's mean and sum of squared deviations from it (two
//       passes over the chunk, in A) into ws[2 * item] and ws[2 * item + 1];
//   kg_norm_split_apply_v<KG_V>: combines the row's chunks in double (mean = sum n_c mean_c / n,
//       M2 = sum M2_c + n_c (mean_c - mean)^2, var = M2 / n), rstd = 1 / sqrt(var + eps), then
//       writes its chunk as norm_group.cuh does (group_norm: scale = rstd * weight, (x - mean) *
//       scale + bias; KG_LAYER: (x - mean) * rstd, then * weight, then + bias).
// Every block of a row combines the same values in the same order, so they agree on the
// statistics. x and y are read and written as words of KG_V elements (type KG_VW); n and chunk
// are multiples of KG_V.
//
// Expects T_x, ld_x, st_x, A (the compute type), KG_ACT (the fused activation of an A value),
// T_p0 / ld_p0 (weight), T_p1 / ld_p1 (bias), KG_RMS (1: RMSNorm, each chunk's mean taken as 0),
// and KG_LAYER, KG_HAS_W, KG_HAS_B, KG_V (1, 2, 4 or 8), KG_VW, KG_NHWC and KG_CG (the channels
// of a group; KG_V divides it when KG_NHWC); undefines them at the end,
// so that a source can append this file once per vector width.
// Element e of row `row`: contiguous rows, or (KG_NHWC) group row % G of sample row / G in an
// [N, S, G * KG_CG] tensor, whose KG_CG channels repeat at stride G * KG_CG.
#if KG_NHWC
#define KG_ELEM(row, e) (((row) / G) * n * G + ((row) % G) * KG_CG + ((e) / KG_CG) * (G * KG_CG) + (e) % KG_CG)
#else
#define KG_ELEM(row, e) ((row) * n + (e))
#endif
#if KG_V == 1
extern "C" __global__ void kg_norm_split_stats_v1(const T_x* __restrict__ x, A* __restrict__ ws, long long rows,
                                                  long long n, long long splits, long long chunk, long long G) {
#elif KG_V == 2
extern "C" __global__ void kg_norm_split_stats_v2(const T_x* __restrict__ x, A* __restrict__ ws, long long rows,
                                                  long long n, long long splits, long long chunk, long long G) {
#elif KG_V == 4
extern "C" __global__ void kg_norm_split_stats_v4(const T_x* __restrict__ x, A* __restrict__ ws, long long rows,
                                                  long long n, long long splits, long long chunk, long long G) {
#elif KG_V == 8
extern "C" __global__ void kg_norm_split_stats_v8(const T_x* __restrict__ x, A* __restrict__ ws, long long rows,
                                                  long long n, long long splits, long long chunk, long long G) {
#else
#error "KG_V must be 1, 2, 4 or 8"
#endif
  __shared__ A sm[33];
  for (long long item = blockIdx.x; item < rows * splits; item += gridDim.x) {
    const long long row = item / splits, lo = (item % splits) * chunk;
    const long long hi = lo + chunk < n ? lo + chunk : n;
#if KG_RMS
    const A mean = 0;  // every chunk's: the row's combined mean is 0, its variance the mean square
#else
    A s = 0;
    for (long long i = lo / KG_V + threadIdx.x; i < hi / KG_V; i += blockDim.x) {
      const KG_VW u = *reinterpret_cast<const KG_VW*>(x + KG_ELEM(row, i * KG_V));
      const T_x* e = reinterpret_cast<const T_x*>(&u);
#pragma unroll
      for (int j = 0; j < KG_V; ++j) s += ld_x(e[j]);
    }
    s = kg_block_sum(s, sm);
    const A mean = (A)((double)s / (double)(hi - lo));
#endif
    A q = 0;
    for (long long i = lo / KG_V + threadIdx.x; i < hi / KG_V; i += blockDim.x) {
      const KG_VW u = *reinterpret_cast<const KG_VW*>(x + KG_ELEM(row, i * KG_V));
      const T_x* e = reinterpret_cast<const T_x*>(&u);
#pragma unroll
      for (int j = 0; j < KG_V; ++j) {
        const A d = ld_x(e[j]) - mean;
        q += d * d;
      }
    }
    q = kg_block_sum(q, sm);
    if (threadIdx.x == 0) {
      ws[2 * item] = mean;
      ws[2 * item + 1] = q;
    }
  }
}
#if KG_V == 1
extern "C" __global__ void kg_norm_split_apply_v1(const T_x* __restrict__ x, const T_p0* __restrict__ w,
                                                  const T_p1* __restrict__ b, const A* __restrict__ ws,
                                                  T_x* __restrict__ y, long long rows, long long n, long long splits,
                                                  long long chunk, long long G, long long Cg, long long S, double eps) {
#elif KG_V == 2
extern "C" __global__ void kg_norm_split_apply_v2(const T_x* __restrict__ x, const T_p0* __restrict__ w,
                                                  const T_p1* __restrict__ b, const A* __restrict__ ws,
                                                  T_x* __restrict__ y, long long rows, long long n, long long splits,
                                                  long long chunk, long long G, long long Cg, long long S, double eps) {
#elif KG_V == 4
extern "C" __global__ void kg_norm_split_apply_v4(const T_x* __restrict__ x, const T_p0* __restrict__ w,
                                                  const T_p1* __restrict__ b, const A* __restrict__ ws,
                                                  T_x* __restrict__ y, long long rows, long long n, long long splits,
                                                  long long chunk, long long G, long long Cg, long long S, double eps) {
#else
extern "C" __global__ void kg_norm_split_apply_v8(const T_x* __restrict__ x, const T_p0* __restrict__ w,
                                                  const T_p1* __restrict__ b, const A* __restrict__ ws,
                                                  T_x* __restrict__ y, long long rows, long long n, long long splits,
                                                  long long chunk, long long G, long long Cg, long long S, double eps) {
#endif
  __shared__ double smd[33];
  for (long long item = blockIdx.x; item < rows * splits; item += gridDim.x) {
    const long long row = item / splits, lo = (item % splits) * chunk;
    const long long hi = lo + chunk < n ? lo + chunk : n;
    const A* st = ws + 2 * row * splits;
    double t = 0;
    for (long long k = threadIdx.x; k < splits; k += blockDim.x) {
      const long long nk = n - k * chunk < chunk ? n - k * chunk : chunk;
      t += (double)nk * (double)st[2 * k];
    }
    const double mean_d = kg_block_sum(t, smd) / (double)n;
    t = 0;
    for (long long k = threadIdx.x; k < splits; k += blockDim.x) {
      const long long nk = n - k * chunk < chunk ? n - k * chunk : chunk;
      const double d = (double)st[2 * k] - mean_d;
      t += (double)st[2 * k + 1] + (double)nk * d * d;
    }
    const double var = kg_block_sum(t, smd) / (double)n;
    const A mean = (A)mean_d;
    const A rstd = (A)(1.0 / sqrt(var + eps));
    for (long long i = lo / KG_V + threadIdx.x; i < hi / KG_V; i += blockDim.x) {
      const long long at_i = KG_ELEM(row, i * KG_V);
      const KG_VW u = *reinterpret_cast<const KG_VW*>(x + at_i);
      const T_x* e = reinterpret_cast<const T_x*>(&u);
      KG_VW o;
      T_x* f = reinterpret_cast<T_x*>(&o);
#if KG_LAYER
#pragma unroll
      for (int j = 0; j < KG_V; ++j) {
        const long long c = i * KG_V + j;
        A r = (ld_x(e[j]) - mean) * rstd;
#if KG_HAS_W
        r *= (A)ld_p0(w[c]);
#endif
#if KG_HAS_B
        r += (A)ld_p1(b[c]);
#endif
        f[j] = st_x(KG_ACT(r));
      }
#elif KG_NHWC
      // Channels last: the word's elements are consecutive channels of one position.
      const long long c0 = (row % G) * KG_CG + (i * KG_V) % KG_CG;
#pragma unroll
      for (int j = 0; j < KG_V; ++j) {
#if KG_HAS_W
        const A sc = rstd * (A)ld_p0(w[c0 + j]);
#else
        const A sc = rstd * (A)1;
#endif
#if KG_HAS_B
        f[j] = st_x(KG_ACT((ld_x(e[j]) - mean) * sc + (A)ld_p1(b[c0 + j])));
#else
        f[j] = st_x(KG_ACT((ld_x(e[j]) - mean) * sc + (A)0));
#endif
      }
#else
      // The channel of element i * KG_V + j of the group: (row % G) * Cg + (i * KG_V + j) / S,
      // stepped along the word instead of divided per element.
      long long c = (row % G) * Cg + (i * KG_V) / S, at = (i * KG_V) % S;
#pragma unroll
      for (int j = 0; j < KG_V; ++j) {
#if KG_HAS_W
        const A sc = rstd * (A)ld_p0(w[c]);
#else
        const A sc = rstd * (A)1;
#endif
#if KG_HAS_B
        const A r = (ld_x(e[j]) - mean) * sc + (A)ld_p1(b[c]);
#else
        const A r = (ld_x(e[j]) - mean) * sc + (A)0;
#endif
        f[j] = st_x(KG_ACT(r));
        if (++at == S) {
          at = 0;
          ++c;
        }
      }
#endif
      *reinterpret_cast<KG_VW*>(y + at_i) = o;
    }
  }
}
#undef KG_ELEM
#undef KG_NHWC
#undef KG_CG
#undef KG_LAYER
#undef KG_HAS_W
#undef KG_HAS_B
#undef KG_V
#undef KG_VW
