// Backend memory services: the word checksum (kiln/backend.h: the formula, the CPU backend's
// checksum over spans, and the CUDA backend's device computation against the CPU's on the same
// bytes) and Backend::upload of many host buffers (the CUDA backend's staged lanes). The CUDA
// cases are skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kiln/kiln.h"

namespace {

using namespace kiln;

Bytes random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  Bytes b(n);
  for (auto& x : b) x = uint8_t(gen());
  return b;
}

// The formula of kiln/backend.h, word by word from single bytes.
uint64_t reference(const std::vector<Bytes>& buffers) {
  uint64_t sum = 0, index = 0;
  for (const Bytes& b : buffers)
    for (size_t j = 0; j < b.size(); j += 8, ++index) {
      uint64_t w = 0;
      for (size_t k = 0; k < 8 && j + k < b.size(); ++k) w |= uint64_t(b[j + k]) << (8 * k);
      const uint64_t m = (w ^ (index * 0x5851F42D4C957F2DULL)) * 0x2545F4914F6CDD1DULL;
      sum += m ^ (m >> 29);
    }
  return sum;
}

std::vector<Backend::Span> spans_of(const std::vector<Bytes>& buffers, size_t offset = 0) {
  std::vector<Backend::Span> s;
  for (const Bytes& b : buffers) s.push_back({b.data() + offset, b.size() - offset});
  return s;
}

TEST(WordChecksum, MatchesItsFormulaAndSeesEveryChange) {
  const std::vector<Bytes> buffers = {random_bytes(1000, 1), random_bytes(13, 2), random_bytes(0, 3),
                                      random_bytes(4096 + 5, 4)};
  Backend& cpu = get_backend(Device::parse("cpu"));
  const uint64_t base = cpu.checksum(spans_of(buffers), nullptr);
  EXPECT_EQ(base, reference(buffers));
  EXPECT_EQ(word_checksum(buffers[0].data(), 1000, 0, 0), reference({buffers[0]}));
  // One flipped bit anywhere, the last byte of a short buffer included.
  for (size_t i : {0, 1, 3}) {
    for (size_t at : {size_t(0), buffers[i].size() - 1}) {
      if (buffers[i].empty()) continue;
      std::vector<Bytes> changed = buffers;
      changed[i][at] ^= 0x10;
      EXPECT_NE(cpu.checksum(spans_of(changed), nullptr), base) << "buffer " << i << " byte " << at;
    }
  }
  // The same words in another order.
  std::vector<Bytes> swapped = buffers;
  std::swap(swapped[0], swapped[3]);
  EXPECT_NE(cpu.checksum(spans_of(swapped), nullptr), base);
  EXPECT_EQ(cpu.checksum({}, nullptr), 0u);
}

TEST(WordChecksum, TheCudaBackendComputesTheCpuSumOnTheDevice) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  Backend& gpu = get_backend(Device::parse("cuda:0"));
  Backend& cpu = get_backend(Device::parse("cpu"));
  // Odd sizes, an empty buffer, one over many blocks, and one read from an unaligned address.
  const std::vector<Bytes> buffers = {random_bytes(1000, 5), random_bytes(13, 6), random_bytes(0, 7),
                                      random_bytes((size_t(3) << 20) + 5, 8), random_bytes(77, 9)};
  std::vector<std::shared_ptr<void>> memory;
  std::vector<Backend::Span> spans;
  for (const Bytes& b : buffers) {
    memory.push_back(gpu.allocate(b.size() + 1));
    gpu.copy_from_host(memory.back().get(), b.data(), b.size(), nullptr);
    spans.push_back({memory.back().get(), b.size()});
  }
  EXPECT_EQ(gpu.checksum(spans, nullptr), cpu.checksum(spans_of(buffers), nullptr));
  // The last buffer again, one byte into its allocation.
  std::shared_ptr<void> shifted = gpu.allocate(buffers[4].size() + 1);
  gpu.copy_from_host(static_cast<uint8_t*>(shifted.get()) + 1, buffers[4].data(), buffers[4].size(), nullptr);
  EXPECT_EQ(gpu.checksum({{static_cast<uint8_t*>(shifted.get()) + 1, buffers[4].size()}}, nullptr),
            reference({buffers[4]}));
}

TEST(Upload, ManyHostBuffersLandWhereTheyBelong) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  Backend& gpu = get_backend(Device::parse("cuda:0"));
  // 64 MB in pieces of every size class (a few bytes to several of the lanes' 2 MiB chunks), so
  // every lane gets work and shares start and end inside buffers.
  std::mt19937 gen(11);
  std::vector<Bytes> host;
  size_t total = 0;
  while (total < (size_t(64) << 20)) {
    const size_t n = (gen() % 3 == 0) ? 1 + gen() % 100 : (gen() % 2 ? gen() % (size_t(5) << 20) : gen() % 70000);
    host.push_back(random_bytes(n, uint32_t(host.size())));
    total += n;
  }
  std::shared_ptr<void> block = gpu.allocate(total + 256 * host.size());
  std::vector<Backend::HostCopy> copies;
  size_t at = 0;
  for (const Bytes& b : host) {
    copies.push_back({static_cast<uint8_t*>(block.get()) + at, b.data(), b.size()});
    at += (b.size() + 255) / 256 * 256;
  }
  gpu.upload(copies);
  gpu.upload({});  // nothing to copy
  for (size_t i = 0; i < host.size(); ++i) {
    Bytes back(host[i].size());
    gpu.copy_to_host(back.data(), copies[i].dst, back.size(), nullptr);
    ASSERT_EQ(back, host[i]) << "buffer " << i << " of " << host.size() << " (" << host[i].size() << " bytes)";
  }
}

}  // namespace
