// CUDA kernels of the pool family (NCHW, or NHWC for max_pool / avg_pool with layout "nhwc";
// 1-D pools run as 2-D with a unit height), generated and compiled by NVRTC. Values compute in
// f32 (f64 for f64).
//
//   max_pool / avg_pool: one thread per output element, walking its window tap by tap in the
//     CPU's order (kernel row, then column), skipping taps in the padding (max_pool's -inf,
//     avg_pool's zeros). avg_pool's divisor is PyTorch's: the window clipped to input +
//     padding (count_include_pad) or to the input, or the divisor override; a window lying
//     wholly in the padding (ceil_mode) gives 0, as on the CPU. max_pool propagates NaN.
//   adaptive_avg_pool: one thread per output over PyTorch's window [floor(o * in / out),
//     ceil((o + 1) * in / out)); the global case (1 x 1 output, e.g. before a classifier) is a
//     warp per plane with a shuffle reduction.
#include <algorithm>

#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/codegen/prelude.h"
#include "src/backends/cuda/kernels.h"
#include "src/ops/access.h"

namespace kiln::cuda {

namespace gen {
namespace {

using Geom = PoolGeometry;
static_assert(sizeof(Geom) == 14 * sizeof(long long), "kernels take Geom by value as 14 long longs");
const char* kGeomDecl = "struct Geom { long long planes, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, C; };\n";

// Output i in row-major order: (plane, oh, ow) channels-first; (n, oh, ow, c) channels-last,
// where neighbouring threads take neighbouring channels, so reads and writes coalesce.
// plane[(ih * W + iw) * step] is the window's input element.
const char* kWindowLoop =
    R"(  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    const long long j = q.C ? i / q.C : i;
    const long long ow = j % q.OW, oh = (j / q.OW) % q.OH, img = j / (q.OW * q.OH);
    const long long step = q.C ? q.C : 1;
    const T_x* plane = q.C ? x + img * q.H * q.W * q.C + i % q.C : x + img * q.H * q.W;
)";

std::string max_kernel() {
  std::string s =
      "extern \"C\" __global__ void kg_max_pool(const T_x* __restrict__ x, T_x* __restrict__ y, Geom q, "
      "long long total) {\n";
  s += kWindowLoop;
  s += R"(    A m = -(A)KG_INF;
    for (long long ki = 0; ki < q.KH; ++ki) {
      const long long ih = oh * q.sh - q.ph + ki * q.dh;
      if (ih < 0 || ih >= q.H) continue;
      for (long long kj = 0; kj < q.KW; ++kj) {
        const long long iw = ow * q.sw - q.pw + kj * q.dw;
        if (iw < 0 || iw >= q.W) continue;
        m = kg_max(m, ld_x(plane[(ih * q.W + iw) * step]));
      }
    }
    y[i] = st_x(m);
  }
}
)";
  return s;
}

// Channels-last max_pool with V channels per thread moved as one 16-byte vector (C % V == 0,
// buffers of the engine's arena, so aligned); 32-bit index arithmetic (total < 2^31).
std::string max_nhwc_vector_kernel(int v) {
  std::string s = "#define KG_V " + std::to_string(v) + "\n";
  s += R"(struct __align__(16) kg_vec { T_x e[KG_V]; };
extern "C" __global__ void kg_max_pool_nhwc(const T_x* __restrict__ x, T_x* __restrict__ y, Geom q, int total) {
  const int cv = (int)q.C / KG_V, H = (int)q.H, W = (int)q.W, OH = (int)q.OH, OW = (int)q.OW;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int c = (i % cv) * KG_V, j = i / cv;
    const int ow = j % OW, oh = (j / OW) % OH, img = j / (OW * OH);
    A m[KG_V];
#pragma unroll
    for (int e = 0; e < KG_V; ++e) m[e] = -(A)KG_INF;
    for (int ki = 0; ki < (int)q.KH; ++ki) {
      const int ih = oh * (int)q.sh - (int)q.ph + ki * (int)q.dh;
      if (ih < 0 || ih >= H) continue;
      for (int kj = 0; kj < (int)q.KW; ++kj) {
        const int iw = ow * (int)q.sw - (int)q.pw + kj * (int)q.dw;
        if (iw < 0 || iw >= W) continue;
        const kg_vec t = *reinterpret_cast<const kg_vec*>(x + ((long long)(img * H + ih) * W + iw) * q.C + c);
#pragma unroll
        for (int e = 0; e < KG_V; ++e) m[e] = kg_max(m[e], ld_x(t.e[e]));
      }
    }
    kg_vec o;
#pragma unroll
    for (int e = 0; e < KG_V; ++e) o.e[e] = st_x(m[e]);
    *reinterpret_cast<kg_vec*>(y + (long long)j * q.C + c) = o;
  }
}
)";
  return s;
}

