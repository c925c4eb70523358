// Softmax / log_softmax of long rows (kernels/softmax.cpp): a block per row in two passes
// over memory, an online (max, sum) pass and the write pass. Expects T_x, ld_x, st_x and A (the
// compute type), and KG_LOG (1: log_softmax).
extern "C" __global__ void kg_softmax_long(const T_x* __restrict__ x, T_x* __restrict__ y, long long rows,
                                           long long R) {
  __shared__ A sm[33];
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const T_x* p = x + row * R;
    T_x* q = y + row * R;
    A m = -(A)KG_INF, s = 0;
    for (long long i = threadIdx.x; i < R; i += blockDim.x) {
      const A v = ld_x(p[i]);
      if (v == -(A)KG_INF) continue;
      if (v > m) {
        s = s * exp(m - v) + (A)1;
        m = v;
      } else s += exp(v - m);
    }
    const A mall = kg_block_max(m, sm, -(A)KG_INF);
    s = m == -(A)KG_INF ? (A)0 : s * exp(m - mall);
    s = kg_block_sum(s, sm);
#if KG_LOG
    const A f = log(s);
#else
    const A f = (A)1 / s;
#endif
    for (long long i = threadIdx.x; i < R; i += blockDim.x) {
      const A d = ld_x(p[i]) - mall;
#if KG_LOG
      q[i] = st_x(d - f);
#else
      q[i] = st_x(exp(d) * f);
#endif
    }
  }
}
#undef KG_LOG
