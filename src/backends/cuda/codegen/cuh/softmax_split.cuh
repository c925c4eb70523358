// Softmax / log_softmax of few long rows split across blocks (kernels/softmax.cpp; the split:
// plan.h's split_rows). Row r (R contiguous elements) is cut into `splits` chunks of `chunk`
// elements (the last may be shorter), chunk c of row r being work item r * splits + c, one block
// each:
//   kg_softmax_split_stats_v<KG_V>: the chunk's max m_c and sum s_c of exp(x - m_c), by the
//       online pass of softmax_long.cuh, into ws[2 * item] and ws[2 * item + 1];
//   kg_softmax_split_apply_v<KG_V>: combines the row's chunks (m = max m_c, s = sum of s_c *
//       exp(m_c - m) over the chunks whose m_c is not -inf), then writes its chunk: exp(x - m) *
//       (1 / s), or (x - m) - log(s) for log_softmax. A NaN anywhere makes s, so the row, NaN.
// Every block of a row combines the same values in the same order. x and y are read and written
// as words of KG_V elements (type KG_VW); R and chunk are multiples of KG_V.
//
// Expects T_x, ld_x, st_x and A (the compute type), and KG_LOG (1: log_softmax), KG_V (1, 2, 4 or
// 8) and KG_VW; undefines them at the end, so that a source can append this file once per vector
// width.
#if KG_V == 1
extern "C" __global__ void kg_softmax_split_stats_v1(const T_x* __restrict__ x, A* __restrict__ ws, long long rows,
                                                     long long R, long long splits, long long chunk) {
#elif KG_V == 2
extern "C" __global__ void kg_softmax_split_stats_v2(const T_x* __restrict__ x, A* __restrict__ ws, long long rows,
                                                     long long R, long long splits, long long chunk) {
#elif KG_V == 4
extern "C" __global__ void kg_softmax_split_stats_v4(const T_x* __restrict__ x, A* __restrict__ ws, long long rows,
                                                     long long R, long long splits, long long chunk) {
#elif KG_V == 8
extern "C" __global__ void kg_softmax_split_stats_v8(const T_x* __restrict__ x, A* __restrict__ ws, long long rows,
                                                     long long R, long long splits, long long chunk) {
#else
#error "KG_V must be 1, 2, 4 or 8"
#endif
  __shared__ A sm[33];
  for (long long item = blockIdx.x; item < rows * splits; item += gridDim.x) {
    const long long row = item / splits, lo = (item % splits) * chunk;
    const long long hi = lo + chunk < R ? lo + chunk : R;
    const KG_VW* p = reinterpret_cast<const KG_VW*>(x + row * R);
    A m = -(A)KG_INF, s = 0;
    for (long long i = lo / KG_V + threadIdx.x; i < hi / KG_V; i += blockDim.x) {
      const KG_VW u = p[i];
      const T_x* e = reinterpret_cast<const T_x*>(&u);
#pragma unroll
      for (int j = 0; j < KG_V; ++j) {
        const A v = ld_x(e[j]);
        if (v == -(A)KG_INF) continue;
        if (v > m) {
          s = s * exp(m - v) + (A)1;
          m = v;
        } else s += exp(v - m);
      }
    }
    const A mall = kg_block_max(m, sm, -(A)KG_INF);
    s = m == -(A)KG_INF ? (A)0 : s * exp(m - mall);
    s = kg_block_sum(s, sm);
    if (threadIdx.x == 0) {
      ws[2 * item] = mall;
      ws[2 * item + 1] = s;
    }
  }
}
#if KG_V == 1
extern "C" __global__ void kg_softmax_split_apply_v1(const T_x* __restrict__ x, const A* __restrict__ ws,
                                                     T_x* __restrict__ y, long long rows, long long R, long long splits,
                                                     long long chunk) {
#elif KG_V == 2
extern "C" __global__ void kg_softmax_split_apply_v2(const T_x* __restrict__ x, const A* __restrict__ ws,
                                                     T_x* __restrict__ y, long long rows, long long R, long long splits,
                                                     long long chunk) {
#elif KG_V == 4
extern "C" __global__ void kg_softmax_split_apply_v4(const T_x* __restrict__ x, const A* __restrict__ ws,
                                                     T_x* __restrict__ y, long long rows, long long R, long long splits,
                                                     long long chunk) {
#else
extern "C" __global__ void kg_softmax_split_apply_v8(const T_x* __restrict__ x, const A* __restrict__ ws,
                                                     T_x* __restrict__ y, long long rows, long long R, long long splits,
                                                     long long chunk) {
#endif
  __shared__ A sm[33];
  for (long long item = blockIdx.x; item < rows * splits; item += gridDim.x) {
    const long long row = item / splits, lo = (item % splits) * chunk;
    const long long hi = lo + chunk < R ? lo + chunk : R;
    const A* st = ws + 2 * row * splits;
    A m = -(A)KG_INF;
    for (long long k = threadIdx.x; k < splits; k += blockDim.x) m = kg_max(m, st[2 * k]);
    const A mall = kg_block_max(m, sm, -(A)KG_INF);
    A s = 0;
    for (long long k = threadIdx.x; k < splits; k += blockDim.x)
      if (st[2 * k] != -(A)KG_INF) s += st[2 * k + 1] * exp(st[2 * k] - mall);
    s = kg_block_sum(s, sm);
#if KG_LOG
    const A f = log(s);
#else
    const A f = (A)1 / s;
#endif
    const KG_VW* p = reinterpret_cast<const KG_VW*>(x + row * R);
    KG_VW* q = reinterpret_cast<KG_VW*>(y + row * R);
    for (long long i = lo / KG_V + threadIdx.x; i < hi / KG_V; i += blockDim.x) {
      const KG_VW u = p[i];
      const T_x* e = reinterpret_cast<const T_x*>(&u);
      KG_VW o;
      T_x* g = reinterpret_cast<T_x*>(&o);
#pragma unroll
      for (int j = 0; j < KG_V; ++j) {
        const A d = ld_x(e[j]) - mall;
#if KG_LOG
        g[j] = st_x(d - f);
#else
        g[j] = st_x(exp(d) * f);
#endif
      }
      q[i] = o;
    }
  }
}
#undef KG_LOG
#undef KG_V
#undef KG_VW