// Whether v lives in the engine's arena (not a caller's buffer): its address is aligned.
bool arena_value(const Graph& g, ValueId v) {
  return g.value(v).producer != nullptr && std::find(g.outputs().begin(), g.outputs().end(), v) == g.outputs().end();
}

std::string avg_kernel() {
  std::string s = R"(// The divisor factor along one dim, as the CPU's avg_factors.
__device__ __forceinline__ float kg_factor(long long o, long long in, long long k, long long s, long long pad, bool include) {
  const long long start = o * s - pad;
  const long long end = start + k < in + pad ? start + k : in + pad;
  const long long clipped = (end < in ? end : in) - (start > 0 ? start : 0);
  return clipped <= 0 ? 0.0f : (float)(include ? end - start : clipped);
}
extern "C" __global__ void kg_avg_pool(const T_x* __restrict__ x, T_x* __restrict__ y, Geom q, long long total, long long include_pad,
                                       long long divisor) {
)";
  s += kWindowLoop;
  s += R"(    A sum = 0;
    for (long long ki = 0; ki < q.KH; ++ki) {
      const long long ih = oh * q.sh - q.ph + ki;
      if (ih < 0 || ih >= q.H) continue;
      for (long long kj = 0; kj < q.KW; ++kj) {
        const long long iw = ow * q.sw - q.pw + kj;
        if (iw < 0 || iw >= q.W) continue;
        sum += ld_x(plane[(ih * q.W + iw) * step]);
      }
    }
    const float f = kg_factor(oh, q.H, q.KH, q.sh, q.ph, include_pad != 0) * kg_factor(ow, q.W, q.KW, q.sw, q.pw, include_pad != 0);
    y[i] = st_x(f == 0.0f ? (A)0 : sum / (A)(divisor ? (float)divisor : f));
  }
}
)";
  return s;
}

std::string adaptive_kernels() {
  std::string s =
      "extern \"C\" __global__ void kg_adaptive_pool(const T_x* __restrict__ x, T_x* __restrict__ y, Geom q, "
      "long long total) {\n";
  s += kWindowLoop;
  s += R"(    const long long h0 = oh * q.H / q.OH, h1 = ((oh + 1) * q.H + q.OH - 1) / q.OH;
    const long long w0 = ow * q.W / q.OW, w1 = ((ow + 1) * q.W + q.OW - 1) / q.OW;
    A sum = 0;
    for (long long ih = h0; ih < h1; ++ih)
      for (long long iw = w0; iw < w1; ++iw) sum += ld_x(plane[(ih * q.W + iw) * step]);
    y[i] = st_x(sum / (A)((h1 - h0) * (w1 - w0)));
  }
}
extern "C" __global__ void kg_global_pool(const T_x* __restrict__ x, T_x* __restrict__ y, long long planes, long long hw) {
  const long long w0 = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5, nw = ((long long)gridDim.x * blockDim.x) >> 5;
  const int lane = threadIdx.x & 31;
  for (long long p = w0; p < planes; p += nw) {
    const T_x* src = x + p * hw;
    A s = 0;
    for (long long i = lane; i < hw; i += 32) s += ld_x(src[i]);
    s = kg_warp_sum(s);
    if (lane == 0) y[p] = st_x(s / (A)hw);
  }
}
)";
  return s;
}

}  // namespace

