// Softmax / log_softmax over a non-innermost axis (kernels/softmax.cpp): x viewed as [outer, R,
// inner], one thread per column in three passes (max, sum, write), coalesced along inner.
// Expects T_x, ld_x, st_x and A (the compute type), and KG_LOG (1: log_softmax).
extern "C" __global__ void kg_softmax_cols(const T_x* __restrict__ x, T_x* __restrict__ y, long long outer, long long R,
                                           long long inner) {
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < outer * inner;
       t += (long long)gridDim.x * blockDim.x) {
    const long long o = t / inner, j = t % inner;
    const T_x* p = x + o * R * inner + j;
    T_x* q = y + o * R * inner + j;
    A m = -(A)KG_INF, s = 0;
    for (long long r = 0; r < R; ++r) m = kg_max(m, ld_x(p[r * inner]));
    for (long long r = 0; r < R; ++r) s += exp(ld_x(p[r * inner]) - m);
#if KG_LOG
    const A f = log(s);
    for (long long r = 0; r < R; ++r) q[r * inner] = st_x((ld_x(p[r * inner]) - m) - f);
#else
    const A f = (A)1 / s;
    for (long long r = 0; r < R; ++r) q[r * inner] = st_x(exp(ld_x(p[r * inner]) - m) * f);
#endif
  }
}
#undef KG_LOG
