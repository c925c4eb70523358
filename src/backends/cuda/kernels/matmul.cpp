// CUDA kernels of the matmul family through cuBLASLt (cublaslt.h).
//
// Row-major Y[M,N] = X[M,K] W is column-major Y^T = W^T X^T, so every problem is posed with the
// operands swapped: linear is D[N, M] = op_T(w[N,K] as K x N) * x (K x M), with the bias as
// cuBLASLt's per-row bias vector; matmul is D[N, M] = b (N x K) * a (K x M) per batch.
//
// linear's epilogue act(x w^T + bias + residual):
//   - bias: CUBLASLT_EPILOGUE_BIAS; a residual of the output's shape is C with beta = 1;
//   - relu and gelu_tanh ride in cuBLASLt (RELU[_BIAS], GELU[_BIAS]: its GELU is the tanh
//     approximation). Exact "gelu" rides there too when the output is f16 or bf16: the two
//     differ by at most 4.7e-4 (at x = 2.7, a quarter of an f16 ulp of the result there), far
//     below what half precision resolves, and a separate pass over the output (an MLP's
//     widest activation) costs far more than the GEMM's epilogue.
//     BuildPolicy::exact_gelu keeps exact GELU in the generated kernel; f32 always does;
//   - gelu, silu, sigmoid, tanh, and a residual that broadcasts, run in a generated in-place
//     kernel after the GEMM (gemm_sources.h).
// matmul's batch dims map onto strided batches (plan_strided_batches); a b shared by every batch
// with a dense a folds the batch into M (one large GEMM); broadcasts that no single stride
// expresses loop over groups of strided batches. Operands read through views (a_view / b_view:
// src/ops/matmul.cpp) pose each matrix as stored or transposed with the view's row stride as
// leading dim, and out_perm writes D at the permuted layout's strides; when such a GEMM's
// batches need more than one group, it runs once over cuBLASLt's pointer arrays, which a
// generated kernel (kiln_gemm_ptrs) writes into the workspace each run. The algorithm is timed
// at build (LtPlan). f32 GEMMs use TF32 tensor cores when BuildPolicy::allow_tf32 (the engine's
// policy, at build and at load).
//
// State: pack_state(epilogue cubin (linear) or pointer-array cubin (matmul) or empty, saved
// algorithm). run() only enqueues.
#include <numeric>

#include "src/backends/cuda/codegen/gemm_sources.h"
#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/kernels.h"
#include "src/backends/cuda/libs/cublaslt.h"
#include "src/ops/access.h"
#include "src/ops/epilogue.h"
#include "src/ops/shape_rules.h"

namespace kiln::cuda {

namespace {

constexpr size_t kGemmWorkspace = size_t(32) << 20;

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_BIAS: return "bias";
    case CUBLASLT_EPILOGUE_RELU: return "relu";
    case CUBLASLT_EPILOGUE_RELU_BIAS: return "bias+relu";
    case CUBLASLT_EPILOGUE_GELU: return "gelu_tanh";
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "bias+gelu_tanh";
    default: return "none";
  }
}

bool gemm_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// The output dims with the residual's strides (0 where it broadcasts), adjacent dims merged
// when both broadcast alike.
int collapse_residual(const std::vector<int64_t>& out, std::vector<int64_t> res, KilnDims& d) {
  while (res.size() < out.size()) res.insert(res.begin(), 1);
  std::vector<int64_t> size, stride;
  int64_t st = 1;
  std::vector<int64_t> rstride(out.size());
  for (size_t i = out.size(); i-- > 0;) rstride[i] = res[i] == 1 ? 0 : st, st *= res[i];
  for (size_t i = 0; i < out.size(); ++i) {
    if (!size.empty() && ((stride.back() == 0) == (rstride[i] == 0)) &&
        (rstride[i] == 0 || stride.back() == rstride[i] * out[i])) {
      size.back() *= out[i];
      stride.back() = rstride[i];
    } else {
      size.push_back(out[i]);
      stride.push_back(rstride[i]);
    }
  }
  if (size.size() > size_t(kKilnMaxDims)) return -1;
  for (size_t i = 0; i < size.size(); ++i) d.size[i] = size[i], d.stride[i] = stride[i];
  return int(size.size());
}

