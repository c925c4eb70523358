// Helpers of the plan-driven generated families (codegen/plan.h: source_head), after the
// prelude: the float infinity, NaN-propagating max / min, warp and block reductions over any
// arithmetic type A, and a row's mean and rstd from its sums. Expects no macros.
#define KG_INF __int_as_float(0x7f800000)
template <typename A>
__device__ __forceinline__ A kg_max(A a, A b) {
  return (b > a || b != b) ? b : a;
}
template <typename A>
__device__ __forceinline__ A kg_min(A a, A b) {
  return (b < a || b != b) ? b : a;
}
// Sum over each aligned group of G lanes (a power of two up to 32); the whole warp calls it.
template <int G, typename A>
__device__ __forceinline__ A kg_group_sum(A v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename A>
__device__ __forceinline__ A kg_warp_sum(A v) {
  return kg_group_sum<32>(v);
}
template <typename A>
__device__ __forceinline__ A kg_warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) v = kg_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// A row's mean and reciprocal standard deviation from its sum and its squared deviations' sum
// over n elements, in the compute type: f32 statistics take rsqrtf (as PyTorch's CUDA norms do;
// f64 division and square root would put a few hundred cycles on each row's critical path), f64
// statistics stay f64.
__device__ __forceinline__ float kg_row_mean(float s, long long n) { return s / (float)n; }
__device__ __forceinline__ double kg_row_mean(double s, long long n) { return s / (double)n; }
__device__ __forceinline__ float kg_row_rstd(float m2, long long n, double eps) {
  return rsqrtf(m2 / (float)n + (float)eps);
}
__device__ __forceinline__ double kg_row_rstd(double m2, long long n, double eps) {
  return 1.0 / sqrt(m2 / (double)n + eps);
}
// Block-wide sum / max (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `sm` holds 33 values of A.
template <typename A>
__device__ __forceinline__ A kg_block_sum(A v, A* sm) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = kg_warp_sum(v);
  if (nw == 1) return v;
  if (lane == 0) sm[wid] = v;
  __syncthreads();
  v = lane < nw ? sm[lane] : A(0);
  v = kg_warp_sum(v);
  __syncthreads();
  return v;
}
template <typename A>
__device__ __forceinline__ A kg_block_max(A v, A* sm, A identity) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = kg_warp_max(v);
  if (nw == 1) return v;
  if (lane == 0) sm[wid] = v;
  __syncthreads();
  v = lane < nw ? sm[lane] : identity;
  v = kg_warp_max(v);
  __syncthreads();
  return v;
}
