// Softmax / log_softmax of rows held in registers (kernels/softmax.cpp): a warp (KG_WARP) or
// a block per row, each thread holding KG_EPL elements loaded KG_V at a time as one word of
// type KG_VW. Max, then exp and sum, then the scaled write: x is read once. The kernel is
// kg_softmax_rows_v<KG_V>.
//
// Expects T_x, ld_x, st_x and A (the compute type), and KG_LOG (1: log_softmax), KG_WARP,
// KG_EPL, KG_V (1, 2, 4 or 8) and KG_VW; undefines them at the end, so that a source can
// append this file once per vector width.
#if KG_WARP
#define KG_G 32
#else
#define KG_G (int)blockDim.x
#endif
#if KG_V == 1
extern "C" __global__ void kg_softmax_rows_v1(const T_x* __restrict__ x, T_x* __restrict__ y, long long rows,
                                              long long R) {
#elif KG_V == 2
extern "C" __global__ void kg_softmax_rows_v2(const T_x* __restrict__ x, T_x* __restrict__ y, long long rows,
                                              long long R) {
#elif KG_V == 4
extern "C" __global__ void kg_softmax_rows_v4(const T_x* __restrict__ x, T_x* __restrict__ y, long long rows,
                                              long long R) {
#elif KG_V == 8
extern "C" __global__ void kg_softmax_rows_v8(const T_x* __restrict__ x, T_x* __restrict__ y, long long rows,
                                              long long R) {
#else
#error "KG_V must be 1, 2, 4 or 8"
#endif
  __shared__ A sm[33];
#if KG_WARP
  const long long r0 = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5,
                  nr = ((long long)gridDim.x * blockDim.x) >> 5;
  const int lane = threadIdx.x & 31;
#else
  const long long r0 = blockIdx.x, nr = gridDim.x;
  const int lane = threadIdx.x;
#endif
  for (long long row = r0; row < rows; row += nr) {
    const KG_VW* p = reinterpret_cast<const KG_VW*>(x + row * R);
    KG_VW* q = reinterpret_cast<KG_VW*>(y + row * R);
    A v[KG_EPL];
#pragma unroll
    for (int c = 0; c < KG_EPL / KG_V; ++c) {
      const long long i = (long long)c * KG_G + lane;
      if (i * KG_V < R) {
        const KG_VW u = p[i];
        const T_x* e = reinterpret_cast<const T_x*>(&u);
#pragma unroll
        for (int j = 0; j < KG_V; ++j) v[c * KG_V + j] = ld_x(e[j]);
      } else {
#pragma unroll
        for (int j = 0; j < KG_V; ++j) v[c * KG_V + j] = -(A)KG_INF;
      }
    }
    A m = -(A)KG_INF;
#pragma unroll
    for (int k = 0; k < KG_EPL; ++k) m = kg_max(m, v[k]);
#if KG_WARP
    m = kg_warp_max(m);
#else
    m = kg_block_max(m, sm, -(A)KG_INF);
#endif
    A s = 0;
#pragma unroll
    for (int c = 0; c < KG_EPL / KG_V; ++c) {
      if (((long long)c * KG_G + lane) * KG_V < R) {
#pragma unroll
        for (int j = 0; j < KG_V; ++j) {
          const A d = v[c * KG_V + j] - m;
#if KG_LOG
          v[c * KG_V + j] = d;
          s += exp(d);
#else
          const A e = exp(d);
          v[c * KG_V + j] = e;
          s += e;
#endif
        }
      }
    }
#if KG_WARP
    s = kg_warp_sum(s);
#else
    s = kg_block_sum(s, sm);
#endif
#if KG_LOG
    const A f = log(s);
#else
    const A f = (A)1 / s;
#endif
#pragma unroll
    for (int c = 0; c < KG_EPL / KG_V; ++c) {
      const long long i = (long long)c * KG_G + lane;
      if (i * KG_V < R) {
        KG_VW u;
        T_x* e = reinterpret_cast<T_x*>(&u);
#if KG_LOG
#pragma unroll
        for (int j = 0; j < KG_V; ++j) e[j] = st_x(v[c * KG_V + j] - f);
#else
#pragma unroll
        for (int j = 0; j < KG_V; ++j) e[j] = st_x(v[c * KG_V + j] * f);
#endif
        q[i] = u;
      }
    }
  }
}
#undef KG_G
#undef KG_LOG
#undef KG_WARP
#undef KG_EPL
#undef KG_V
#undef KG_VW
