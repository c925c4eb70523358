// Source of the generated depthwise conv (depthwise.h): which convs it takes, how its work is
// cut, and the CUDA C++ of its two variants (vectorized over channels, and scalar).
//
// Work split (threads per block: 256, fewer for small convs; see variant()):
//   vec     the largest power of two <= 16 bytes / element dividing C (8 for f16/bf16, 4 for
//           f32 when C allows); the scalar variant has vec 1.
//   pixels  adjacent outputs along OW per thread: 4 at stride 1, 2 at larger strides, 1 when a
//           kernel row's weights (KW x vec floats) would crowd the registers; never above OW.
//   tile    channel vectors per block: at most 64, and few enough that the tile's weights (f32,
//           taps x tile x vec) fit 32 KB of shared memory; C is cut into `tiles` equal tiles.
// Thread t of a block takes channel vector t % tile and pixel group t / tile (threads past
// groups * tile only help stage the weights). Kernel size, stride, dilation, vec, pixels and
// tile are compile-time constants of the source (so every loop over them unrolls and the sums
// stay in registers); sizes and padding are kernel arguments.
//
// Does not: choose between this kernel and cuDNN (conv.cpp times them), or touch the GPU.
#include <algorithm>

#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/codegen/prelude.h"
#include "src/backends/cuda/kernels/depthwise.h"

namespace kiln::cuda {

namespace {

constexpr int kMaxKernel = 32;             // KH, KW at most (the column loop is unrolled)
constexpr int kWeightBytes = 32 * 1024;    // shared memory for a tile's weights
constexpr int kMaxTile = 64;               // channel vectors per block
constexpr int64_t kTargetBlocks = 2 * gen::kLargeGpuSms;  // two blocks for each multiprocessor

// Helpers shared by both variants (templates over the vector width and its word type).
const char* const kHelpers = R"(
template <int V, typename VW> __device__ __forceinline__ void kd_ld(const T* __restrict__ p, float (&f)[V]) {
  const VW u = *reinterpret_cast<const VW*>(p);
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int v = 0; v < V; ++v) f[v] = to_float(e[v]);
}
template <int V, typename VW> __device__ __forceinline__ void kd_st(T* __restrict__ p, const float (&f)[V]) {
  VW u;
  T* e = reinterpret_cast<T*>(&u);
#pragma unroll
  for (int v = 0; v < V; ++v) e[v] = from_float<T>(f[v]);
  *reinterpret_cast<VW*>(p) = u;
}
// Pixel group gi -> (n, oh, column group gw); 32-bit division while gi fits (the usual case).
__device__ __forceinline__ void kd_split(long long gi, int owg, int OH, int& n, int& oh, int& gw) {
  if (gi <= 0x7fffffffLL) {
    const unsigned g = (unsigned)gi, r = g / (unsigned)owg;
    gw = (int)(g - r * (unsigned)owg), oh = (int)(r % (unsigned)OH), n = (int)(r / (unsigned)OH);
  } else {
    const long long r = gi / owg;
    gw = (int)(gi - r * owg), oh = (int)(r % OH), n = (int)(r / OH);
  }
}
template <int V> __device__ __forceinline__ void kd_ldw(const float* p, float (&f)[V]) {
  if (V % 4 == 0) {
#pragma unroll
    for (int i = 0; i < V / 4; ++i) {
      const float4 q = reinterpret_cast<const float4*>(p)[i];
      f[4 * i] = q.x, f[4 * i + 1] = q.y, f[4 * i + 2] = q.z, f[4 * i + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) f[v] = p[v];
  }
}
)";

// One variant. Tokens: KD_NAME, KD_V, KD_VW, KD_P, KD_CT, KD_GR, KD_TAPS, KD_KH, KD_KW, KD_SH,
// KD_SW, KD_DH, KD_DW, KD_SPAN, KD_KHUNROLL, KD_BIAS, KD_RES, KD_SUM.
const char* const kKernel = R"(
extern "C" __global__ void __launch_bounds__(256) KD_NAME(const T* __restrict__ x, const T* __restrict__ w,
    const T* __restrict__ bias, const T* __restrict__ res, T* __restrict__ y, int N, int H, int W, int C, int OH,
    int OW, int PH, int PW) {
  __shared__ __align__(16) float kd_w[KD_TAPS * KD_CT * KD_V];
  const int c0 = blockIdx.y * (KD_CT * KD_V);
  const int tc = min(KD_CT * KD_V, C - c0);
  const T* __restrict__ wt = w + (long long)c0 * KD_TAPS;  // the tile's weights: contiguous in [C, KH, KW, 1]
  // Staged KD_V weights a load: tc is a multiple of KD_V and c0 * KD_TAPS too, so the loads
  // stay aligned when w is (run() checks).
  for (int i = threadIdx.x * KD_V; i < tc * KD_TAPS; i += blockDim.x * KD_V) {
    float f[KD_V];
    kd_ld<KD_V, KD_VW>(wt + i, f);
#pragma unroll
    for (int v = 0; v < KD_V; ++v) {
      const int ch = (i + v) / KD_TAPS;
      kd_w[(i + v - ch * KD_TAPS) * (KD_CT * KD_V) + ch] = f[v];
    }
  }
  __syncthreads();
  const int cv = threadIdx.x % KD_CT, pg = threadIdx.x / KD_CT;
  if (pg >= KD_GR || cv * KD_V >= tc) return;
  const int c = c0 + cv * KD_V;
KD_BIAS  const int owg = (OW + KD_P - 1) / KD_P;
  const long long total = (long long)N * OH * owg;
  for (long long gi = (long long)blockIdx.x * KD_GR + pg; gi < total; gi += (long long)gridDim.x * KD_GR) {
    int n, oh, gw;
    kd_split(gi, owg, OH, n, oh, gw);
    const int ow0 = gw * KD_P;
    const int ih0 = oh * KD_SH - PH, iw0 = ow0 * KD_SW - PW;
    float acc[KD_P][KD_V];
#pragma unroll
    for (int p = 0; p < KD_P; ++p)
#pragma unroll
      for (int v = 0; v < KD_V; ++v) acc[p][v] = 0.0f;
KD_KHUNROLL
    for (int kh = 0; kh < KD_KH; ++kh) {
      const int ih = ih0 + kh * KD_DH;
      if (ih < 0 || ih >= H) continue;
      float wr[KD_KW][KD_V];
      const float* wrow = kd_w + kh * (KD_KW * KD_CT * KD_V) + cv * KD_V;
#pragma unroll
      for (int kw = 0; kw < KD_KW; ++kw) kd_ldw<KD_V>(wrow + kw * (KD_CT * KD_V), wr[kw]);
      const T* __restrict__ xrow = x + (((long long)n * H + ih) * W) * C + c;
      // Each input column of the row is loaded once and used by every (output, tap) that reads it.
#pragma unroll
      for (int j = 0; j < KD_SPAN; ++j) {
        const int iw = iw0 + j;
        if (iw < 0 || iw >= W) continue;
        float xv[KD_V];
        kd_ld<KD_V, KD_VW>(xrow + (long long)iw * C, xv);
#pragma unroll
        for (int p = 0; p < KD_P; ++p)
#pragma unroll
          for (int kw = 0; kw < KD_KW; ++kw)
            if (p * KD_SW + kw * KD_DW == j)
#pragma unroll
              for (int v = 0; v < KD_V; ++v) acc[p][v] = fmaf(xv[v], wr[kw][v], acc[p][v]);
      }
    }
#pragma unroll
    for (int p = 0; p < KD_P; ++p) {
      const int ow = ow0 + p;
      if (ow >= OW) break;
      const long long o = (((long long)n * OH + oh) * OW + ow) * C + c;
KD_RES      float out[KD_V];
#pragma unroll
      for (int v = 0; v < KD_V; ++v) out[v] = kd_act(KD_SUM);
      kd_st<KD_V, KD_VW>(y + o, out);
    }
  }
}
)";

