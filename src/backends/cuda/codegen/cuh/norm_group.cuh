// Normalization of contiguous groups of n elements (kernels/norm.cpp), a block per group: sum,
// squared deviations, then the write. Serves group_norm (per (sample, group): the channel of
// element i is (group % G) * Cg + i / S; as the CPU, scale = rstd * weight, then (x - mean) *
// scale + bias) and layer_norm's long rows (KG_LAYER: the channel is the element; (x - mean) *
// rstd, then * weight, then + bias).
//
// Expects T_x, ld_x, st_x, A (the compute type), KG_ACT (the fused activation of an A value),
// T_p0 / ld_p0 (weight), T_p1 / ld_p1 (bias), KG_RMS (1: RMSNorm, the mean taken as 0, no pass),
// and KG_LAYER, KG_HAS_W, KG_HAS_B, KG_NHWC (group_norm of x [N, S, C]) and KG_CG (its channels
// per group).
extern "C" __global__ void kg_group_norm(const T_x* __restrict__ x, const T_p0* __restrict__ w,
                                         const T_p1* __restrict__ b, T_x* __restrict__ y, long long groups, long long n,
                                         long long G, long long Cg, long long S, double eps) {
  __shared__ A sm[33];
  for (long long grp = blockIdx.x; grp < groups; grp += gridDim.x) {
#if KG_NHWC
    // Sample grp / G's group grp % G: KG_CG channels at stride G * KG_CG in each of S positions.
    const long long base = (grp / G) * n * G + (grp % G) * KG_CG;
#define KG_AT(i) (base + ((i) / KG_CG) * (G * KG_CG) + (i) % KG_CG)
#else
    const long long base = grp * n;
#define KG_AT(i) (base + (i))
#endif
    A s = 0;
#if KG_RMS
    const A mean = 0;
#else
    for (long long i = threadIdx.x; i < n; i += blockDim.x) s += ld_x(x[KG_AT(i)]);
    s = kg_block_sum(s, sm);
    const A mean = (A)((double)s / (double)n);
    s = 0;
#endif
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
      const A d = ld_x(x[KG_AT(i)]) - mean;
      s += d * d;
    }
    s = kg_block_sum(s, sm);
    const A rstd = (A)(1.0 / sqrt((double)s / (double)n + eps));
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
#if KG_LAYER
      const long long c = i;
      A r = (ld_x(x[KG_AT(i)]) - mean) * rstd;
#if KG_HAS_W
      r *= (A)ld_p0(w[c]);
#endif
#if KG_HAS_B
      r += (A)ld_p1(b[c]);
#endif
#else
#if KG_NHWC
      const long long c = (grp % G) * KG_CG + i % KG_CG;
#else
      const long long c = (grp % G) * Cg + i / S;
#endif
#if KG_HAS_W
      const A sc = rstd * (A)ld_p0(w[c]);
#else
      const A sc = rstd * (A)1;
#endif
#if KG_HAS_B
      const A r = (ld_x(x[KG_AT(i)]) - mean) * sc + (A)ld_p1(b[c]);
#else
      const A r = (ld_x(x[KG_AT(i)]) - mean) * sc + (A)0;
#endif
#endif
      y[KG_AT(i)] = st_x(KG_ACT(r));
    }
#undef KG_AT
  }
}
#undef KG_NHWC
#undef KG_CG
#undef KG_LAYER
#undef KG_HAS_W
#undef KG_HAS_B
