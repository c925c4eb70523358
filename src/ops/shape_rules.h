// Per-family shape rules (one .cpp per family under src/ops/) and the helpers they share.
#pragma once

#include <string>
#include <vector>

#include "kiln/errors.h"
#include "kiln/ir.h"

namespace kiln {

using TypeList = std::vector<const TensorType*>;

std::vector<TensorType> infer_unary(OpKind op, const TypeList& in, const Attrs& a);
std::vector<TensorType> infer_binary(OpKind op, const TypeList& in, const Attrs& a);
std::vector<TensorType> infer_where(OpKind op, const TypeList& in, const Attrs& a);
std::vector<TensorType> infer_cast(OpKind op, const TypeList& in, const Attrs& a);
std::vector<TensorType> infer_reduce(OpKind op, const TypeList& in, const Attrs& a);
std::vector<TensorType> infer_softmax(OpKind op, const TypeList& in, const Attrs& a);
std::vector<TensorType> infer_norm(OpKind op, const TypeList& in, const Attrs& a);
std::vector<TensorType> infer_matmul(OpKind op, const TypeList& in, const Attrs& a);
std::vector<TensorType> infer_conv(OpKind op, const TypeList& in, const Attrs& a);
std::vector<TensorType> infer_pool(OpKind op, const TypeList& in, const Attrs& a);
std::vector<TensorType> infer_shape_op(OpKind op, const TypeList& in, const Attrs& a);
std::vector<TensorType> infer_gather(OpKind op, const TypeList& in, const Attrs& a);
std::vector<TensorType> infer_attention(OpKind op, const TypeList& in, const Attrs& a);
std::vector<TensorType> infer_generator(OpKind op, const TypeList& in, const Attrs& a);
std::vector<TensorType> infer_fused(OpKind op, const TypeList& in, const Attrs& a);

// numpy broadcasting of two shapes; throws kShapeMismatch naming op and both shapes.
std::vector<int64_t> broadcast_shapes(OpKind op, const std::vector<int64_t>& a, const std::vector<int64_t>& b);
// Whether `small` broadcasts to exactly `big` (numpy rules: right-aligned, each dim equal or 1).
bool broadcasts_to(const std::vector<int64_t>& small, const std::vector<int64_t>& big);

// Attribute checks several op families share (src/ops/attr_checks.cpp); each failure is
// kInvalidArgument naming the op and the attribute.
std::string list_str(const std::vector<int64_t>& v);  // "[1,2,3]"
// An int-list attribute with one value per spatial dim (n of them), each >= lo; `fallback`
// when absent.
std::vector<int64_t> spatial_attr(OpKind op, const Attrs& a, const char* key, size_t n,
                                  const std::vector<int64_t>& fallback, int64_t lo);
// That `v` (the op's `what`, e.g. "value") converts to integral `dt` without overflow, as
// PyTorch requires (a kernel's cast would otherwise be undefined); no check for floats.
void check_fits(OpKind op, DType dt, double v, const char* what);

// The layout attribute of conv, max_pool and avg_pool: whether their tensors are channels-last
// (layout = "nhwc": x [N, H, W, C]; see src/ops/conv.cpp and pool.cpp) rather than channels-first
// ("nchw", the default, as in PyTorch). "nhwc" is for 2-D ops of those three only.
bool channels_last(OpKind op, const Attrs& a);
// A 4-D type with its channel dim moved: [N, H, W, C] -> [N, C, H, W] and back.
TensorType channels_first_view(TensorType t);
TensorType channels_last_view(TensorType t);

// The layout attribute of sdpa (src/ops/attention.cpp): whether q, k, v and the output are
// [B, S, H, D] (layout = "bshd") rather than [..., H, S, D] ("bhsd", the default); any other
// value is kInvalidArgument naming the attribute.
bool sdpa_bshd(const Attrs& a);
// A rank-4 type with dims 1 and 2 swapped ([B, S, H, D] <-> [B, H, S, D]); kShapeMismatch
// naming sdpa's layout for another rank.
TensorType swap_seq_heads(TensorType t);

// An operand that an op reads through a view attribute [offset, size0, stride0, size1,
// stride1, ...] of its input buffer (sdpa's q_view / k_view / v_view, matmul's a_view / b_view),
// or the buffer itself (dense()).
struct OperandView {
  TensorType logical;            // the dims the op's math sees
  int64_t offset = 0;            // elements from the start of the buffer
  std::vector<int64_t> strides;  // elements per logical dim (0 where a dim broadcasts)
  bool dense() const;            // offset 0 and row-major strides: the buffer is the logical tensor
};
// The buffer `t` read whole and row-major.
OperandView dense_view(const TensorType& t);
// View attribute `key` of `op` over input buffer `t` (the op's operand `operand`, for messages),
// validated: at least `min_rank` dims, sizes, strides and offset >= 0, no int64 overflow, every
// element reached inside the buffer (kInvalidArgument / kShapeMismatch naming the attribute).
// The logical type has t's dtype and the view's (static) sizes.
OperandView parse_operand_view(OpKind op, const Attrs& a, const char* key, const char* operand, const TensorType& t,
                               size_t min_rank);

// How a node reads its input i, whose type is `buffer`: through its attribute "view<i>"
// (input_view_key; the format above, sizes of any rank), else whole and row-major. A view
// stands for a permute / slice / expand chain in front of the input (fold_input_views): the op
// sees the view's logical type. fused_pointwise and concat take views (reads_input_views);
// infer_types refuses them on other ops. Errors as parse_operand_view's.
OperandView input_view(OpKind op, const Attrs& a, size_t i, const TensorType& buffer);
std::string input_view_key(size_t i);
bool reads_input_views(OpKind op);

// An op's optional out_perm (sdpa, matmul): its output tensor is permute(logical output,
// out_perm), dense in that order. The identity when absent; kInvalidArgument unless a
// permutation of the `rank` dims that keeps the last one (`last`, for the message) last.
std::vector<int64_t> out_perm_attr(OpKind op, const Attrs& a, int64_t rank, const char* last);
// The logical output written dense in the order `perm` puts its dims: each dim's stride.
OperandView permuted_output(const TensorType& logical, const std::vector<int64_t>& perm);
// The output tensor's type: the logical dims in the order `perm` puts them.
TensorType placed_type(const TensorType& logical, const std::vector<int64_t>& perm);

// How a matmul reads its operands (a_view / b_view, src/ops/matmul.cpp, else the inputs) and
// writes its logical output y (dense, or in out_perm's order).
struct MatmulLayout {
  OperandView a, b, y;
  std::vector<int64_t> out_perm;
};
MatmulLayout matmul_layout(const TypeList& in, const Attrs& a);
// A matmul operand's (or output's) batch strides in elements per output batch dim `out_batch`:
// its batch dims right-aligned, 0 where it has none or extent 1 (broadcast).
std::vector<int64_t> matmul_batch_strides(const std::vector<int64_t>& out_batch, const OperandView& v);
// matmul's `alpha` (1 when absent); kInvalidArgument when it is no finite float.
double matmul_alpha(const Attrs& a);

// How an sdpa node reads q, k, v and writes its output, whatever its attributes say (layout
// "bhsd" / "bshd", or the operand views q_view / k_view / v_view and out_perm; see
// src/ops/attention.cpp): each as a strided view of its buffer over the operand's logical
// default-layout dims ([..., L, E], [..., S, E], [..., S, Ev], output [..., L, Ev]); the head
// dim's stride is 1. Backends read this instead of the attributes, so every form runs through
// one description.
using SdpaView = OperandView;
struct SdpaLayout {
  SdpaView q, k, v, out;
  std::vector<int64_t> out_perm;  // the output tensor is permute(logical output, out_perm)
  bool dense() const { return q.dense() && k.dense() && v.dense() && out.dense(); }
};
// Validates the attributes against the input types `in` (q, k, v[, mask]) as the shape rule
// does (kInvalidArgument / kShapeMismatch naming the cause) and describes the node.
SdpaLayout sdpa_layout(const TypeList& in, const Attrs& a);

// A type with the dims of `like` (symbols kept) and another dtype.
inline TensorType with_dtype(const TensorType& like, DType dt) {
  TensorType t = like;
  t.dtype = dt;
  return t;
}

}  // namespace kiln
