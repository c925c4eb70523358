// The pointer arrays of a pointer-array matmul (codegen/gemm_sources.h: gemm_pointers_source):
// operands whose batches no single stride reaches (views of [B, S, H, D] buffers, broadcasts of
// one operand over a batch dim) run as one cuBLASLt launch over arrays of matrix pointers,
// written here each run from the operands' batch strides. Compiled by NVRTC after the prelude.
struct KilnDims {
  long long size[8];
  long long stride[8];
};

// One thread per batch i (row-major over the output batch dims ad.size): arr[i], arr[nb + i]
// and arr[2 * nb + i] point at batch i's matrix of a, b and d, each at its own batch strides
// (ad, bd, dd .stride, elements of ab_bytes / d_bytes).
extern "C" __global__ void kiln_gemm_ptrs(long long nb, int brank, KilnDims ad, KilnDims bd, KilnDims dd, const char* a,
                                          const char* b, char* d, long long ab_bytes, long long d_bytes,
                                          const void** arr) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= nb) return;
  long long rem = i, ao = 0, bo = 0, o = 0;
#pragma unroll
  for (int k = 7; k >= 0; --k) {  // constant indices keep the dims off the stack
    if (k >= brank) continue;
    const long long x = rem % ad.size[k];
    rem /= ad.size[k];
    ao += x * ad.stride[k], bo += x * bd.stride[k], o += x * dd.stride[k];
  }
  arr[i] = a + ao * ab_bytes;
  arr[nb + i] = b + bo * ab_bytes;
  arr[2 * nb + i] = d + o * d_bytes;
}
