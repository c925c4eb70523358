// The epilogue after a cuBLASLt GEMM (codegen/gemm_sources.h: gemm_epilogue_source): in place,
// y = act(y + residual[broadcast]). Compiled by NVRTC after the prelude and these definitions:
//   T              typedef: the storage type of y and the residual
//   KILN_RESIDUAL  1 when a residual is added, else 0
//   KILN_ACT(x)    the activation of float x (a prelude kiln_<name> call, or x itself)
struct KilnDims {
  long long size[8];
  long long stride[8];
};

__device__ __forceinline__ float kiln_act(float x) { return KILN_ACT(x); }

// rd.size: the output's (collapsed) dims, rd.stride: the residual's strides (0 where it
// broadcasts); r may be null without a residual.
extern "C" __global__ void kiln_gemm_epilogue(T* y, const T* __restrict__ r, long long n, int rank, KilnDims rd) {
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    float v = to_float(y[i]);
#if KILN_RESIDUAL
    long long rem = i, off = 0;
#pragma unroll
    for (int d = 7; d >= 0; --d) {  // constant indices keep rd off the stack
      if (d >= rank) continue;
      const long long sz = rd.size[d];
      off += (rem % sz) * rd.stride[d];
      rem /= sz;
    }
    v += to_float(r[off]);
#endif
    y[i] = from_float<T>(kiln_act(v));
  }
}

// The activation alone, 16 bytes per thread step.
extern "C" __global__ void kiln_gemm_epilogue_vec(T* y, long long nvec) {
  const int kPer = 16 / sizeof(T);
  const long long step = (long long)gridDim.x * blockDim.x;
  uint4* yv = reinterpret_cast<uint4*>(y);
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += step) {
    uint4 u = yv[i];
    T* e = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int j = 0; j < kPer; ++j) e[j] = from_float<T>(kiln_act(to_float(e[j])));
    yv[i] = u;
  }
}
