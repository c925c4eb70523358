// pad of the shape family (kernels/shape.cpp: gen_pad has the design). Compiled by NVRTC after
// plan.h's source_head(); the generator writes one extern "C" kernel per variant, a call of:
//   kg_pad<MODE, RANK, W, I>                one output element per thread
//   kg_pad_rows<MODE, RANK, E, O, COLS, I>  one output row of COLS elements E per thread,
//                                           stored as one word O
// MODE is a KgPadMode, RANK the walked dims, I the index type (int, or long long past 2^30).

// Sizes of the walked dims, passed by value (the generator's PadDims has this layout).
struct PadDims {
  long long oext[8];
  long long iext[8];
  long long before[8];
  long long ist[8];
};

enum KgPadMode { kg_mode_constant = 0, kg_mode_reflect = 1, kg_mode_replicate = 2 };

template <int MODE, int RANK, typename W, typename I>
__device__ __forceinline__ void kg_pad(const W* __restrict__ x, W* __restrict__ y, PadDims p, unsigned long long fill,
                                       long long n) {
  const W f = (W)fill;
  for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < (I)n; i += (I)gridDim.x * blockDim.x) {
    I r = i, io = 0;
    bool inside = true;
#pragma unroll
    for (int k = RANK - 1; k >= 0; --k) {
      const I e = (I)p.oext[k], ie = (I)p.iext[k];
      const I c = r % e;
      r /= e;
      I j = c - (I)p.before[k];
      // The input coordinate output coordinate j (less the padding before it) reads; constant
      // padding instead clears `inside` outside the input.
      if constexpr (MODE == kg_mode_reflect) j = j < 0 ? -j : (j >= ie ? 2 * (ie - 1) - j : j);
      else if constexpr (MODE == kg_mode_replicate) j = j < 0 ? 0 : (j >= ie ? ie - 1 : j);
      else inside = inside && j >= 0 && j < ie;
      io += j * (I)p.ist[k];
    }
    y[i] = inside ? x[io] : f;
  }
}

template <int MODE, int RANK, typename E, typename O, int COLS, typename I>
__device__ __forceinline__ void kg_pad_rows(const E* __restrict__ x, O* __restrict__ y, PadDims p,
                                            unsigned long long fill, long long n) {
  const E f = (E)fill;
  for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < (I)n; i += (I)gridDim.x * blockDim.x) {
    I r = i, io = 0;
    bool inside = true;
#pragma unroll
    for (int k = RANK - 2; k >= 0; --k) {
      const I e = (I)p.oext[k], ie = (I)p.iext[k];
      const I c = r % e;
      r /= e;
      I j = c - (I)p.before[k];
      if constexpr (MODE == kg_mode_reflect) j = j < 0 ? -j : (j >= ie ? 2 * (ie - 1) - j : j);
      else if constexpr (MODE == kg_mode_replicate) j = j < 0 ? 0 : (j >= ie ? ie - 1 : j);
      else inside = inside && j >= 0 && j < ie;
      io += j * (I)p.ist[k];
    }
    const I ie = (I)p.iext[RANK - 1], st = (I)p.ist[RANK - 1], b = (I)p.before[RANK - 1];
    union {
      O word;
      E e[COLS];
    } row;
#pragma unroll
    for (int c = 0; c < COLS; ++c) {
      I j = c - b;
      bool in = inside;
      if constexpr (MODE == kg_mode_reflect) j = j < 0 ? -j : (j >= ie ? 2 * (ie - 1) - j : j);
      else if constexpr (MODE == kg_mode_replicate) j = j < 0 ? 0 : (j >= ie ? ie - 1 : j);
      else in = in && j >= 0 && j < ie;
      row.e[c] = in ? x[io + j * st] : f;
    }
    y[i] = row.word;
  }
}
