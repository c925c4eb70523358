// Choosing a cuBLASLt algorithm (LtPlan) and mapping broadcast batch dims onto strided
// batches (plan_strided_batches); see cublaslt.h.
//
// At build: the timing cache is asked first (key: family, the problem's signature, the
// workspace bound, GPU and library versions). On a miss, cuBLASLt's heuristic proposes up to
// TacticBudget::cublaslt_heuristics algorithms, up to timed_candidates of them run on scratch buffers
// of the real sizes (allocated here, freed before returning; a pointer-array batch gets pointer
// arrays into them at its matrices' real offsets), the fastest is kept and cached.
// The saved state is a format tag and the algorithm's 64 bytes (cublasLtMatmulAlgo_t is a
// plain struct); at load it is checked with cublasLtMatmulAlgoCheck and, if the library no
// longer accepts it (another version), replaced by the heuristic's first choice: never timed.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "src/backends/cuda/libs/cublaslt.h"
#include "src/backends/cuda/tuning/tactics.h"

namespace kiln::cuda {

namespace {

constexpr uint32_t kAlgoTag = 0x4B4C5431;  // "KLT1"

// Elements spanned by a strided batch of column-major matrices.
size_t span(int64_t rows_ld, int64_t cols, int32_t batch, int64_t stride) {
  return size_t(rows_ld * cols + stride * (batch - 1));
}

Bytes algo_bytes(const cublasLtMatmulAlgo_t& a) {
  Bytes b(LtPlan::kSavedBytes);
  std::memcpy(b.data(), &kAlgoTag, 4);
  std::memcpy(b.data() + 4, &a, sizeof(a));
  return b;
}

std::optional<cublasLtMatmulAlgo_t> parse_algo(const Bytes& b) {
  uint32_t tag = 0;
  if (b.size() != LtPlan::kSavedBytes) return std::nullopt;
  std::memcpy(&tag, b.data(), 4);
  if (tag != kAlgoTag) return std::nullopt;
  cublasLtMatmulAlgo_t a;
  std::memcpy(&a, b.data() + 4, sizeof(a));
  return a;
}

}  // namespace

LtPlan::LtPlan(const GemmShape& s, size_t workspace, const TacticBudget& budget, const std::string& family,
               const BatchOffsets* offsets)
    : mm_(std::make_unique<LtMatmul>(s)), workspace_(workspace) {
  KILN_CHECK(!s.pointer_array || (offsets && offsets->a.size() == size_t(s.batch) &&
                                  offsets->b.size() == size_t(s.batch) && offsets->c.size() == size_t(s.batch)),
             kInternal, "LtPlan: a pointer-array GEMM needs the offsets of its ", s.batch, " matrices");
  const std::string key = timing_key(family, {s.signature(), "ws" + std::to_string(workspace)});
  const TimingClaim claim(key);
  if (auto cached = timing_cache_find(key)) {
    auto a = parse_algo(*cached);
    if (a && mm_->check(*a, workspace)) {
      algo_ = *a;
      how_ = "algorithm from the timing cache";
      finish_init();
      return;
    }
  }
  const auto algos = mm_->heuristics(int(budget.cublaslt_heuristics), s.align, workspace);
  KILN_CHECK(!algos.empty(), kUnsupported, "cuBLASLt proposes no algorithm for ", s.signature());
  size_t best = 0;
  if (algos.size() > 1 && budget.timed) {
    const size_t es = dtype_size(s.ab_type), cs = dtype_size(s.cd_type);
    const size_t a_mat = size_t(s.lda * (s.trans_a ? s.m : s.k)), b_mat = size_t(s.ldb * (s.trans_b ? s.k : s.n)),
                 c_mat = size_t(s.ldc * s.n);
    // Strided: the batch's span. Pointer array: up to the last matrix's end.
    auto extent = [&](size_t mat, int64_t stride, const std::vector<int64_t>* offs) {
      if (!s.pointer_array) return span(int64_t(mat), 1, s.batch, stride);
      return size_t(*std::max_element(offs->begin(), offs->end())) + mat;
    };
    ScratchBuffer a(es * extent(a_mat, s.stride_a, offsets ? &offsets->a : nullptr));
    ScratchBuffer b(es * extent(b_mat, s.stride_b, offsets ? &offsets->b : nullptr));
    ScratchBuffer c(cs * extent(c_mat, s.stride_c, offsets ? &offsets->c : nullptr));
    ScratchBuffer d(cs * extent(c_mat, s.stride_c, offsets ? &offsets->c : nullptr));
    ScratchBuffer bias(cs * size_t(s.m));
    ScratchBuffer ws(workspace);
    // Pointer array: the four operands' pointer arrays, one after the other.
    const size_t nb = s.pointer_array ? size_t(s.batch) : 0;
    ScratchBuffer arrays(4 * nb * sizeof(void*));
    void* const* arr = static_cast<void* const*>(arrays.get());
    if (s.pointer_array) {
      std::vector<const void*> host(4 * nb);
      for (size_t i = 0; i < nb; ++i) {
        host[i] = static_cast<const uint8_t*>(a.get()) + size_t(offsets->a[i]) * es;
        host[nb + i] = static_cast<const uint8_t*>(b.get()) + size_t(offsets->b[i]) * es;
        host[2 * nb + i] = static_cast<const uint8_t*>(c.get()) + size_t(offsets->c[i]) * cs;
        host[3 * nb + i] = static_cast<const uint8_t*>(d.get()) + size_t(offsets->c[i]) * cs;
      }
      KILN_CUDA_CHECK(cudaMemcpy(arrays.get(), host.data(), host.size() * sizeof(void*), cudaMemcpyHostToDevice));
    }
    std::vector<Candidate> cands;
    for (const auto& algo : algos)
      cands.push_back([&, algo](cudaStream_t st) {
        const bool beta = s.beta != 0.0f;
        if (s.pointer_array)
          mm_->run(algo, arr, arr + nb, beta ? arr + 2 * nb : nullptr, const_cast<void**>(arr + 3 * nb), nullptr,
                   ws.get(), workspace, st);
        else mm_->run(algo, a.get(), b.get(), beta ? c.get() : nullptr, d.get(), bias.get(), ws.get(), workspace, st);
      });
    std::string report;
    best = time_candidates(cands, budget.timed_candidates, &report);
    how_ = "cuBLASLt algorithm " + report;
  } else {
    how_ = "cuBLASLt heuristic's first algorithm";
  }
  algo_ = algos[best];
  timing_cache_insert(key, algo_bytes(algo_));
  finish_init();
}

LtPlan::LtPlan(const GemmShape& s, size_t workspace, const Bytes& saved)
    : mm_(std::make_unique<LtMatmul>(s)), workspace_(workspace) {
  auto a = parse_algo(saved);
  KILN_CHECK(a.has_value(), kCorrupted, "saved cuBLASLt algorithm of ", saved.size(), " bytes is malformed");
  if (mm_->check(*a, workspace)) {
    algo_ = *a;
    how_ = "saved cuBLASLt algorithm";
  } else {
    const auto algos = mm_->heuristics(1, s.align, workspace);
    KILN_CHECK(!algos.empty(), kUnsupported, "cuBLASLt proposes no algorithm for ", s.signature());
    algo_ = algos[0];
    how_ = "cuBLASLt heuristic (the saved algorithm is not valid with this library/device)";
  }
  finish_init();
}

void LtPlan::finish_init() {
  const uint32_t elem = uint32_t(std::min(dtype_size(mm_->shape().ab_type), dtype_size(mm_->shape().cd_type)));
  needed_ = mm_->workspace_needed(algo_);
  if (mm_->shape().align <= elem) return;
  auto algos = mm_->heuristics(1, elem, workspace_);
  if (!algos.empty()) {
    unaligned_ = algos[0];
    needed_ = std::max(needed_, mm_->workspace_needed(*unaligned_));
  }
}

Bytes LtPlan::save() const { return algo_bytes(algo_); }

void LtPlan::enqueue(uintptr_t bits, const void* a, const void* b, const void* c, void* d, const void* bias,
                     const RunContext& rc) const {
  const cublasLtMatmulAlgo_t* algo = &algo_;
  if (bits % mm_->shape().align != 0) {
    KILN_CHECK(unaligned_.has_value(), kInvalidArgument, "cuBLASLt GEMM ", mm_->shape().signature(),
               ": a tensor pointer is not ", mm_->shape().align, "-byte aligned and no algorithm accepts it");
    algo = &*unaligned_;
  }
  KILN_CHECK(rc.workspace_size >= needed_ || needed_ == 0, kInternal, "cuBLASLt GEMM: workspace of ", rc.workspace_size,
             " bytes, ", needed_, " declared");
  mm_->run(*algo, a, b, c, d, bias, needed_ ? rc.workspace : nullptr, needed_, stream_of(rc));
}

void LtPlan::run(const void* a, const void* b, const void* c, void* d, const void* bias, const RunContext& rc) const {
  enqueue(uintptr_t(a) | uintptr_t(b) | uintptr_t(c) | uintptr_t(d), a, b, c, d, bias, rc);
}

void LtPlan::run_pointers(const void* a, const void* b, const void* c, void* d, uintptr_t matrix_bits,
                          const RunContext& rc) const {
  KILN_CHECK(mm_->shape().pointer_array, kInternal, "LtPlan::run_pointers on a strided GEMM");
  enqueue(matrix_bits, a, b, c, d, nullptr, rc);
}

BatchPlan plan_strided_batches(const std::vector<int64_t>& out_batch,
                               const std::vector<std::vector<int64_t>>& strides) {
  const size_t r = out_batch.size(), nops = strides.size();
  int64_t total = 1;
  for (int64_t d : out_batch) total *= d;
  // Every operand's offset (elements) for every output batch index.
  std::vector<std::vector<int64_t>> off(nops, std::vector<int64_t>(size_t(total), 0));
  for (size_t t = 0; t < nops; ++t) {
    const std::vector<int64_t>& stride = strides[t];
    for (int64_t idx = 0; idx < total; ++idx) {
      int64_t rem = idx, o = 0;
      for (size_t d = r; d-- > 0;) o += (rem % out_batch[d]) * stride[d], rem /= out_batch[d];
      off[t][size_t(idx)] = o;
    }
  }
  // Largest inner count (a product of trailing batch dims) with affine offsets in every group.
  BatchPlan plan;
  for (size_t lead = 0; lead <= r; ++lead) {
    int64_t inner = 1;
    for (size_t d = lead; d < r; ++d) inner *= out_batch[d];
    bool ok = true;
    std::vector<int64_t> inner_stride(nops, 0);
    for (size_t t = 0; ok && t < nops; ++t) {
      inner_stride[t] = inner > 1 ? off[t][1] - off[t][0] : 0;
      for (int64_t g = 0; ok && g < total / std::max<int64_t>(inner, 1); ++g)
        for (int64_t i = 0; ok && i < inner; ++i)
          ok = off[t][size_t(g * inner + i)] == off[t][size_t(g * inner)] + i * inner_stride[t];
    }
    if (!ok) continue;
    plan.inner = inner;
    plan.inner_stride = inner_stride;
    plan.outer_offset.assign(nops, {});
    for (size_t t = 0; t < nops; ++t)
      for (int64_t g = 0; g < total / std::max<int64_t>(inner, 1); ++g)
        plan.outer_offset[t].push_back(off[t][size_t(g * inner)]);
    return plan;
  }
  KILN_FAIL(kInternal, "plan_batches: no plan");  // lead == r (inner 1) always fits
}

}  // namespace kiln::cuda
