// CUDA kernels of the normalization family (inference), generated and compiled by NVRTC.
//
//   layer_norm: rows of D = the last normalized_rank dims. D <= 1024: one warp per row; D <=
//               16384: one 512-thread block per row; the row stays in registers (vectors of up
//               to 16 bytes), so x is read once. Longer rows: a block per row reading x three
//               times (sum, squared deviations, write).
//   group_norm: one 512-thread block per (sample, group), whose elements are contiguous:
//               sum, squared deviations, then the write with the channel's weight and bias.
//   batch_norm: a per-channel kernel folds the running statistics into scale and shift (in
//               the workspace, f64 arithmetic as on the CPU), then y = x * scale + shift.
// Statistics follow the CPU: f32 (f64 for f64), two-pass mean and biased variance, rstd =
// 1 / sqrt(var + eps) computed in double; y = (x - mean) * rstd, then * weight, then + bias.
// weight / bias may have x's dtype or f32; absent ones are compiled out.
#include <algorithm>

#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/codegen/prelude.h"
#include "src/backends/cuda/kernels.h"

namespace kiln::cuda {

namespace gen {
namespace {

constexpr int kBlockThreads = 512;

bool present(const Node& n, size_t i) { return i < n.inputs.size() && n.inputs[i] != kNoValue; }

// Parameter helpers: P_w / P_b loads (or nothing when absent).
std::string param_defs(const Node& n, const Graph& g, size_t first) {
  std::string s;
  const char* names[] = {"p0", "p1", "p2", "p3"};
  for (size_t i = first; i < n.inputs.size() && i - first < 4; ++i)
    if (n.inputs[i] != kNoValue) s += type_defs(names[i - first], g.type(n.inputs[i]).dtype);
  return s;
}

// Loads the vec parameter values of lane chunk i into `arr` (A) as whole words: the widest of at
// most 16 bytes that the launch's alignment (vec * esz, checked on every pointer) allows. Scalar
// 2-byte loads of the weight and bias spread a warp's instruction over 16 sectors each and cost
// more L1 wavefronts than the row itself.
std::string param_loads(const std::string& ptr, const std::string& ld, const std::string& arr, int vec, int esz,
                        int psz) {
  const int word = std::min({16, vec * esz, vec * psz}), count = vec * psz / word;
  const std::string wt = word_type(word), pt = ptr == "w" ? "T_p0" : "T_p1";
  std::string s = R"(        {
          WT pw[CNT];
          const WT* pq = reinterpret_cast<const WT*>(PTR + i * KG_V);
#pragma unroll
          for (int k = 0; k < CNT; ++k) pw[k] = pq[k];
          const PT* pe = reinterpret_cast<const PT*>(pw);
#pragma unroll
          for (int j = 0; j < KG_V; ++j) ARR[c * KG_V + j] = (A)LD(pe[j]);
        }
)";
  s = replace_all(s, "WT", wt);
  s = replace_all(s, "CNT", std::to_string(count));
  s = replace_all(s, "PTR", ptr);
  s = replace_all(s, "PT", pt);
  s = replace_all(s, "ARR", arr);
  return replace_all(s, "LD", ld);
}

// psz_w / psz_b: the weight's and bias's element sizes (0 when absent).
std::string layer_cached(bool warp, int epl, int vec, int esz, int psz_w, int psz_b, const std::string& name) {
  const bool w = psz_w > 0, b = psz_b > 0;
  std::string s =
      "extern \"C\" __global__ void " + name +
      "(const T_x* __restrict__ x, const T_p0* __restrict__ w, const T_p1* "
      "__restrict__ b, T_x* __restrict__ y, long long rows, long long D, double eps) {\n  __shared__ A sm[33];\n";
  if (warp) {
    s += "  const long long r0 = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5, nr = ((long long)gridDim.x * "
         "blockDim.x) >> 5;\n  const int lane = threadIdx.x & 31;\n";
  } else {
    s += "  const long long r0 = blockIdx.x, nr = gridDim.x;\n  const int lane = threadIdx.x;\n";
  }
  const std::string rsum = warp ? "kg_warp_sum(s)" : "kg_block_sum(s, sm)";
  s += R"(  for (long long row = r0; row < rows; row += nr) {
    const VW* p = reinterpret_cast<const VW*>(x + row * D);
    VW* q = reinterpret_cast<VW*>(y + row * D);
    A v[KG_EPL];
KG_PARAM_DECLS    A s = 0;
#pragma unroll
    for (int c = 0; c < KG_EPL / KG_V; ++c) {
      const long long i = (long long)c * KG_G + lane;
      if (i * KG_V < D) {
        const VW u = p[i];
        const T_x* e = reinterpret_cast<const T_x*>(&u);
#pragma unroll
        for (int j = 0; j < KG_V; ++j) { v[c * KG_V + j] = ld_x(e[j]); s += v[c * KG_V + j]; }
KG_PARAM_LOADS      } else {
#pragma unroll
        for (int j = 0; j < KG_V; ++j) v[c * KG_V + j] = 0;
      }
    }
)";
  s += "    s = " + rsum + ";\n    const A mean = (A)((double)s / (double)D);\n    s = 0;\n";
  s += R"(#pragma unroll
    for (int c = 0; c < KG_EPL / KG_V; ++c)
      if (((long long)c * KG_G + lane) * KG_V < D)
#pragma unroll
        for (int j = 0; j < KG_V; ++j) s += (v[c * KG_V + j] - mean) * (v[c * KG_V + j] - mean);
)";
  s += "    s = " + rsum + ";\n    const A rstd = (A)(1.0 / sqrt((double)s / (double)D + eps));\n";
  s += R"(#pragma unroll
    for (int c = 0; c < KG_EPL / KG_V; ++c) {
      const long long i = (long long)c * KG_G + lane;
      if (i * KG_V < D) {
        VW u;
        T_x* e = reinterpret_cast<T_x*>(&u);
#pragma unroll
        for (int j = 0; j < KG_V; ++j) {
          A r = (v[c * KG_V + j] - mean) * rstd;
)";
  if (w) s += "          r *= wv[c * KG_V + j];\n";
  if (b) s += "          r += bv[c * KG_V + j];\n";
  s += "          e[j] = st_x(r);\n        }\n        q[i] = u;\n      }\n    }\n  }\n}\n";
  // The weight and bias are loaded with the row, so their latency overlaps x's instead of
  // following the two reductions.
  s = replace_all(s, "KG_PARAM_DECLS", std::string(w ? "    A wv[KG_EPL];\n" : "") + (b ? "    A bv[KG_EPL];\n" : ""));
  std::string loads;
  if (w) loads += param_loads("w", "ld_p0", "wv", vec, esz, psz_w);
  if (b) loads += param_loads("b", "ld_p1", "bv", vec, esz, psz_b);
  s = replace_all(s, "KG_PARAM_LOADS", loads);
  s = replace_all(s, "KG_EPL", std::to_string(epl));
  s = replace_all(s, "KG_V", std::to_string(vec));
  s = replace_all(s, "KG_G", warp ? "32" : "(int)blockDim.x");
  return replace_all(s, "VW", word_type(vec * esz));
}

// Contiguous groups of n elements (layer_norm long rows, group_norm): block per group.
// Channel of element i: (group % G) * Cg + i / S (layer_norm: the element itself).
std::string group_kernel(bool layer, bool w, bool b) {
  std::string s =
      R"(extern "C" __global__ void kg_group_norm(const T_x* __restrict__ x, const T_p0* __restrict__ w, const T_p1* __restrict__ b,
                                         T_x* __restrict__ y, long long groups, long long n, long long G, long long Cg, long long S,
                                         double eps) {
  __shared__ A sm[33];
  for (long long grp = blockIdx.x; grp < groups; grp += gridDim.x) {
    const T_x* p = x + grp * n;
    T_x* q = y + grp * n;
    A s = 0;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) s += ld_x(p[i]);
    s = kg_block_sum(s, sm);
    const A mean = (A)((double)s / (double)n);
    s = 0;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) { const A d = ld_x(p[i]) - mean; s += d * d; }
    s = kg_block_sum(s, sm);
    const A rstd = (A)(1.0 / sqrt((double)s / (double)n + eps));
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
)";
  s += layer ? "      const long long c = i;\n" : "      const long long c = (grp % G) * Cg + i / S;\n";
  if (layer) {
    s += "      A r = (ld_x(p[i]) - mean) * rstd;\n";
    if (w) s += "      r *= (A)ld_p0(w[c]);\n";
    if (b) s += "      r += (A)ld_p1(b[c]);\n";
  } else {  // as the CPU: scale = rstd * weight, then (x - mean) * scale + bias
    s += std::string("      const A sc = rstd * ") + (w ? "(A)ld_p0(w[c])" : "(A)1") + ";\n";
    s += std::string("      const A r = (ld_x(p[i]) - mean) * sc + ") + (b ? "(A)ld_p1(b[c])" : "(A)0") + ";\n";
  }
  s += "      q[i] = st_x(r);\n    }\n  }\n}\n";
  return s;
}

