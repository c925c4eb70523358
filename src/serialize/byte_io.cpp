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
  // A thread per 8 chunks at least (starting a thread costs about as much as summing a chunk),
  // 8 at most: the sum is bound by memory bandwidth well before that.
  const size_t hw = std::max<size_t>(1, std::thread::hardware_concurrency());
  const size_t threads = std::max<size_t>(1, std::min({hw, size_t(8), chunks / 8}));
  run_parts(threads, [&](size_t t) { sum_chunks(chunks * t / threads, chunks * (t + 1) / threads); });
  return block_sum(sums.data(), sums.size());
}

size_t utf8_invalid_at(const uint8_t* p, size_t n) {
  size_t i = 0;
  while (i < n) {
    const uint8_t b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    // The sequence length and the range of its second byte (which rules out overlong forms,
    // surrogates and code points past U+10FFFF); later bytes are 0x80..0xbf.
    size_t len;
    uint8_t lo = 0x80, hi = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) len = 2;
    else if (b == 0xe0) len = 3, lo = 0xa0;
    else if (b == 0xed) len = 3, hi = 0x9f;
    else if (b >= 0xe1 && b <= 0xef) len = 3;
    else if (b == 0xf0) len = 4, lo = 0x90;
    else if (b == 0xf4) len = 4, hi = 0x8f;
    else if (b >= 0xf1 && b <= 0xf3) len = 4;
    else return i;
    if (n - i < len || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xbf) return i;
    i += len;
  }
  return n;
}

}  // namespace kiln::serialize
