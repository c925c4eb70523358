// Device names and the backend registry.
#include <cstdlib>
#include <string>

#include "kiln/backend.h"
#include "kiln/errors.h"

namespace kiln {

Backend& cpu_backend();
#ifdef KILN_WITH_CUDA
Backend& cuda_backend(int index);
bool cuda_device_present();
namespace cuda {
void set_timing_cache_path(const std::string& path);  // timing_cache.h
}
#endif

void set_timing_cache_path(const std::string& path) {
#ifdef KILN_WITH_CUDA
  cuda::set_timing_cache_path(path);
#else
  (void)path;
#endif
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
