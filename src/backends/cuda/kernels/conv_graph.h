// The cuDNN operation graph of one conv / conv_transpose node, and the generated epilogue used
// when cuDNN has no engine for the fused graph.
//
// conv:            CONVOLUTION_FORWARD(x, w) -> [+ bias] -> [+ residual] -> [activation] -> y
//                  (hardswish / hardsigmoid as chains of cuDNN pointwise ops on by-value scalars)
// conv_transpose:  CONVOLUTION_BACKWARD_DATA(dy = x, w) -> dx = y [+ bias]
// Intermediates are virtual f32 tensors; compute is f32. 1-D convs are 2-D with H = 1.
// Tensors are described to cuDNN as [N, C, H, W] with their real strides: NCHW (Kiln's
// default), or channels-last when the node has the attribute layout = "nhwc", whose IR shapes
// are x [N, H, W, C], w [O, KH, KW, C/g] (KRSC), residual and y [N, OH, OW, O] (src/ops/conv.cpp).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "src/backends/cuda/libs/cudnn_graph.h"
#include "src/ops/epilogue.h"

namespace kiln::cuda {

struct ConvGeom {
  bool transpose = false, nhwc = false, one_d = false;
  // A conv over 3 spatial dims (NCDHW, not transposed): the depth's extents below; 1 and its
  // defaults otherwise.
  bool three_d = false;
  DType dtype = DType::kF32;
  int64_t N = 0, C = 0, H = 0, W = 0;     // x (for conv_transpose: dy)
  int64_t O = 0, OH = 0, OW = 0;          // y (for conv_transpose: dx)
  int64_t W0 = 0, W1 = 0, KH = 0, KW = 0; // weight dims as the IR gives them
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
  int64_t D = 1, OD = 1, KD = 1, sd = 1, pd = 0, dd = 1;
  bool bias = false, residual = false;
  pw::Activation act;
  bool has_epilogue() const { return bias || residual || !act.none; }
  int64_t x_numel() const { return N * C * D * H * W; }
  int64_t w_numel() const { return W0 * W1 * KD * KH * KW; }
  int64_t y_numel() const { return N * O * OD * OH * OW; }
};

// A conv over an image: at most 4 input channels (to_channels_last pads RGB to 4), groups 1.
inline bool image_input(const ConvGeom& q) { return !q.transpose && q.groups == 1 && q.C <= 4; }

// A conv that is one GEMM of [N*H*W, C] x [C, O]: channels-last, groups 1, a 1x1 kernel without
// padding or dilation, and stride 1 or a 1x1 image (where a stride skips nothing).
inline bool gemm_conv(const ConvGeom& q) {
  return !q.transpose && q.nhwc && q.groups == 1 && q.KH == 1 && q.KW == 1 && q.ph == 0 && q.pw == 0 && q.dh == 1 &&
         q.dw == 1 && ((q.sh == 1 && q.sw == 1) || (q.H == 1 && q.W == 1));
}

// hardswish or hardsigmoid: cuDNN runs them as a chain of pointwise ops (build_conv_graph).
bool hard_activation(const pw::Activation& a);

// Why the conv family cannot run node `n` of a verified graph (its attributes checked by the
// shape rule), or "" when it can: 1, 2 or (conv, channels first) 3 spatial dims, f32 / f16 /
// bf16, and for conv_transpose an output_padding below the stride (cuDNN's backward data).
std::string conv_refusal(const Node& n, const Graph& g);
// The geometry of a conv / conv_transpose node of any dtype; throws kUnsupported with
// conv_refusal's reason for a shape or attribute the family cannot run (kInternal for an op
// outside the family).
ConvGeom conv_geometry(const Node& n, const Graph& g);
// Shapes, dtypes and attributes, one string each: the timing key's parts and the signature.
std::vector<std::string> conv_key_parts(const ConvGeom& q);

// Unique ids of the non-virtual tensors in a conv graph.
// kUidThree and kUidSixth are the by-value scalars of the hardswish / hardsigmoid chains.
enum ConvUid : int64_t {
  kUidX = 1,
  kUidW = 2,
  kUidBias = 3,
  kUidResidual = 4,
  kUidY = 5,
  kUidThree = 6,
  kUidSixth = 7
};
// The pointer a variant pack gives `uid`: one of the tensors, or a scalar's host value.
void* conv_data_ptr(int64_t uid, void* x, void* w, void* bias, void* residual, void* y);

// A finalized operation graph plus the descriptors it refers to (kept alive with it).
struct ConvOpGraph {
  std::deque<Desc> parts;  // a deque: references to its elements stay valid as it grows
  Desc graph;
  std::vector<int64_t> uids;  // the variant pack's ids: x, w, [bias], [residual], [scalars], y
  std::string ops;            // "conv + bias + relu", for describe()
};

// `fused`: the whole epilogue inside the graph; otherwise the graph is the conv alone, writing y
// in its dtype. Throws kUnsupported (with cuDNN's reason) when cuDNN refuses the graph.
ConvOpGraph build_conv_graph(const ConvGeom& q, cudnnHandle_t handle, bool fused, const std::string& what);

// CUDA C++ of the in-place epilogue y = act(y + bias[c] + residual) over the whole output; its
// kernel is "kiln_conv_epilogue"(T* y, const T* bias, const T* residual, long long n,
// long long inner, long long channels) with c = (i / inner) % channels; and
// "kiln_conv_epilogue_vec"(T* y, const T* bias, const T* residual, long long nvec, long long channels)
// for channels-last outputs whose channels are a multiple of 16 bytes, one 16-byte vector a step
// (every pointer 16-byte aligned).
std::string conv_epilogue_source(const ConvGeom& q);

}  // namespace kiln::cuda
