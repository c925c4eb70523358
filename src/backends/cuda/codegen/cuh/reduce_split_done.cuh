// Reduction of few long rows split across blocks, second pass (kernels/reduce.cpp): a block per
// output combines the `splits` chunk results reduce_split.cuh left in the workspace, in the
// same order for every run, and writes the output. KG_MODE 0: the combination; 1: the mean
// (the sum / count); 2: the variance, from the chunks' means and sums of squared deviations
// combined in double (mean = sum n_c mean_c / count, M2 = sum M2_c + n_c (mean_c - mean)^2),
// M2 / (count - correction) as reduce_rows.cuh.
//
// Expects reduce_common.cuh and KG_MODE.
extern "C" __global__ void kg_reduce_split_done(const A* __restrict__ ws, T_x* __restrict__ y, long long outputs,
                                                long long splits, long long chunk, long long count, double correction) {
#if KG_MODE == 2
  __shared__ double smd[33];
#else
  __shared__ A sm[33];
#endif
  for (long long o = blockIdx.x; o < outputs; o += gridDim.x) {
#if KG_MODE == 2
    const A* st = ws + 2 * o * splits;
    double t = 0;
    for (long long k = threadIdx.x; k < splits; k += blockDim.x) {
      const long long nk = count - k * chunk < chunk ? count - k * chunk : chunk;
      t += (double)nk * (double)st[2 * k];
    }
    const double mean = kg_block_sum(t, smd) / (double)count;
    t = 0;
    for (long long k = threadIdx.x; k < splits; k += blockDim.x) {
      const long long nk = count - k * chunk < chunk ? count - k * chunk : chunk;
      const double d = (double)st[2 * k] - mean;
      t += (double)st[2 * k + 1] + (double)nk * d * d;
    }
    const double m2 = kg_block_sum(t, smd);
    const A r = (A)(m2 / ((double)count - correction));
#else
    const A* st = ws + o * splits;
    A acc = KG_IDENTITY;
    for (long long k = threadIdx.x; k < splits; k += blockDim.x) acc = kg_comb(acc, st[k]);
    acc = kg_bred(acc, sm);
#if KG_MODE == 1
    const A r = acc / (A)count;
#else
    const A r = acc;
#endif
#endif
    if (threadIdx.x == 0) y[o] = KG_STORE(r);
  }
}
