// The word checksum (kiln/backend.h) of device memory: one launch per buffer, each block sums
// its words and adds the sum to one device word (modular, so the order does not matter). The
// kernel is one of Kiln's own, compiled by NVRTC once per process and GPU architecture (by the
// backend's warm-up, ahead of the engine cache's first fingerprint), so the weights are read
// once, with no framework operations (and none of their first-use kernel loads) in between.
#include <algorithm>
#include <string>

#include "src/backends/cuda/codegen/embedded.h"
#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/device/checksum.h"
#include "src/backends/cuda/device/cuda_util.h"

namespace kiln::cuda {

namespace {

constexpr int kThreads = 256;

std::string checksum_source() {
  return detail::concat("#define KILN_WORD_MIX1 ", kWordMix1, "ULL\n#define KILN_WORD_MIX2 ", kWordMix2, "ULL\n",
                        embedded_source("support_checksum.cuh"));
}

}  // namespace

cudaKernel_t checksum_kernel() {
  return Module::support_kernel(checksum_source(), "kiln_word_checksum", "the word checksum");
}

uint64_t word_checksum_on_device(const std::vector<Backend::Span>& buffers, cudaStream_t stream) {
  cudaKernel_t kernel = checksum_kernel();
  const int max_blocks = current_device().sm_count * 8;
  uint64_t* sum = nullptr;
  KILN_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&sum), sizeof(uint64_t), stream));
  uint64_t result = 0;
  try {
    KILN_CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(uint64_t), stream));
    uint64_t first = 0;
    for (const Backend::Span& b : buffers) {
      if (!b.bytes) continue;
      const uint64_t words = (b.bytes + 7) / 8;
      const int blocks = int(std::min<uint64_t>(uint64_t(max_blocks), (words + kThreads - 1) / kThreads));
      const auto* p = static_cast<const unsigned char*>(b.data);
      uint64_t bytes = b.bytes;
      void* args[] = {&p, &bytes, &first, &sum};
      launch(kernel, dim3(unsigned(blocks)), dim3(kThreads), args, 0, stream);
      first += words;
    }
    KILN_CUDA_CHECK(cudaMemcpyAsync(&result, sum, sizeof(uint64_t), cudaMemcpyDeviceToHost, stream));
  } catch (...) {
    (void)cudaFreeAsync(sum, stream);
    throw;
  }
  KILN_CUDA_CHECK(cudaFreeAsync(sum, stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  return result;
}

}  // namespace kiln::cuda
