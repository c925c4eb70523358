// The fill kernel that stands in for a recorded graph's small memset nodes
// (device/cuda_util.cpp: small_memsets_as_kernels). Compiled by NVRTC alone; expects no
// definitions. Element i of a pitched 2D memset (rows of `width` elements of `elem` bytes, 1, 2
// or 4, `pitch` bytes apart) is set to `value`.
extern "C" __global__ void kiln_fill(unsigned char* dst, unsigned long long pitch, unsigned value, unsigned elem,
                                     unsigned long long width, unsigned long long count) {
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < count;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    unsigned char* p = dst + (i / width) * pitch + (i % width) * elem;
    if (elem == 4) *reinterpret_cast<unsigned*>(p) = value;
    else if (elem == 2) *reinterpret_cast<unsigned short*>(p) = (unsigned short)value;
    else *p = (unsigned char)value;
  }
}
