// The word checksum of device memory (device/checksum.cpp; kiln/backend.h defines it), one
// launch per buffer. Compiled by NVRTC alone after these definitions:
//   KILN_WORD_MIX1, KILN_WORD_MIX2   the checksum's multipliers (kWordMix1 / kWordMix2) as
//                                    unsigned long long literals
// Word j of the buffer (zero-padded past its end) is word first + j of the whole sum; each
// block adds its words' mixed sum to *sum (modular, so the order does not matter).
typedef unsigned long long u64;
extern "C" __global__ void kiln_word_checksum(const unsigned char* p, u64 bytes, u64 first, u64* sum) {
  const u64 words = (bytes + 7) / 8;
  const bool aligned = (reinterpret_cast<u64>(p) & 7) == 0;
  u64 s = 0;
  for (u64 j = blockIdx.x * (u64)blockDim.x + threadIdx.x; j < words; j += (u64)gridDim.x * blockDim.x) {
    u64 w = 0;
    if (aligned && 8 * j + 8 <= bytes) {
      w = reinterpret_cast<const u64*>(p)[j];
    } else {
      for (u64 b = 0; b < 8 && 8 * j + b < bytes; ++b) w |= (u64)p[8 * j + b] << (8 * b);
    }
    u64 m = (w ^ ((first + j) * KILN_WORD_MIX1)) * KILN_WORD_MIX2;
    s += m ^ (m >> 29);
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
  __shared__ u64 warp_sums[32];
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    u64 t = 0;
    for (unsigned k = 0; k < blockDim.x / 32; ++k) t += warp_sums[k];
    atomicAdd(sum, t);
  }
}
