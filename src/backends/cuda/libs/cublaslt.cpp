// cuBLASLt plumbing (cublaslt.h): handle, descriptors, heuristics, running one GEMM.
// Algorithm choice (timing, cache, saved state) and batch plans are in cublaslt_plan.cpp.
#include <map>
#include <memory>
#include <sstream>

#include "src/backends/cuda/libs/cublaslt.h"
#include "src/common/stopwatch.h"

namespace kiln::cuda {

void fail_cublas(cublasStatus_t status, const char* expr, const char* file, int line) {
  const std::string msg =
      detail::concat(expr, " failed: ", cublasLtGetStatusString(status), " (", int(status), ") at ", file, ":", line);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) KILN_FAIL(kInvalidArgument, "out of device memory: ", msg);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) KILN_FAIL(kUnsupported, msg);
  KILN_FAIL(kInternal, msg);
}

cublasLtHandle_t lt_handle() {
  struct Deleter {
    void operator()(cublasLtContext* h) const { cublasLtDestroy(h); }
  };
  static std::mutex mu;
  static std::map<int, std::unique_ptr<cublasLtContext, Deleter>> handles;
  int dev = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto& h = handles[dev];
  if (!h) {
    cublasLtHandle_t raw = nullptr;
    KILN_CUBLAS_CHECK(cublasLtCreate(&raw));
    h.reset(raw);
  }
  return h.get();
}

std::string lt_warm_up() {
  const Stopwatch handle_watch;
  (void)lt_handle();
  std::string report = detail::concat("cuBLASLt handle ", tenths(handle_watch.ms()), " ms, queries");
  // A square f16 GEMM with a bias epilogue, then the two one-column shapes (a batch-1 linear),
  // which cuBLASLt serves from kernels of their own.
  for (const auto& [m, n] : {std::pair<int64_t, int64_t>{128, 128}, {1, 128}, {128, 1}}) {
    GemmShape s;
    s.ab_type = s.cd_type = DType::kF16;
    s.m = m, s.n = n, s.k = 128;
    s.trans_a = true;
    s.lda = s.ldb = 128, s.ldc = m;
    s.epilogue = CUBLASLT_EPILOGUE_BIAS;
    const LtMatmul mm(s);
    const Stopwatch query_watch;
    const auto algos = mm.heuristics(1, s.align, 0);
    if (!algos.empty()) (void)mm.check(algos[0], 0);
    report += detail::concat(" ", tenths(query_watch.ms()));
  }
  return report + " ms";
}

cudaDataType_t cuda_data_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF64: return CUDA_R_64F;
    default: KILN_FAIL(kUnsupported, "cuBLASLt GEMMs take f32, f16, bf16 or f64, not ", dtype_name(t));
  }
}

std::string GemmShape::signature() const {
  std::ostringstream os;
  os << dtype_name(ab_type) << ">" << dtype_name(cd_type) << (tf32 ? ",tf32" : "") << ",m" << m << ",n" << n << ",k"
     << k << "," << (trans_a ? "T" : "N") << (trans_b ? "T" : "N") << ",ld" << lda << "/" << ldb << "/" << ldc << ",b"
     << batch << ",s" << stride_a << "/" << stride_b << "/" << stride_c << ",epi" << int(epilogue) << ",alpha" << alpha
     << ",beta" << beta << ",align" << align << (pointer_array ? ",ptr" : "");
  return os.str();
}

namespace {

void set_layout_batch(cublasLtMatrixLayout_t l, int32_t batch, int64_t stride, bool pointers) {
  if (batch <= 1 && !pointers) return;
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
  if (pointers) {
    const uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof(mode)));
    return;
  }
  KILN_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
}

cublasLtMatrixLayout_t make_layout(DType t, int64_t rows, int64_t cols, int64_t ld, int32_t batch, int64_t stride,
                                   bool pointers) {
  cublasLtMatrixLayout_t l = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, cuda_data_type(t), uint64_t(rows), uint64_t(cols), ld));
  try {
    set_layout_batch(l, batch, stride, pointers);
  } catch (...) {
    cublasLtMatrixLayoutDestroy(l);
    throw;
  }
  return l;
}

}  // namespace

