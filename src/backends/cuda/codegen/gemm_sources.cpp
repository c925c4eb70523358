// Generated sources of the GEMM families (gemm_sources.h): the activation / broadcast-residual
// epilogue after a cuBLASLt GEMM (cuh/gemm_epilogue.cuh), the pointer arrays of a pointer-array
// matmul (cuh/gemm_pointers.cuh), and the masked softmax of attention's
// fallback path (cuh/gemm_sdpa_softmax.cuh). The fused attention kernel is in
// flash_attention_source.cpp.
//
// Activations are the prelude's kiln_<name> helpers (prelude.h: src/ops/pointwise.h's formulas
// in f32), so a fused linear computes what the separate add and activation nodes would.
#include "kiln/errors.h"
#include "src/backends/cuda/codegen/embedded.h"
#include "src/backends/cuda/codegen/gemm_sources.h"
#include "src/backends/cuda/codegen/prelude.h"

namespace kiln::cuda {

std::string gemm_epilogue_source(DType dtype, const pw::Activation& activation, bool residual) {
  std::string s = prelude();
  s += "typedef " + std::string(storage_type(dtype)) + " T;\n";
  s += "#define KILN_RESIDUAL " + std::string(residual ? "1" : "0") + "\n";
  s += "#define KILN_ACT(x) " + activation_call(activation, "x") + "\n";
  s += embedded_source("gemm_epilogue.cuh");
  return s;
}

std::string gemm_pointers_source() { return prelude() + std::string(embedded_source("gemm_pointers.cuh")); }

std::string sdpa_softmax_source(DType dtype, int mask_kind) {
  KILN_CHECK(mask_kind >= 0 && mask_kind <= 2, kInternal, "sdpa softmax: mask kind ", mask_kind);
  std::string s = prelude();
  s += "typedef " + std::string(storage_type(dtype)) + " T;\n";
  s += "typedef " + std::string(mask_kind == 1 ? "bool" : storage_type(dtype)) + " MT;\n";
  s += "#define KILN_MASK " + std::to_string(mask_kind) + "\n";
  s += embedded_source("gemm_sdpa_softmax.cuh");
  return s;
}

}  // namespace kiln::cuda
