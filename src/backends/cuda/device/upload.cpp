// Staged host-to-device uploads on several lanes; see upload.h.
#include <algorithm>
#include <cstring>
#include <thread>

#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/device/upload.h"
#include "src/common/run_parts.h"

namespace kiln::cuda {

namespace {

constexpr size_t kChunk = size_t(2) << 20;      // bytes per pinned chunk; two per lane
constexpr size_t kMinShare = size_t(8) << 20;   // an upload gets one lane per this many bytes
constexpr unsigned kMostLanes = 4;

}  // namespace

struct Uploader::Lane {
  cudaStream_t stream = nullptr;
  cudaEvent_t landed[2] = {nullptr, nullptr};  // recorded after the DMA out of each chunk
  void* chunk[2] = {nullptr, nullptr};

  Lane() = default;
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;
  ~Lane() {
    // Nothing may throw here; at process exit the driver may already be gone.
    if (stream) (void)cudaStreamSynchronize(stream);
    for (int i = 0; i < 2; ++i) {
      if (landed[i]) (void)cudaEventDestroy(landed[i]);
      if (chunk[i]) (void)cudaFreeHost(chunk[i]);
    }
    if (stream) (void)cudaStreamDestroy(stream);
  }

  // Copies the bytes [lo, hi) of the copies laid end to end; returns when they have landed.
  void copy(const std::vector<Backend::HostCopy>& copies, size_t lo, size_t hi) {
    int b = 0;
    size_t used = 0;  // bytes of chunk b filled
    KILN_CUDA_CHECK(cudaEventSynchronize(landed[b]));
    size_t start = 0;  // where the current copy begins in the laid-out bytes
    for (const Backend::HostCopy& c : copies) {
      if (start >= hi) break;
      const size_t end = std::min(hi, start + c.bytes);
      for (size_t p = std::max(lo, start); p < end;) {
        if (used == kChunk) {  // chunk b is full: its DMA runs while the other one fills
          KILN_CUDA_CHECK(cudaEventRecord(landed[b], stream));
          b ^= 1;
          used = 0;
          KILN_CUDA_CHECK(cudaEventSynchronize(landed[b]));
        }
        const size_t n = std::min(end - p, kChunk - used), at = p - start;
        char* staged = static_cast<char*>(chunk[b]) + used;
        std::memcpy(staged, static_cast<const char*>(c.src) + at, n);
        KILN_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(c.dst) + at, staged, n, cudaMemcpyHostToDevice, stream));
        used += n;
        p += n;
      }
      start += c.bytes;
    }
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
};

Uploader::Uploader(int device) : device_(device) {}
Uploader::~Uploader() = default;

void Uploader::prepare() {
  std::lock_guard<std::mutex> lock(mutex_);
  prepare_locked();
}

void Uploader::prepare_locked() {
  if (!lanes_.empty()) return;
  const unsigned lanes = std::clamp(std::thread::hardware_concurrency() / 4, 1u, kMostLanes);
  std::vector<std::unique_ptr<Lane>> made;
  for (unsigned i = 0; i < lanes; ++i) {
    auto lane = std::make_unique<Lane>();
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking));
    for (int j = 0; j < 2; ++j) {
      KILN_CUDA_CHECK(cudaEventCreateWithFlags(&lane->landed[j], cudaEventDisableTiming));
      KILN_CUDA_CHECK(cudaMallocHost(&lane->chunk[j], kChunk));
    }
    made.push_back(std::move(lane));
  }
  lanes_ = std::move(made);
}

bool Uploader::upload(const std::vector<Backend::HostCopy>& copies) {
  size_t total = 0;
  for (const Backend::HostCopy& c : copies) total += c.bytes;
  if (!total) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    prepare_locked();
  } catch (const Error&) {
    return false;  // no pinned memory to spare
  }
  const size_t n = std::min(lanes_.size(), std::max<size_t>(1, total / kMinShare));
  run_parts(n, [&](size_t t) {
    KILN_CUDA_CHECK(cudaSetDevice(device_));  // a new thread starts on device 0
    lanes_[t]->copy(copies, total * t / n, total * (t + 1) / n);
  });
  return true;
}

}  // namespace kiln::cuda
