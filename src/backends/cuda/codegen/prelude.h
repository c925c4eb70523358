// Building blocks of generated CUDA C++ (see nvrtc.h): the prelude every source starts with
// and the names and conversions of each dtype in generated code.
//
// The prelude includes no header (NVRTC needs none): f16 and bf16 are 16-bit storage types
// (kiln_half, kiln_bf16) converted to and from float with PTX cvt instructions; all arithmetic
// on them happens in float (FP32 accumulation everywhere). Loads and stores of 16 bytes use
// uint4 through the helpers below when a kernel knows its pointers and sizes allow it.
#pragma once

#include <string>

#include "kiln/dtype.h"
#include "src/ops/epilogue.h"

namespace kiln::cuda {

// Type definitions and helpers: kiln_half, kiln_bf16, to_float()/from_float<T>() overloads
// for every storage type, and the math functions generated code may call (erf, tanh, exp...
// are NVRTC builtins; gelu, silu, hardswish... are defined here once).
const std::string& prelude();

// The fused activation `a` (src/ops/epilogue.h) applied to the float expression `v`, as a call of
// the prelude's function ("kiln_hardswish(v)"; `v` itself for "none"). The one place generated
// epilogues (GEMM, conv, depthwise) name an activation.
std::string activation_call(const pw::Activation& a, const std::string& v);

// A literal of `v` in generated code, exact in the type arithmetic on `t` happens in (float for
// f32 / f16 / bf16, with the f suffix; double for f64); inf and NaN as bit patterns.
std::string float_literal(double v, DType t);

// The storage type of a dtype in generated code: f32 "float", f64 "double", f16 "kiln_half",
// bf16 "kiln_bf16", i64 "long long", i32 "int", i8 "signed char", u8 "unsigned char",
// bool "bool".
const char* storage_type(DType t);
// The type arithmetic on a dtype happens in: "float" for f32/f16/bf16, "double" for f64,
// the storage type for integers and bool.
const char* compute_type(DType t);

}  // namespace kiln::cuda