std::string batch_kernels(bool w, bool b) {
  std::string s =
      R"(extern "C" __global__ void kg_bn_prep(const T_p0* __restrict__ mean, const T_p1* __restrict__ var, const T_p2* __restrict__ w,
                                      const T_p3* __restrict__ b, A* __restrict__ ss, long long C, double eps) {
  for (long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x; c < C; c += (long long)gridDim.x * blockDim.x) {
)";
  s += std::string("    const double sc = ") + (w ? "(double)ld_p2(w[c])" : "1.0") +
       " / sqrt((double)ld_p1(var[c]) + eps);\n";
  s += std::string("    ss[c] = (A)sc;\n    ss[C + c] = (A)(") + (b ? "(double)ld_p3(b[c])" : "0.0") +
       " - (double)ld_p0(mean[c]) * sc);\n  }\n}\n";
  s +=
      R"(extern "C" __global__ void kg_bn_apply(const T_x* __restrict__ x, const A* __restrict__ ss, T_x* __restrict__ y,
                                       long long numel, long long C, long long S) {
  if (numel < 2147483647LL) {
    const unsigned n32 = (unsigned)numel, C32 = (unsigned)C, S32 = (unsigned)S;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n32; i += gridDim.x * blockDim.x) {
      const unsigned c = (i / S32) % C32;
      y[i] = st_x(ld_x(x[i]) * ss[c] + ss[C32 + c]);
    }
  } else {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < numel; i += (long long)gridDim.x * blockDim.x) {
      const long long c = (i / S) % C;
      y[i] = st_x(ld_x(x[i]) * ss[c] + ss[C + c]);
    }
  }
}
)";
  return s;
}

}  // namespace

