// Kiln's operator set: tens of ops, not ATen's hundreds. ATen importers map onto these.
//
// Adding an op is a fixed checklist (the compiler enforces the first two):
//   1. a line in KILN_OP_LIST below (enum, name, family, min inputs, max inputs; -1 = variadic),
//   2. bump kExpectedOpCount in src/ops/registry.cpp (a static_assert),
//   3. its shape rule in src/ops/<family>.cpp,
//   4. its CPU kernel in src/backends/cpu/<family>.cpp (the reference semantics),
//   5. its CUDA kernel in src/backends/cuda/kernels/<family>.cpp: the family's supports_<family>
//      predicate says which nodes of the op it runs (others stay on the CPU or in PyTorch), its
//      generator or library call makes the kernel, device code goes in codegen/cuh/ (see
//      src/backends/cuda/README.md); tests/python/test_cuda_ops.py compares it with the CPU,
//   6. an entry in tests/python/test_ops.py (checked against PyTorch on random inputs),
//   7. importers for the ATen overloads it serves in src/import/.
//
// Tensors are dense and row-major. Unless stated, outputs have the dtype of the first input.
// Axes in attributes are non-negative (importers normalize). Attribute schema per op:
//
// unary (x) -> same shape/dtype. gelu: approximate: "none" | "tanh". clamp: min, max (float,
//   each optional). leaky_relu: negative_slope (float). logical_not: bool -> bool.
//   sign: -1, 0 or 1 (+0 for NaN and for -0), floating or integer. floor, ceil, round (half to
//   even), trunc: floating only (importers pass integer tensors through unchanged).
// binary (a, b) -> numpy broadcasting; a and b have one dtype (importers cast). eq..ge,
//   logical_*: -> bool. div on integers truncates toward zero. pow: float only.
// where (cond: bool, a, b) -> broadcast of the three; dtype of a.
// cast (x) {dtype}.
// reduce_* (x) {axes: ints (empty = all), keepdim: bool}; reduce_var adds {correction: float}.
//   argmax (x) {axis: int, keepdim: bool} -> i64.
// softmax / log_softmax (x) {axis: int}.
// batch_norm (x[N,C,...], mean[C], var[C], weight[C]?, bias[C]?) {eps: float}.
// layer_norm (x, weight?, bias?) {normalized_rank: int (normalize over the last k dims), eps}.
// group_norm (x[N,C,...], weight[C]?, bias[C]?) {groups: int, eps: float, layout: "nchw" | "nhwc"
//   (x is [N, H, W, C])}.
// matmul (a[...,M,K], b[...,K,N]) -> [broadcast(...),M,N]; both rank >= 2.
// linear (x[...,K], w[N,K], bias[N]?, residual?[broadcasts to the output, x's dtype])
//   {activation (optional)} -> [...,N] = act(x @ w^T + bias + residual).
// conv (x[N,C,*s], w[O,C/g,*k], bias[O]?, residual?[the output's type]) {stride, padding,
//   dilation: ints (one per spatial dim; 1 or 2 spatial dims), groups: int, activation
//   (optional)} = act(conv(x, w) + bias + residual).
//   activation: "none" (default) | "relu" | "gelu" | "gelu_tanh" | "silu" | "sigmoid" | "tanh"
//   (src/ops/epilogue.h). Absent optional inputs are kNoValue (bias may be absent while a
//   residual is present); fuse_epilogue fills them.
// conv_transpose (x[N,C,*s], w[C,O/g,*k], bias[O]?) {stride, padding, output_padding,
//   dilation: ints, groups: int}.
// max_pool (x[N,C,*s]) {kernel, stride, padding, dilation: ints, ceil_mode: bool}.
// avg_pool (x[N,C,*s]) {kernel, stride, padding: ints, ceil_mode, count_include_pad: bool,
//   divisor: int (0 = none)}.
// adaptive_avg_pool (x[N,C,*s]) {output_size: ints}.
// reshape (x) {shape: ints, all concrete}. permute (x) {perm: ints}.
// expand (x) {shape: ints, same rank as x; x's dims are 1 or equal}.
// slice (x) {axis, start, end, step: int; 0 <= start <= end <= dim, step >= 1}.
// concat (xs...) {axis: int}. split (x) {axis: int, sizes: ints} -> len(sizes) outputs.
// pad (x) {pads: ints [before_0, after_0, before_1, after_1, ...] one pair per dim (>= 0),
//   mode: "constant" | "reflect" | "replicate", value: float}.
// copy (x) -> x (materializes a value, e.g. an input returned as an output).
// gather (x, index: i64|i32) {axis: int} -> torch.gather. index_select (x, index[K]) {axis}.
// sdpa (q[...,L,E], k[...,S,E], v[...,S,Ev], mask?[broadcast to ...,L,S]) {causal: bool,
//   scale: float (optional; default 1/sqrt(E))} -> [...,L,Ev]. A bool mask keeps where true;
//   a float mask is added to the scores.
// arange () {start, end, step: float, dtype}. full () {shape: ints, value: float, dtype}.
// fused_pointwise (xs...) -> outputs of Node::body, a graph of pointwise ops only.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace kiln {