class GemmKernel final : public Kernel {
 public:
  struct Epilogue {
    std::shared_ptr<const Module> module;
    cudaKernel_t scalar = nullptr, vec = nullptr;
    bool residual = false;
    int rank = 0;
    KilnDims dims{};
    int64_t numel = 0;
    int64_t per_vec = 1;
  };

  struct Pointers {
    std::shared_ptr<const Module> module;
    cudaKernel_t fill = nullptr;
    long long nb = 0;
    int brank = 0;
    KilnDims dims[3]{};  // A, B, D: the output batch dims (size) and each operand's batch strides
    int64_t offset[2] = {0, 0};  // A's and B's view offsets (elements)
  };
  std::unique_ptr<LtPlan> plan;
  BatchPlan batches;  // operands: 0 = A (column-major), 1 = B, 2 = C/D
  std::optional<Pointers> pointers;
  int a_in = 0, b_in = 1, bias_in = -1, c_in = -1;
  size_t a_es = 0, c_es = 0;
  std::optional<Epilogue> epi;
  std::string desc;

  void run(const void* const* in, void* const* out, const RunContext& rc) const override {
    if (!plan) return;  // empty output
    const auto* a = static_cast<const uint8_t*>(in[a_in]);
    const auto* b = static_cast<const uint8_t*>(in[b_in]);
    const void* bias = bias_in >= 0 ? in[bias_in] : nullptr;
    const auto* c = c_in >= 0 ? static_cast<const uint8_t*>(in[c_in]) : nullptr;
    auto* d = static_cast<uint8_t*>(out[0]);
    if (pointers) {
      const Pointers& pa = *pointers;
      RunContext gemm_rc = rc;
      gemm_rc.workspace_size = plan->workspace_size();
      auto** arr = reinterpret_cast<void**>(static_cast<uint8_t*>(rc.workspace) + pointer_array_at());
      const char* pa_a = reinterpret_cast<const char*>(a + size_t(pa.offset[0]) * a_es);
      const char* pa_b = reinterpret_cast<const char*>(b + size_t(pa.offset[1]) * a_es);
      char* pa_d = reinterpret_cast<char*>(d);
      long long nb = pa.nb, ab_bytes = (long long)a_es, d_bytes = (long long)c_es;
      int brank = pa.brank;
      KilnDims ad = pa.dims[0], bd = pa.dims[1], dd = pa.dims[2];
      void* args[] = {&nb, &brank, &ad, &bd, &dd, &pa_a, &pa_b, &pa_d, &ab_bytes, &d_bytes, &arr};
      launch(pa.fill, dim3(unsigned((nb + 127) / 128)), dim3(128), args, 0, stream_of(rc));
      const size_t n = size_t(nb);
      plan->run_pointers(arr, arr + n, nullptr, arr + 2 * n, uintptr_t(pa_a) | uintptr_t(pa_b) | uintptr_t(pa_d),
                         gemm_rc);
      return;
    }
    for (size_t o = 0; o < batches.outer(); ++o) {
      const size_t oa = size_t(batches.outer_offset[0][o]) * a_es, ob = size_t(batches.outer_offset[1][o]) * a_es;
      const size_t oc = size_t(batches.outer_offset[2][o]) * c_es;
      plan->run(a + oa, b + ob, c ? c + oc : nullptr, d + oc, bias, rc);
    }
    if (!epi) return;
    const cudaStream_t st = stream_of(rc);
    const int sms = current_device().sm_count;
    const bool vec = !epi->residual && epi->numel % epi->per_vec == 0 && uintptr_t(out[0]) % 16 == 0;
    const long long n = vec ? epi->numel / epi->per_vec : epi->numel;
    const unsigned grid = unsigned(std::min<long long>((n + 255) / 256, int64_t(sms) * 8));
    void* y = out[0];
    if (vec) {
      long long nv = n;
      void* args[] = {&y, &nv};
      launch(epi->vec, dim3(grid), dim3(256), args, 0, st);
    } else {
      const void* r = epi->residual ? in[3] : nullptr;
      long long nn = n;
      int rank = epi->rank;
      KilnDims dims = epi->dims;
      void* args[] = {&y, &r, &nn, &rank, &dims};
      launch(epi->scalar, dim3(grid), dim3(256), args, 0, st);
    }
  }
  // The pointer arrays follow the GEMM's workspace.
  size_t pointer_array_at() const { return (plan->workspace_size() + 255) / 256 * 256; }
  size_t workspace_size() const override {
    if (!plan) return 0;
    return pointers ? pointer_array_at() + 3 * size_t(pointers->nb) * sizeof(void*) : plan->workspace_size();
  }
  bool bakes_constants() const override { return false; }  // operands by pointer
  std::string describe() const override { return desc; }
  Bytes state() const override {
    const Bytes cubin = epi ? epi->module->cubin() : pointers ? pointers->module->cubin() : Bytes{};
    return pack_state(cubin, plan ? plan->save() : Bytes{});
  }
};

