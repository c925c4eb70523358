// avg_pool, a thread per output (kernels/pool.cpp): the window tap by tap in the CPU's order,
// skipping taps in the padding, divided by PyTorch's divisor: the window clipped to input +
// padding (include_pad) or to the input, or the divisor override; a window lying wholly in the
// padding (ceil_mode) gives 0, as on the CPU. Outputs in row-major order: (plane, oh, ow)
// channels-first, (n, oh, ow, c) channels-last (q.C != 0).
// Expects Geom, T_x, ld_x, st_x and A (the compute type).

// The divisor factor along one dim, as the CPU's avg_factors.
__device__ __forceinline__ float kg_factor(long long o, long long in, long long k, long long s, long long pad,
                                           bool include) {
  const long long start = o * s - pad;
  const long long end = start + k < in + pad ? start + k : in + pad;
  const long long clipped = (end < in ? end : in) - (start > 0 ? start : 0);
  return clipped <= 0 ? 0.0f : (float)(include ? end - start : clipped);
}
extern "C" __global__ void kg_avg_pool(const T_x* __restrict__ x, T_x* __restrict__ y, Geom q, long long total,
                                       long long include_pad, long long divisor) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long j = q.C ? i / q.C : i;
    const long long ow = j % q.OW, oh = (j / q.OW) % q.OH, img = j / (q.OW * q.OH);
    const long long step = q.C ? q.C : 1;
    const T_x* plane = q.C ? x + img * q.H * q.W * q.C + i % q.C : x + img * q.H * q.W;
    A sum = 0;
    for (long long ki = 0; ki < q.KH; ++ki) {
      const long long ih = oh * q.sh - q.ph + ki;
      if (ih < 0 || ih >= q.H) continue;
      for (long long kj = 0; kj < q.KW; ++kj) {
        const long long iw = ow * q.sw - q.pw + kj;
        if (iw < 0 || iw >= q.W) continue;
        sum += ld_x(plane[(ih * q.W + iw) * step]);
      }
    }
    const float f =
        kg_factor(oh, q.H, q.KH, q.sh, q.ph, include_pad != 0) * kg_factor(ow, q.W, q.KW, q.sw, q.pw, include_pad != 0);
    y[i] = st_x(f == 0.0f ? (A)0 : sum / (A)(divisor ? (float)divisor : f));
  }
}