enum class OpFamily : uint8_t {
  kUnary, kBinary, kWhere, kCast, kReduce, kSoftmax, kNorm, kMatmul, kConv, kPool, kShape,
  kGather, kAttention, kGenerator, kFused,
};

// X(enum, name, family, min_inputs, max_inputs)
#define KILN_OP_LIST(X)                                 \
  X(kRelu, "relu", kUnary, 1, 1)                        \
  X(kGelu, "gelu", kUnary, 1, 1)                        \
  X(kSilu, "silu", kUnary, 1, 1)                        \
  X(kSigmoid, "sigmoid", kUnary, 1, 1)                  \
  X(kTanh, "tanh", kUnary, 1, 1)                        \
  X(kExp, "exp", kUnary, 1, 1)                          \
  X(kLog, "log", kUnary, 1, 1)                          \
  X(kSqrt, "sqrt", kUnary, 1, 1)                        \
  X(kRsqrt, "rsqrt", kUnary, 1, 1)                      \
  X(kNeg, "neg", kUnary, 1, 1)                          \
  X(kAbs, "abs", kUnary, 1, 1)                          \
  X(kErf, "erf", kUnary, 1, 1)                          \
  X(kHardswish, "hardswish", kUnary, 1, 1)              \
  X(kHardsigmoid, "hardsigmoid", kUnary, 1, 1)          \
  X(kReciprocal, "reciprocal", kUnary, 1, 1)            \
  X(kSin, "sin", kUnary, 1, 1)                          \
  X(kCos, "cos", kUnary, 1, 1)                          \
  X(kLogicalNot, "logical_not", kUnary, 1, 1)           \
  X(kClamp, "clamp", kUnary, 1, 1)                      \
  X(kLeakyRelu, "leaky_relu", kUnary, 1, 1)             \
  X(kSign, "sign", kUnary, 1, 1)                        \
  X(kFloor, "floor", kUnary, 1, 1)                      \
  X(kCeil, "ceil", kUnary, 1, 1)                        \
  X(kRound, "round", kUnary, 1, 1)                      \
  X(kTrunc, "trunc", kUnary, 1, 1)                      \
  X(kAdd, "add", kBinary, 2, 2)                         \
  X(kSub, "sub", kBinary, 2, 2)                         \
  X(kMul, "mul", kBinary, 2, 2)                         \
  X(kDiv, "div", kBinary, 2, 2)                         \
  X(kPow, "pow", kBinary, 2, 2)                         \
  X(kMaximum, "maximum", kBinary, 2, 2)                 \
  X(kMinimum, "minimum", kBinary, 2, 2)                 \
  X(kEq, "eq", kBinary, 2, 2)                           \
  X(kNe, "ne", kBinary, 2, 2)                           \
  X(kLt, "lt", kBinary, 2, 2)                           \
  X(kLe, "le", kBinary, 2, 2)                           \
  X(kGt, "gt", kBinary, 2, 2)                           \
  X(kGe, "ge", kBinary, 2, 2)                           \
  X(kLogicalAnd, "logical_and", kBinary, 2, 2)          \
  X(kLogicalOr, "logical_or", kBinary, 2, 2)            \
  X(kWhere, "where", kWhere, 3, 3)                      \
  X(kCast, "cast", kCast, 1, 1)                         \
  X(kReduceSum, "reduce_sum", kReduce, 1, 1)            \
  X(kReduceMean, "reduce_mean", kReduce, 1, 1)          \
  X(kReduceMax, "reduce_max", kReduce, 1, 1)            \
  X(kReduceMin, "reduce_min", kReduce, 1, 1)            \
  X(kReduceVar, "reduce_var", kReduce, 1, 1)            \
  X(kArgmax, "argmax", kReduce, 1, 1)                   \
  X(kSoftmax, "softmax", kSoftmax, 1, 1)                \
  X(kLogSoftmax, "log_softmax", kSoftmax, 1, 1)         \
  X(kBatchNorm, "batch_norm", kNorm, 3, 5)              \
  X(kLayerNorm, "layer_norm", kNorm, 1, 3)              \
  X(kGroupNorm, "group_norm", kNorm, 1, 3)              \
  X(kMatmul, "matmul", kMatmul, 2, 2)                   \
  X(kLinear, "linear", kMatmul, 2, 4)                   \
  X(kConv, "conv", kConv, 2, 4)                         \
  X(kConvTranspose, "conv_transpose", kConv, 2, 3)      \
  X(kMaxPool, "max_pool", kPool, 1, 1)                  \
  X(kAvgPool, "avg_pool", kPool, 1, 1)                  \
  X(kAdaptiveAvgPool, "adaptive_avg_pool", kPool, 1, 1) \
  X(kReshape, "reshape", kShape, 1, 1)                  \
  X(kPermute, "permute", kShape, 1, 1)                  \
  X(kExpand, "expand", kShape, 1, 1)                    \
  X(kSlice, "slice", kShape, 1, 1)                      \
  X(kConcat, "concat", kShape, 1, -1)                   \
  X(kSplit, "split", kShape, 1, 1)                      \
  X(kPad, "pad", kShape, 1, 1)                          \
  X(kCopy, "copy", kShape, 1, 1)                        \
  X(kGather, "gather", kGather, 2, 2)                   \
  X(kIndexSelect, "index_select", kGather, 2, 2)        \
  X(kSdpa, "sdpa", kAttention, 3, 4)                    \
  X(kArange, "arange", kGenerator, 0, 0)                \
  X(kFull, "full", kGenerator, 0, 0)                    \
  X(kFusedPointwise, "fused_pointwise", kFused, 1, -1)