struct Problem {
  GemmShape shape;
  BatchPlan batches;
  bool pointers = false;  // pointer-array batches (shape.pointer_array)
  std::vector<int64_t> out_batch;
  std::vector<int64_t> batch_strides[3];  // per output batch dim: A's, B's, D's (pointer arrays)
  int64_t view_offset[2] = {0, 0};  // A's and B's
  int a_in = 0, b_in = 1, bias_in = -1, c_in = -1;
  pw::Activation activation;  // run by the generated epilogue (none: only a residual, or nothing)
  bool kernel_residual = false;
  std::string what;
};

uint32_t alignment_of(size_t es, std::initializer_list<const std::vector<int64_t>*> offsets,
                      std::initializer_list<int64_t> strides) {
  int64_t g = 16;
  for (const auto* v : offsets)
    for (int64_t o : *v) g = std::gcd(g, o * int64_t(es));
  for (int64_t s : strides) g = std::gcd(g, s * int64_t(es));
  return uint32_t(g == 0 ? 16 : g);
}

// `saved`: the state of a built kernel, whose choice between tanh GELU in cuBLASLt and exact
// GELU in a generated epilogue (a cubin) is kept as it was made.
Problem linear_problem(const Node& n, const Graph& g, const BuildPolicy& policy, const CompiledState* saved) {
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& yt = g.type(n.outputs[0]);
  const int64_t K = xt.dims.back().extent, N = yt.dims.back().extent, M = K ? xt.numel() / K : 0;
  const bool has_bias = n.inputs.size() > 2 && n.inputs[2] != kNoValue;
  const bool has_res = n.inputs.size() > 3 && n.inputs[3] != kNoValue;
  const pw::Activation act = pw::parse_activation(n.op, n.attrs);
  Problem p;
  GemmShape& s = p.shape;
  s.ab_type = s.cd_type = xt.dtype;
  s.tf32 = xt.dtype == DType::kF32 && policy.allow_tf32;
  s.m = N, s.n = M, s.k = K;
  s.trans_a = true;
  s.lda = K, s.ldb = K, s.ldc = N;
  p.a_in = 1, p.b_in = 0;
  p.batches.outer_offset = {{0}, {0}, {0}};
  p.batches.inner_stride = {0, 0, 0};
  const bool res_in_c = has_res && g.type(n.inputs[3]).shape() == yt.shape();
  if (res_in_c) s.beta = 1.0f, p.c_in = 3;
  p.kernel_residual = has_res && !res_in_c;
  if (has_bias) p.bias_in = 2;
  const std::string& a = act.name;
  const bool half = xt.dtype == DType::kF16 || xt.dtype == DType::kBF16;
  const bool tanh_gelu_ok = half && a == "gelu" && (saved ? saved->cubin.empty() : !policy.exact_gelu);
  const bool lt_act = !p.kernel_residual && (a == "relu" || a == "gelu_tanh" || tanh_gelu_ok);
  if (lt_act) {
    s.epilogue = a == "relu" ? (has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU)
                             : (has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU);
  } else {
    s.epilogue = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    p.activation = act;
  }
  p.what = "linear " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
  if (tanh_gelu_ok) p.what += " (exact gelu as cuBLASLt's tanh form)";
  return p;
}

