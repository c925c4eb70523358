// The conv family's generated depthwise kernel: channels-last (layout "nhwc") convs with
// groups == C == O (channel multiplier 1), any kernel size, stride, padding and dilation, f32 /
// f16 / bf16 with f32 accumulation and the epilogue act(conv + bias + residual) fused.
//
// cuDNN runs these with a grouped direct kernel that is several times slower than the memory
// traffic allows, so make_conv_kernel (conv.cpp) builds this kernel as well, times it against
// the cuDNN plan (tactics.h) and keeps the faster; the choice is a ConvChoice with tactic
// kDepthwise (conv_state.h), saved with the cubin so that loading an engine compiles nothing.
//
// The kernel (depthwise_source.cpp): a block of up to 256 threads owns a tile of channels; each
// thread computes `pixels` adjacent outputs of one row for a vector of `vec` adjacent channels
// (16-byte loads: 8 halves or 4 floats), reading each input column of a kernel row once for all
// its outputs, with the tile's weights staged in shared memory as f32 [tap][channel]. Blocks
// stride over the output pixels. The weight is read as the IR gives it, [C, KH, KW, 1] (the
// engine's constant buffer, which refit rewrites in place), not a private transposed copy.
// Where C is not a multiple of the vector or a buffer is not aligned to it, the scalar variant
// (vec 1) of the same source runs instead.
//
// Does not: run grouped convs with more than one channel per group, channel multipliers > 1,
// NCHW convs (the to_channels_last pass makes them nhwc first) or conv_transpose.
#pragma once

#include <memory>
#include <string>

#include "kiln/backend.h"
#include "src/backends/cuda/kernels/conv_graph.h"
#include "src/backends/cuda/kernels/conv_state.h"

namespace kiln::cuda {

class Module;

// One kernel of the generated source and how it is launched.
struct DepthwiseVariant {
  std::string kernel;  // extern "C" name; empty when the source has no such variant
  int vec = 1;         // channels per thread (one vector load)
  int pixels = 1;      // adjacent output pixels per thread
  int tile = 1;        // channel vectors per block (the channel tile is tile * vec channels)
  int groups = 1;      // pixel groups a block computes at once: threads / tile
  int tiles = 1;       // channel tiles: the grid's y extent
  int threads = 256;   // threads per block (tile * groups, rounded up to a warp); at most 256
};

struct DepthwiseSource {
  std::string source;
  DepthwiseVariant wide;    // vec > 1; kernel empty when C has no vector width > 1
  DepthwiseVariant scalar;  // vec == 1, always present
  uint64_t hash = 0;        // FNV-1a of `source` (ConvChoice::kernel_hash)
  std::string describe;     // "generated depthwise 3x3 s1 f16 vec8 x4px + bias + relu"
};

inline constexpr int kDepthwiseThreads = 256;

// Whether the generated kernel runs conv `q`; *why says why not.
bool depthwise_eligible(const ConvGeom& q, std::string* why = nullptr);
// The source and launch shapes for `q` (eligible); deterministic, needs no GPU.
DepthwiseSource generate_depthwise(const ConvGeom& q);

// The ConvChoice naming this kernel (tactic kDepthwise, kernel_hash src.hash).
ConvChoice depthwise_choice(const DepthwiseSource& src, uint64_t signature);

// The kernel over a compiled (or loaded) module of `src`; state() is pack_state(cubin,
// encode_conv_choice(depthwise choice for `signature`)).
std::unique_ptr<Kernel> make_depthwise_kernel(const ConvGeom& q, const DepthwiseSource& src,
                                              std::shared_ptr<const Module> module, uint64_t signature,
                                              const std::string& note);

}  // namespace kiln::cuda
