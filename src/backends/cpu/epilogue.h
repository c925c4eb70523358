// The epilogue of the CPU linear and conv kernels: after the GEMM has written x @ w^T + bias
// (conv: conv(x, w) + bias) as f32, add the optional residual (input 3, broadcast to the
// output) and apply the `activation` attribute, in place, in one sweep over the output.
//
// The formulas are the stand-alone ops' own (pw::binary_array for the add, pw::unary_array for
// the activation; src/ops/epilogue.h maps activation names to unary ops), so a fused node
// computes what the unfused add / activation nodes computed, in f32. relu without a residual
// rides in sgemm's own epilogue instead (gemm_relu()).
#pragma once

#include <algorithm>
#include <cstdint>

#include "src/backends/cpu/gemm.h"
#include "src/ops/epilogue.h"

namespace kiln::cpu {

class Epilogue {
 public:
  Epilogue(const Node& n, const Graph& g)
      : residual_(g, n.inputs.size() > 3 ? n.inputs[3] : kNoValue), act_(pw::parse_activation(n.op, n.attrs)) {
    const std::vector<int64_t> out = g.type(n.outputs[0]).shape();
    numel_ = g.type(n.outputs[0]).numel();
    if (residual_.present()) plan_ = pw::plan_broadcast(out, {g.type(n.inputs[3]).shape()});
  }

  // relu with no residual: may be left to GemmArgs::relu (then tell apply()).
  bool gemm_relu() const { return !residual_.present() && !act_.none && act_.op == OpKind::kRelu; }
  int64_t scratch_floats() const { return residual_.scratch_floats(); }
  std::string describe() const {
    std::string s = residual_.present() ? " + residual" : "";
    return act_.none ? s : s + " + " + act_.name;
  }

  // y: the f32 output (numel elements); residual: the node's input 3 (null when absent);
  // scratch: scratch_floats() floats; gemm_did_relu: the GEMM already applied the activation.
  void apply(float* y, const void* residual, float* scratch, bool gemm_did_relu) const {
    const bool act = !act_.none && !gemm_did_relu;
    if (numel_ == 0 || (!act && !residual_.present())) return;
    if (!residual_.present()) {
      parallel_for(numel_, kGrain,
                   [&](int64_t b, int64_t e) { pw::unary_array(act_.op, act_.params, y + b, y + b, e - b); });
      return;
    }
    const float* r = residual_.get(residual, scratch);
    const int64_t rs = plan_.inner_stride(0);
    parallel_for(numel_, kGrain, [&](int64_t b, int64_t e) {
      plan_.for_each_run(b, e, [&](const int64_t* off, int64_t o, int64_t len) {
        pw::binary_array(OpKind::kAdd, y + o, 1, r + off[0], rs, y + o, len);
        if (act) pw::unary_array(act_.op, act_.params, y + o, y + o, len);
      });
    });
  }

 private:
  static constexpr int64_t kGrain = 16384;
  F32Input residual_;
  pw::Activation act_;
  pw::BroadcastPlan plan_;
  int64_t numel_ = 0;
};

}  // namespace kiln::cpu
