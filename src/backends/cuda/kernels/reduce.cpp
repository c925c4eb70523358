// CUDA kernels of the reduce family: reduce_sum / _mean / _max / _min / _var over any axes and
// argmax over one, generated and compiled by NVRTC.
//
// At make time x's dims are collapsed as on the CPU (unit dims dropped, neighbours that are
// both reduced or both kept merged), leaving kept dims and reduced dims around an innermost
// run that is either reduced (rows) or kept (columns):
//   rows:    one warp per output (at most 2048 reduced elements) or one 256-thread block,
//            16-byte loads when every run starts aligned; warp shuffles combine the lanes;
//   columns: where every run starts 16-byte aligned, one 16-byte word of consecutive outputs
//            per block, 32 to 256 threads splitting the reduction with up to four words in
//            flight each; else 32 consecutive outputs per block, 8 or 32 rows of threads
//            splitting the reduction, combined through shared memory.
// The numbers of kept and reduced dims are part of the source (they unroll); extents and
// strides are arguments. Floating sums accumulate in f32 (f64 for f64), integer sums in 64
// bits, wrapping like the CPU; max / min propagate NaN; reduce_var is two-pass (mean, then
// squared deviations), as on the CPU. argmax keeps the first index of the largest value, a
// NaN counting as largest. An empty reduction writes sum 0, mean / var NaN.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/codegen/prelude.h"
#include "src/backends/cuda/kernels.h"
#include "src/common/element_access.h"
#include "src/ops/access.h"

