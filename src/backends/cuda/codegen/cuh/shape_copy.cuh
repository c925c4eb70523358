// The strided copy and the tiled transpose of the shape family (kernels/shape.cpp has the
// design). Compiled by NVRTC after plan.h's source_head() and its `Dims` struct; the generator
// writes one extern "C" kernel per variant, a call of these templates:
//   kg_copy<RANK, W, I, OUT_CONTIG>   RANK dims walked, W the word moved, I the index type
//                                     (unsigned int, or unsigned long long past 2^31 words),
//                                     OUT_CONTIG: the output is written in order (y[i])
//   kg_transpose<BATCH_RANK, W>       32 x 32 tiles through shared memory, BATCH_RANK outer dims
//   kg_transpose_pairs<BATCH_RANK>    2-byte elements in 64 x 64 tiles, moved as 4-byte pairs
//   kg_concat<W, I>                   up to 8 parts of a concat written by one launch

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

// kg_transpose for 2-byte elements, moved as pairs: a 64 x 64 tile is read as pairs along D (the
// input's contiguous dim) and written as pairs along L (the output's), each warp row 128 bytes.
// L, D, sl, od and every batch stride are even and the buffers 4-byte aligned (kernels/shape.cpp
// and the launch's fallback see to it).
template <int BATCH_RANK>
__device__ __forceinline__ void kg_transpose_pairs(const unsigned short* __restrict__ x, unsigned short* __restrict__ y,
                                                   Dims d, long long L, long long sl, long long D, long long od,
                                                   long long tilesL, long long batch) {
  __shared__ unsigned int tile[64][33];  // [l][pair of d]: one padding word keeps the columns apart
  const long long t = blockIdx.x, l0 = (t % tilesL) * 64, d0 = (t / tilesL) * 64;
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
    for (int j = ty; j < 64; j += 8)
      if (l0 + j < L && d0 + 2 * tx < D)
        tile[j][tx] = reinterpret_cast<const unsigned int*>(x + io + (l0 + j) * sl + d0)[tx];
    __syncthreads();
    for (int j = ty; j < 64; j += 8)
      if (d0 + j < D && l0 + 2 * tx < L) {
        const int shift = (j & 1) * 16;
        const unsigned int lo = (tile[2 * tx][j >> 1] >> shift) & 0xffffu;
        const unsigned int hi = (tile[2 * tx + 1][j >> 1] >> shift) & 0xffffu;
        reinterpret_cast<unsigned int*>(y + oo + (d0 + j) * od + l0)[tx] = lo | (hi << 16);
      }
    __syncthreads();
  }
}

// Up to 8 parts of a concat in one launch. The output is [outer, total] words and part k is
// [outer, start[k + 1] - start[k]] words at output column start[k]; a launch covers the columns
// [start[0], start[8]) (unused parts: start at the end, pointer null). One thread per output
// word (grid-stride): its column picks the part, without indexing the pointers at run time.
struct ConcatParts {
  long long start[9];
};

template <typename W, typename I>
__device__ __forceinline__ void kg_concat(const W* __restrict__ x0, const W* __restrict__ x1,
                                          const W* __restrict__ x2, const W* __restrict__ x3,
                                          const W* __restrict__ x4, const W* __restrict__ x5,
                                          const W* __restrict__ x6, const W* __restrict__ x7, W* __restrict__ y,
                                          ConcatParts p, long long total, long long n) {
  const W* xs[8] = {x0, x1, x2, x3, x4, x5, x6, x7};
  const I span = (I)(p.start[8] - p.start[0]);
  for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < (I)n; i += (I)gridDim.x * blockDim.x) {
    const I row = i / span;
    const long long col = p.start[0] + (long long)(i - row * span);
    const W* src = xs[0];
    long long lo = p.start[0], hi = p.start[1];
#pragma unroll
    for (int k = 1; k < 8; ++k)
      if (col >= p.start[k]) src = xs[k], lo = p.start[k], hi = p.start[k + 1];
    y[(long long)row * total + col] = src[(long long)row * (hi - lo) + (col - lo)];
  }
}
