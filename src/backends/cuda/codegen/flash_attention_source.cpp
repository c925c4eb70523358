// Source of the fused flash-attention kernel (gemm_sources.h: flash_attention_source).
//
// One CTA of 4 warps takes 64 query rows (16 per warp) of one batch matrix. Q is staged
// through shared memory into mma A fragments held in registers for the whole kernel; then for
// each block of 64 keys, K and V are copied to shared memory by cp.async (16 bytes per thread
// step, rows past S zero-filled; K and V in separate groups, so the scores start while V is in
// flight; with head dims up to 64 two stages, so block j + 1 loads while block j computes; head
// dims 96 and 128 have one, their tiles would pass the 48 KB of static shared memory), K's fragments come by
// ldmatrix.x4, and each warp computes its 16 x 64 scores with mma.sync.m16n8k16 (f32
// accumulators), applies scale, causal/bool/additive masks and the online softmax (running
// max and sum in f32, exp2 domain), converts the probabilities to f16/bf16 in registers (the
// accumulator layout of two n-tiles is the A layout of one k-step) and accumulates P V with
// mma.sync (V's fragments through ldmatrix.trans). Causal blocks stop at the last key their
// rows can see. A row with nothing to attend gives zeros, as the CPU reference does.
//
// Fragment layouts (PTX ISA, m16n8k16, g = lane / 4, t = lane % 4): A regs {a0..a3} hold rows
// g / g+8, cols 2t..2t+1 / +8; B regs {b0, b1} hold k rows 2t..2t+1 / +8 of column g; C holds
// rows g / g+8, cols 2t..2t+1.
#include "kiln/errors.h"
#include "src/backends/cuda/codegen/embedded.h"
#include "src/backends/cuda/codegen/gemm_sources.h"
#include "src/backends/cuda/codegen/prelude.h"

namespace kiln::cuda {

std::string flash_attention_source(DType dtype, int head_dim, int mask_kind) {
  KILN_CHECK(dtype == DType::kF16 || dtype == DType::kBF16, kInternal, "flash attention: dtype ", dtype_name(dtype));
  KILN_CHECK(flash_attention_head_dim(head_dim), kInternal, "flash attention: head dim ", head_dim);
  KILN_CHECK(mask_kind >= 0 && mask_kind <= 2, kInternal, "flash attention: mask kind ", mask_kind);
  const bool bf16 = dtype == DType::kBF16;
  std::string s = prelude();
  s += "#define FA_D " + std::to_string(head_dim) + "\n";
  s += "#define FA_MASK " + std::to_string(mask_kind) + "\n";
  s += "#define FA_BF16 " + std::string(bf16 ? "1" : "0") + "\n";
  s += "#define FA_TY \"" + std::string(bf16 ? "bf16" : "f16") + "\"\n";
  s += "#define FA_BM " + std::to_string(kFlashBlockM) + "\n#define FA_BN " + std::to_string(kFlashBlockN) + "\n";
  s += embedded_source("flash_attention.cuh");
  return s;
}

}  // namespace kiln::cuda
