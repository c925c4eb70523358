// Shared pieces of the CPU backend: the per-family kernel factories (one .cpp per family,
// named after the op family, as in include/kiln/ops.h) and a Kernel made from a function.
// Element access for every dtype and parallel_for, which other layers use too, live in
// src/common/.
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
#include "src/common/element_access.h"
#include "src/common/parallel.h"

namespace kiln::cpu {

std::unique_ptr<Kernel> make_unary_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_binary_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_where_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_cast_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_reduce_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_softmax_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_norm_kernel(const Node& n, const Graph& g);
// `derived` (may be null): where constant weights packed for the GEMM are shared (KernelOptions).
std::unique_ptr<Kernel> make_matmul_kernel(const Node& n, const Graph& g, DerivedConstants* derived);
// `workspace_limit`: the bytes of scratch the engine allows; im2col convs work in chunks of output
// rows small enough to fit it. `derived` as for matmul.
std::unique_ptr<Kernel> make_conv_kernel(const Node& n, const Graph& g, size_t workspace_limit,
                                         DerivedConstants* derived);
// A channels-last node (layout "nhwc": conv, max_pool, avg_pool) as the same node
using KernelMaker = std::function<std::unique_ptr<Kernel>(const Node&, const Graph&)>;
// channels-first, made by `make_first`, between transposes into and out of the workspace.
// `moved` lists the inputs in [N, H, W, C] (the output always is).
std::unique_ptr<Kernel> make_channels_last(const Node& n, const Graph& g, const std::vector<size_t>& moved,
                                           const KernelMaker& make_first);
// The general form (layout.cpp): a node with a layout attribute run as the same node without it,
// made by `make_inner`, on inputs `moved` permuted by `perm` (inner dim i = outer dim perm[i]);
// the inner output is permuted back by perm's inverse. perm swaps two adjacent blocks of dims.
std::unique_ptr<Kernel> make_relayout(const Node& n, const Graph& g, const std::vector<size_t>& moved,
                                      const std::vector<int64_t>& perm, const KernelMaker& make_inner);
std::unique_ptr<Kernel> make_pool_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_shape_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_gather_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_attention_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_generator_kernel(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_fused_kernel(const Node& n, const Graph& g);

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

}  // namespace kiln::cpu
