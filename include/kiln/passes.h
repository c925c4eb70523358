// Graph passes, one per file under src/passes/. Each returns whether it changed the graph.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/ir.h"

namespace kiln {

// Removes nodes none of whose outputs is used, then compacts the graph.
bool eliminate_dead_code(Graph& g);
// Drops a node that repeats an earlier one (same op, inputs and attributes); its readers read
// the earlier node's outputs. Compacts the graph when anything merged.
bool eliminate_common_subexpressions(Graph& g);
// Evaluates nodes whose inputs are all constants (on the CPU reference kernels) and replaces
// them by constants. Weights stay weights only when untouched; folding a weight drops its name.
bool fold_constants(Graph& g);
// Folds inference batch_norm into a preceding conv / conv_transpose / linear whose weight is
// a constant and whose output has no other use; any other batch_norm with constant parameters
// becomes a per-channel x * s + t (pointwise ops that fuse and move through layouts).
bool fold_batch_norm(Graph& g);
// Which sdpa nodes fold_attention_layout (and, for their q / k / v, fuse_sibling_linears) may
// give strided operands. fused_attention_shape: those the fused attention kernels serve (f16 /
// bf16, head dim 32, 64, 96 or 128), the default, for backends whose other attention paths want whole
// heads contiguous (the CPU's runs strided operands through copies). strided_attention_shape:
// every f32 / f16 / bf16 sdpa node, for backends whose fallback reads strided operands in one
// pass whatever their batch strides (CUDA's cuBLASLt fallback batches the [B, H] views of a
// qkv output through pointer arrays).
using AttentionFilter = std::function<bool(const Graph& g, const Node& sdpa)>;
bool fused_attention_shape(const Graph& g, const Node& sdpa);
bool strided_attention_shape(const Graph& g, const Node& sdpa);
// Runs each 2-D conv whose stride equals its kernel (a patch embedding: windows that neither
// overlap nor leave gaps) as permute -> linear -> permute: im2col of such a conv is a permute.
// Static shapes, H and W multiples of the kernel, groups 1, no padding or dilation, no residual
// or activation yet (run it before fuse_epilogue, after fold_batch_norm).
bool convs_to_linears(Graph& g);
// Runs each channels-last conv of a 1x1 kernel over a 1x1 image (squeeze-excitation) as a linear
// of the same epilogue: static shapes, groups 1, no padding or dilation (after to_channels_last).
bool dense_convs_to_linears(Graph& g);
// Replaces each permute that, through the reshapes and permutes before it, reads its start value
// in row-major order by a reshape of that value (free in the memory plan). Run it after the
// layout passes.
bool collapse_view_chains(Graph& g);
// Replaces each chain of reshape, permute and index_select (constant index) nodes that copies
// two or more times but moves whole rows (a whole number of 16-byte words each) by one
// index_select of the rows (src/passes/row_gathers.h): one pass over memory. Static shapes.
// Run it after the layout passes.
bool chains_to_row_gathers(Graph& g);
// A pointwise op reading expand(y) reads y itself where y broadcasts to its output alone, so the
// expand is not written (broadcast_expands.cpp). Run it before fuse_pointwise.
bool broadcast_expands(Graph& g);
// A gather reading expand(y) as its index reads y broadcast (its `broadcast` dims) where y has
// extent 1 in the dims the expand widens to x's extent (broadcast_expands.cpp). Run it before
// fold_constants, which would otherwise fold the expanded copy.
bool broadcast_gather_indices(Graph& g);
// Runs two or more plain linears that read the same x with constant weights (q, k and v
// projections, SwiGLU's gate and up) as one linear over the weights concatenated along N, with a
// slice of its output per former linear. Only when every output is read where it lies: as sdpa
// q / k / v operands through reshape / permute nodes, of sdpa nodes `foldable` accepts (the
// filter fold_attention_layout is given, which reads the slices as views), or, with
// `pointwise_views` (pointwise fusion follows) and static shapes, by pointwise ops, which
// fold_input_views makes read views (also through expand). The weight concatenations are nodes
// on constants for fold_constants to fold. Run it after lower_precision, before fuse_epilogue.
bool fuse_sibling_linears(Graph& g, const AttentionFilter& foldable = fused_attention_shape,
                          bool pointwise_views = false);
// Replaces activations written out as arithmetic (the tanh form of GELU, x * sigmoid(x)) by the
// gelu {approximate: tanh} / silu op, which fuse_epilogue can then fold. Run it before
// fuse_epilogue.
bool name_activations(Graph& g);
// Folds a constant per-output-channel or one-element factor that multiplies a single-use linear's
// or conv's output (no activation or residual yet; a layer scale) into its constant weight and
// bias, as nodes on constants for fold_constants to fold. Run it before a fuse_epilogue.
bool fold_channel_scales(Graph& g);
// Folds a bias add, a residual add and an activation (relu, gelu, silu, sigmoid, tanh) that
// follow a single-use linear or conv into that op's epilogue (its bias / residual inputs and
// `activation` attribute). With `pointwise_follows` (fuse_pointwise runs later), an activation
// whose one use is a pointwise op is left for fuse_pointwise to compute inside that op's kernel.
// Run it before fuse_pointwise.
bool fuse_epilogue(Graph& g, bool pointwise_follows = true);
// Runs every 2-D conv channels-last (layout "nhwc") and moves the permutes this puts around
// them through the ops between convs (pointwise ops, pools, concats, slices, pads, gathers,
// reductions, reshapes: src/passes/sink_permutes.h) until they cancel, so a conv region
// converts layout only at its boundary. Run it after fuse_epilogue, then fold_constants.
bool to_channels_last(Graph& g);
// Moves the bias and activation of an f16 / bf16 channels-last conv over an image (at most 4 input
// channels, no residual, an activation that never decreases) behind the channels-last max_pool
// that alone reads it: act(max_pool(conv(x, w)) + b), exact for such activations. Run it after
// to_channels_last (the builder does, for CUDA builds: cuDNN's first-layer kernels run the conv
// alone).
bool pool_before_epilogue(Graph& g);
// Makes sdpa read q, k and v where the head split left them and write where the head merge
// wants them: permute(x, [0, 2, 1, 3]) operands become layout "bshd"; other reshape / permute /
// slice chains become operand views (q_view, ...) of the value they start from, and a lone
// output permute becomes out_perm. Run it after fuse_epilogue, before fuse_pointwise.
// Only sdpa nodes `foldable` accepts change (AttentionFilter above).
bool fold_attention_layout(Graph& g, const AttentionFilter& foldable = fused_attention_shape);
// Lets each matmul read an operand that a chain of permute / slice / expand / reshape nodes
// made as a strided view of the value the chain starts from (a_view / b_view), so the chain
// copies nothing; batch dims the chain merged from non-adjacent memory are split (the output is
// reshaped back); a scalar scale of an operand becomes alpha; a permute that alone reads the
// output (keeping its last dim last) becomes out_perm. Static shapes; where it saves a copy
// (matmul_views.cpp). Run it after fold_attention_layout, before fuse_pointwise.
bool fold_matmul_views(Graph& g);
// Makes an sdpa whose mask is logical_and(all-true constant, m) read m (sdpa broadcasts its
// mask over the scores), so transformers' folded index masks cost nothing per score.
bool simplify_attention_masks(Graph& g);
// Makes an sdpa whose mask is a constant causal pattern (bool, or additive with 0 and -inf or the
// dtype's lowest value; the same [L, S] triangle in every batch slice) causal without a mask:
// the kernels then skip the keys above the diagonal instead of reading a mask per score.
bool causal_attention_masks(Graph& g);
// Makes attention written out as ops one sdpa node: matmul(softmax(scores), v) whose scores are
// matmul(q, k transposed) with single-element scales, additive biases (relative positions, window
// masks) and batch reshapes between them becomes sdpa(q, k, v, summed bias) {scale}. Run it
// before fuse_sibling_linears and fold_attention_layout, which then treat it like any sdpa.
bool form_attention(Graph& g);
// Turns each distinct bool mask of f16 / bf16 sdpa nodes into one additive mask in q's dtype,
// where(m, 0, -inf), which they all read (the CUDA builder runs it: cuDNN's fused attention takes
// only an additive mask).
bool additive_attention_masks(Graph& g);
// Replaces a concat whose inputs are slices (or negated slices) of one tensor along the concat
// axis by an index_select of that tensor (times a constant sign): RoPE's rotate_half becomes a
// gathered leaf of the rotary kernel. Run it before the fold_constants ahead of fuse_pointwise.
bool gather_concats(Graph& g);
// Replaces permute(reshape(concat(parts) {axis k})) whose reshape splits axis k into (parts, part
// size) and whose permute moves only that parts dim by a concat of the reshaped parts along the
// dim where it lands: a channel shuffle after a concat is one kernel that writes the parts
// interleaved.
bool interleave_concats(Graph& g);
// Makes a reduce_sum / reduce_mean whose input is mul(x, x), read by nothing else, reduce x
// with {square: true}: the squares are formed as the reduction loads x (RMSNorm, L2 norms).
// Run it before fuse_pointwise.
bool square_into_reductions(Graph& g);
// Replaces RMSNorm written out (x * rsqrt(mean(x^2) over the last dims + eps), then times a
// weight) by layer_norm {rms} (src/passes/rms_norms.cpp). Run it after square_into_reductions,
// before fuse_pointwise.
bool form_rms_norms(Graph& g);
// Groups chains of pointwise ops into fused_pointwise nodes with a body graph.
bool fuse_pointwise(Graph& g);
// Lets each fused_pointwise node (a single pointwise op becoming one) and each concat read an
// input that a chain of permute / slice / split / expand / reshape nodes made as a strided view
// of the value the chain starts from ("view<i>"), its innermost dim contiguous, so the chain
// copies nothing (input_views.cpp). Static shapes. Run it after fuse_pointwise.
bool fold_input_views(Graph& g);
// Makes a concat whose parts are fused pointwise kernels read only by it, or strided views, one
// fused_pointwise node whose body ends in the concat: one kernel computes every part in its
// columns (pointwise_concats.cpp). Static shapes. Run it after fold_input_views.
bool fuse_pointwise_concats(Graph& g);
// Runs the graph in `compute` (f16 or bf16): every f32 value inside it becomes `compute`, f32
// graph inputs / outputs keep their type behind cast nodes, f32 constants are read through a
// cast (fold_constants then stores them narrow), dtype attributes saying f32 say `compute`.
// Integer, bool and f64 values are untouched. Throws kInvalidArgument for another `compute`.
bool lower_precision(Graph& g, DType compute);

// Assigns every intermediate value an offset in one arena by liveness. Graph inputs,
// outputs and constants are not in the arena (offset -1). Alias rule (alias_views, on by
// default): the output of a node for which output_reinterprets_input holds (a reshape, a
// copy, or a permute that moves only size-1 dims) whose input is also in the arena gets its
// input's offset, and the shared bytes stay live until the last use of every value aliasing
// them (chains included); its kernel then sees equal input and output pointers and moves
// nothing. From a graph input or constant, or into a graph output, such a node still copies.
struct MemoryPlan {
  std::vector<int64_t> offsets;  // per ValueId
  size_t arena_bytes = 0;        // what the plan needs
  size_t naive_bytes = 0;        // sum of every intermediate's size, aliases included (no reuse)
  size_t aliased_values = 0;     // intermediates placed on their input's bytes by the alias rule
  size_t in_place_values = 0;    // node outputs written over an input's bytes (the in-place rule)
  size_t alignment = 64;
};
// in_place(node, input): whether node's output 0 may take that input's bytes (the kernel's
// Kernel::writes_over_input); empty: no node may.
using InPlace = std::function<bool(size_t node, size_t input)>;
MemoryPlan plan_memory(const Graph& g, size_t alignment = 64, bool alias_views = true, const InPlace& in_place = {});
// Whether node n's single output holds exactly its single input's bytes (a reshape, a copy, or
// a permute / expand / slice that reads its input in order: same dtype and byte count, tensors
// being dense and row-major), so the two may share storage.
bool output_reinterprets_input(const Node& n, const Graph& g);

}  // namespace kiln