Generated generate_pool(const Node& n, const Graph& g) {
  const TensorType& xt = g.type(n.inputs[0]);
  KILN_CHECK(is_floating(xt.dtype), kUnsupported, op_name(n.op), ": x must be floating, got ", xt.to_string());
  KILN_CHECK(xt.rank() == 3 || xt.rank() == 4, kUnsupported, op_name(n.op), ": x must be [N, C, W] or [N, C, H, W]");
  const Geom q = pool_geometry(n, g);
  const int64_t total = g.type(n.outputs[0]).numel();
  Generated gn;
  const std::string desc = std::string("cuda ") + op_name(n.op) + " " + xt.to_string();
  gn.plan.describe = desc + " (empty)";
  if (total == 0) return gn;
  const std::string head =
      source_head() + kGeomDecl + type_defs("x", xt.dtype) + "typedef " + compute_of(xt.dtype) + " A;\n";
  const int vec = q.C ? int(16 / dtype_size(xt.dtype)) : 0;
  if (n.op == OpKind::kMaxPool && vec > 1 && q.C % vec == 0 && total / vec < (int64_t(1) << 31) &&
      g.type(n.inputs[0]).numel() < (int64_t(1) << 31) && arena_value(g, n.inputs[0]) && arena_value(g, n.outputs[0])) {
    gn.source = head + max_nhwc_vector_kernel(vec);
    Launch l("kg_max_pool_nhwc", blocks_for(total / vec, 256), 256);
    l.in(0).out(0).val(q).val(int(total / vec));
    gn.plan.launches.push_back(std::move(l));
    gn.plan.describe = desc + " (nhwc, " + std::to_string(vec) + " channels per thread)";
  } else if (n.op == OpKind::kMaxPool) {
    gn.source = head + max_kernel();
    Launch l("kg_max_pool", blocks_for(total, 256), 256);
    l.in(0).out(0).val(q).i64(total);
    gn.plan.launches.push_back(std::move(l));
    gn.plan.describe = desc + " (thread per output)";
  } else if (n.op == OpKind::kAvgPool) {
    gn.source = head + avg_kernel();
    Launch l("kg_avg_pool", blocks_for(total, 256), 256);
    l.in(0)
        .out(0)
        .val(q)
        .i64(total)
        .i64(n.attrs.get_bool("count_include_pad", true) ? 1 : 0)
        .i64(n.attrs.get_int("divisor", 0));
    gn.plan.launches.push_back(std::move(l));
    gn.plan.describe = desc + " (thread per output)";
  } else {
    KILN_CHECK(n.op == OpKind::kAdaptiveAvgPool, kInternal, op_name(n.op), " is not in the pool family");
    gn.source = head + adaptive_kernels();
    if (q.OH == 1 && q.OW == 1) {
      Launch l("kg_global_pool", blocks_for(q.planes, 8), 256);
      l.in(0).out(0).i64(q.planes).i64(q.H * q.W);
      gn.plan.launches.push_back(std::move(l));
      gn.plan.describe = desc + " (global: warp per plane)";
    } else {
      Launch l("kg_adaptive_pool", blocks_for(total, 256), 256);
      l.in(0).out(0).val(q).i64(total);
      gn.plan.launches.push_back(std::move(l));
      gn.plan.describe = desc + " (thread per output)";
    }
  }
  return gn;
}

}  // namespace gen

bool supports_pool(const Node& n, const Graph& g, std::string* why) {
  try {
    gen::generate_pool(n, g);
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

std::unique_ptr<Kernel> make_pool_kernel(const Node& n, const Graph& g, const KernelOptions&, const Bytes* state) {
  if (state) return gen::build({}, gen::what_of(n), state);
  return gen::build(gen::generate_pool(n, g), gen::what_of(n), nullptr);
}

}  // namespace kiln::cuda
