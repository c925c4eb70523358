// checksum64 (byte_io.h): the chunks of large data summed on several threads.
#include "src/serialize/byte_io.h"

#include <algorithm>
#include <thread>

#include "src/common/run_parts.h"

namespace kiln::serialize {

uint64_t checksum64(const uint8_t* data, size_t n) {
  using checksum_detail::block_sum;
  if (n <= kChecksumChunk) return block_sum(data, n);
  const size_t chunks = (n + kChecksumChunk - 1) / kChecksumChunk;
  std::vector<uint8_t> sums(chunks * 8);
  auto sum_chunks = [&](size_t first, size_t end) {
    for (size_t c = first; c < end; ++c) {
      const size_t at = c * kChecksumChunk;
      const uint64_t h = block_sum(data + at, std::min(kChecksumChunk, n - at));
      for (int b = 0; b < 8; ++b) sums[c * 8 + size_t(b)] = uint8_t(h >> (8 * b));
    }
  };
  // A thread per 8 chunks at least (starting one costs ~0.1 ms, a chunk ~0.1-0.3 ms), 8 at most:
  // the sum is bound by memory bandwidth well before that.
  const size_t hw = std::max<size_t>(1, std::thread::hardware_concurrency());
  const size_t threads = std::max<size_t>(1, std::min({hw, size_t(8), chunks / 8}));
  run_parts(threads, [&](size_t t) { sum_chunks(chunks * t / threads, chunks * (t + 1) / threads); });
  return block_sum(sums.data(), sums.size());
}

}  // namespace kiln::serialize