int pixels_for(const ConvGeom& q, int vec) {
  if (q.KW * vec > 64) return 1;
  return int(std::min<int64_t>(q.sw == 1 ? 4 : 2, q.OW));
}

// The work split of one variant. By default 256 threads a block and `pixels_for` outputs a
// thread. A small conv (batch 1) cut that way leaves most multiprocessors idle (a
// 7x7x960 output makes 9 blocks), so while the grid has fewer than kTargetBlocks blocks the
// blocks shrink (128, 64 threads: the same threads over more multiprocessors), then each thread
// takes one output instead of several (more threads). Blocks stay at 64 threads or more: each
// block stages its tile's weights, which a block of little work would spend its time on. A
// function of the conv alone, not of the GPU, so the source (and its hash) is the same on every
// device.
DepthwiseVariant variant(const ConvGeom& q, int vec, const std::string& name) {
  DepthwiseVariant v;
  v.kernel = name;
  v.vec = vec;
  const int64_t vectors = (q.C + vec - 1) / vec, taps = q.KH * q.KW;
  const int64_t fit = std::max<int64_t>(1, kWeightBytes / (taps * vec * 4));
  const int64_t most = std::min<int64_t>(kMaxTile, fit);
  auto blocks = [&](int pixels, int threads) {
    v.pixels = pixels;
    v.tiles = int((vectors + most - 1) / most);
    v.tile = int((vectors + v.tiles - 1) / v.tiles);
    v.groups = threads / v.tile;
    v.threads = (v.tile * v.groups + 31) / 32 * 32;
    const int64_t pixel_groups = q.N * q.OH * ((q.OW + pixels - 1) / pixels);
    return (pixel_groups + v.groups - 1) / v.groups * v.tiles;
  };
  const int wide = pixels_for(q, vec);
  const std::pair<int, int> steps[] = {{wide, 256}, {wide, 128}, {wide, 64}, {1, 128}, {1, 64}};
  for (const auto& [pixels, threads] : steps)
    if (blocks(pixels, threads) >= kTargetBlocks) break;
  return v;
}

