// Shared pieces of the CPU backend: the per-family kernel factories (one .cpp per family,
// named after the op family, as in include/kiln/ops.h), element access for every dtype, a
// Kernel made from a function, and parallel_for.
//
// The CPU backend is Kiln's reference: every op has a kernel here, and every other backend
// is tested against it. Floating ops compute in f32 (f64 in double); f16/bf16 load and store
// through f32.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "kiln/backend.h"
#include "kiln/errors.h"
#include "kiln/ir.h"

namespace kiln::cpu {

std::unique_ptr<Kernel> make_unary_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_binary_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_where_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_cast_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_reduce_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_softmax_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_norm_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_matmul_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_conv_kernel(const Node& n, const Graph& g);
// A channels-last node (layout "nhwc": conv, max_pool, avg_pool) as the same node
// channels-first, made by `make_first`, between transposes into and out of the workspace.
// `moved` lists the inputs in [N, H, W, C] (the output always is).
std::unique_ptr<Kernel> make_channels_last(const Node& n, const Graph& g, const std::vector<size_t>& moved,
                                           std::unique_ptr<Kernel> (*make_first)(const Node&, const Graph&));
// The general form (layout.cpp): a node with a layout attribute run as the same node without it,
// made by `make_inner`, on inputs `moved` permuted by `perm` (inner dim i = outer dim perm[i]);
// the inner output is permuted back by perm's inverse. perm swaps two adjacent blocks of dims.
std::unique_ptr<Kernel> make_relayout(const Node& n, const Graph& g, const std::vector<size_t>& moved,
                                      const std::vector<int64_t>& perm,
                                      std::unique_ptr<Kernel> (*make_inner)(const Node&, const Graph&));
std::unique_ptr<Kernel> make_pool_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_shape_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_gather_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_attention_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_generator_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_fused_kernel(const Node& n, const Graph& g);

// ---- element access -------------------------------------------------------------------
inline double load_as_double(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF64: return static_cast<const double*>(p)[i];
    case DType::kF16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kI32: return static_cast<const int32_t*>(p)[i];
    case DType::kI8: return static_cast<const int8_t*>(p)[i];
    case DType::kU8: return static_cast<const uint8_t*>(p)[i];
    case DType::kBool: return static_cast<const uint8_t*>(p)[i] ? 1.0 : 0.0;
  }
  return 0.0;
}

inline void store_double(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::kF64: static_cast<double*>(p)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v)); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::kI64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DType::kI32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::kI8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case DType::kU8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case DType::kBool: static_cast<uint8_t*>(p)[i] = v != 0.0 ? 1 : 0; break;
  }
}

inline float load_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<float>(load_as_double(p, t, i));
  }
}

inline void store_f32(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = float_to_half(v); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(v); break;
    default: store_double(p, t, i, v); break;
  }
}

// Converts n elements of `src` (dtype t) to f32 in `dst`, and back.
void to_f32(const void* src, DType t, float* dst, int64_t n);
void from_f32(const float* src, DType t, void* dst, int64_t n);

// ---- kernels from functions -------------------------------------------------------------
using KernelFn = std::function<void(const void* const* inputs, void* const* outputs, const RunContext& ctx)>;

// `over_inputs[i]`: output 0 may be written over input i (Kernel::writes_over_input).
class FnKernel final : public Kernel {
 public:
  FnKernel(KernelFn fn, std::string desc, size_t workspace = 0, std::vector<bool> over_inputs = {})
      : fn_(std::move(fn)), desc_(std::move(desc)), workspace_(workspace), over_(std::move(over_inputs)) {}
  void run(const void* const* inputs, void* const* outputs, const RunContext& ctx) const override {
    fn_(inputs, outputs, ctx);
  }
  size_t workspace_size() const override { return workspace_; }
  std::string describe() const override { return desc_; }
  bool writes_over_input(size_t input) const override { return input < over_.size() && over_[input]; }

 private:
  KernelFn fn_;
  std::string desc_;
  size_t workspace_;
  std::vector<bool> over_;
};

inline std::unique_ptr<Kernel> make_fn_kernel(KernelFn fn, std::string desc, size_t workspace = 0,
                                              std::vector<bool> over_inputs = {}) {
  return std::make_unique<FnKernel>(std::move(fn), std::move(desc), workspace, std::move(over_inputs));
}

// ---- threads ----------------------------------------------------------------------------
// Runs fn(begin, end) over [0, n) split into chunks of at least `grain`, on a pool of
// threads (KILN_NUM_THREADS, default: hardware threads). Nested or concurrent calls (several
// contexts at once) run on the calling thread. Exceptions from fn are rethrown in the caller.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
int num_threads();

}  // namespace kiln::cpu
