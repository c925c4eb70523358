// Device names, the backend registry, and Backend's default services.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kiln/backend.h"
#include "kiln/errors.h"
#include "src/common/stopwatch.h"

namespace kiln {

Backend& cpu_backend();
#ifdef KILN_WITH_CUDA
Backend& cuda_backend(int index);
bool cuda_device_present();
namespace cuda {
bool supports_node(const Node& n, const Graph& g, std::string* why);  // kernels.h
std::vector<LibraryVersion> library_versions();  // library_versions.cpp
void set_timing_cache_path(const std::string& path);  // timing_cache.h
}
#endif

std::shared_ptr<const void> DerivedConstants::get(const std::shared_ptr<const HostBuffer>& source,
                                                  const std::string& what, const Make& make) {
  const std::lock_guard<std::mutex> lock(mu_);
  const auto key = std::make_pair(source.get(), what);
  if (auto it = entries_.find(key); it != entries_.end() && it->second.source.lock() == source)
    if (std::shared_ptr<const void> data = it->second.data.lock()) return data;
  std::shared_ptr<const void> data = make();
  std::erase_if(entries_, [](const auto& e) { return e.second.source.expired() || e.second.data.expired(); });
  entries_[key] = Entry{source, data};
  return data;
}

void DerivedConstants::clear() {
  const std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
}

std::vector<LibraryVersion> backend_library_versions() {
#ifdef KILN_WITH_CUDA
  return cuda::library_versions();
#else
  return {};
#endif
}

void set_timing_cache_path(const std::string& path) {
#ifdef KILN_WITH_CUDA
  cuda::set_timing_cache_path(path);
#else
  (void)path;
#endif
}

uint64_t word_checksum(const void* data, size_t bytes, uint64_t first_word, uint64_t sum) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t j = 0; 8 * j < bytes; ++j) {
    uint64_t w = 0;
    const size_t n = std::min<size_t>(8, bytes - 8 * j);
    std::memcpy(&w, p + 8 * j, n);  // little-endian hosts only (as the engine file format)
    uint64_t m = (w ^ ((first_word + j) * kWordMix1)) * kWordMix2;
    sum += m ^ (m >> 29);
  }
  return sum;
}

std::vector<std::unique_ptr<Kernel>> Backend::make_kernels(const Graph& graph, const KernelOptions& options,
                                                          const std::vector<Bytes>* states, std::vector<double>* ms) {
  std::vector<std::unique_ptr<Kernel>> kernels;
  ms->assign(graph.nodes().size(), 0.0);
  for (size_t i = 0; i < graph.nodes().size(); ++i) {
    const Stopwatch watch;
    kernels.push_back(make_kernel(*graph.nodes()[i], graph, options, states ? &(*states)[i] : nullptr));
    (*ms)[i] = watch.ms();
  }
  return kernels;
}

uint64_t Backend::checksum(const std::vector<Span>& buffers, void* stream) {
  const bool in_place = device().type == DeviceType::kCPU;  // host memory is read where it is
  uint64_t sum = 0, word = 0;
  Bytes host;
  for (const Span& b : buffers) {
    const void* data = b.data;
    if (!in_place) {
      host.resize(b.bytes);
      copy_to_host(host.data(), b.data, b.bytes, stream);
      data = host.data();
    }
    sum = word_checksum(data, b.bytes, word, sum);
    word += (b.bytes + 7) / 8;
  }
  return sum;
}

std::string Device::to_string() const {
  if (type == DeviceType::kCPU) return "cpu";
  return "cuda:" + std::to_string(index);
}

Device Device::parse(const std::string& s) {
  if (s == "cpu") return Device{DeviceType::kCPU, 0};
  if (s == "cuda") return Device{DeviceType::kCUDA, 0};
  if (s.rfind("cuda:", 0) == 0) {
    std::string idx = s.substr(5);
    char* end = nullptr;
    long v = std::strtol(idx.c_str(), &end, 10);
    if (!idx.empty() && end && *end == '\0' && v >= 0 && v < 1024) return Device{DeviceType::kCUDA, int(v)};
  }
  KILN_FAIL(kInvalidArgument, "unknown device '", s, "'; valid: cpu, cuda, cuda:N");
}

bool backend_available(DeviceType type) {
  if (type == DeviceType::kCPU) return true;
#ifdef KILN_WITH_CUDA
  return cuda_device_present();
#else
  return false;
#endif
}

bool device_supports(DeviceType type, const Node& node, const Graph& graph, std::string* why) {
  if (type == DeviceType::kCPU) return cpu_backend().supports(node, graph, why);
#ifdef KILN_WITH_CUDA
  return cuda::supports_node(node, graph, why);
#else
  if (why) *why = "this Kiln build has no CUDA backend (built with KILN_CUDA=OFF or without a CUDA toolkit)";
  return false;
#endif
}

Backend& get_backend(const Device& device) {
  if (device.type == DeviceType::kCPU) return cpu_backend();
#ifdef KILN_WITH_CUDA
  KILN_CHECK(cuda_device_present(), kUnsupported, "no CUDA device is present for ", device.to_string());
  return cuda_backend(device.index);
#else
  KILN_FAIL(kUnsupported, "this Kiln build has no CUDA backend (built with KILN_CUDA=OFF or without a CUDA "
                          "toolkit); device ", device.to_string(), " is unavailable");
#endif
}

}  // namespace kiln
