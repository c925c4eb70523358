// The f32 GEMM of the CPU backend, and the small pieces the dense kernels (matmul, conv, pool,
// attention) share: carving scratch out of a kernel's workspace, staging inputs as f32, and
// running independent parts in parallel.
//
// sgemm computes C = alpha * A * B + beta * C, then an optional epilogue (bias per row or per
// column, relu), for A and B given by arbitrary strides (so transposes are free) and a row-major
// C (not aliasing A or B). It packs A and B into cache-sized panels and runs a register-blocked micro-kernel written
// with vector extensions, so one source compiles to AVX-512, AVX2 or SSE. Kernels may not
// allocate per call, so packing buffers come from the caller (sgemm_scratch_floats).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "src/backends/cpu/kernels.h"
#include "src/ops/shape_rules.h"

namespace kiln::cpu {

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;  // A(i, p) = a[i * a_rs + p * a_cs]
  int64_t a_rs = 0, a_cs = 1;
  const float* b = nullptr;  // B(p, j) = b[p * b_rs + j * b_cs]
  int64_t b_rs = 0, b_cs = 1;
  float* c = nullptr;  // C(i, j) = c[i * ldc + j]
  int64_t ldc = 0;
  float alpha = 1.0f, beta = 0.0f;  // beta == 0: C is not read (may hold garbage)
  const float* bias = nullptr;      // added after alpha * A * B + beta * C
  bool bias_per_row = false;        // bias[i] (length m) instead of bias[j] (length n)
  bool relu = false;
  // B already in sgemm's panel layout (sgemm_pack_b), e.g. a constant weight packed at build
  // time; b, b_rs and b_cs must still describe B (the unpacked paths below read them).
  const float* packed_b = nullptr;
  // A likewise (sgemm_pack_a_parallel), e.g. a convolution's weight; a, a_rs and a_cs still describe A.
  const float* packed_a = nullptr;
};

// Problems with at most this many rows (B contiguous along depth or columns), or with one
// column, skip packing: B is read once, in place.
inline constexpr int64_t kFewRows = 4;

// Row-major A[m, k] (lda) times row-major B[k, n] (ldb), or B given transposed as [n, k].
inline GemmArgs gemm_rowmajor(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                              int64_t ldb, bool trans_b, float* c, int64_t ldc) {
  GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.a = a, g.a_rs = lda, g.a_cs = 1;
  g.b = b;
  if (trans_b) g.b_rs = 1, g.b_cs = ldb;
  else g.b_rs = ldb, g.b_cs = 1;
  g.c = c, g.ldc = ldc;
  return g;
}

// Floats of scratch that sgemm needs for problems up to m x n x k split into at most
// `max_parts` parallel parts (1: the calling thread only). Monotonic in every argument.
int64_t sgemm_scratch_floats(int64_t m, int64_t n, int64_t k, int max_parts);
// `scratch` holds sgemm_scratch_floats(m, n, k, max_parts) floats (or more), 64-byte aligned.
void sgemm(const GemmArgs& g, float* scratch, int max_parts);

// Packs A (m x k, strides a_rs / a_cs) for GemmArgs::packed_a, on every thread (for weights
// packed when a kernel is made: not for run time).
int64_t sgemm_packed_a_floats(int64_t m, int64_t k);
void sgemm_pack_a_parallel(int64_t m, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, float* dst);
// Packs B (k x n, strides b_rs / b_cs) for GemmArgs::packed_b.
int64_t sgemm_packed_b_floats(int64_t n, int64_t k);
void sgemm_pack_b(int64_t n, int64_t k, const float* b, int64_t b_rs, int64_t b_cs, float* dst);
// The same split over threads, for weights packed when a kernel is made (not for run time:
// it may allocate).
void sgemm_pack_b_parallel(int64_t n, int64_t k, const float* b, int64_t b_rs, int64_t b_cs, float* dst);

// ---- f64 (dgemm.cpp) ------------------------------------------------------------------------

