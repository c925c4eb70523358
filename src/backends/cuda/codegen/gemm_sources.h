// Generated CUDA sources of the GEMM-based families (matmul.cpp, attention.cpp): what cuBLASLt's
// epilogues cannot do, and the fused attention kernel. Each function returns a complete NVRTC
// source (prelude.h's prelude first, the variant's definitions, then the kernels of
// codegen/cuh/gemm_*.cuh or flash_attention.cuh); the kernels take every size as an argument, so
// one source serves every node of the same dtype and variant.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/dtype.h"
#include "src/ops/epilogue.h"

namespace kiln::cuda {

// Shapes passed by value to the generated kernels; the layout matches the struct the sources
// declare (kKilnMaxDims dims, outermost first).
inline constexpr int kKilnMaxDims = 8;
struct KilnDims {
  long long size[kKilnMaxDims];
  long long stride[kKilnMaxDims];
};

// In-place y = act(y + residual[broadcast]) over a GEMM's output (src/ops/epilogue.h's
// activations; none with a residual only adds it). Kernels:
//   kiln_gemm_epilogue(T* y, const T* r, long long n, int rank, KilnDims rdims)
//     rdims.size: the output's (collapsed) dims, rdims.stride: the residual's strides (0 where
//     it broadcasts); r may be null when `residual` is false.
//   kiln_gemm_epilogue_vec(T* y, long long nvec): activation only, 16 bytes per thread step.
std::string gemm_epilogue_source(DType dtype, const pw::Activation& activation, bool residual);

// The pointer arrays of a matmul whose batches run through cuBLASLt's pointer arrays:
//   kiln_gemm_ptrs(long long nb, int brank, KilnDims ad, bd, dd, const char* a, const char* b,
//                  char* d, long long ab_bytes, long long d_bytes, const void** arr)
// one thread per batch i (row-major over the output batch dims ad.size): arr[t * nb + i] for
// t = a, b, d, each at its batch strides (ad / bd / dd .stride, in elements).
std::string gemm_pointers_source();

// The masked softmax of attention's fallback path, one warp per score row (any block size that
// is a multiple of 32; a grid-stride loop covers the rows):
//   kiln_sdpa_softmax_w(const float* scores, T* probs, const M* mask, long long rows, int L, int S,
//                       long long row0, int brank, KilnDims mdims, long long mrow_stride,
//                       long long mcol_stride, int causal)
// scores/probs: [rows, S] (probs may alias scores when T is float); row r is query row
// (row0 + r) % L of batch (row0 + r) / L; mdims: the output batch dims (size) and the mask's
// batch strides (stride); mask kinds: 0 none, 1 bool (keep where true), 2 additive (of T).
// Causal keeps key j <= query i (top-left aligned). A row with nothing to attend gives zeros.
// The same source has the pointer arrays of the fallback's pointer-array GEMMs:
//   kiln_sdpa_ptrs(long long nb, int brank, KilnDims kd, qd, vd, od, k, q, v, o, scores, probs,
//                  long long es, long long score_bytes, long long prob_bytes, const void** arr)
// one thread per batch i: arr[t * nb + i] for t = k, q, v, o (each at its batch strides over the
// output batch dims kd.size, es bytes an element), scores and probs (i * their matrix bytes).
std::string sdpa_softmax_source(DType dtype, int mask_kind);

// The fused flash-attention kernel (f16/bf16, tensor cores via mma.sync m16n8k16, online
// softmax in f32) for head dim `head_dim` (flash_attention_head_dim; q, k and v share it):
//   kiln_flash_attention(const T* q, const T* k, const T* v, T* o, const M* mask,
//                        int L, int S, float scale_log2, int causal, KilnDims qd, KilnDims kd,
//                        KilnDims vd, KilnDims od, KilnDims md, int brank, long long mrow_stride,
//                        long long mcol_stride, long long q_ld, long long k_ld, long long v_ld,
//                        long long o_ld)
// grid (ceil(L / 64), batch), 128 threads, static shared memory only; qd/kd/vd/od/md: output
// batch dims (size) and each operand's batch strides in elements (stride); *_ld: elements
// between sequence rows (multiples of 8); scale_log2 is the softmax scale times log2(e).
// Pointers must be 16-byte aligned.
std::string flash_attention_source(DType dtype, int head_dim, int mask_kind);
// The head dims the kernel takes: multiples of 32 (K's fragments load 32 dims at a time) up to
// 128 (the registers of a row's accumulators).
constexpr bool flash_attention_head_dim(int64_t d) { return d >= 32 && d <= 128 && d % 32 == 0; }
inline constexpr int kFlashBlockM = 64;
inline constexpr int kFlashBlockN = 64;
inline constexpr int kFlashThreads = 128;

}  // namespace kiln::cuda
