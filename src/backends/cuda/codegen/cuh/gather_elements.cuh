// gather (torch.gather) of the gather family (kernels/gather.cpp has the design). Compiled by
// NVRTC after plan.h's source_head() and its `Dims` struct, and these definitions:
//   W               typedef: the word type of one element
//   I               typedef: the index type (long long or int)
//   KG_GATHER_RANK  dims of the index (and output) walk, 1 to 8
//   P               typedef: the position type, unsigned int where every offset fits in 31 bits
//                   (32-bit division is several times cheaper than 64-bit), else long long
// One thread per output element: the input offset of every dim but the axis (d.ist is 0 there)
// plus the index value times axis_stride; the index is read at strides d.ost (0 where it
// broadcasts). An index outside [-dim, dim) gives a zero element.
extern "C" __global__ void kg_gather(const W* __restrict__ x, const I* __restrict__ index, W* __restrict__ y, Dims d,
                                     long long axis_stride, long long dim, long long n) {
  for (P i = blockIdx.x * (P)blockDim.x + threadIdx.x; i < (P)n; i += (P)gridDim.x * blockDim.x) {
    P r = i, off = 0, ioff = 0;
#pragma unroll
    for (int k = KG_GATHER_RANK - 1; k >= 0; --k) {
      const P e = (P)d.ext[k];
      const P c = r % e;
      r /= e;
      off += c * (P)d.ist[k];
      ioff += c * (P)d.ost[k];
    }
    long long v = (long long)index[ioff];
    if (v < 0) v += dim;
    y[i] = (v >= 0 && v < dim) ? x[off + (P)v * (P)axis_stride] : (W)0;
  }
}
