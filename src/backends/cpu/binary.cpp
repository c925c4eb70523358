// CPU kernels of the binary family: y = f(a, b) under numpy broadcasting, f from
// src/ops/pointwise.h.
//
// The factory plans the broadcast once (pw::BroadcastPlan: dims merged where both operands are
// contiguous), so run() only walks runs along the innermost merged dim and hands each to
// pw::binary_array / compare_array with the operands' strides there: same-shape tensors are one
// dense run, a scalar operand has stride 0, a bias add is rows of dense runs against one
// vector. Integers compute exactly in their own type; f16 / bf16 go through f32 in blocks.
// The flat output range splits over threads.
#include <algorithm>
#include <memory>

#include "src/backends/cpu/kernels.h"
#include "src/ops/pointwise.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kBlock = 512;
constexpr int64_t kGrain = 32768;

bool writes_bool(OpKind op) {
  switch (op) {
    case OpKind::kEq: case OpKind::kNe: case OpKind::kLt: case OpKind::kLe: case OpKind::kGt: case OpKind::kGe:
    case OpKind::kLogicalAnd: case OpKind::kLogicalOr: return true;
    default: return false;
  }
}

struct Plan {
  OpKind op;
  pw::BroadcastPlan bp;
  int64_t sa, sb;  // operand strides along the innermost dim: 0 (broadcast) or 1
};

// T: the storage type, computed in directly.
template <typename T>
KernelFn direct(std::shared_ptr<const Plan> plan) {
  return [plan](const void* const* in, void* const* out, const RunContext&) {
    const Plan& p = *plan;
    const T* a = static_cast<const T*>(in[0]);
    const T* b = static_cast<const T*>(in[1]);
    parallel_for(p.bp.numel, kGrain, [&](int64_t begin, int64_t end) {
      p.bp.for_each_run(begin, end, [&](const int64_t* off, int64_t o, int64_t len) {
        if (writes_bool(p.op))
          pw::compare_array(p.op, a + off[0], p.sa, b + off[1], p.sb, static_cast<uint8_t*>(out[0]) + o, len);
        else
          pw::binary_array(p.op, a + off[0], p.sa, b + off[1], p.sb, static_cast<T*>(out[0]) + o, len);
      });
    });
  };
}

// f16 / bf16: operands widened to f32 block by block (a broadcast operand: its one element).
KernelFn via_f32(std::shared_ptr<const Plan> plan, DType dt) {
  return [plan, dt](const void* const* in, void* const* out, const RunContext&) {
    const Plan& p = *plan;
    const auto* a = static_cast<const uint16_t*>(in[0]);
    const auto* b = static_cast<const uint16_t*>(in[1]);
    const bool to_bool = writes_bool(p.op);
    parallel_for(p.bp.numel, kGrain / 4, [&](int64_t begin, int64_t end) {
      float fa[kBlock], fb[kBlock], fy[kBlock];
      p.bp.for_each_run(begin, end, [&](const int64_t* off, int64_t o, int64_t len) {
        for (int64_t i = 0; i < len; i += kBlock) {
          const int64_t m = std::min(kBlock, len - i);
          if (p.sa) to_f32(a + off[0] + i, dt, fa, m);
          else fa[0] = load_f32(a, dt, off[0]);
          if (p.sb) to_f32(b + off[1] + i, dt, fb, m);
          else fb[0] = load_f32(b, dt, off[1]);
          if (to_bool) {
            pw::compare_array(p.op, fa, p.sa, fb, p.sb, static_cast<uint8_t*>(out[0]) + o + i, m);
          } else {
            pw::binary_array(p.op, fa, p.sa, fb, p.sb, fy, m);
            from_f32(fy, dt, static_cast<uint16_t*>(out[0]) + o + i, m);
          }
        }
      });
    });
  };
}

}  // namespace

std::unique_ptr<Kernel> make_binary_kernel(const Node& n, const Graph& g) {
  const TensorType& at = g.type(n.inputs[0]);
  const TensorType& bt = g.type(n.inputs[1]);
  const TensorType& yt = g.type(n.outputs[0]);
  const DType dt = at.dtype;
  auto plan = std::make_shared<Plan>();
  plan->op = n.op;
  plan->bp = pw::plan_broadcast(yt.shape(), {at.shape(), bt.shape()});
  plan->sa = plan->bp.inner_stride(0);
  plan->sb = plan->bp.inner_stride(1);
  // Fail at build time for an op the element type cannot take.
  if (!writes_bool(n.op)) {
    if (is_floating(dt)) pw::apply_binary<float>(n.op, 1.0f, 1.0f);
    else pw::apply_binary<int64_t>(n.op, 1, 1);
  }
  KernelFn fn;
  switch (dt) {
    case DType::kF32: fn = direct<float>(plan); break;
    case DType::kF64: fn = direct<double>(plan); break;
    case DType::kF16:
    case DType::kBF16: fn = via_f32(plan, dt); break;
    case DType::kI64: fn = direct<int64_t>(plan); break;
    case DType::kI32: fn = direct<int32_t>(plan); break;
    case DType::kI8: fn = direct<int8_t>(plan); break;
    case DType::kU8:
    case DType::kBool: fn = direct<uint8_t>(plan); break;
  }
  std::string desc = std::string("cpu ") + op_name(n.op) + " " + dtype_name(dt) + " runs of " +
                     std::to_string(plan->bp.inner()) + " (strides " + std::to_string(plan->sa) + "," +
                     std::to_string(plan->sb) + ")";
  return make_fn_kernel(std::move(fn), desc);
}

}  // namespace kiln::cpu
