// CPU kernels of the generator family.
//
// full: the value is cast to the dtype once, here (an i64 attribute stays exact), and run()
// only replicates those bytes. arange: element i is start + i * step computed in double and
// then cast, so every dtype sees the same sequence (the shape rule has checked that it fits
// integral dtypes). Both split large outputs over threads.
#include <algorithm>

#include "src/backends/cpu/kernels.h"
#include "src/ops/access.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kParallelElems = int64_t(1) << 16;

void for_range(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (n < kParallelElems) return fn(0, n);
  parallel_for(n, kParallelElems / 4, fn);
}

template <typename T>
KernelFn fill_fn(int64_t n, uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return [n, v](const void* const*, void* const* out, const RunContext&) {
    T* y = static_cast<T*>(out[0]);
    for_range(n, [&](int64_t b, int64_t e) { std::fill(y + b, y + e, v); });
  };
}

// Element i of arange, cast by Cast (the dtype's conversion of a double).
template <typename T, T (*Cast)(double)>
KernelFn arange_fn(int64_t n, double start, double step) {
  return [n, start, step](const void* const*, void* const* out, const RunContext&) {
    T* y = static_cast<T*>(out[0]);
    for_range(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) y[i] = Cast(start + static_cast<double>(i) * step);
    });
  };
}

template <typename T>
T plain(double v) { return static_cast<T>(v); }
uint16_t to_half(double v) { return float_to_half(static_cast<float>(v)); }
uint16_t to_bf16(double v) { return float_to_bf16(static_cast<float>(v)); }
uint8_t to_bool(double v) { return v != 0.0 ? 1 : 0; }

KernelFn make_arange(DType dt, int64_t n, double start, double step) {
  switch (dt) {
    case DType::kF32: return arange_fn<float, plain<float>>(n, start, step);
    case DType::kF64: return arange_fn<double, plain<double>>(n, start, step);
    case DType::kF16: return arange_fn<uint16_t, to_half>(n, start, step);
    case DType::kBF16: return arange_fn<uint16_t, to_bf16>(n, start, step);
    case DType::kI64: return arange_fn<int64_t, plain<int64_t>>(n, start, step);
    case DType::kI32: return arange_fn<int32_t, plain<int32_t>>(n, start, step);
    case DType::kI8: return arange_fn<int8_t, plain<int8_t>>(n, start, step);
    case DType::kU8: return arange_fn<uint8_t, plain<uint8_t>>(n, start, step);
    case DType::kBool: return arange_fn<uint8_t, to_bool>(n, start, step);
  }
  KILN_FAIL(kInternal, "arange: unknown dtype");
}

}  // namespace

std::unique_ptr<Kernel> make_generator_kernel(const Node& n, const Graph& g) {
  const TensorType& yt = g.type(n.outputs[0]);
  const int64_t count = yt.numel();
  if (n.op == OpKind::kArange) {
    KernelFn fn = make_arange(yt.dtype, count, n.attrs.get_float("start", 0.0), n.attrs.get_float("step", 1.0));
    return make_fn_kernel(std::move(fn), std::string("cpu arange ") + dtype_name(yt.dtype));
  }
  KILN_CHECK(n.op == OpKind::kFull, kInternal, op_name(n.op), " is not in the generator family");
  const uint64_t bits = full_value_bits(n.attrs, yt.dtype);
  KernelFn fn;
  switch (dtype_size(yt.dtype)) {
    case 1: fn = fill_fn<uint8_t>(count, bits); break;
    case 2: fn = fill_fn<uint16_t>(count, bits); break;
    case 4: fn = fill_fn<uint32_t>(count, bits); break;
    default: fn = fill_fn<uint64_t>(count, bits); break;
  }
  return make_fn_kernel(std::move(fn), std::string("cpu full ") + dtype_name(yt.dtype));
}

}  // namespace kiln::cpu
