// A fill (codegen/plan.h: add_fill): kg_fill_<B> writes n words of B bytes, each the low B
// bytes of `pat`, grid-stride. Expects KG_FILL_BYTES, the word size B (1, 2, 4, 8 or 16);
// undefines it at the end, so that a source can append this file once per word size.
#if KG_FILL_BYTES == 1
extern "C" __global__ void kg_fill_1(unsigned char* y, uint4 pat, long long n) {
  typedef unsigned char W;
#elif KG_FILL_BYTES == 2
extern "C" __global__ void kg_fill_2(unsigned short* y, uint4 pat, long long n) {
  typedef unsigned short W;
#elif KG_FILL_BYTES == 4
extern "C" __global__ void kg_fill_4(unsigned int* y, uint4 pat, long long n) {
  typedef unsigned int W;
#elif KG_FILL_BYTES == 8
extern "C" __global__ void kg_fill_8(unsigned long long* y, uint4 pat, long long n) {
  typedef unsigned long long W;
#elif KG_FILL_BYTES == 16
extern "C" __global__ void kg_fill_16(uint4* y, uint4 pat, long long n) {
  typedef uint4 W;
#else
#error "KG_FILL_BYTES must be 1, 2, 4, 8 or 16"
#endif
  const W v = *reinterpret_cast<const W*>(&pat);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    y[i] = v;
}
#undef KG_FILL_BYTES
