// batch_norm (kernels/norm.cpp): kg_bn_prep folds the running statistics into a per-channel
// scale and shift (ss[c], ss[C + c]; f64 arithmetic as on the CPU), then kg_bn_apply computes
// y = x * scale + shift, with 32-bit indices while they fit.
//
// Expects T_x, ld_x, st_x, A (the compute type), T_p0 .. T_p3 with ld_p0 .. ld_p3 (mean, var,
// weight, bias), and KG_HAS_W and KG_HAS_B.
extern "C" __global__ void kg_bn_prep(const T_p0* __restrict__ mean, const T_p1* __restrict__ var,
                                      const T_p2* __restrict__ w, const T_p3* __restrict__ b, A* __restrict__ ss,
                                      long long C, double eps) {
  for (long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x; c < C; c += (long long)gridDim.x * blockDim.x) {
#if KG_HAS_W
    const double sc = (double)ld_p2(w[c]) / sqrt((double)ld_p1(var[c]) + eps);
#else
    const double sc = 1.0 / sqrt((double)ld_p1(var[c]) + eps);
#endif
    ss[c] = (A)sc;
#if KG_HAS_B
    ss[C + c] = (A)((double)ld_p3(b[c]) - (double)ld_p0(mean[c]) * sc);
#else
    ss[C + c] = (A)(0.0 - (double)ld_p0(mean[c]) * sc);
#endif
  }
}
extern "C" __global__ void kg_bn_apply(const T_x* __restrict__ x, const A* __restrict__ ss, T_x* __restrict__ y,
                                       long long numel, long long C, long long S) {
  if (numel < 2147483647LL) {
    const unsigned n32 = (unsigned)numel, C32 = (unsigned)C, S32 = (unsigned)S;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n32; i += gridDim.x * blockDim.x) {
      const unsigned c = (i / S32) % C32;
      y[i] = st_x(ld_x(x[i]) * ss[c] + ss[C32 + c]);
    }
  } else {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < numel;
         i += (long long)gridDim.x * blockDim.x) {
      const long long c = (i / S) % C;
      y[i] = st_x(ld_x(x[i]) * ss[c] + ss[C + c]);
    }
  }
}
#undef KG_HAS_W
#undef KG_HAS_B
