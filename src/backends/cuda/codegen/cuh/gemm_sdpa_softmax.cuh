// The masked softmax of attention's fallback path and its pointer arrays
// (codegen/gemm_sources.h: sdpa_softmax_source). Compiled by NVRTC after the prelude and these
// definitions:
//   T          typedef: the storage type of the probabilities
//   MT         typedef: the mask's element type (bool, or T for an additive mask)
//   KILN_MASK  0 no mask, 1 bool mask (keep where true), 2 additive mask
struct KilnDims {
  long long size[8];
  long long stride[8];
};
#define KILN_NEG_INF __int_as_float(0xff800000)

// One warp per score row: coalesced loads, the prelude's shuffle reductions, no block
// barriers. The second and third pass over a row read it from L1.
extern "C" __global__ void kiln_sdpa_softmax_w(const float* scores, T* probs, const MT* __restrict__ mask,
                                               long long rows, int L, int S, long long row0, int brank, KilnDims md,
                                               long long mrs, long long mcs, int causal) {
  const int lane = threadIdx.x & 31, warps_per_block = blockDim.x >> 5;
  const long long stride = (long long)gridDim.x * warps_per_block;
  for (long long r = (long long)blockIdx.x * warps_per_block + (threadIdx.x >> 5); r < rows; r += stride) {
    const long long g = row0 + r;
    const int i = (int)(g % L);
    const float* srow = scores + r * S;
    T* prow = probs + r * S;
#if KILN_MASK
    long long moff = (long long)i * mrs, rem = g / L;
#pragma unroll
    for (int d = 7; d >= 0; --d) {
      if (d >= brank) continue;
      moff += (rem % md.size[d]) * md.stride[d];
      rem /= md.size[d];
    }
    const MT* mrow = mask + moff;
#endif
    const int valid = causal ? min(S, i + 1) : S;
#if KILN_MASK == 1
#define KILN_SCORE(j) (mrow[(long long)(j) * mcs] ? srow[j] : KILN_NEG_INF)
#elif KILN_MASK == 2
#define KILN_SCORE(j) (srow[j] + to_float(mrow[(long long)(j) * mcs]))
#else
#define KILN_SCORE(j) (srow[j])
#endif
    float mx = KILN_NEG_INF;
    for (int j = lane; j < valid; j += 32) mx = fmaxf(mx, KILN_SCORE(j));
    mx = kiln_warp_max(mx);
    float sum = 0.0f;
    if (mx != KILN_NEG_INF)
      for (int j = lane; j < valid; j += 32) sum += expf(KILN_SCORE(j) - mx);
    sum = kiln_warp_sum(sum);
    const float inv = (mx == KILN_NEG_INF || !(sum > 0.0f)) ? 0.0f : 1.0f / sum;
    // probs may alias scores (f32): each lane reads element j before it writes it.
    for (int j = lane; j < S; j += 32) {
      const float p = (j < valid && inv != 0.0f) ? expf(KILN_SCORE(j) - mx) * inv : 0.0f;
      prow[j] = from_float<T>(p);
    }
  }
}

// The pointer arrays of a pointer-array fallback: for batch i (row-major over the output batch
// dims, sizes in kd.size) the k, q, v and out matrices at each operand's batch strides, and
// the i-th scores / probs matrix, written as six arrays of nb pointers.
extern "C" __global__ void kiln_sdpa_ptrs(long long nb, int brank, KilnDims kd, KilnDims qd, KilnDims vd, KilnDims od,
                                          const char* k, const char* q, const char* v, char* o, char* scores,
                                          char* probs, long long es, long long score_bytes, long long prob_bytes,
                                          const void** arr) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nb) return;
  long long rem = i, ko = 0, qo = 0, vo = 0, oo = 0;
#pragma unroll
  for (int d = 7; d >= 0; --d) {
    if (d >= brank) continue;
    const long long x = rem % kd.size[d];
    rem /= kd.size[d];
    ko += x * kd.stride[d], qo += x * qd.stride[d], vo += x * vd.stride[d], oo += x * od.stride[d];
  }
  arr[i] = k + ko * es;
  arr[nb + i] = q + qo * es;
  arr[2 * nb + i] = v + vo * es;
  arr[3 * nb + i] = o + oo * es;
  arr[4 * nb + i] = scores + i * score_bytes;
  arr[5 * nb + i] = probs + i * prob_bytes;
}
