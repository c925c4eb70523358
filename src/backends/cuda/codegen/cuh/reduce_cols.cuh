// Reduction whose innermost run is kept (kernels/reduce.cpp): block (32, ways) makes 32
// consecutive outputs of a row, x over the run, y splitting the reduction (ways = blockDim.y,
// a power of two up to 32). Each thread keeps four partial results over rows ty, ty + ways,
// ... so four loads are in flight at once (a global average pool at batch 1 is a short
// reduction on few blocks: its time is the chain of load latencies), and the ways combine as a
// tree in shared memory. KG_MODE: 0 the combination, 1 the mean, 2 the variance (two passes).
//
// Expects reduce_common.cuh and KG_MODE.
extern "C" __global__ void kg_reduce_cols(const T_x* __restrict__ x, T_x* __restrict__ y, Side g, long long rows,
                                          long long inner, long long count, double correction) {
  __shared__ A sm[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y, ways = blockDim.y;
  const long long tiles = (inner + 31) / 32;
  for (long long t = blockIdx.x; t < rows * tiles; t += gridDim.x) {
    const long long row = t / tiles, j = (t % tiles) * 32 + tx;
    long long base = 0;
    kg_kept_offset(base, row, g);
    A acc;
    {
      A acc0 = KG_IDENTITY, acc1 = KG_IDENTITY, acc2 = KG_IDENTITY, acc3 = KG_IDENTITY;
      if (j < inner) {
        long long r = ty;
        for (; r + 3 * ways < count; r += 4 * ways) {
          long long off0 = base + j;
          kg_red_offset(off0, r + 0 * ways, g);
          const A v0 = kg_ld(x[off0]);
          long long off1 = base + j;
          kg_red_offset(off1, r + 1 * ways, g);
          const A v1 = kg_ld(x[off1]);
          long long off2 = base + j;
          kg_red_offset(off2, r + 2 * ways, g);
          const A v2 = kg_ld(x[off2]);
          long long off3 = base + j;
          kg_red_offset(off3, r + 3 * ways, g);
          const A v3 = kg_ld(x[off3]);
          acc0 = kg_comb(acc0, v0);
          acc1 = kg_comb(acc1, v1);
          acc2 = kg_comb(acc2, v2);
          acc3 = kg_comb(acc3, v3);
        }
        for (; r < count; r += ways) {
          long long off = base + j;
          kg_red_offset(off, r, g);
          const A v = kg_ld(x[off]);
          acc0 = kg_comb(acc0, v);
        }
      }
      acc = kg_comb(kg_comb(acc0, acc1), kg_comb(acc2, acc3));
    }
    sm[ty][tx] = acc;
    __syncthreads();
    for (int h = ways / 2; h > 0; h /= 2) {
      if (ty < h) sm[ty][tx] = kg_comb(sm[ty][tx], sm[ty + h][tx]);
      __syncthreads();
    }
    acc = sm[0][tx];
    __syncthreads();
#if KG_MODE == 2
    const A mean = acc / (A)count;
    {
      A acc0 = (A)0, acc1 = (A)0, acc2 = (A)0, acc3 = (A)0;
      if (j < inner) {
        long long r = ty;
        for (; r + 3 * ways < count; r += 4 * ways) {
          long long off0 = base + j;
          kg_red_offset(off0, r + 0 * ways, g);
          const A v0 = kg_ld(x[off0]);
          long long off1 = base + j;
          kg_red_offset(off1, r + 1 * ways, g);
          const A v1 = kg_ld(x[off1]);
          long long off2 = base + j;
          kg_red_offset(off2, r + 2 * ways, g);
          const A v2 = kg_ld(x[off2]);
          long long off3 = base + j;
          kg_red_offset(off3, r + 3 * ways, g);
          const A v3 = kg_ld(x[off3]);
          acc0 += (v0 - mean) * (v0 - mean);
          acc1 += (v1 - mean) * (v1 - mean);
          acc2 += (v2 - mean) * (v2 - mean);
          acc3 += (v3 - mean) * (v3 - mean);
        }
        for (; r < count; r += ways) {
          long long off = base + j;
          kg_red_offset(off, r, g);
          const A v = kg_ld(x[off]);
          acc0 += (v - mean) * (v - mean);
        }
      }
      acc = kg_comb(kg_comb(acc0, acc1), kg_comb(acc2, acc3));
    }
    sm[ty][tx] = acc;
    __syncthreads();
    for (int h = ways / 2; h > 0; h /= 2) {
      if (ty < h) sm[ty][tx] = kg_comb(sm[ty][tx], sm[ty + h][tx]);
      __syncthreads();
    }
    acc = sm[0][tx];
    __syncthreads();
    const A r = (A)((double)acc / ((double)count - correction));
#elif KG_MODE == 1
    const A r = acc / (A)count;
#else
    const A r = acc;
#endif
    if (ty == 0 && j < inner) y[row * inner + j] = KG_STORE(r);
  }
}
