// CPU kernel of cast: every dtype to every dtype, element by element, with the value rules of
// pw::cast_value (src/ops/pointwise.h): float -> integer truncates toward zero (saturating at
// the i64 range, NaN -> 0, then wrapping to the narrower type); -> bool is != 0; bool -> x is
// 0 or 1; integer -> integer wraps; f64 -> f16 / bf16 rounds through f32.
//
// One loop per (from, to) pair, instantiated at compile time, so each converts without a
// switch per element; a cast to the same dtype is a copy. Large tensors split over threads.
#include <cstring>
#include <type_traits>

#include "src/backends/cpu/kernels.h"
#include "src/ops/pointwise.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kGrain = 65536;

constexpr bool is_float16(DType d) { return d == DType::kF16 || d == DType::kBF16; }

template <DType From, DType To>
typename pw::Elem<To>::S cast_elem(typename pw::Elem<From>::S v) {
  using ST = typename pw::Elem<To>::S;
  // The source value at its natural width: float (f32, f16, bf16), double, or int64_t.
  auto w = [&] {
    if constexpr (From == DType::kF64) return v;
    else if constexpr (is_float16(From) || From == DType::kF32) return pw::Elem<From>::load(v);
    else if constexpr (From == DType::kBool) return int64_t(v != 0);
    else return static_cast<int64_t>(v);
  }();
  constexpr bool wide_float = std::is_floating_point_v<decltype(w)>;
  if constexpr (To == DType::kBool) {
    return ST(w != 0);
  } else if constexpr (To == DType::kF32 || To == DType::kF64) {
    return static_cast<ST>(w);
  } else if constexpr (is_float16(To)) {
    return pw::Elem<To>::store(static_cast<float>(w));
  } else if constexpr (wide_float) {
    return static_cast<ST>(pw::to_int64_saturated(static_cast<double>(w)));
  } else {
    return static_cast<ST>(w);
  }
}

template <DType From, DType To>
void convert(const void* src, void* dst, int64_t begin, int64_t end) {
  const auto* x = static_cast<const typename pw::Elem<From>::S*>(src);
  auto* y = static_cast<typename pw::Elem<To>::S*>(dst);
  for (int64_t i = begin; i < end; ++i) y[i] = cast_elem<From, To>(x[i]);
}

using ConvertFn = void (*)(const void*, void*, int64_t, int64_t);

}  // namespace

std::unique_ptr<Kernel> make_cast_kernel(const Node& n, const Graph& g) {
  KILN_CHECK(n.op == OpKind::kCast, kInternal, op_name(n.op), " is not cast");
  const DType from = g.type(n.inputs[0]).dtype, to = g.type(n.outputs[0]).dtype;
  const int64_t numel = g.type(n.inputs[0]).numel();
  const std::string desc = std::string("cpu cast ") + dtype_name(from) + " -> " + dtype_name(to);
  if (from == to) {
    const size_t bytes = g.type(n.inputs[0]).nbytes();
    return make_fn_kernel(
        [bytes](const void* const* in, void* const* out, const RunContext&) {
          if (bytes && in[0] != out[0]) std::memcpy(out[0], in[0], bytes);
        },
        desc + " (copy)");
  }
  const ConvertFn convert_fn = pw::visit_dtype(from, [&](auto f) {
    return pw::visit_dtype(to, [&](auto t) -> ConvertFn { return &convert<decltype(f)::value, decltype(t)::value>; });
  });
  return make_fn_kernel(
      [convert_fn, numel](const void* const* in, void* const* out, const RunContext&) {
        parallel_for(numel, kGrain, [&](int64_t b, int64_t e) { convert_fn(in[0], out[0], b, e); });
      },
      desc);
}

}  // namespace kiln::cpu