// C = A * B in double (C overwritten; not aliasing A or B), strides as in GemmArgs. `scratch`
// holds one packed block of B: at most 256 x 512 doubles, fewer for small k or n.
struct DgemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const double* a = nullptr;
  int64_t a_rs = 0, a_cs = 1;
  const double* b = nullptr;
  int64_t b_rs = 0, b_cs = 1;
  double* c = nullptr;
  int64_t ldc = 0;
};
void dgemm(const DgemmArgs& g, double* scratch);
// linear / matmul nodes whose operands are f64 (matmul.cpp sends them here).
std::unique_ptr<Kernel> make_linear_f64(const Node& n, const Graph& g);
std::unique_ptr<Kernel> make_matmul_f64(const Node& n, const Graph& g);

// ---- shared pieces of the dense kernels ----------------------------------------------------

// Hands out 64-byte aligned float arrays from a workspace. Run the same sequence of take()
// calls at build time (no base: only sizes) and at run time (on ctx.workspace).
class Carver {
 public:
  explicit Carver(void* base = nullptr) : base_(static_cast<char*>(base)) {}
  float* take(int64_t floats) {
    size_t off = used_;
    used_ += (static_cast<size_t>(floats) * sizeof(float) + 63) / 64 * 64;
    return base_ ? reinterpret_cast<float*>(base_ + off) : nullptr;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

// Checks that the caller's workspace is as large as a kernel declared.
inline void check_workspace(const RunContext& ctx, size_t need, const char* op) {
  KILN_CHECK(need == 0 || (ctx.workspace != nullptr && ctx.workspace_size >= need), kInternal, op,
             ": workspace of ", ctx.workspace_size, " bytes, kernel needs ", need);
}

// One input seen as f32: the caller's buffer when it is f32, a copy converted once at build
// time when it is a constant of another dtype, else converted into scratch at run time.
class F32Input {
 public:
  F32Input() = default;
  F32Input(const Graph& g, ValueId id);  // id may be kNoValue (absent)
  bool present() const { return present_; }
  int64_t numel() const { return numel_; }
  int64_t scratch_floats() const { return present_ && dtype_ != DType::kF32 && !constant_ ? numel_ : 0; }
  // `scratch` holds scratch_floats() floats (unused otherwise).
  const float* get(const void* p, float* scratch) const;

 private:
  bool present_ = false;
  DType dtype_ = DType::kF32;
  int64_t numel_ = 0;
  std::shared_ptr<const std::vector<float>> constant_;
};

// to_f32 / from_f32 split over threads for large tensors.
void to_f32_parallel(const void* src, DType t, float* dst, int64_t n);
void from_f32_parallel(const float* src, DType t, void* dst, int64_t n);

// Element offset, for each output batch index (row-major over out_batch), of the matching
// matrix of an operand with batch dims `batch` (right-aligned; size-1 dims broadcast).
std::vector<int64_t> batch_offsets(const std::vector<int64_t>& out_batch, const std::vector<int64_t>& batch,
                                   int64_t matrix_size);

// A matmul operand as its kernels read it (its view, src/ops/shape_rules.h): element (i, j) of
// the matrix for output batch index b is offsets[b] + i * rs + j * cs of the input buffer.
struct StridedOperand {
  std::vector<int64_t> offsets;
  int64_t rs = 0, cs = 1;
};
StridedOperand strided_operand(const std::vector<int64_t>& out_batch, const OperandView& v);

// Output positions o in [lo, hi) of [0, out) whose input position o * stride + off lies in
// [0, in): the unpadded range of one kernel tap along one spatial dim.
inline void tap_range(int64_t out, int64_t in, int64_t stride, int64_t off, int64_t& lo, int64_t& hi) {
  lo = off >= 0 ? 0 : (-off + stride - 1) / stride;
  hi = in - off <= 0 ? 0 : (in - off - 1) / stride + 1;
  lo = std::min(lo, out);
  hi = std::max(lo, std::min(hi, out));
}

// How many independent parts (each with its own scratch) to run `tasks` tasks in.
inline int parts_for(int64_t tasks) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(tasks, num_threads())));
}
// Runs fn(part) for every part in [0, parts), in parallel; each part runs on one thread.
void for_parts(int parts, const std::function<void(int)>& fn);

}  // namespace kiln::cpu
