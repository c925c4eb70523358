// gather (torch.gather) of the gather family (kernels/gather.cpp has the design). Compiled by
// NVRTC after plan.h's source_head() and its `Dims` struct, and these definitions:
//   W               typedef: the word type of one element
//   I               typedef: the index type (long long or int)
//   KG_GATHER_RANK  dims of the index (and output) walk, 1 to 8
// One thread per output element: the input offset of every dim but the axis (d.ist is 0 there)
// plus the index value times axis_stride; an index outside [-dim, dim) gives a zero element.
extern "C" __global__ void kg_gather(const W* __restrict__ x, const I* __restrict__ index, W* __restrict__ y, Dims d,
                                     long long axis_stride, long long dim, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    long long r = i, off = 0;
#pragma unroll
    for (int k = KG_GATHER_RANK - 1; k >= 0; --k) {
      const long long c = r % d.ext[k];
      r /= d.ext[k];
      off += c * d.ist[k];
    }
    long long v = (long long)index[i];
    if (v < 0) v += dim;
    y[i] = (v >= 0 && v < dim) ? x[off + v * axis_stride] : (W)0;
  }
}