MatmulLayout layout_of(const Node& n, const Graph& g) {
  return matmul_layout({&g.type(n.inputs[0]), &g.type(n.inputs[1])}, n.attrs);
}

// Why cuBLASLt cannot read a matmul's operand views as they are, or "".
std::string view_refusal(const Node& n, const Graph& g) {
  const MatmulLayout v = layout_of(n, g);
  const char* names[2] = {"a", "b"};
  const OperandView* views[2] = {&v.a, &v.b};
  for (size_t i = 0; i < 2; ++i) {
    const std::vector<int64_t> sh = views[i]->logical.shape();
    const size_t r = sh.size();
    if (!matrix_layout(sh[r - 2], sh[r - 1], views[i]->strides[r - 2], views[i]->strides[r - 1]).ok)
      return std::string("the view of ") + names[i] + " has no contiguous matrix dim";
  }
  if (g.type(n.outputs[0]).rank() - 2 > kKilnMaxDims) return "more than 8 batch dims read through views";
  return "";
}

Problem matmul_problem(const Node& n, const Graph& g, const BuildPolicy& policy) {
  const MatmulLayout v = layout_of(n, g);
  const auto as = v.a.logical.shape(), bs = v.b.logical.shape(), ys = v.y.logical.shape();
  const DType dt = g.type(n.inputs[0]).dtype;
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  const bool views = !v.a.dense() || !v.b.dense() || !v.y.dense();
  Problem p;
  p.a_in = 1, p.b_in = 0;
  p.out_batch.assign(ys.begin(), ys.end() - 2);
  p.batch_strides[0] = matmul_batch_strides(p.out_batch, v.b);
  p.batch_strides[1] = matmul_batch_strides(p.out_batch, v.a);
  p.batch_strides[2] = matmul_batch_strides(p.out_batch, v.y);
  p.view_offset[0] = v.b.offset, p.view_offset[1] = v.a.offset;
  p.batches = plan_strided_batches(p.out_batch, {p.batch_strides[0], p.batch_strides[1], p.batch_strides[2]});
  for (size_t t = 0; t < 2; ++t)
    for (int64_t& o : p.batches.outer_offset[t]) o += p.view_offset[t];
  GemmShape& s = p.shape;
  s.ab_type = s.cd_type = dt;
  s.tf32 = dt == DType::kF32 && policy.allow_tf32;
  s.m = N, s.n = M, s.k = K;
  s.alpha = float(matmul_alpha(n.attrs));
  const size_t ra = as.size(), rb = bs.size();
  const MatrixLayout la = matrix_layout(K, N, v.b.strides[rb - 2], v.b.strides[rb - 1]);
  const MatrixLayout lb = matrix_layout(M, K, v.a.strides[ra - 2], v.a.strides[ra - 1]);
  KILN_CHECK(la.ok && lb.ok, kUnsupported, "CUDA matmul: ", view_refusal(n, g));
  s.trans_a = la.trans, s.lda = la.ld, s.trans_b = lb.trans, s.ldb = lb.ld;
  const size_t ry = ys.size();
  s.ldc = matrix_layout(M, N, v.y.strides[ry - 2], v.y.strides[ry - 1]).ld;  // out_perm keeps columns contiguous
  const BatchPlan& bp = p.batches;
  const bool fold = bp.outer() == 1 && bp.inner > 1 && bp.inner_stride[0] == 0 && bp.inner_stride[1] == M * K &&
                    !s.trans_b && s.ldb == K && v.y.dense();
  if (fold) {
    s.n = M * bp.inner;
    p.batches.inner = 1;
    p.batches.inner_stride = {0, 0, 0};
  } else if (views && bp.outer() > 1) {
    p.pointers = true;
    s.pointer_array = true;
    s.batch = int32_t(int64_t(bp.outer()) * bp.inner);
  } else if (bp.inner > 1) {
    s.batch = int32_t(bp.inner);
    s.stride_a = bp.inner_stride[0], s.stride_b = bp.inner_stride[1], s.stride_c = bp.inner_stride[2];
  }
  s.align = alignment_of(dtype_size(dt), {&bp.outer_offset[0], &bp.outer_offset[1], &bp.outer_offset[2]},
                         {bp.inner_stride[0], bp.inner_stride[1], bp.inner_stride[2]});
  const std::string batching = p.pointers ? std::to_string(s.batch) + " batches through pointer arrays"
                                          : std::to_string(bp.outer()) + "x" + std::to_string(s.batch) + " batches";
  p.what = "matmul " + batching + " of " + std::to_string(s.n) + "x" + std::to_string(N) + "x" + std::to_string(K) +
           (fold ? " (batch folded)" : "") + (s.alpha == 1.0f ? "" : " (alpha " + std::to_string(s.alpha) + ")") +
           (views ? std::string(" reading views (a ") + (s.trans_b ? "T" : "N") + ", b " + (s.trans_a ? "T" : "N") + ")"
                  : "");
  return p;
}

}  // namespace

