// CPU kernels of the unary family: y[i] = f(x[i]) with f from src/ops/pointwise.h.
//
// f32, f64 and integer tensors run pw::unary_array in place of the data (one loop per op that
// the compiler vectorizes); f16 / bf16 go through f32 in stack blocks of kBlock elements. Large
// tensors split over threads; transcendental ops split sooner since each element costs more.
#include <algorithm>

#include "src/backends/cpu/kernels.h"
#include "src/ops/pointwise.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kBlock = 1024;

bool cheap(OpKind op) {
  return op == OpKind::kRelu || op == OpKind::kNeg || op == OpKind::kAbs || op == OpKind::kClamp ||
         op == OpKind::kLeakyRelu || op == OpKind::kLogicalNot || op == OpKind::kHardswish ||
         op == OpKind::kHardsigmoid || op == OpKind::kReciprocal || op == OpKind::kSqrt || op == OpKind::kRsqrt ||
         op == OpKind::kSign || op == OpKind::kFloor || op == OpKind::kCeil || op == OpKind::kRound ||
         op == OpKind::kTrunc;
}

template <typename T>
KernelFn direct(OpKind op, pw::UnaryParams p, int64_t n, int64_t grain) {
  return [=](const void* const* in, void* const* out, const RunContext&) {
    const T* x = static_cast<const T*>(in[0]);
    T* y = static_cast<T*>(out[0]);
    parallel_for(n, grain, [&](int64_t b, int64_t e) { pw::unary_array(op, p, x + b, y + b, e - b); });
  };
}

KernelFn via_f32(OpKind op, pw::UnaryParams p, int64_t n, int64_t grain, DType dt) {
  return [=](const void* const* in, void* const* out, const RunContext&) {
    const auto* x = static_cast<const uint16_t*>(in[0]);
    auto* y = static_cast<uint16_t*>(out[0]);
    parallel_for(n, grain, [&](int64_t b, int64_t e) {
      float buf[kBlock];
      for (int64_t i = b; i < e; i += kBlock) {
        const int64_t len = std::min(kBlock, e - i);
        to_f32(x + i, dt, buf, len);
        pw::unary_array(op, p, buf, buf, len);
        from_f32(buf, dt, y + i, len);
      }
    });
  };
}

}  // namespace

std::unique_ptr<Kernel> make_unary_kernel(const Node& n, const Graph& g) {
  const OpKind op = n.op;
  const DType dt = g.type(n.inputs[0]).dtype;
  const int64_t numel = g.type(n.inputs[0]).numel();
  const pw::UnaryParams p = pw::UnaryParams::from(op, n.attrs);
  const int64_t grain = cheap(op) ? 32768 : 4096;
  KernelFn fn;
  switch (dt) {
    case DType::kF32: fn = direct<float>(op, p, numel, grain); break;
    case DType::kF64: fn = direct<double>(op, p, numel, grain); break;
    case DType::kF16:
    case DType::kBF16: fn = via_f32(op, p, numel, grain, dt); break;
    case DType::kI64: fn = direct<int64_t>(op, p, numel, grain); break;
    case DType::kI32: fn = direct<int32_t>(op, p, numel, grain); break;
    case DType::kI8: fn = direct<int8_t>(op, p, numel, grain); break;
    case DType::kU8:
    case DType::kBool: fn = direct<uint8_t>(op, p, numel, grain); break;
  }
  // Fail at build time, not on the first run, for an op the element type cannot take.
  if (is_floating(dt)) {
    pw::apply_unary<float>(op, 0.5f, p);
  } else {
    pw::apply_unary<int64_t>(op, 1, p);
  }
  return make_fn_kernel(std::move(fn), std::string("cpu ") + op_name(op) + " " + dtype_name(dt));
}

}  // namespace kiln::cpu