namespace kiln::cuda {

namespace gen {
namespace {

constexpr int kMaxSide = 4;  // kept / reduced dims outside the innermost run

using Layout = ReduceLayout;

struct Side {
  long long kext[kMaxSide], kst[kMaxSide], rext[kMaxSide], rst[kMaxSide];
};
const char* kSideDecl = "struct Side { long long kext[4]; long long kst[4]; long long rext[4]; long long rst[4]; };\n";

// Offset code: `var += offset of index idx over dims <pre>ext/<pre>st[0..n)`.
std::string offset_code(const std::string& var, const std::string& idx, const std::string& pre, size_t n) {
  if (n == 0) return "";
  std::string s = "    { long long q_ = " + idx + ";\n";
  for (size_t k = n; k-- > 1;)
    s += "      " + var + " += (q_ % g." + pre + "ext[" + std::to_string(k) + "]) * g." + pre + "st[" +
         std::to_string(k) + "]; q_ /= g." + pre + "ext[" + std::to_string(k) + "];\n";
  s += "      " + var + " += q_ * g." + pre + "st[0]; }\n";
  return s;
}

// The accumulator: type A, identity, combine, load of one element.
struct AccSpec {
  std::string type, identity, combine, load, store;
};

AccSpec acc_spec(OpKind op, DType dt) {
  AccSpec a;
  const bool flt = is_floating(dt);
  const std::string c = compute_of(dt);
  const bool isum = !flt && (op == OpKind::kReduceSum);
  a.type = isum ? "unsigned long long" : c;
  a.load = isum ? "(unsigned long long)ld_x(v)" : "ld_x(v)";
  a.store = isum ? "st_x((long long)r)" : "st_x(r)";
  if (op == OpKind::kReduceMax || op == OpKind::kReduceMin) {
    const bool mx = op == OpKind::kReduceMax;
    a.combine = mx ? "kg_max(a, b)" : "kg_min(a, b)";
    if (flt) a.identity = mx ? "-(A)KG_INF" : "(A)KG_INF";
    else a.identity = mx ? "(A)(-9223372036854775807LL - 1)" : "(A)9223372036854775807LL";
  } else {
    a.combine = "a + b";
    a.identity = "(A)0";
  }
  return a;
}

std::string acc_helpers(const AccSpec& a) {
  return "typedef " + a.type +
         " A;\n"
         "__device__ __forceinline__ A kg_comb(A a, A b) { return " +
         a.combine +
         "; }\n"
         "__device__ __forceinline__ A kg_ld(T_x v) { return " +
         a.load +
         "; }\n"
         "__device__ __forceinline__ A kg_wred(A v) {\n"
         "  for (int o = 16; o > 0; o >>= 1) v = kg_comb(v, __shfl_xor_sync(0xffffffffu, v, o));\n  return v;\n}\n"
         "__device__ __forceinline__ A kg_bred(A v, A* sm) {\n"
         "  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;\n"
         "  v = kg_wred(v);\n  if (nw == 1) return v;\n  if (lane == 0) sm[wid] = v;\n  __syncthreads();\n"
         "  v = lane < nw ? sm[lane] : " +
         a.identity + ";\n  v = kg_wred(v);\n  __syncthreads();\n  return v;\n}\n";
}

// Rows: the innermost run is reduced. mode: 0 plain, 1 mean, 2 var.
std::string rows_kernel(const Layout& L, const AccSpec& a, int mode, bool block, int vec, const std::string& name) {
  const size_t kr = L.kept_shape.size(), rr = L.red_shape.size();
  std::string s = "extern \"C\" __global__ void " + name +
                  "(const T_x* __restrict__ x, T_x* __restrict__ y, Side g,"
                  " long long outputs, long long nro, long long run, long long count, double correction) {\n";
  s += "  __shared__ A sm[33];\n";
  if (block) {
    s += "  const long long gid0 = blockIdx.x, ngroups = gridDim.x; const int lane = threadIdx.x, G = blockDim.x;\n";
  } else {
    s += "  const long long gid0 = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5, ngroups = "
         "((long long)gridDim.x * blockDim.x) >> 5;\n  const int lane = threadIdx.x & 31, G = 32;\n";
  }
  const std::string red = block ? "kg_bred(acc, sm)" : "kg_wred(acc)";
  // One pass over the reduced elements, folding `expr` (of A v) into acc.
  auto pass = [&](const std::string& fold) {
    std::string p = "    for (long long ro = 0; ro < nro; ++ro) {\n      long long off = base;\n";
    p += offset_code("off", "ro", "r", rr);
    if (vec > 1) {
      p += "      const uint4* p4 = reinterpret_cast<const uint4*>(x + off);\n"
           "      for (long long i = lane; i < run / " +
           std::to_string(vec) +
           "; i += G) {\n"
           "        const uint4 u = p4[i]; const T_x* e = reinterpret_cast<const T_x*>(&u);\n"
           "#pragma unroll\n        for (int j = 0; j < " +
           std::to_string(vec) + "; ++j) { const A v = kg_ld(e[j]); " + fold + " }\n      }\n";
    } else {
      p +=
          "      const T_x* p = x + off;\n      for (long long i = lane; i < run; i += G) { const A v = kg_ld(p[i]); " +
          fold + " }\n";
    }
    return p + "    }\n";
  };
  s += "  for (long long o = gid0; o < outputs; o += ngroups) {\n    long long base = 0;\n";
  s += offset_code("base", "o", "k", kr);
  s += "    A acc = " + a.identity + ";\n";
  s += pass("acc = kg_comb(acc, v);");
  s += "    acc = " + red + ";\n";
  if (mode == 2) {
    s += "    const A mean = acc / (A)count;\n    acc = (A)0;\n";
    s += pass("acc += (v - mean) * (v - mean);");
    s += "    acc = " + red + ";\n    const A r = (A)((double)acc / ((double)count - correction));\n";
  } else if (mode == 1) {
    s += "    const A r = acc / (A)count;\n";
  } else {
    s += "    const A r = acc;\n";
  }
  s += "    if (lane == 0) y[o] = " + a.store + ";\n  }\n}\n";
  return s;
}

// Columns: the innermost run is kept. Block (32, ways): x over the run, y splits the reduction
// (ways = blockDim.y, a power of two up to 32). Each thread keeps four partial results over rows
// ty, ty + ways, ... so four loads are in flight at once (a global average pool at batch 1 is a
// short reduction on few blocks: its time is the chain of load latencies), and the ways combine
// as a tree in shared memory.
std::string cols_kernel(const Layout& L, const AccSpec& a, int mode) {
  const size_t kr = L.kept_shape.size(), rr = L.red_shape.size();
  std::string s =
      "extern \"C\" __global__ void kg_reduce_cols(const T_x* __restrict__ x, T_x* __restrict__ y, Side g,"
      " long long rows, long long inner, long long count, double correction) {\n";
  s += "  __shared__ A sm[32][33];\n  const int tx = threadIdx.x, ty = threadIdx.y, ways = blockDim.y;\n"
       "  const long long tiles = (inner + 31) / 32;\n";
  s += "  for (long long t = blockIdx.x; t < rows * tiles; t += gridDim.x) {\n"
       "    const long long row = t / tiles, j = (t % tiles) * 32 + tx;\n    long long base = 0;\n";
  s += offset_code("base", "row", "k", kr);
  // One pass over the rows: `fold(acc, v)` folds value v into accumulator acc.
  auto pass = [&](const std::string& init,
                  const std::function<std::string(const std::string&, const std::string&)>& fold) {
    std::string p =
        "    {\n    A acc0 = " + init + ", acc1 = " + init + ", acc2 = " + init + ", acc3 = " + init + ";\n";
    p += "    if (j < inner) {\n      long long r = ty;\n      for (; r + 3 * ways < count; r += 4 * ways) {\n";
    const char* const unrolled[] = {"0", "1", "2", "3"};
    for (const char* k : unrolled) {
      const std::string off = std::string("off") + k;
      p += "        long long " + off + " = base + j;\n";
      p += replace_all(offset_code(off, std::string("r + ") + k + " * ways", "r", rr), "    ", "        ");
      p += std::string("        const A v") + k + " = kg_ld(x[" + off + "]);\n";
    }
    for (const char* k : unrolled) p += "        " + fold(std::string("acc") + k, std::string("v") + k) + "\n";
    p += "      }\n      for (; r < count; r += ways) {\n        long long off = base + j;\n";
    p += replace_all(offset_code("off", "r", "r", rr), "    ", "        ");
    p += "        const A v = kg_ld(x[off]);\n        ";
    p += fold("acc0", "v");
    p += "\n      }\n    }\n";
    return p + "    acc = kg_comb(kg_comb(acc0, acc1), kg_comb(acc2, acc3));\n    }\n";
  };
  // Folds the ways' results into sm[0][tx], read back into `out` by every thread.
  auto combine = [&](const std::string& out) {
    return "    sm[ty][tx] = acc;\n    __syncthreads();\n    for (int h = ways / 2; h > 0; h /= 2) {\n"
           "      if (ty < h) sm[ty][tx] = kg_comb(sm[ty][tx], sm[ty + h][tx]);\n      __syncthreads();\n    }\n    " +
           out + " = sm[0][tx];\n    __syncthreads();\n";
  };
  s += "    A acc;\n" +
       pass(a.identity,
            [](const std::string& acc, const std::string& v) { return acc + " = kg_comb(" + acc + ", " + v + ");"; }) +
       combine("acc");
  if (mode == 2) {
    s += "    const A mean = acc / (A)count;\n" +
         pass("(A)0", [](const std::string& acc,
                         const std::string& v) { return acc + " += (" + v + " - mean) * (" + v + " - mean);"; }) +
         combine("acc") + "    const A r = (A)((double)acc / ((double)count - correction));\n";
  } else if (mode == 1) {
    s += "    const A r = acc / (A)count;\n";
  } else {
    s += "    const A r = acc;\n";
  }
  s += "    if (ty == 0 && j < inner) y[row * inner + j] = " + a.store + ";\n  }\n}\n";
  return s;
}

// Columns, `vec` at a time: each thread loads `vec` consecutive outputs' elements of a row as
// one 16-byte word. A block (blockDim.x threads, a power of two from 32 to 256, splitting the
// reduction) makes one group of `vec` outputs, so a reduction over few columns (a global average
// pool at batch 1: [1, 784, 72] is 9 groups) still spreads over several blocks, and each thread
// has up to four words in flight at once: the whole reduction is about one load latency. Warp
// shuffles, then shared memory across the warps, combine the threads.
std::string cols_vec_kernel(const Layout& L, const AccSpec& a, int mode, int vec, const std::string& name) {
  const size_t kr = L.kept_shape.size(), rr = L.red_shape.size();
  const std::string V = std::to_string(vec);
  std::string s = "extern \"C\" __global__ void " + name +
                  "(const T_x* __restrict__ x, T_x* __restrict__ y, Side g,"
                  " long long rows, long long inner, long long count, double correction) {\n";
  s += "  __shared__ A sm[8][" + V + "];\n  __shared__ A res[" + V +
       "];\n"
       "  const int t = threadIdx.x, ways = blockDim.x, lane = t & 31, wid = t >> 5, nw = ways >> 5;\n"
       "  const long long groups = inner / " +
       V + ";\n";
  s += "  for (long long b = blockIdx.x; b < rows * groups; b += gridDim.x) {\n"
       "    const long long row = b / groups, j = (b % groups) * " +
       V + ";\n    long long base = j;\n";
  s += offset_code("base", "row", "k", kr);
  // One pass over the rows, folding each element e[c] of column c into acc[c].
  auto pass = [&](const std::string& init, const std::string& fold) {
    std::string p = "    {\n    A acc[" + V + "];\n#pragma unroll\n    for (int c = 0; c < " + V +
                    "; ++c) acc[c] = " + init + ";\n";
    p += "    for (long long r = t; r < count; r += 4 * ways) {\n      uint4 u[4];\n#pragma unroll\n"
         "      for (int k = 0; k < 4; ++k) {\n        if (r + k * ways < count) {\n          long long off = base;\n";
    p += replace_all(offset_code("off", "r + k * ways", "r", rr), "    ", "          ");
    p += "          u[k] = *reinterpret_cast<const uint4*>(x + off);\n        }\n      }\n#pragma unroll\n"
         "      for (int k = 0; k < 4; ++k) {\n        if (r + k * ways < count) {\n"
         "          const T_x* e = reinterpret_cast<const T_x*>(&u[k]);\n#pragma unroll\n"
         "          for (int c = 0; c < " +
         V + "; ++c) { const A v = kg_ld(e[c]); " + fold +
         " }\n"
         "        }\n      }\n    }\n";
    // res[c] = the combination of every thread's acc[c].
    p += "#pragma unroll\n    for (int c = 0; c < " + V +
         "; ++c) {\n      const A w = kg_wred(acc[c]);\n"
         "      if (lane == 0) sm[wid][c] = w;\n    }\n    __syncthreads();\n"
         "    if (t < " +
         V +
         ") {\n      A w = sm[0][t];\n      for (int i = 1; i < nw; ++i) w = kg_comb(w, sm[i][t]);\n"
         "      res[t] = w;\n    }\n    __syncthreads();\n    }\n";
    return p;
  };
  s += pass(a.identity, "acc[c] = kg_comb(acc[c], v);");
  if (mode == 2) {
    s += "    A mean[" + V + "];\n#pragma unroll\n    for (int c = 0; c < " + V +
         "; ++c) mean[c] = res[c] / (A)count;\n"
         "    __syncthreads();\n";
    s += pass("(A)0", "acc[c] += (v - mean[c]) * (v - mean[c]);");
    s += "    const A r = t < " + V + " ? (A)((double)res[t] / ((double)count - correction)) : (A)0;\n";
  } else if (mode == 1) {
    s += "    const A r = t < " + V + " ? res[t] / (A)count : (A)0;\n";
  } else {
    s += "    const A r = t < " + V + " ? res[t] : (A)0;\n";
  }
  s += "    if (t < " + V + ") y[row * inner + j + t] = " + a.store + ";\n    __syncthreads();\n  }\n}\n";
  return s;
}

// Elements of `dt` in a 16-byte word when every run of the layout (the innermost one, and each
// kept and reduced stride) starts on a word, so 16-byte loads serve it; else 1.
int word_elements(const Layout& L, DType dt) {
  const size_t esz = dtype_size(dt);
  if (esz > 8) return 1;
  const int64_t vec = int64_t(16 / esz);
  bool ok = L.inner % vec == 0;
  for (int64_t st : L.kept_stride) ok = ok && st % vec == 0;
  for (int64_t st : L.red_stride) ok = ok && st % vec == 0;
  return ok ? int(vec) : 1;
}

std::string argmax_kernels(DType dt) {
  const bool flt = is_floating(dt);
  std::string s = "typedef " + std::string(compute_of(dt)) + " A;\n";
  s += std::string("#define KG_LOWEST ") + (flt ? "(-(A)KG_INF)" : "((A)(-9223372036854775807LL - 1))") + "\n";
  s += R"(// b beats a: larger, or NaN over a number, or equal (both NaN) with a smaller index.
__device__ __forceinline__ bool kg_better(A bv, long long bi, A av, long long ai) {
  const bool bn = bv != bv, an = av != av;
  if (bn != an) return bn;
  if (!bn && bv != av) return bv > av;
  return bi < ai;
}
extern "C" __global__ void kg_argmax_rows(const T_x* __restrict__ x, long long* __restrict__ y, long long outer, long long R) {
  const long long w0 = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5, nw = ((long long)gridDim.x * blockDim.x) >> 5;
  const int lane = threadIdx.x & 31;
  for (long long o = w0; o < outer; o += nw) {
    const T_x* p = x + o * R;
    A bv = KG_LOWEST; long long bi = 9223372036854775807LL;
    for (long long r = lane; r < R; r += 32) {
      const A v = ld_x(p[r]);
      if (kg_better(v, r, bv, bi)) bv = v, bi = r;
    }
    for (int off = 16; off > 0; off >>= 1) {
      const A ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const long long oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (kg_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (lane == 0) y[o] = bi;
  }
}
extern "C" __global__ void kg_argmax_cols(const T_x* __restrict__ x, long long* __restrict__ y, long long outer, long long R,
                                          long long inner) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < outer * inner; i += (long long)gridDim.x * blockDim.x) {
    const long long o = i / inner, j = i % inner;
    const T_x* p = x + o * R * inner + j;
    A bv = ld_x(p[0]); long long bi = 0;
    for (long long r = 1; r < R; ++r) {
      const A v = ld_x(p[r * inner]);
      if (kg_better(v, r, bv, bi)) bv = v, bi = r;
    }
    y[i] = bi;
  }
}
)";
  return s;
}

Generated gen_argmax(const Node& n, const Graph& g) {
  const TensorType& xt = g.type(n.inputs[0]);
  const auto shape = xt.shape();
  const auto axis = size_t(n.attrs.get_int("axis"));
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t R = shape[axis];
  Generated gn;
  gn.plan.describe = std::string("cuda argmax ") + xt.to_string() + (inner == 1 ? " (warp per row)" : " (columns)");
  if (outer * inner == 0) return gn;
  gn.source = source_head() + type_defs("x", xt.dtype) + argmax_kernels(xt.dtype);
  if (inner == 1) {
    Launch l("kg_argmax_rows", blocks_for(outer, 8), 256);
    l.in(0).out(0).i64(outer).i64(R);
    gn.plan.launches.push_back(std::move(l));
  } else {
    Launch l("kg_argmax_cols", blocks_for(outer * inner, 256), 256);
    l.in(0).out(0).i64(outer).i64(R).i64(inner);
    gn.plan.launches.push_back(std::move(l));
  }
  return gn;
}

}  // namespace

Generated generate_reduce(const Node& n, const Graph& g) {
  if (n.op == OpKind::kArgmax) return gen_argmax(n, g);
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& yt = g.type(n.outputs[0]);
  const DType dt = xt.dtype;
  const auto shape = xt.shape();
  std::vector<int64_t> axes = n.attrs.get_ints("axes", {});
  std::vector<char> reduced(shape.size(), axes.empty() ? 1 : 0);
  for (int64_t a : axes) reduced[size_t(a)] = 1;
  const double correction = n.attrs.get_float("correction", 1.0);
  const int mode = n.op == OpKind::kReduceMean ? 1 : n.op == OpKind::kReduceVar ? 2 : 0;
  KILN_CHECK(n.op != OpKind::kReduceVar || is_floating(dt), kUnsupported, "reduce_var of ", xt.to_string());

  Generated gn;
  const std::string desc = std::string("cuda ") + op_name(n.op) + " " + xt.to_string();
  if (yt.numel() == 0) {
    gn.plan.describe = desc + " (empty)";
    return gn;
  }
  int64_t count = 1;
  for (size_t d = 0; d < shape.size(); ++d) count *= reduced[d] ? shape[d] : 1;
  if (count == 0) {  // sum 0; mean and var NaN
    uint64_t bits = 0;
    store_double(&bits, dt, 0, n.op == OpKind::kReduceSum ? 0.0 : std::numeric_limits<double>::quiet_NaN());
    add_fill(gn.source, gn.plan, 0, yt.numel(), int(dtype_size(dt)), bits);
    gn.plan.describe = desc + " (empty reduction)";
    return gn;
  }
  const Layout L = collapse_reduction(shape, reduced);
  KILN_CHECK(L.kept_shape.size() <= size_t(kMaxSide) && L.red_shape.size() <= size_t(kMaxSide), kUnsupported,
             op_name(n.op), ": more than ", kMaxSide, " alternating reduced and kept dims");
  Side side{};
  for (size_t k = 0; k < L.kept_shape.size(); ++k) side.kext[k] = L.kept_shape[k], side.kst[k] = L.kept_stride[k];
  for (size_t k = 0; k < L.red_shape.size(); ++k) side.rext[k] = L.red_shape[k], side.rst[k] = L.red_stride[k];

  const AccSpec acc = acc_spec(n.op, dt);
  gn.source = source_head() + kSideDecl + type_defs("x", dt) + acc_helpers(acc);
  if (L.inner_reduced) {
    const int vec = word_elements(L, dt);
    const bool block = L.count > 2048;
    const int64_t nro = L.count / L.inner;
    auto rows = [&](int v) {
      const std::string name = "kg_reduce_rows_v" + std::to_string(v);
      gn.source += rows_kernel(L, acc, mode, block, v, name);
      Launch l(name, block ? blocks_for(L.outputs, 1) : blocks_for(L.outputs, 8), 256);
      l.in(0).out(0).val(side).i64(L.outputs).i64(nro).i64(L.inner).i64(L.count).f64(correction);
      return l;
    };
    Launch l = rows(vec);
    if (vec > 1) with_fallback(l, 16, rows(1));
    gn.plan.launches.push_back(std::move(l));
    gn.plan.describe = desc + (block ? " (block" : " (warp") + " per output, " + std::to_string(vec) + "-wide loads)";
  } else {
    gn.source += cols_kernel(L, acc, mode);
    const int64_t rows = L.outputs / L.inner, tiles = (L.inner + 31) / 32;
    // Few column tiles (a global average pool at batch 1: [1, 784, 72] is 3 tiles) leave most of
    // the GPU idle; 32 ways instead of 8 then shorten each thread's serial run over the rows.
    const uint32_t ways = rows * tiles < kLargeGpuSms ? 32 : 8;
    Launch l("kg_reduce_cols", blocks_for(rows * tiles, 1), 32, 1, ways);
    l.in(0).out(0).val(side).i64(rows).i64(L.inner).i64(L.count).f64(correction);
    if (const int vec = word_elements(L, dt); vec > 1) {  // the scalar kernel as the fallback for unaligned x
      const std::string name = "kg_reduce_cols_v" + std::to_string(vec);
      gn.source += cols_vec_kernel(L, acc, mode, vec, name);
      uint32_t threads = 32;  // about four rows per thread
      while (threads < 256 && int64_t(threads) * 4 < L.count) threads *= 2;
      Launch v(name, blocks_for(rows * (L.inner / vec), 1), threads);
      v.in(0).out(0).val(side).i64(rows).i64(L.inner).i64(L.count).f64(correction);
      with_fallback(v, 16, std::move(l));
      gn.plan.launches.push_back(std::move(v));
      gn.plan.describe = desc + " (columns, " + std::to_string(vec) + "-wide loads)";
    } else {
      gn.plan.launches.push_back(std::move(l));
      gn.plan.describe = desc + " (columns)";
    }
  }
  return gn;
}

}  // namespace gen

bool supports_reduce(const Node& n, const Graph& g, std::string* why) {
  try {
    gen::generate_reduce(n, g);
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

std::unique_ptr<Kernel> make_reduce_kernel(const Node& n, const Graph& g, const KernelOptions&, const Bytes* state) {
  if (state) return gen::build({}, gen::what_of(n), state);
  return gen::build(gen::generate_reduce(n, g), gen::what_of(n), nullptr);
}

}  // namespace kiln::cuda
