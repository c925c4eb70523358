// max_pool, a thread per output (kernels/pool.cpp): the window tap by tap in the CPU's order
// (kernel row, then column), skipping taps in the padding; NaN propagates. Outputs in
// row-major order: (plane, oh, ow) channels-first, (n, oh, ow, c) channels-last (q.C != 0),
// where neighbouring threads take neighbouring channels, so reads and writes coalesce.
// Expects Geom, T_x, ld_x, st_x and A (the compute type).
extern "C" __global__ void kg_max_pool(const T_x* __restrict__ x, T_x* __restrict__ y, Geom q, long long total) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long j = q.C ? i / q.C : i;
    const long long ow = j % q.OW, oh = (j / q.OW) % q.OH, img = j / (q.OW * q.OH);
    const long long step = q.C ? q.C : 1;
    const T_x* plane = q.C ? x + img * q.H * q.W * q.C + i % q.C : x + img * q.H * q.W;
    A m = -(A)KG_INF;
    for (long long ki = 0; ki < q.KH; ++ki) {
      const long long ih = oh * q.sh - q.ph + ki * q.dh;
      if (ih < 0 || ih >= q.H) continue;
      for (long long kj = 0; kj < q.KW; ++kj) {
        const long long iw = ow * q.sw - q.pw + kj * q.dw;
        if (iw < 0 || iw >= q.W) continue;
        m = kg_max(m, ld_x(plane[(ih * q.W + iw) * step]));
      }
    }
    y[i] = st_x(m);
  }
}