bool supports_matmul(const Node& n, const Graph& g, std::string* why) {
  auto no = [&](const std::string& r) {
    if (why) *why = r;
    return false;
  };
  if (n.op != OpKind::kMatmul && n.op != OpKind::kLinear) return no(std::string(op_name(n.op)) + " is not a GEMM");
  const DType dt = g.type(n.inputs[0]).dtype;
  if (!gemm_dtype(dt)) return no(std::string("cuBLASLt GEMMs here take f32, f16 or bf16, not ") + dtype_name(dt));
  const TensorType& a = g.type(n.inputs[0]);
  if (a.dims.back().extent == 0 && g.type(n.outputs[0]).numel() > 0) return no("an empty reduction (K = 0)");
  if (n.op == OpKind::kMatmul && (n.attrs.has("a_view") || n.attrs.has("b_view") || n.attrs.has("out_perm")))
    if (std::string r = view_refusal(n, g); !r.empty()) return no(r);
  if (n.op == OpKind::kLinear && n.inputs.size() > 3 && n.inputs[3] != kNoValue) {
    KilnDims d{};
    if (collapse_residual(g.type(n.outputs[0]).shape(), g.type(n.inputs[3]).shape(), d) < 0)
      return no("the residual broadcasts over more than 8 dim groups");
  }
  return true;
}

