// index_select of the gather family (kernels/gather.cpp has the design). Compiled by NVRTC after
// plan.h's source_head(); the generator writes one extern "C" kernel per word size, a call of
//   kg_index_select<W, I>   W the word moved, I the index type (long long or int)
// The output is [outer, count, inner] words: each thread moves one word of an inner block; an
// index outside [-dim, dim) gives a zero block.
template <typename W, typename I>
__device__ __forceinline__ void kg_index_select(const W* __restrict__ x, const I* __restrict__ index, W* __restrict__ y,
                                                long long count, long long inner, long long dim, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long j = i % inner, t = i / inner, k = t % count, o = t / count;
    long long v = (long long)index[k];
    if (v < 0) v += dim;
    W z{};
    if (v >= 0 && v < dim) z = x[(o * dim + v) * inner + j];
    y[i] = z;
  }
}
