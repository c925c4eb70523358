// cuBLASLt plumbing shared by the matmul and attention families: error checks, the per-device
// handle, one GEMM problem (descriptors built once), choosing its algorithm (heuristics, timed
// on scratch buffers, remembered in the timing cache, saved in the kernel state), and the
// batch plan that maps numpy-broadcast batch dims onto strided batches.
//
// Everything is column-major, as cuBLASLt sees it; the families turn their row-major tensors
// into column-major problems by swapping operands (row-major Y[M,N] is column-major Y^T[N,M]).
//
// Precision: f16/bf16 use CUBLAS_COMPUTE_32F (f32 accumulation); f32 uses TF32 tensor cores
// (CUBLAS_COMPUTE_32F_FAST_TF32) where GemmShape::tf32 says so (the families set it from
// BuildPolicy::allow_tf32), else exact f32 GEMMs; it is part of the signature, so of the timing key.
#pragma once

#include <cublasLt.h>

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kiln/backend.h"
#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/libs/batch_plan.h"

namespace kiln::cuda {

[[noreturn]] void fail_cublas(cublasStatus_t status, const char* expr, const char* file, int line);

#define KILN_CUBLAS_CHECK(expr)                                                                            \
  do {                                                                                                     \
    cublasStatus_t kiln_st_ = (expr);                                                                      \
    if (kiln_st_ != CUBLAS_STATUS_SUCCESS) ::kiln::cuda::fail_cublas(kiln_st_, #expr, __FILE__, __LINE__); \
  } while (0)

// The cuBLASLt handle of the current device (created once; cublasLtMatmul is thread-safe on it).
cublasLtHandle_t lt_handle();
// Makes the current device's handle and runs first algorithm queries and checks (the library's
// one-time setup) on small f16 GEMMs; returns what each step took, in the form "cuBLASLt handle
// T ms, queries T1 T2 T3 ms".
std::string lt_warm_up();

// D[m,n] = act(alpha op(A) op(B) + beta C + bias), column-major, `batch` matrices: strided,
// or with `pointer_array` each operand's matrices found through a device array of `batch`
// pointers (cuBLASLt's pointer-array batch mode; the strides are then unused), for batches
// that no single stride reaches.
struct GemmShape {
  DType ab_type = DType::kF32;  // A and B
  DType cd_type = DType::kF32;  // C and D (and bias)
  bool tf32 = false;            // f32: TF32 tensor cores
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldc = 0;  // D has C's layout
  int32_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements; 0 broadcasts one matrix
  bool pointer_array = false;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  float alpha = 1.0f, beta = 0.0f;
  uint32_t align = 16;  // bytes every A/B/C/D pointer (and batch offset) is assumed aligned to
  std::string signature() const;  // every field, for timing keys and messages
};

// One GEMM problem with its descriptors. run() is const and may be called from several threads.
class LtMatmul {
 public:
  explicit LtMatmul(const GemmShape& s);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  const GemmShape& shape() const { return s_; }
  // Up to `max_count` algorithms cuBLASLt proposes, best guess first, for pointers aligned to
  // `align` bytes and at most `workspace` bytes of workspace.
  std::vector<cublasLtMatmulAlgo_t> heuristics(int max_count, uint32_t align, size_t workspace) const;
  // Whether `algo` is valid for this problem on this device within `workspace` bytes.
  bool check(const cublasLtMatmulAlgo_t& algo, size_t workspace) const;
  // The workspace bytes `algo` needs for this problem (it must be valid: check()).
  size_t workspace_needed(const cublasLtMatmulAlgo_t& algo) const;
  void run(const cublasLtMatmulAlgo_t& algo, const void* a, const void* b, const void* c, void* d, const void* bias,
           void* workspace, size_t workspace_bytes, cudaStream_t stream) const;

 private:
  void release();
  GemmShape s_;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  mutable std::mutex mu_;              // guards the bias pointer attribute between set and enqueue
  mutable const void* bias_ = nullptr;
};

// Where the matrices of a pointer-array batch lie, for timing: per operand (A, B, C) each
// matrix's offset in elements from the operand's first one.
struct BatchOffsets {
  std::vector<int64_t> a, b, c;
};

// The algorithm of an LtMatmul, chosen at build (timed, or from the timing cache) or restored
// from saved bytes at load; plus a second one for pointers that are not `align`-aligned.
class LtPlan {
 public:
  // Build: times (or finds in the timing cache, keyed by `family` and the shape's signature) up
  // to budget.cublaslt_heuristics algorithms. A pointer-array shape needs `offsets` (its
  // matrices are timed where the real ones lie).
  LtPlan(const GemmShape& s, size_t workspace, const TacticBudget& budget, const std::string& family,
         const BatchOffsets* offsets = nullptr);
  // Load: `saved` from save(); an algorithm the library no longer accepts is re-chosen by heuristic.
  LtPlan(const GemmShape& s, size_t workspace, const Bytes& saved);

  Bytes save() const;
  const std::string& how() const { return how_; }  // "timed ...", "timing cache", "saved", ...
  const LtMatmul& matmul() const { return *mm_; }
  // Workspace bytes the kept algorithms need (the most of the timed and the fallback one); at most
  // the `workspace` the plan was made with, which bounded the candidates.
  size_t workspace_size() const { return needed_; }
  // Runs with the timed algorithm, or the fallback one when a pointer is not aligned enough.
  void run(const void* a, const void* b, const void* c, void* d, const void* bias, const RunContext& rc) const;
  // A pointer-array shape: a..d are device arrays of matrix pointers; `matrix_bits` is the OR
  // of every matrix address (or of values with the same low bits), which picks the algorithm.
  void run_pointers(const void* a, const void* b, const void* c, void* d, uintptr_t matrix_bits,
                    const RunContext& rc) const;

  static constexpr size_t kSavedBytes = 4 + sizeof(cublasLtMatmulAlgo_t);

 private:
  void finish_init();  // picks the fallback for unaligned pointers; records the workspace both need
  // Runs with the timed algorithm, or the unaligned one when `bits` (addresses or'd) need it.
  void enqueue(uintptr_t bits, const void* a, const void* b, const void* c, void* d, const void* bias,
               const RunContext& rc) const;
  std::unique_ptr<LtMatmul> mm_;
  size_t workspace_ = 0;  // the bound candidates were chosen within
  size_t needed_ = 0;     // what the kept algorithms need
  cublasLtMatmulAlgo_t algo_{};
  std::optional<cublasLtMatmulAlgo_t> unaligned_;
  std::string how_;
};

// cudaMalloc'd scratch for timing, filled with a small constant; freed on destruction.
class ScratchBuffer {
 public:
  explicit ScratchBuffer(size_t bytes);
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
};

cudaDataType_t cuda_data_type(DType t);

}  // namespace kiln::cuda