std::unique_ptr<Kernel> make_matmul_kernel(const Node& n, const Graph& g, const KernelOptions& options,
                                           const Bytes* state) {
  std::string why;
  KILN_CHECK(supports_matmul(n, g, &why), kUnsupported, "CUDA matmul: ", why);
  auto k = std::make_unique<GemmKernel>();
  const TensorType& yt = g.type(n.outputs[0]);
  if (yt.numel() == 0) {
    k->desc = "empty output: nothing to run";
    return k;
  }
  std::optional<CompiledState> saved;
  if (state) saved = unpack_state(*state);
  Problem p = n.op == OpKind::kLinear ? linear_problem(n, g, options.policy, saved ? &*saved : nullptr)
                                      : matmul_problem(n, g, options.policy);
  const size_t ws = std::min(kGemmWorkspace, options.workspace_limit);  // the bound; the plan keeps what it needs
  BatchOffsets at;  // a pointer-array GEMM's matrices, for timing
  if (p.pointers) {
    GemmKernel::Pointers pa;
    pa.nb = p.shape.batch;
    pa.brank = int(p.out_batch.size());
    for (size_t t = 0; t < 3; ++t)
      for (size_t d = 0; d < p.out_batch.size(); ++d)
        pa.dims[t].size[d] = p.out_batch[d], pa.dims[t].stride[d] = p.batch_strides[t][d];
    pa.offset[0] = p.view_offset[0], pa.offset[1] = p.view_offset[1];
    const BatchPlan& bp = p.batches;
    for (size_t g2 = 0; g2 < bp.outer(); ++g2)
      for (int64_t i = 0; i < bp.inner; ++i) {
        auto off = [&](size_t t) {
          return bp.outer_offset[t][g2] + i * bp.inner_stride[t] - (t < 2 ? p.view_offset[t] : 0);
        };
        at.a.push_back(off(0)), at.b.push_back(off(1)), at.c.push_back(off(2));
      }
    if (saved) {
      KILN_CHECK(!saved->cubin.empty(), kCorrupted, "matmul state of node '", n.name,
                 "' lacks its pointer-array kernel");
      pa.module = Module::load(saved->cubin);
    } else {
      pa.module = Module::compile(gemm_pointers_source(), "matmul pointer arrays of node '" + n.name + "'");
    }
    pa.fill = pa.module->kernel("kiln_gemm_ptrs");
    k->pointers = std::move(pa);
  }
  k->plan = saved ? std::make_unique<LtPlan>(p.shape, ws, saved->params)
                  : std::make_unique<LtPlan>(p.shape, ws, options.budget(), op_name(n.op), p.pointers ? &at : nullptr);
  k->batches = p.batches;
  k->a_in = p.a_in, k->b_in = p.b_in, k->bias_in = p.bias_in, k->c_in = p.c_in;
  k->a_es = dtype_size(p.shape.ab_type), k->c_es = dtype_size(p.shape.cd_type);
  k->desc = "cuBLASLt " + p.what + " " + dtype_name(p.shape.ab_type) + (p.shape.tf32 ? " (TF32)" : "") +
            ", cuBLASLt epilogue " + epilogue_name(p.shape.epilogue) + (p.c_in >= 0 ? " + residual as C" : "") + "; " +
            k->plan->how();
  if (!p.activation.none || p.kernel_residual) {
    GemmKernel::Epilogue e;
    const DType dt = yt.dtype;
    if (saved && !saved->cubin.empty()) {
      e.module = Module::load(saved->cubin);
    } else {
      KILN_CHECK(!saved, kCorrupted, "matmul state of node '", n.name, "' lacks its epilogue kernel");
      e.module = Module::compile(gemm_epilogue_source(dt, p.activation, p.kernel_residual),
                                 "linear epilogue of node '" + n.name + "'");
    }
    e.scalar = e.module->kernel("kiln_gemm_epilogue");
    e.vec = e.module->kernel("kiln_gemm_epilogue_vec");
    e.residual = p.kernel_residual;
    e.numel = yt.numel();
    e.per_vec = int64_t(16 / dtype_size(dt));
    if (e.residual) e.rank = collapse_residual(yt.shape(), g.type(n.inputs[3]).shape(), e.dims);
    k->desc += "; generated epilogue" + std::string(e.residual ? " + broadcast residual" : "") +
               (p.activation.none ? "" : " + " + p.activation.name);
    k->epi = std::move(e);
  }
  return k;
}

}  // namespace kiln::cuda
