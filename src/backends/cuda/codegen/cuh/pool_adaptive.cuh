// adaptive_avg_pool (kernels/pool.cpp). kg_adaptive_pool: a thread per output over PyTorch's
// window [floor(o * in / out), ceil((o + 1) * in / out)), outputs in row-major order as the
// other pools'. kg_global_pool: the 1 x 1 output (e.g. before a classifier), a warp per plane
// with a shuffle reduction. Expects Geom, T_x, ld_x, st_x and A (the compute type).
extern "C" __global__ void kg_adaptive_pool(const T_x* __restrict__ x, T_x* __restrict__ y, Geom q, long long total) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long j = q.C ? i / q.C : i;
    const long long ow = j % q.OW, oh = (j / q.OW) % q.OH, img = j / (q.OW * q.OH);
    const long long step = q.C ? q.C : 1;
    const T_x* plane = q.C ? x + img * q.H * q.W * q.C + i % q.C : x + img * q.H * q.W;
    const long long h0 = oh * q.H / q.OH, h1 = ((oh + 1) * q.H + q.OH - 1) / q.OH;
    const long long w0 = ow * q.W / q.OW, w1 = ((ow + 1) * q.W + q.OW - 1) / q.OW;
    A sum = 0;
    for (long long ih = h0; ih < h1; ++ih)
      for (long long iw = w0; iw < w1; ++iw) sum += ld_x(plane[(ih * q.W + iw) * step]);
    y[i] = st_x(sum / (A)((h1 - h0) * (w1 - w0)));
  }
}
extern "C" __global__ void kg_global_pool(const T_x* __restrict__ x, T_x* __restrict__ y, long long planes,
                                          long long hw) {
  const long long w0 = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5,
                  nw = ((long long)gridDim.x * blockDim.x) >> 5;
  const int lane = threadIdx.x & 31;
  for (long long p = w0; p < planes; p += nw) {
    const T_x* src = x + p * hw;
    A s = 0;
    for (long long i = lane; i < hw; i += 32) s += ld_x(src[i]);
    s = kg_warp_sum(s);
    if (lane == 0) y[p] = st_x(s / (A)hw);
  }
}