LtMatmul::LtMatmul(const GemmShape& s) : s_(s) {
  KILN_CHECK(s.m > 0 && s.n > 0 && s.k > 0, kInternal, "LtMatmul: empty problem ", s.signature());
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (s.ab_type == DType::kF64) compute = CUBLAS_COMPUTE_64F;
  else if (s.ab_type == DType::kF32 && s.tf32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  const cudaDataType_t scale = s.ab_type == DType::kF64 ? CUDA_R_64F : CUDA_R_32F;
  try {
    KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_, compute, scale));
    const int32_t ta = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    const uint32_t epi = s.epilogue;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (s.epilogue & CUBLASLT_EPILOGUE_BIAS) {
      const int32_t bt = cuda_data_type(s.cd_type);
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    }
    const bool p = s.pointer_array;
    a_ = make_layout(s.ab_type, s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k, s.lda, s.batch, s.stride_a, p);
    b_ = make_layout(s.ab_type, s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n, s.ldb, s.batch, s.stride_b, p);
    c_ = make_layout(s.cd_type, s.m, s.n, s.ldc, s.batch, s.stride_c, p);
  } catch (...) {
    release();
    throw;
  }
}

LtMatmul::~LtMatmul() { release(); }

void LtMatmul::release() {
  if (c_) cublasLtMatrixLayoutDestroy(c_), c_ = nullptr;
  if (b_) cublasLtMatrixLayoutDestroy(b_), b_ = nullptr;
  if (a_) cublasLtMatrixLayoutDestroy(a_), a_ = nullptr;
  if (op_) cublasLtMatmulDescDestroy(op_), op_ = nullptr;
}

std::vector<cublasLtMatmulAlgo_t> LtMatmul::heuristics(int max_count, uint32_t align, size_t workspace) const {
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, cublasStatus_t (*)(cublasLtMatmulPreference_t)> guard(
      pref, &cublasLtMatmulPreferenceDestroy);
  const uint64_t ws = workspace;
  KILN_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(size_t(std::max(max_count, 1)));
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_handle(), op_, a_, b_, c_, c_, pref, int(results.size()),
                                                           results.data(), &found);
  std::vector<cublasLtMatmulAlgo_t> algos;
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return algos;
  KILN_CUBLAS_CHECK(st);
  for (int i = 0; i < found; ++i)
    if (results[size_t(i)].state == CUBLAS_STATUS_SUCCESS) algos.push_back(results[size_t(i)].algo);
  return algos;
}

bool LtMatmul::check(const cublasLtMatmulAlgo_t& algo, size_t workspace) const {
  cublasLtMatmulHeuristicResult_t r{};
  if (cublasLtMatmulAlgoCheck(lt_handle(), op_, a_, b_, c_, c_, &algo, &r) != CUBLAS_STATUS_SUCCESS) return false;
  return r.workspaceSize <= workspace;
}

size_t LtMatmul::workspace_needed(const cublasLtMatmulAlgo_t& algo) const {
  cublasLtMatmulHeuristicResult_t r{};
  KILN_CUBLAS_CHECK(cublasLtMatmulAlgoCheck(lt_handle(), op_, a_, b_, c_, c_, &algo, &r));
  return r.workspaceSize;
}

void LtMatmul::run(const cublasLtMatmulAlgo_t& algo, const void* a, const void* b, const void* c, void* d,
                   const void* bias, void* workspace, size_t workspace_bytes, cudaStream_t stream) const {
  const double alpha64 = s_.alpha, beta64 = s_.beta;
  const float alpha32 = s_.alpha, beta32 = s_.beta;
  const bool f64 = s_.ab_type == DType::kF64;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &beta32;
  std::lock_guard<std::mutex> lock(mu_);
  if ((s_.epilogue & CUBLASLT_EPILOGUE_BIAS) && bias != bias_) {
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    bias_ = bias;
  }
  KILN_CUBLAS_CHECK(cublasLtMatmul(lt_handle(), op_, alpha, a, a_, b, b_, beta, c ? c : d, c_, d, c_, &algo, workspace,
                                   workspace_bytes, stream));
}

ScratchBuffer::ScratchBuffer(size_t bytes) {
  KILN_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(bytes, 256)));
  // 0x3C bytes: about 1.06 in f16, 0.0115 in f32 and bf16: finite, small, and no denormals.
  const cudaError_t err = cudaMemset(p_, 0x3C, std::max<size_t>(bytes, 256));
  if (err != cudaSuccess) {
    cudaFree(p_);
    KILN_CUDA_CHECK(err);
  }
}

ScratchBuffer::~ScratchBuffer() {
  if (p_) cudaFree(p_);
}

}  // namespace kiln::cuda
