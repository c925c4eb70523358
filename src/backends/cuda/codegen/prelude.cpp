// The prelude of every generated CUDA source and the dtype names used in generated code.
//
// kiln_half and kiln_bf16 are distinct one-member structs (not typedefs of unsigned short),
// so that to_float(kiln_half) and to_float(kiln_bf16) are different overloads and a 16-bit
// integer can never be mistaken for either. Conversions use PTX cvt (round to nearest even,
// as the CPU's float_to_half / float_to_bf16); bf16 -> f32 is a shift. The activation helpers
// follow src/ops/pointwise.h (the CPU's definitions) formula for formula, in float and double.
#include <cmath>
#include <cstdio>

#include "kiln/errors.h"
#include "src/backends/cuda/codegen/embedded.h"
#include "src/backends/cuda/codegen/prelude.h"

namespace kiln::cuda {

const std::string& prelude() {
  static const std::string text(embedded_source("prelude.cuh"));
  return text;
}

std::string float_literal(double v, DType t) {
  const bool f32 = t != DType::kF64;
  if (f32) v = double(float(v));
  if (std::isnan(v)) return f32 ? "__int_as_float(0x7fc00000)" : "__longlong_as_double(0x7ff8000000000000LL)";
  if (std::isinf(v)) {
    const std::string inf = f32 ? "__int_as_float(0x7f800000)" : "__longlong_as_double(0x7ff0000000000000LL)";
    return v < 0 ? "(-" + inf + ")" : inf;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return std::string("(") + buf + (f32 ? "f)" : ")");
}

std::string activation_call(const pw::Activation& a, const std::string& v) {
  if (a.none) return v;
  switch (a.op) {
    case OpKind::kRelu: return "kiln_relu(" + v + ")";
    case OpKind::kGelu: return (a.params.gelu_tanh ? "kiln_gelu_tanh(" : "kiln_gelu(") + v + ")";
    case OpKind::kSilu: return "kiln_silu(" + v + ")";
    case OpKind::kSigmoid: return "kiln_sigmoid(" + v + ")";
    case OpKind::kTanh: return "kiln_tanh(" + v + ")";
    case OpKind::kHardswish: return "kiln_hardswish(" + v + ")";
    case OpKind::kHardsigmoid: return "kiln_hardsigmoid(" + v + ")";
    case OpKind::kClamp: return "kiln_clipped_relu(" + v + ", " + float_literal(a.params.hi, DType::kF64) + ")";
    default: KILN_FAIL(kUnsupported, "generated epilogue: activation '", a.name, "'");
  }
}

const char* storage_type(DType t) {
  switch (t) {
    case DType::kF32: return "float";
    case DType::kF64: return "double";
    case DType::kF16: return "kiln_half";
    case DType::kBF16: return "kiln_bf16";
    case DType::kI64: return "long long";
    case DType::kI32: return "int";
    case DType::kI8: return "signed char";
    case DType::kU8: return "unsigned char";
    case DType::kBool: return "bool";
  }
  KILN_FAIL(kInternal, "unknown dtype code ", int(t));
}

const char* compute_type(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16: return "float";
    case DType::kF64: return "double";
    default: return storage_type(t);
  }
}

}  // namespace kiln::cuda
