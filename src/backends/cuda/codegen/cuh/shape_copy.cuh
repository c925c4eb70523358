// The strided copy and the tiled transpose of the shape family (kernels/shape.cpp has the
// design). Compiled by NVRTC after plan.h's source_head() and its `Dims` struct; the generator
// writes one extern "C" kernel per variant, a call of these templates:
//   kg_copy<RANK, W, I, OUT_CONTIG>   RANK dims walked, W the word moved, I the index type
//                                     (unsigned int, or unsigned long long past 2^31 words),
//                                     OUT_CONTIG: the output is written in order (y[i])
//   kg_transpose<BATCH_RANK, W>       32 x 32 tiles through shared memory, BATCH_RANK outer dims

// One thread per word (grid-stride): word i of the row-major walk of d.ext reads the input at
// sum(c_k * d.ist[k]) and writes the output at sum(c_k * d.ost[k]).
template <int RANK, typename W, typename I, bool OUT_CONTIG>
__device__ __forceinline__ void kg_copy(const W* __restrict__ x, W* __restrict__ y, Dims d, long long n) {
  for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < (I)n; i += (I)gridDim.x * blockDim.x) {
    I r = i;
    long long io = 0, oo = 0;
#pragma unroll
    for (int k = RANK - 1; k > 0; --k) {
      const I e = (I)d.ext[k];
      const I c = r % e;
      r /= e;
      io += (long long)c * d.ist[k];
      oo += (long long)c * d.ost[k];
    }
    io += (long long)r * d.ist[0];
    oo += (long long)r * d.ost[0];
    if constexpr (OUT_CONTIG) y[i] = x[io];
    else y[oo] = x[io];
  }
}

// Block (tile t, batch b): a 32 x 32 tile of an [L, D] plane read with D contiguous in x (row
// stride sl) and written with L contiguous in y (row stride od); d walks the batch dims.
template <int BATCH_RANK, typename W>
__device__ __forceinline__ void kg_transpose(const W* __restrict__ x, W* __restrict__ y, Dims d, long long L,
                                             long long sl, long long D, long long od, long long tilesL,
                                             long long batch) {
  __shared__ W tile[32][33];
  const long long t = blockIdx.x, l0 = (t % tilesL) * 32, d0 = (t / tilesL) * 32;
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (long long b = blockIdx.y; b < batch; b += gridDim.y) {
    long long r = b, io = 0, oo = 0;
#pragma unroll
    for (int k = BATCH_RANK - 1; k >= 0; --k) {
      const long long c = r % d.ext[k];
      r /= d.ext[k];
      io += c * d.ist[k];
      oo += c * d.ost[k];
    }
    for (int j = ty; j < 32; j += 8)
      if (l0 + j < L && d0 + tx < D) tile[j][tx] = x[io + (l0 + j) * sl + d0 + tx];
    __syncthreads();
    for (int j = ty; j < 32; j += 8)
      if (d0 + j < D && l0 + tx < L) y[oo + (d0 + j) * od + l0 + tx] = tile[tx][j];
    __syncthreads();
  }
}