Generated generate_norm(const Node& n, const Graph& g) {
  const TensorType& xt = g.type(n.inputs[0]);
  KILN_CHECK(is_floating(xt.dtype), kUnsupported, op_name(n.op), ": x must be floating, got ", xt.to_string());
  const auto shape = xt.shape();
  const double eps = n.attrs.get_float("eps", 1e-5);
  const int64_t numel = xt.numel();
  const int esz = int(dtype_size(xt.dtype));
  Generated gn;
  const std::string desc = std::string("cuda ") + op_name(n.op) + " " + xt.to_string();
  gn.plan.describe = desc + " (empty)";
  if (numel == 0) return gn;
  std::string head = source_head() + type_defs("x", xt.dtype) + "typedef " + compute_of(xt.dtype) + " A;\n";
  const bool w = present(n, 1), b = present(n, 2);

  if (n.op == OpKind::kLayerNorm) {
    const auto k = size_t(n.attrs.get_int("normalized_rank", 1));
    int64_t rows = 1, D = 1;
    for (size_t d = 0; d < shape.size(); ++d) (d + k < shape.size() ? rows : D) *= shape[d];
    // Absent parameters still need a type for the (null) pointer argument.
    head += param_defs(n, g, 1);
    if (!w) head += "typedef float T_p0;\n";
    if (!b) head += "typedef float T_p1;\n";
    if (D <= 32 * kBlockThreads) {
      const bool warp = D <= 1024;
      const int G = warp ? 32 : kBlockThreads;
      const RowSplit split = split_row(D, G, esz);
      const int epl = split.per_lane, vec = split.vec;
      auto psz = [&](size_t i) { return present(n, i) ? int(dtype_size(g.type(n.inputs[i]).dtype)) : 0; };
      gn.source = head;
      auto ln = [&](int v) {
        const std::string name = "kg_layer_norm_v" + std::to_string(v);
        gn.source += layer_cached(warp, epl, v, esz, psz(1), psz(2), name);
        // Warp per row: 4 rows a block, fewer when the rows are too few to reach every
        // multiprocessor of a large GPU (one 128-token sequence: 128 rows).
        const uint32_t wpb = rows >= 4 * kLargeGpuSms ? 4 : rows >= 2 * kLargeGpuSms ? 2 : 1;
        Launch l(name, warp ? blocks_for(rows, wpb) : blocks_for(rows, 1), warp ? 32 * wpb : uint32_t(G));
        l.in(0).opt_in(n, 1).opt_in(n, 2).out(0).i64(rows).i64(D).f64(eps);
        return l;
      };
      Launch l = ln(vec);
      if (vec > 1) with_fallback(l, uint32_t(vec * esz), ln(1));
      gn.plan.launches.push_back(std::move(l));
      gn.plan.describe =
          desc + (warp ? " (warp" : " (block") + " per row in registers, " + std::to_string(vec) + "-wide loads)";
    } else {
      gn.source = head + group_kernel(true, w, b);
      Launch l("kg_group_norm", blocks_for(rows, 1), kBlockThreads);
      l.in(0).opt_in(n, 1).opt_in(n, 2).out(0).i64(rows).i64(D).i64(1).i64(D).i64(1).f64(eps);
      gn.plan.launches.push_back(std::move(l));
      gn.plan.describe = desc + " (block per row, three passes)";
    }
    return gn;
  }

  const int64_t N = shape.at(0), C = shape.at(1);
  int64_t S = 1;
  for (size_t d = 2; d < shape.size(); ++d) S *= shape[d];
  if (n.op == OpKind::kGroupNorm) {
    const int64_t G = n.attrs.get_int("groups"), Cg = C / G;
    head += param_defs(n, g, 1);
    if (!w) head += "typedef float T_p0;\n";
    if (!b) head += "typedef float T_p1;\n";
    gn.source = head + group_kernel(false, w, b);
    Launch l("kg_group_norm", blocks_for(N * G, 1), kBlockThreads);
    l.in(0).opt_in(n, 1).opt_in(n, 2).out(0).i64(N * G).i64(Cg * S).i64(G).i64(Cg).i64(S).f64(eps);
    gn.plan.launches.push_back(std::move(l));
    gn.plan.describe = desc + " (block per group)";
    return gn;
  }

  KILN_CHECK(n.op == OpKind::kBatchNorm, kInternal, op_name(n.op), " is not in the norm family");
  const bool bw = present(n, 3), bb = present(n, 4);
  head += param_defs(n, g, 1);
  if (!bw) head += "typedef float T_p2;\n";
  if (!bb) head += "typedef float T_p3;\n";
  gn.source = head + batch_kernels(bw, bb);
  const int64_t abytes = xt.dtype == DType::kF64 ? 8 : 4;
  gn.plan.workspace = uint64_t((2 * C * abytes + 255) / 256 * 256);
  Launch prep("kg_bn_prep", blocks_for(C, 256), 256);
  prep.in(1).in(2).opt_in(n, 3).opt_in(n, 4).ws().i64(C).f64(eps);
  Launch apply("kg_bn_apply", blocks_for(numel, 256), 256);
  apply.in(0).ws().out(0).i64(numel).i64(C).i64(S);
  gn.plan.launches.push_back(std::move(prep));
  gn.plan.launches.push_back(std::move(apply));
  gn.plan.describe = desc + " (folded scale and shift)";
  (void)N;
  return gn;
}

}  // namespace gen

bool supports_norm(const Node& n, const Graph& g, std::string* why) {
  try {
    gen::generate_norm(n, g);
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

std::unique_ptr<Kernel> make_norm_kernel(const Node& n, const Graph& g, const KernelOptions&, const Bytes* state) {
  if (state) return gen::build({}, gen::what_of(n), state);
  return gen::build(gen::generate_norm(n, g), gen::what_of(n), nullptr);
}

}  // namespace kiln::cuda
