// layer_norm of rows held in registers (kernels/norm.cpp): a group of KG_GROUP lanes of a warp
// (KG_WARP; 32, or fewer for short rows, 32 / KG_GROUP rows a warp) or a block per row, each
// thread holding KG_EPL elements loaded KG_V at a time as one word of type KG_VW.
// The weight and bias are loaded with the row, so their latency overlaps x's instead of
// following the two reductions; they are loaded as whole words too (KG_W_WORDS words of type
// KG_W_WORD per chunk of KG_V, the bias likewise), since scalar 2-byte loads spread a warp's
// instruction over 16 sectors each. Sum, squared deviations, then the write; the statistics in
// A (kg_row_mean, kg_row_rstd). The kernel is kg_layer_norm_v<KG_V>.
//
// Expects T_x, ld_x, st_x, A (the compute type), KG_ACT (the fused activation of an A value),
// KG_RMS (1: RMSNorm, the mean taken as 0),
// T_p0 / ld_p0 (weight), T_p1 / ld_p1 (bias),
// and KG_WARP, KG_GROUP (with KG_WARP), KG_EPL, KG_V (1, 2, 4 or 8), KG_VW, KG_HAS_W (with
// KG_W_WORD, KG_W_WORDS) and KG_HAS_B (with KG_B_WORD, KG_B_WORDS); undefines them at the end,
// so that a source can append this file once per vector width.
#if KG_WARP
#define KG_G KG_GROUP
#else
#define KG_G (int)blockDim.x
#endif
#if KG_V == 1
extern "C" __global__ void kg_layer_norm_v1(const T_x* __restrict__ x, const T_p0* __restrict__ w,
                                            const T_p1* __restrict__ b, T_x* __restrict__ y, long long rows,
                                            long long D, double eps) {
#elif KG_V == 2
extern "C" __global__ void kg_layer_norm_v2(const T_x* __restrict__ x, const T_p0* __restrict__ w,
                                            const T_p1* __restrict__ b, T_x* __restrict__ y, long long rows,
                                            long long D, double eps) {
#elif KG_V == 4
extern "C" __global__ void kg_layer_norm_v4(const T_x* __restrict__ x, const T_p0* __restrict__ w,
                                            const T_p1* __restrict__ b, T_x* __restrict__ y, long long rows,
                                            long long D, double eps) {
#elif KG_V == 8
extern "C" __global__ void kg_layer_norm_v8(const T_x* __restrict__ x, const T_p0* __restrict__ w,
                                            const T_p1* __restrict__ b, T_x* __restrict__ y, long long rows,
                                            long long D, double eps) {
#else
#error "KG_V must be 1, 2, 4 or 8"
#endif
  __shared__ A sm[33];
#if KG_WARP
  // Every lane of a warp takes the same trips through the loop (its group's row is r + sub), so
  // the group shuffles run with the whole warp; a group past the last row loads and stores nothing.
  constexpr int per = 32 / KG_GROUP;
  const long long r0 = ((blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5) * per,
                  nr = (((long long)gridDim.x * blockDim.x) >> 5) * per;
  const int lane = threadIdx.x & (KG_GROUP - 1), sub = (threadIdx.x & 31) / KG_GROUP;
#else
  const long long r0 = blockIdx.x, nr = gridDim.x;
  const int lane = threadIdx.x, sub = 0;
#endif
  for (long long r = r0; r < rows; r += nr) {
    const long long row = r + sub;
    const long long live = row < rows ? D : 0;  // elements this group reads and writes
    const KG_VW* p = reinterpret_cast<const KG_VW*>(x + row * D);
    KG_VW* q = reinterpret_cast<KG_VW*>(y + row * D);
    A v[KG_EPL];
#if KG_HAS_W
    A wv[KG_EPL];
#endif
#if KG_HAS_B
    A bv[KG_EPL];
#endif
    A s = 0;
#pragma unroll
    for (int c = 0; c < KG_EPL / KG_V; ++c) {
      const long long i = (long long)c * KG_G + lane;
      if (i * KG_V < live) {
        const KG_VW u = p[i];
        const T_x* e = reinterpret_cast<const T_x*>(&u);
#pragma unroll
        for (int j = 0; j < KG_V; ++j) {
          v[c * KG_V + j] = ld_x(e[j]);
          s += v[c * KG_V + j];
        }
#if KG_HAS_W
        {
          KG_W_WORD pw[KG_W_WORDS];
          const KG_W_WORD* pq = reinterpret_cast<const KG_W_WORD*>(w + i * KG_V);
#pragma unroll
          for (int k = 0; k < KG_W_WORDS; ++k) pw[k] = pq[k];
          const T_p0* pe = reinterpret_cast<const T_p0*>(pw);
#pragma unroll
          for (int j = 0; j < KG_V; ++j) wv[c * KG_V + j] = (A)ld_p0(pe[j]);
        }
#endif
#if KG_HAS_B
        {
          KG_B_WORD pw[KG_B_WORDS];
          const KG_B_WORD* pq = reinterpret_cast<const KG_B_WORD*>(b + i * KG_V);
#pragma unroll
          for (int k = 0; k < KG_B_WORDS; ++k) pw[k] = pq[k];
          const T_p1* pe = reinterpret_cast<const T_p1*>(pw);
#pragma unroll
          for (int j = 0; j < KG_V; ++j) bv[c * KG_V + j] = (A)ld_p1(pe[j]);
        }
#endif
      } else {
#pragma unroll
        for (int j = 0; j < KG_V; ++j) v[c * KG_V + j] = 0;
      }
    }
#if KG_RMS
    const A mean = 0;  // RMSNorm: squares about zero (s, unused, compiles away)
#else
#if KG_WARP
    s = kg_group_sum<KG_GROUP>(s);
#else
    s = kg_block_sum(s, sm);
#endif
    const A mean = kg_row_mean(s, D);
#endif
    s = 0;
#pragma unroll
    for (int c = 0; c < KG_EPL / KG_V; ++c)
      if (((long long)c * KG_G + lane) * KG_V < live)
#pragma unroll
        for (int j = 0; j < KG_V; ++j) s += (v[c * KG_V + j] - mean) * (v[c * KG_V + j] - mean);
#if KG_WARP
    s = kg_group_sum<KG_GROUP>(s);
#else
    s = kg_block_sum(s, sm);
#endif
    const A rstd = kg_row_rstd(s, D, eps);
#pragma unroll
    for (int c = 0; c < KG_EPL / KG_V; ++c) {
      const long long i = (long long)c * KG_G + lane;
      if (i * KG_V < live) {
        KG_VW u;
        T_x* e = reinterpret_cast<T_x*>(&u);
#pragma unroll
        for (int j = 0; j < KG_V; ++j) {
          A r = (v[c * KG_V + j] - mean) * rstd;
#if KG_HAS_W
          r *= wv[c * KG_V + j];
#endif
#if KG_HAS_B
          r += bv[c * KG_V + j];
#endif
          e[j] = st_x(KG_ACT(r));
        }
        q[i] = u;
      }
    }
  }
}
#undef KG_G
#undef KG_WARP
#undef KG_GROUP
#undef KG_EPL
#undef KG_V
#undef KG_VW
#undef KG_HAS_W
#undef KG_W_WORD
#undef KG_W_WORDS
#undef KG_HAS_B
#undef KG_B_WORD
#undef KG_B_WORDS
