// Reduction whose innermost run is reduced (kernels/reduce.cpp): a group of KG_GROUP lanes of a
// warp (32: the warp; fewer for short rows, 32 / KG_GROUP outputs per warp), or a 256-thread
// block (KG_BLOCK), per output; each pass walks the nro runs of `run` elements, KG_V elements at
// a time as 16-byte words when KG_V > 1; shuffles within the group (and shared memory across the
// warps of a block) combine the lanes. KG_MODE: 0 the combination, 1 the mean, 2 the variance
// (two passes: mean, then squared deviations). The kernel is kg_reduce_rows_v<KG_V>.
//
// Expects reduce_common.cuh, KG_MODE, KG_BLOCK, KG_GROUP (a power of two up to 32) and KG_V (1,
// 2, 4, 8 or 16); undefines KG_BLOCK, KG_GROUP and KG_V at the end, so that a source can append
// this file once per vector width.
#if KG_V == 1
extern "C" __global__ void kg_reduce_rows_v1(const T_x* __restrict__ x, T_x* __restrict__ y, Side g, long long outputs,
                                             long long nro, long long run, long long count, double correction) {
#elif KG_V == 2
extern "C" __global__ void kg_reduce_rows_v2(const T_x* __restrict__ x, T_x* __restrict__ y, Side g, long long outputs,
                                             long long nro, long long run, long long count, double correction) {
#elif KG_V == 4
extern "C" __global__ void kg_reduce_rows_v4(const T_x* __restrict__ x, T_x* __restrict__ y, Side g, long long outputs,
                                             long long nro, long long run, long long count, double correction) {
#elif KG_V == 8
extern "C" __global__ void kg_reduce_rows_v8(const T_x* __restrict__ x, T_x* __restrict__ y, Side g, long long outputs,
                                             long long nro, long long run, long long count, double correction) {
#elif KG_V == 16
extern "C" __global__ void kg_reduce_rows_v16(const T_x* __restrict__ x, T_x* __restrict__ y, Side g, long long outputs,
                                              long long nro, long long run, long long count, double correction) {
#else
#error "KG_V must be 1, 2, 4, 8 or 16"
#endif
  __shared__ A sm[33];
#if KG_BLOCK
  const long long gid0 = blockIdx.x, ngroups = gridDim.x;
  const int lane = threadIdx.x, G = blockDim.x, sub = 0;
#else
  // Every lane of a warp takes the same trip through the loop (its groups' outputs are o0 + sub),
  // so the group shuffles run with the whole warp.
  constexpr int per = 32 / KG_GROUP;
  const long long gid0 = ((blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5) * per,
                  ngroups = (((long long)gridDim.x * blockDim.x) >> 5) * per;
  const int lane = threadIdx.x & (KG_GROUP - 1), G = KG_GROUP, sub = (threadIdx.x & 31) / KG_GROUP;
#endif
  for (long long o0 = gid0; o0 < outputs; o0 += ngroups) {
    const long long o = o0 + sub;
    const long long live_run = o < outputs ? run : 0;  // a group past the end reads nothing
    long long base = 0;
    if (o < outputs) kg_kept_offset(base, o, g);
    A acc = KG_IDENTITY;
    for (long long ro = 0; ro < nro; ++ro) {
      long long off = base;
      kg_red_offset(off, ro, g);
#if KG_V > 1
      const uint4* p4 = reinterpret_cast<const uint4*>(x + off);
      for (long long i = lane; i < live_run / KG_V; i += G) {
        const uint4 u = p4[i];
        const T_x* e = reinterpret_cast<const T_x*>(&u);
#pragma unroll
        for (int j = 0; j < KG_V; ++j) {
          const A v = kg_ld(e[j]);
          acc = kg_comb(acc, v);
        }
      }
#else
      const T_x* p = x + off;
      for (long long i = lane; i < live_run; i += G) {
        const A v = kg_ld(p[i]);
        acc = kg_comb(acc, v);
      }
#endif
    }
#if KG_BLOCK
    acc = kg_bred(acc, sm);
#else
    acc = kg_gred<KG_GROUP>(acc);
#endif
#if KG_MODE == 2
    const A mean = acc / (A)count;
    acc = (A)0;
    for (long long ro = 0; ro < nro; ++ro) {
      long long off = base;
      kg_red_offset(off, ro, g);
#if KG_V > 1
      const uint4* p4 = reinterpret_cast<const uint4*>(x + off);
      for (long long i = lane; i < live_run / KG_V; i += G) {
        const uint4 u = p4[i];
        const T_x* e = reinterpret_cast<const T_x*>(&u);
#pragma unroll
        for (int j = 0; j < KG_V; ++j) {
          const A v = kg_ld(e[j]);
          acc += (v - mean) * (v - mean);
        }
      }
#else
      const T_x* p = x + off;
      for (long long i = lane; i < live_run; i += G) {
        const A v = kg_ld(p[i]);
        acc += (v - mean) * (v - mean);
      }
#endif
    }
#if KG_BLOCK
    acc = kg_bred(acc, sm);
#else
    acc = kg_gred<KG_GROUP>(acc);
#endif
    const A r = (A)((double)acc / ((double)count - correction));
#elif KG_MODE == 1
    const A r = acc / (A)count;
#else
    const A r = acc;
#endif
    if (lane == 0 && o < outputs) y[o] = KG_STORE(r);
  }
}
#undef KG_BLOCK
#undef KG_GROUP
#undef KG_V
