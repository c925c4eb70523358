// The CPU backend: host memory, and a kernel per node from the family factories.
#include <cstdlib>
#include <cstring>

#include "src/backends/cpu/kernels.h"

namespace kiln {

namespace {

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
  Device device() const override { return Device{DeviceType::kCPU, 0}; }
  std::string device_name() const override { return "cpu"; }

  bool supports(const Node&, const Graph&, std::string*) const override {
    // The reference backend runs every op its shape rule accepts.
    return true;
  }

  std::unique_ptr<Kernel> make_kernel(const Node& n, const Graph& g, const KernelOptions& options,
                                      const Bytes* state) override {
    // CPU kernels have a single implementation each, so they save no state.
    KILN_CHECK(!state || state->empty(), kCorrupted, "engine file has ", state ? state->size() : 0,
               " bytes of kernel state for CPU node ", op_name(n.op), ", CPU kernels keep none");
    switch (op_info(n.op).family) {
      case OpFamily::kUnary: return cpu::make_unary_kernel(n, g);
      case OpFamily::kBinary: return cpu::make_binary_kernel(n, g);
      case OpFamily::kWhere: return cpu::make_where_kernel(n, g);
      case OpFamily::kCast: return cpu::make_cast_kernel(n, g);
      case OpFamily::kReduce: return cpu::make_reduce_kernel(n, g);
      case OpFamily::kSoftmax: return cpu::make_softmax_kernel(n, g);
      case OpFamily::kNorm: return cpu::make_norm_kernel(n, g);
      case OpFamily::kMatmul: return cpu::make_matmul_kernel(n, g, options.derived.get());
      case OpFamily::kConv: return cpu::make_conv_kernel(n, g, options.workspace_limit, options.derived.get());
      case OpFamily::kPool: return cpu::make_pool_kernel(n, g);
      case OpFamily::kShape: return cpu::make_shape_kernel(n, g);
      case OpFamily::kGather: return cpu::make_gather_kernel(n, g);
      case OpFamily::kAttention: return cpu::make_attention_kernel(n, g);
      case OpFamily::kGenerator: return cpu::make_generator_kernel(n, g);
      case OpFamily::kFused: return cpu::make_fused_kernel(n, g);
    }
    KILN_FAIL(kInternal, "no CPU kernel family for ", op_name(n.op));
  }

  std::shared_ptr<void> allocate(size_t bytes) override {
    size_t a = alignment();
    size_t rounded = (std::max<size_t>(bytes, 1) + a - 1) / a * a;
    void* p = std::aligned_alloc(a, rounded);
    KILN_CHECK(p != nullptr, kInvalidArgument, "cannot allocate ", bytes, " bytes of host memory");
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }
  void copy_from_host(void* dst, const void* src, size_t bytes, void*) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes, void*) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_on_device(void* dst, const void* src, size_t bytes, void*) override {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }
  void synchronize(void*) override {}
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend b;
  return b;
}

}  // namespace kiln
