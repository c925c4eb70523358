// CUDA kernels of softmax and log_softmax over one axis, generated and compiled by NVRTC.
//
// x is viewed as [outer, R, inner] around the axis. Statistics are f32 (f64 for f64):
//   inner == 1, R <= 1024:   one warp per row; the row lives in registers (each lane holds up
//                            to 32 elements), loaded with vectors of up to 16 bytes when R
//                            allows; max, then exp and sum, then the scaled write: x is read once.
//   inner == 1, R <= 16384:  one 512-thread block per row, the row again in registers.
//   inner == 1, longer:      one block per row in two passes over memory: an online (max, sum)
//                            pass, then the write pass.
//   inner > 1:               one thread per column, three passes (max, sum, write), coalesced
//                            along the kept run.
// Semantics follow the CPU: softmax = exp(x - max) * (1 / sum), log_softmax =
// (x - max) - log(sum); a NaN anywhere makes the row NaN.
#include <algorithm>

#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/codegen/prelude.h"
#include "src/backends/cuda/kernels.h"

namespace kiln::cuda {

namespace gen {
namespace {

constexpr int kBlockThreads = 512;

// The register-cached row kernel: G threads per row (32: a warp, else the block), EPL
// elements per thread in chunks of V.
std::string cached_kernel(bool log, bool warp, int epl, int vec, int esz, const std::string& name) {
  std::string s = "extern \"C\" __global__ void " + name +
                  "(const T_x* __restrict__ x, T_x* __restrict__ y, long long rows, "
                  "long long R) {\n  __shared__ A sm[33];\n";
  if (warp) {
    s += "  const long long r0 = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5, nr = ((long long)gridDim.x * "
         "blockDim.x) >> 5;\n  const int lane = threadIdx.x & 31;\n";
  } else {
    s += "  const long long r0 = blockIdx.x, nr = gridDim.x;\n  const int lane = threadIdx.x;\n";
  }
  const std::string rmax = warp ? "kg_warp_max(m)" : "kg_block_max(m, sm, -(A)KG_INF)";
  const std::string rsum = warp ? "kg_warp_sum(s)" : "kg_block_sum(s, sm)";
  s += R"(  for (long long row = r0; row < rows; row += nr) {
    const VW* p = reinterpret_cast<const VW*>(x + row * R);
    VW* q = reinterpret_cast<VW*>(y + row * R);
    A v[KG_EPL];
#pragma unroll
    for (int c = 0; c < KG_EPL / KG_V; ++c) {
      const long long i = (long long)c * KG_G + lane;
      if (i * KG_V < R) {
        const VW u = p[i];
        const T_x* e = reinterpret_cast<const T_x*>(&u);
#pragma unroll
        for (int j = 0; j < KG_V; ++j) v[c * KG_V + j] = ld_x(e[j]);
      } else {
#pragma unroll
        for (int j = 0; j < KG_V; ++j) v[c * KG_V + j] = -(A)KG_INF;
      }
    }
    A m = -(A)KG_INF;
#pragma unroll
    for (int k = 0; k < KG_EPL; ++k) m = kg_max(m, v[k]);
)";
  s += "    m = " + rmax + ";\n    A s = 0;\n";
  s += R"(#pragma unroll
    for (int c = 0; c < KG_EPL / KG_V; ++c) {
      if (((long long)c * KG_G + lane) * KG_V < R) {
#pragma unroll
        for (int j = 0; j < KG_V; ++j) {
          const A d = v[c * KG_V + j] - m;
)";
  s += log ? "          v[c * KG_V + j] = d;\n          s += exp(d);\n"
           : "          const A e = exp(d);\n          v[c * KG_V + j] = e;\n          s += e;\n";
  s += "        }\n      }\n    }\n    s = " + rsum + ";\n";
  s += log ? "    const A f = log(s);\n" : "    const A f = (A)1 / s;\n";
  s += R"(#pragma unroll
    for (int c = 0; c < KG_EPL / KG_V; ++c) {
      const long long i = (long long)c * KG_G + lane;
      if (i * KG_V < R) {
        VW u;
        T_x* e = reinterpret_cast<T_x*>(&u);
#pragma unroll
)";
  s += std::string("        for (int j = 0; j < KG_V; ++j) e[j] = st_x(") +
       (log ? "v[c * KG_V + j] - f" : "v[c * KG_V + j] * f") + ");\n        q[i] = u;\n      }\n    }\n  }\n}\n";
  s = replace_all(s, "KG_EPL", std::to_string(epl));
  s = replace_all(s, "KG_V", std::to_string(vec));
  s = replace_all(s, "KG_G", warp ? "32" : "(int)blockDim.x");
  return replace_all(s, "VW", word_type(vec * esz));
}

// Long rows: one block per row, an online (max, sum) pass and a write pass.
std::string long_kernel(bool log) {
  std::string s =
      R"(extern "C" __global__ void kg_softmax_long(const T_x* __restrict__ x, T_x* __restrict__ y, long long rows, long long R) {
  __shared__ A sm[33];
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const T_x* p = x + row * R;
    T_x* q = y + row * R;
    A m = -(A)KG_INF, s = 0;
    for (long long i = threadIdx.x; i < R; i += blockDim.x) {
      const A v = ld_x(p[i]);
      if (v == -(A)KG_INF) continue;
      if (v > m) { s = s * exp(m - v) + (A)1; m = v; }
      else s += exp(v - m);
    }
    const A mall = kg_block_max(m, sm, -(A)KG_INF);
    s = m == -(A)KG_INF ? (A)0 : s * exp(m - mall);
    s = kg_block_sum(s, sm);
)";
  s += log ? "    const A f = log(s);\n" : "    const A f = (A)1 / s;\n";
  s += "    for (long long i = threadIdx.x; i < R; i += blockDim.x) {\n      const A d = ld_x(p[i]) - mall;\n";
  s += log ? "      q[i] = st_x(d - f);\n" : "      q[i] = st_x(exp(d) * f);\n";
  s += "    }\n  }\n}\n";
  return s;
}

std::string cols_kernel(bool log) {
  std::string s =
      R"(extern "C" __global__ void kg_softmax_cols(const T_x* __restrict__ x, T_x* __restrict__ y, long long outer, long long R,
                                           long long inner) {
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < outer * inner; t += (long long)gridDim.x * blockDim.x) {
    const long long o = t / inner, j = t % inner;
    const T_x* p = x + o * R * inner + j;
    T_x* q = y + o * R * inner + j;
    A m = -(A)KG_INF, s = 0;
    for (long long r = 0; r < R; ++r) m = kg_max(m, ld_x(p[r * inner]));
    for (long long r = 0; r < R; ++r) s += exp(ld_x(p[r * inner]) - m);
)";
  s += log ? "    const A f = log(s);\n    for (long long r = 0; r < R; ++r) q[r * inner] = st_x((ld_x(p[r * inner]) - "
             "m) - f);\n"
           : "    const A f = (A)1 / s;\n    for (long long r = 0; r < R; ++r) q[r * inner] = st_x(exp(ld_x(p[r * "
             "inner]) - m) * f);\n";
  s += "  }\n}\n";
  return s;
}

}  // namespace

Generated generate_softmax(const Node& n, const Graph& g) {
  const TensorType& xt = g.type(n.inputs[0]);
  KILN_CHECK(is_floating(xt.dtype), kUnsupported, op_name(n.op), ": x must be floating, got ", xt.to_string());
  const auto shape = xt.shape();
  const auto axis = size_t(n.attrs.get_int("axis"));
  int64_t outer = 1, inner = 1;
  const int64_t R = shape.at(axis);
  for (size_t d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const bool log = n.op == OpKind::kLogSoftmax;
  Generated gn;
  const std::string desc = std::string("cuda ") + op_name(n.op) + " " + xt.to_string();
  gn.plan.describe = desc + " (empty)";
  if (outer * R * inner == 0) return gn;
  gn.source = source_head() + type_defs("x", xt.dtype) + "typedef " + compute_of(xt.dtype) + " A;\n";
  const int esz = int(dtype_size(xt.dtype));
  if (inner == 1 && R <= 16 * kBlockThreads) {
    const bool warp = R <= 1024;
    const int G = warp ? 32 : kBlockThreads;
    const RowSplit split = split_row(R, G, esz);
    const int epl = split.per_lane, vec = split.vec;
    auto rows = [&](int v) {
      const std::string name = "kg_softmax_rows_v" + std::to_string(v);
      gn.source += cached_kernel(log, warp, epl, v, esz, name);
      Launch l(name, warp ? blocks_for(outer, 4) : blocks_for(outer, 1), warp ? 128 : uint32_t(G));
      l.in(0).out(0).i64(outer).i64(R);
      return l;
    };
    Launch l = rows(vec);
    if (vec > 1) with_fallback(l, uint32_t(vec * esz), rows(1));
    gn.plan.launches.push_back(std::move(l));
    gn.plan.describe =
        desc + (warp ? " (warp" : " (block") + " per row in registers, " + std::to_string(vec) + "-wide loads)";
  } else if (inner == 1) {
    gn.source += long_kernel(log);
    Launch l("kg_softmax_long", blocks_for(outer, 1), 1024);
    l.in(0).out(0).i64(outer).i64(R);
    gn.plan.launches.push_back(std::move(l));
    gn.plan.describe = desc + " (block per row, two passes)";
  } else {
    gn.source += cols_kernel(log);
    Launch l("kg_softmax_cols", blocks_for(outer * inner, 256), 256);
    l.in(0).out(0).i64(outer).i64(R).i64(inner);
    gn.plan.launches.push_back(std::move(l));
    gn.plan.describe = desc + " (thread per column)";
  }
  return gn;
}

}  // namespace gen

bool supports_softmax(const Node& n, const Graph& g, std::string* why) {
  try {
    gen::generate_softmax(n, g);
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

std::unique_ptr<Kernel> make_softmax_kernel(const Node& n, const Graph& g, const KernelOptions&, const Bytes* state) {
  if (state) return gen::build({}, gen::what_of(n), state);
  return gen::build(gen::generate_softmax(n, g), gen::what_of(n), nullptr);
}

}  // namespace kiln::cuda
