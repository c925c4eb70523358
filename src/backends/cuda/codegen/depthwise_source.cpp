// Source of the generated depthwise conv (depthwise.h): which convs it takes, how its work is
// cut, and the source of its two variants (vectorized over channels, and scalar): the conv's
// constants as #defines and cuh/depthwise_common.cuh, then per variant its work split as
// #defines and cuh/depthwise_kernel.cuh.
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

#include "src/backends/cuda/codegen/embedded.h"
#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/codegen/prelude.h"
#include "src/backends/cuda/kernels/depthwise.h"

namespace kiln::cuda {

namespace {

constexpr int kMaxKernel = 32;             // KH, KW at most (the column loop is unrolled)
constexpr int kWeightBytes = 32 * 1024;    // shared memory for a tile's weights
constexpr int kMaxTile = 64;               // channel vectors per block
constexpr int64_t kTargetBlocks = 2 * gen::kLargeGpuSms;  // two blocks for each multiprocessor

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

// One variant: the extern "C" declaration of its kernel (the name and parameters the launches
// use), its work split as #defines, and cuh/depthwise_kernel.cuh, which defines the kernel.
std::string kernel_text(const ConvGeom& q, const DepthwiseVariant& v, int esz) {
  const int span = (v.pixels - 1) * int(q.sw) + (int(q.KW) - 1) * int(q.dw) + 1;
  std::string s = "extern \"C\" __global__ void __launch_bounds__(256) " + v.kernel +
                  "(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,"
                  " const T* __restrict__ res, T* __restrict__ y, int N, int H, int W, int C, int OH, int OW, int PH,"
                  " int PW);\n";
  s += "#define KD_NAME " + v.kernel + "\n#define KD_VW " + gen::word_type(v.vec * esz) + "\n";
  const std::pair<const char*, int> ints[] = {
      {"KD_V", v.vec}, {"KD_P", v.pixels}, {"KD_CT", v.tile}, {"KD_GR", v.groups}, {"KD_SPAN", span}};
  for (const auto& [name, value] : ints) s += "#define " + std::string(name) + " " + std::to_string(value) + "\n";
  return s + std::string(embedded_source("depthwise_kernel.cuh"));
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
  out.source = prelude() + "typedef " + storage_type(q.dtype) + " T;\n";
  const std::pair<const char*, int64_t> conv[] = {{"KD_KH", q.KH}, {"KD_KW", q.KW},     {"KD_TAPS", q.KH * q.KW},
                                                  {"KD_SH", q.sh}, {"KD_SW", q.sw},     {"KD_DH", q.dh},
                                                  {"KD_DW", q.dw}, {"KD_BIAS", q.bias}, {"KD_RES", q.residual}};
  for (const auto& [name, value] : conv)
    out.source += "#define " + std::string(name) + " " + std::to_string(value) + "\n";
  out.source += "#define KD_ACT(v) " + activation_call(q.act, "v") + "\n";
  out.source += embedded_source("depthwise_common.cuh");
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
