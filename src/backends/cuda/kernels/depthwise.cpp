// The generated depthwise conv's Kernel (depthwise.h) and its timing against the cuDNN plan.
//
// Made once per engine with every size known: run() only checks the alignment of the buffers it
// reads and writes in vectors (x, w, bias, residual, y),
// picks the vectorized variant when all are aligned to its vector (engine buffers always are)
// and the scalar variant otherwise, and launches on the caller's stream: capturable into a CUDA
// graph, no allocation. The grid is sized from the device's multiprocessor count; blocks stride
// over the output pixels, so any grid is correct.
//
// Does not: generate the source (depthwise_source.cpp) or decide, at load, which tactic a
// saved state names (conv.cpp).
#include <algorithm>

#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/kernels/depthwise.h"

namespace kiln::cuda {

namespace {

struct Variant {
  cudaKernel_t fn = nullptr;
  dim3 grid;
  uintptr_t align = 1;  // bytes every vector-accessed buffer must be aligned to
  unsigned threads = kDepthwiseThreads;
};

Variant resolve(const ConvGeom& q, const Module& m, const DepthwiseVariant& v) {
  Variant r;
  r.fn = m.kernel(v.kernel.c_str());
  const int64_t row_groups = (q.OW + v.pixels - 1) / v.pixels;
  const int64_t blocks = (q.N * q.OH * row_groups + v.groups - 1) / v.groups;
  const int64_t cap = std::max<int64_t>(1, int64_t(current_device().sm_count) * 16 / v.tiles);
  r.grid = dim3(unsigned(std::clamp<int64_t>(blocks, 1, cap)), unsigned(v.tiles));
  r.align = uintptr_t(v.vec) * dtype_size(q.dtype);
  r.threads = unsigned(v.threads);
  return r;
}

class DepthwiseKernel final : public Kernel {
 public:
  DepthwiseKernel(const ConvGeom& q, const DepthwiseSource& src, std::shared_ptr<const Module> module, Bytes state,
                  std::string desc)
      : module_(std::move(module)),
        bias_(q.bias),
        residual_(q.residual),
        state_(std::move(state)),
        desc_(std::move(desc)) {
    if (!src.wide.kernel.empty()) wide_ = resolve(q, *module_, src.wide);
    scalar_ = resolve(q, *module_, src.scalar);
    const int64_t dims[kDims] = {q.N, q.H, q.W, q.C, q.OH, q.OW, q.ph, q.pw};
    for (int i = 0; i < kDims; ++i) dims_[i] = int(dims[i]);
  }

  void run(const void* const* in, void* const* out, const RunContext& rc) const override {
    const void* x = in[0];
    const void* w = in[1];
    const void* bias = bias_ ? in[2] : nullptr;
    const void* res = residual_ ? in[3] : nullptr;
    void* y = out[0];
    const Variant* v = &scalar_;
    if (wide_.fn) {
      const uintptr_t a = wide_.align;
      auto ok = [a](const void* p) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
      if (ok(x) && ok(w) && ok(bias) && ok(res) && ok(y)) v = &wide_;
    }
    void* args[5 + kDims] = {&x, &w, &bias, &res, &y};
    for (int i = 0; i < kDims; ++i) args[5 + i] = const_cast<int*>(&dims_[i]);
    launch(v->fn, v->grid, dim3(v->threads), args, 0, stream_of(rc));
  }

  bool bakes_constants() const override { return false; }  // weights and bias by pointer
  std::string describe() const override { return desc_; }
  Bytes state() const override { return state_; }

 private:
  static constexpr int kDims = 8;  // N, H, W, C, OH, OW, PH, PW: the kernel's int arguments
  std::shared_ptr<const Module> module_;
  Variant wide_, scalar_;
  bool bias_, residual_;
  int dims_[kDims] = {};
  Bytes state_;
  std::string desc_;
};

}  // namespace

ConvChoice depthwise_choice(const DepthwiseSource& src, uint64_t signature) {
  ConvChoice c;
  c.tactic = ConvTactic::kDepthwise;
  c.signature = signature;
  c.kernel_hash = src.hash;
  c.engine = -1;
  return c;
}

std::unique_ptr<Kernel> make_depthwise_kernel(const ConvGeom& q, const DepthwiseSource& src,
                                              std::shared_ptr<const Module> module, uint64_t signature,
                                              const std::string& note) {
  KILN_CHECK(module != nullptr, kInternal, "depthwise conv: no module");
  Bytes state = pack_state(module->cubin(), encode_conv_choice(depthwise_choice(src, signature)));
  return std::make_unique<DepthwiseKernel>(q, src, std::move(module), std::move(state), src.describe + ", " + note);
}

}  // namespace kiln::cuda
