// Channels-last max_pool with KG_V channels per thread moved as one 16-byte vector
// (kernels/pool.cpp; C % KG_V == 0 and buffers of the engine's arena, so aligned), 32-bit index
// arithmetic (total < 2^31). Expects Geom, T_x, ld_x, st_x, A (the compute type) and KG_V.
struct __align__(16) kg_vec {
  T_x e[KG_V];
};
extern "C" __global__ void kg_max_pool_nhwc(const T_x* __restrict__ x, T_x* __restrict__ y, Geom q, int total) {
  const int cv = (int)q.C / KG_V, H = (int)q.H, W = (int)q.W, OH = (int)q.OH, OW = (int)q.OW;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int c = (i % cv) * KG_V, j = i / cv;
    const int ow = j % OW, oh = (j / OW) % OH, img = j / (OW * OH);
    A m[KG_V];
#pragma unroll
    for (int e = 0; e < KG_V; ++e) m[e] = -(A)KG_INF;
    for (int ki = 0; ki < (int)q.KH; ++ki) {
      const int ih = oh * (int)q.sh - (int)q.ph + ki * (int)q.dh;
      if (ih < 0 || ih >= H) continue;
      for (int kj = 0; kj < (int)q.KW; ++kj) {
        const int iw = ow * (int)q.sw - (int)q.pw + kj * (int)q.dw;
        if (iw < 0 || iw >= W) continue;
        const kg_vec t = *reinterpret_cast<const kg_vec*>(x + ((long long)(img * H + ih) * W + iw) * q.C + c);
#pragma unroll
        for (int e = 0; e < KG_V; ++e) m[e] = kg_max(m[e], ld_x(t.e[e]));
      }
    }
    kg_vec o;
#pragma unroll
    for (int e = 0; e < KG_V; ++e) o.e[e] = st_x(m[e]);
    *reinterpret_cast<kg_vec*>(y + (long long)j * q.C + c) = o;
  }
}
#undef KG_V
