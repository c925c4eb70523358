// arange of the generator family (kernels/generator.cpp). Compiled by NVRTC after plan.h's
// source_head() and these definitions:
//   T                 typedef: the output's storage type
//   KG_ARANGE_CONVERT how a double becomes a T: 0 a C cast (integers truncate), 1 through float
//                     (f16 / bf16), 2 bool (!= 0)
// Element i is start + i * step in double, then converted.
extern "C" __global__ void kg_arange(T* __restrict__ y, double start, double step, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const double v = start + (double)i * step;
#if KG_ARANGE_CONVERT == 1
    y[i] = from_float<T>((float)v);
#elif KG_ARANGE_CONVERT == 2
    y[i] = v != 0.0;
#else
    y[i] = (T)v;
#endif
  }
}