std::string kernel_text(const ConvGeom& q, const DepthwiseVariant& v, int esz) {
  const int span = (v.pixels - 1) * int(q.sw) + (int(q.KW) - 1) * int(q.dw) + 1;
  std::string sum = "acc[p][v]";
  if (q.bias) sum += " + bv[v]";
  if (q.residual) sum += " + rv[v]";
  std::string s = kKernel;
  s = gen::replace_all(s, "KD_BIAS", q.bias ? "  float bv[KD_V];\n  kd_ld<KD_V, KD_VW>(bias + c, bv);\n" : "");
  s = gen::replace_all(s, "KD_RES",
                       q.residual ? "      float rv[KD_V];\n      kd_ld<KD_V, KD_VW>(res + o, rv);\n" : "");
  s = gen::replace_all(s, "KD_SUM", sum);
  s = gen::replace_all(s, "KD_KHUNROLL", q.KH <= 7 ? "#pragma unroll" : "#pragma unroll 1");
  s = gen::replace_all(s, "KD_NAME", v.kernel);
  s = gen::replace_all(s, "KD_VW", gen::word_type(v.vec * esz));
  const std::pair<const char*, int64_t> ints[] = {{"KD_V", v.vec},     {"KD_P", v.pixels},       {"KD_CT", v.tile},
                                                  {"KD_GR", v.groups}, {"KD_TAPS", q.KH * q.KW}, {"KD_KH", q.KH},
                                                  {"KD_KW", q.KW},     {"KD_SH", q.sh},          {"KD_SW", q.sw},
                                                  {"KD_DH", q.dh},     {"KD_DW", q.dw},          {"KD_SPAN", span}};
  for (const auto& [token, value] : ints) s = gen::replace_all(s, token, std::to_string(value));
  return s;
}

}  // namespace

bool depthwise_eligible(const ConvGeom& q, std::string* why) {
  auto no = [&](const std::string& reason) {
    if (why) *why = "depthwise kernel: " + reason;
    return false;
  };
  if (q.transpose) return no("conv_transpose");
  if (!q.nhwc) return no("layout is not nhwc");
  if (q.dtype != DType::kF32 && q.dtype != DType::kF16 && q.dtype != DType::kBF16)
    return no(std::string("dtype ") + dtype_name(q.dtype));
  if (q.groups != q.C || q.O != q.C || q.W0 != q.C || q.W1 != 1)
    return no("not depthwise with channel multiplier 1 (groups " + std::to_string(q.groups) + ", C " +
              std::to_string(q.C) + ", O " + std::to_string(q.O) + ")");
  if (q.KH > kMaxKernel || q.KW > kMaxKernel)
    return no("kernel " + std::to_string(q.KH) + "x" + std::to_string(q.KW) + " over " + std::to_string(kMaxKernel));
  if (q.N * q.OH * q.OW == 0 || q.C == 0) return no("empty output");
  if (q.C > (int64_t(1) << 20)) return no(std::to_string(q.C) + " channels (at most 2^20)");
  const int64_t dims[] = {q.N, q.H, q.W, q.C, q.OH, q.OW, q.ph, q.pw};
  for (int64_t d : dims)
    if (d > 0x7fffffff) return no("a size or padding over 2^31");
  return true;
}

DepthwiseSource generate_depthwise(const ConvGeom& q) {
  std::string why;
  KILN_CHECK(depthwise_eligible(q, &why), kUnsupported, why);
  const int esz = int(dtype_size(q.dtype));
  int vec = 16 / esz;
  while (vec > 1 && q.C % vec != 0) vec /= 2;
  DepthwiseSource out;
  out.scalar = variant(q, 1, "kiln_dw_scalar");
  if (vec > 1) out.wide = variant(q, vec, "kiln_dw_vec" + std::to_string(vec));
  out.source = prelude() + "\ntypedef " + storage_type(q.dtype) + " T;\n" + kHelpers +
               "__device__ __forceinline__ float kd_act(float v) { return " + activation_call(q.act, "v") + "; }\n";
  if (vec > 1) out.source += kernel_text(q, out.wide, esz);
  out.source += kernel_text(q, out.scalar, esz);
  out.hash = fnv1a(reinterpret_cast<const uint8_t*>(out.source.data()), out.source.size());
  if (out.hash == 0) out.hash = 1;  // 0 means "no kernel" in a ConvChoice
  const DepthwiseVariant& main = vec > 1 ? out.wide : out.scalar;
  std::string d = "generated depthwise " + std::to_string(q.KH) + "x" + std::to_string(q.KW) + " s" +
                  std::to_string(q.sh) + "," + std::to_string(q.sw) + " d" + std::to_string(q.dh) + "," +
                  std::to_string(q.dw) + " " + dtype_name(q.dtype) + " vec" + std::to_string(main.vec) + " x" +
                  std::to_string(main.pixels) + "px tile " + std::to_string(main.tile * main.vec) + "ch";
  if (q.bias) d += " + bias";
  if (q.residual) d += " + residual";
  if (!q.act.none) d += " + " + q.act.name;
  out.describe = d;
  return out;
}

}  // namespace kiln::cuda
