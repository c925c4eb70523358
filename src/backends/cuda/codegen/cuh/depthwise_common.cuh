// Helpers of the generated depthwise conv (codegen/depthwise_source.cpp has the design), once per
// source before its kernels (depthwise_kernel.cuh). Compiled by NVRTC after the prelude and:
//   T          typedef: the storage type of x, w, bias, residual and y
//   KD_ACT(v)  the activation of float v (a prelude kiln_<name> call, or v itself)
// Loads / stores V elements of T as one word VW, converted to / from float.
template <int V, typename VW>
__device__ __forceinline__ void kd_ld(const T* __restrict__ p, float (&f)[V]) {
  const VW u = *reinterpret_cast<const VW*>(p);
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int v = 0; v < V; ++v) f[v] = to_float(e[v]);
}
template <int V, typename VW>
__device__ __forceinline__ void kd_st(T* __restrict__ p, const float (&f)[V]) {
  VW u;
  T* e = reinterpret_cast<T*>(&u);
#pragma unroll
  for (int v = 0; v < V; ++v) e[v] = from_float<T>(f[v]);
  *reinterpret_cast<VW*>(p) = u;
}
// Pixel group gi -> (n, oh, column group gw); 32-bit division while gi fits (the usual case).
__device__ __forceinline__ void kd_split(long long gi, int owg, int OH, int& n, int& oh, int& gw) {
  if (gi <= 0x7fffffffLL) {
    const unsigned g = (unsigned)gi, r = g / (unsigned)owg;
    gw = (int)(g - r * (unsigned)owg), oh = (int)(r % (unsigned)OH), n = (int)(r / (unsigned)OH);
  } else {
    const long long r = gi / owg;
    gw = (int)(gi - r * owg), oh = (int)(r % OH), n = (int)(r / OH);
  }
}
// V staged f32 weights (float4 loads when V allows).
template <int V>
__device__ __forceinline__ void kd_ldw(const float* p, float (&f)[V]) {
  if (V % 4 == 0) {
#pragma unroll
    for (int i = 0; i < V / 4; ++i) {
      const float4 q = reinterpret_cast<const float4*>(p)[i];
      f[4 * i] = q.x, f[4 * i + 1] = q.y, f[4 * i + 2] = q.z, f[4 * i + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) f[v] = p[v];
  }
}

__device__ __forceinline__ float kd_act(float v) { return KD_ACT(v); }