enum class OpKind : uint16_t {
#define KILN_X(e, n, f, lo, hi) e,
  KILN_OP_LIST(KILN_X)
#undef KILN_X
  kCount
};
inline constexpr int kNumOps = static_cast<int>(OpKind::kCount);

struct TensorType;
class Attrs;

// A shape rule: validates inputs and attributes (throwing kInvalidArgument or kShapeMismatch
// naming the op and the cause) and returns the output types. inputs[i] is null for an absent
// optional input.
using ShapeRule = std::vector<TensorType> (*)(OpKind op, const std::vector<const TensorType*>& inputs,
                                              const Attrs& attrs);

struct OpInfo {
  OpKind kind;
  const char* name;
  OpFamily family;
  int min_inputs;
  int max_inputs;  // -1: variadic
  ShapeRule shape_rule;
  // Traits queried by passes instead of switching on kinds.
  bool pointwise() const { return family == OpFamily::kUnary || family == OpFamily::kBinary ||
                                  family == OpFamily::kWhere || family == OpFamily::kCast; }
};

const OpInfo& op_info(OpKind op);
const char* op_name(OpKind op);
std::optional<OpKind> op_from_name(std::string_view name);

// Runs op's arity check and shape rule.
std::vector<TensorType> infer_types(OpKind op, const std::vector<const TensorType*>& inputs, const Attrs& attrs);

}  // namespace kiln
