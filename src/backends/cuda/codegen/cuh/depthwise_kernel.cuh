// One variant of the generated depthwise conv (codegen/depthwise_source.cpp has the design and
// the work split), appended once per variant after depthwise_common.cuh. Expects:
//   the conv's  KD_KH, KD_KW (kernel size), KD_TAPS (KD_KH * KD_KW), KD_SH, KD_SW (stride),
//               KD_DH, KD_DW (dilation), KD_BIAS, KD_RES (1 when a bias / residual is added)
//   the variant's  KD_NAME (the kernel's name), KD_V (channels per vector), KD_VW (the word of
//               KD_V elements), KD_P (adjacent outputs along OW per thread), KD_CT (channel
//               vectors per block), KD_GR (pixel groups per block), KD_SPAN (input columns of
//               KD_P outputs along a kernel row)
// It undefines the variant's (and its own KD_SUM) at its end, for the next variant to define.
// Thread t takes channel vector t % KD_CT and pixel group t / KD_CT (threads past
// KD_GR * KD_CT only help stage the block's weights).

// The pre-activation sum of output p, channel v: the conv, plus the bias and residual if fused.
#if KD_BIAS && KD_RES
#define KD_SUM(p, v) acc[p][v] + bv[v] + rv[v]
#elif KD_BIAS
#define KD_SUM(p, v) acc[p][v] + bv[v]
#elif KD_RES
#define KD_SUM(p, v) acc[p][v] + rv[v]
#else
#define KD_SUM(p, v) acc[p][v]
#endif

extern "C" __global__ void __launch_bounds__(256)
    KD_NAME(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, const T* __restrict__ res,
            T* __restrict__ y, int N, int H, int W, int C, int OH, int OW, int PH, int PW) {
  __shared__ __align__(16) float kd_w[KD_TAPS * KD_CT * KD_V];
  const int c0 = blockIdx.y * (KD_CT * KD_V);
  const int tc = min(KD_CT * KD_V, C - c0);
  const T* __restrict__ wt = w + (long long)c0 * KD_TAPS;  // the tile's weights: contiguous in [C, KH, KW, 1]
  // Staged KD_V weights a load: tc is a multiple of KD_V and c0 * KD_TAPS too, so the loads
  // stay aligned when w is (run() checks).
  for (int i = threadIdx.x * KD_V; i < tc * KD_TAPS; i += blockDim.x * KD_V) {
    float f[KD_V];
    kd_ld<KD_V, KD_VW>(wt + i, f);
#pragma unroll
    for (int v = 0; v < KD_V; ++v) {
      const int ch = (i + v) / KD_TAPS;
      kd_w[(i + v - ch * KD_TAPS) * (KD_CT * KD_V) + ch] = f[v];
    }
  }
  __syncthreads();
  const int cv = threadIdx.x % KD_CT, pg = threadIdx.x / KD_CT;
  if (pg >= KD_GR || cv * KD_V >= tc) return;
  const int c = c0 + cv * KD_V;
#if KD_BIAS
  float bv[KD_V];
  kd_ld<KD_V, KD_VW>(bias + c, bv);
#endif
  const int owg = (OW + KD_P - 1) / KD_P;
  const long long total = (long long)N * OH * owg;
  for (long long gi = (long long)blockIdx.x * KD_GR + pg; gi < total; gi += (long long)gridDim.x * KD_GR) {
    int n, oh, gw;
    kd_split(gi, owg, OH, n, oh, gw);
    const int ow0 = gw * KD_P;
    const int ih0 = oh * KD_SH - PH, iw0 = ow0 * KD_SW - PW;
    float acc[KD_P][KD_V];
#pragma unroll
    for (int p = 0; p < KD_P; ++p)
#pragma unroll
      for (int v = 0; v < KD_V; ++v) acc[p][v] = 0.0f;
#if KD_KH <= 7
#pragma unroll
#else
#pragma unroll 1
#endif
    for (int kh = 0; kh < KD_KH; ++kh) {
      const int ih = ih0 + kh * KD_DH;
      if (ih < 0 || ih >= H) continue;
      float wr[KD_KW][KD_V];
      const float* wrow = kd_w + kh * (KD_KW * KD_CT * KD_V) + cv * KD_V;
#pragma unroll
      for (int kw = 0; kw < KD_KW; ++kw) kd_ldw<KD_V>(wrow + kw * (KD_CT * KD_V), wr[kw]);
      const T* __restrict__ xrow = x + (((long long)n * H + ih) * W) * C + c;
      // Each input column of the row is loaded once and used by every (output, tap) that reads it.
#pragma unroll
      for (int j = 0; j < KD_SPAN; ++j) {
        const int iw = iw0 + j;
        if (iw < 0 || iw >= W) continue;
        float xv[KD_V];
        kd_ld<KD_V, KD_VW>(xrow + (long long)iw * C, xv);
#pragma unroll
        for (int p = 0; p < KD_P; ++p)
#pragma unroll
          for (int kw = 0; kw < KD_KW; ++kw)
            if (p * KD_SW + kw * KD_DW == j)
#pragma unroll
              for (int v = 0; v < KD_V; ++v) acc[p][v] = fmaf(xv[v], wr[kw][v], acc[p][v]);
      }
    }
#pragma unroll
    for (int p = 0; p < KD_P; ++p) {
      const int ow = ow0 + p;
      if (ow >= OW) break;
      const long long o = (((long long)n * OH + oh) * OW + ow) * C + c;
#if KD_RES
      float rv[KD_V];
      kd_ld<KD_V, KD_VW>(res + o, rv);
#endif
      float out[KD_V];
#pragma unroll
      for (int v = 0; v < KD_V; ++v) out[v] = kd_act(KD_SUM(p, v));
      kd_st<KD_V, KD_VW>(y + o, out);
    }
  }
}

#undef KD_NAME
#undef KD_V
#undef KD_VW
#undef KD_P
#undef KD_CT
#undef KD_GR
#undef KD_SPAN
#undef KD_SUM
