// Reduction of few long rows split across blocks, first pass (kernels/reduce.cpp; the split:
// plan.h's split_rows). The reduced elements of output o, in the order of reduce_rows.cuh (nro
// runs of `run` elements, the last reduced dim fastest), are cut into `splits` chunks of
// `chunk` elements (the last may be shorter), chunk c of output o being work item o * splits +
// c, one 256-thread block each. Each block combines its chunk (walking the runs it covers, KG_V
// elements at a time as 16-byte words when KG_V > 1) and writes the result to the workspace:
// KG_MODE 0 and 1 the combination in ws[item]; KG_MODE 2 the chunk's mean and sum of squared
// deviations from it (two passes over the chunk) in ws[2 * item] and ws[2 * item + 1].
// reduce_split_done.cuh combines the chunks. The kernel is kg_reduce_split_v<KG_V>.
//
// Expects reduce_common.cuh, KG_MODE and KG_V (1, 2, 4, 8 or 16), with run and chunk multiples
// of KG_V; undefines KG_V at the end, so that a source can append this file once per vector
// width.
#if KG_V == 1
extern "C" __global__ void kg_reduce_split_v1(const T_x* __restrict__ x, A* __restrict__ ws, Side g, long long outputs,
                                              long long run, long long count, long long splits, long long chunk) {
#elif KG_V == 2
extern "C" __global__ void kg_reduce_split_v2(const T_x* __restrict__ x, A* __restrict__ ws, Side g, long long outputs,
                                              long long run, long long count, long long splits, long long chunk) {
#elif KG_V == 4
extern "C" __global__ void kg_reduce_split_v4(const T_x* __restrict__ x, A* __restrict__ ws, Side g, long long outputs,
                                              long long run, long long count, long long splits, long long chunk) {
#elif KG_V == 8
extern "C" __global__ void kg_reduce_split_v8(const T_x* __restrict__ x, A* __restrict__ ws, Side g, long long outputs,
                                              long long run, long long count, long long splits, long long chunk) {
#elif KG_V == 16
extern "C" __global__ void kg_reduce_split_v16(const T_x* __restrict__ x, A* __restrict__ ws, Side g, long long outputs,
                                               long long run, long long count, long long splits, long long chunk) {
#else
#error "KG_V must be 1, 2, 4, 8 or 16"
#endif
  __shared__ A sm[33];
  for (long long item = blockIdx.x; item < outputs * splits; item += gridDim.x) {
    const long long o = item / splits, lo = (item % splits) * chunk;
    const long long hi = lo + chunk < count ? lo + chunk : count;
    long long base = 0;
    kg_kept_offset(base, o, g);
    A acc = KG_IDENTITY;
    // Run ro holds reduced elements [ro * run, ro * run + run); the chunk covers [lo, hi) of them.
    for (long long ro = lo / run; ro * run < hi; ++ro) {
      long long off = base;
      kg_red_offset(off, ro, g);
      const long long a = lo > ro * run ? lo - ro * run : 0, z = hi < ro * run + run ? hi - ro * run : run;
#if KG_V > 1
      const uint4* p4 = reinterpret_cast<const uint4*>(x + off);
      for (long long i = a / KG_V + threadIdx.x; i < z / KG_V; i += blockDim.x) {
        const uint4 u = p4[i];
        const T_x* e = reinterpret_cast<const T_x*>(&u);
#pragma unroll
        for (int j = 0; j < KG_V; ++j) acc = kg_comb(acc, kg_ld(e[j]));
      }
#else
      const T_x* p = x + off;
      for (long long i = a + threadIdx.x; i < z; i += blockDim.x) acc = kg_comb(acc, kg_ld(p[i]));
#endif
    }
    acc = kg_bred(acc, sm);
#if KG_MODE == 2
    const A mean = acc / (A)(hi - lo);
    A q = (A)0;
    for (long long ro = lo / run; ro * run < hi; ++ro) {
      long long off = base;
      kg_red_offset(off, ro, g);
      const long long a = lo > ro * run ? lo - ro * run : 0, z = hi < ro * run + run ? hi - ro * run : run;
#if KG_V > 1
      const uint4* p4 = reinterpret_cast<const uint4*>(x + off);
      for (long long i = a / KG_V + threadIdx.x; i < z / KG_V; i += blockDim.x) {
        const uint4 u = p4[i];
        const T_x* e = reinterpret_cast<const T_x*>(&u);
#pragma unroll
        for (int j = 0; j < KG_V; ++j) {
          const A v = kg_ld(e[j]);
          q += (v - mean) * (v - mean);
        }
      }
#else
      const T_x* p = x + off;
      for (long long i = a + threadIdx.x; i < z; i += blockDim.x) {
        const A v = kg_ld(p[i]);
        q += (v - mean) * (v - mean);
      }
#endif
    }
    q = kg_bred(q, sm);
    if (threadIdx.x == 0) {
      ws[2 * item] = mean;
      ws[2 * item + 1] = q;
    }
#else
    if (threadIdx.x == 0) ws[item] = acc;
#endif
  }
}
#undef KG_V
