// How an op walks its input, as every backend computes it: the collapsed layout of a
// reduction, the window geometry of a pooling op, the strided view that permute, expand
// and slice read through, and the view pad reads. These follow from the op's shapes and attributes alone, so they
// live with the ops and the CPU and CUDA kernels share them.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/ir.h"

namespace kiln {

// Element strides of a dense row-major tensor of `shape`.
std::vector<int64_t> row_major_strides(const std::vector<int64_t>& shape);

// Element offset of row-major index `i` of a tensor of `sizes` read through element `strides`
// (one per dim).
inline int64_t strided_offset(int64_t i, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  int64_t off = 0;
  for (size_t d = sizes.size(); d-- > 0;) off += (i % sizes[d]) * strides[d], i /= sizes[d];
  return off;
}

// A reduction over a dense row-major tensor with size-1 dims dropped and neighbouring dims of
// the same kind (kept / reduced) merged. The innermost run is `inner`; it is reduced
// (inner_reduced) or kept.
struct ReduceLayout {
  std::vector<int64_t> kept_shape, kept_stride;  // kept dims outside the inner run
  std::vector<int64_t> red_shape, red_stride;    // reduced dims outside the inner run
  int64_t inner = 1;
  bool inner_reduced = false;
  int64_t count = 1;    // reduced elements per output
  int64_t outputs = 1;
};
// reduced[i] != 0 marks dim i as reduced.
ReduceLayout collapse_reduction(const std::vector<int64_t>& shape, const std::vector<char>& reduced);

// max_pool / avg_pool / adaptive_avg_pool over NC[H]W: planes = N*C, 1d pools have H = OH =
// KH = 1. Channels-last pools (layout "nhwc", x [N, H, W, C]) have C = the channel count
// (planes still N*C, a plane's elements C apart); channels-first ones C = 0. Fourteen int64
// fields in this order: the CUDA kernels take it by value as a struct of fourteen long longs.
struct PoolGeometry {
  int64_t planes = 0, H = 1, W = 1, OH = 1, OW = 1;
  int64_t KH = 1, KW = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  int64_t C = 0;
};
PoolGeometry pool_geometry(const Node& n, const Graph& g);

// permute / expand / slice: output element (i0, i1, ...) reads input element
// offset + sum(ik * strides[k]) (in elements; expand gives stride 0 on broadcast dims).
struct StridedView {
  std::vector<int64_t> strides;
  int64_t offset = 0;
};
StridedView strided_view(const Node& n, const Graph& g);

// pad: the dims it reads (x's, permuted by the optional `input_perm`) and their element strides
// in x, dense and row-major.
struct PadInput {
  std::vector<int64_t> dims, strides;
};
PadInput pad_input(const Node& n, const Graph& g);

// gather: the element strides of its index per output dim, row-major over the index's own
// shape and 0 in the op's `broadcast` dims (where the index has extent 1).
std::vector<int64_t> gather_index_strides(const Node& n, const Graph& g);

// A GEMM operand's matrix [R, C] (row stride rs, column stride cs, elements) as a BLAS
// reads it: stored as it is (column-major C x R with leading dim ld = rs) or transposed
// (column-major R x C, ld = cs). ok is false when neither dim is contiguous or the other's stride
// is shorter than the contiguous dim's extent (no valid leading dim). Extent-1 dims take any stride.
struct MatrixLayout {
  bool ok = false, trans = false;
  int64_t ld = 0;
};
MatrixLayout matrix_layout(int64_t R, int64_t C, int64_t rs, int64_t cs);

// Whether a shape-family node's output is its input's elements in their own order, so its
// bytes are the input's bytes: reshape and copy always; permute, expand and slice when their
// view walks the input contiguously from its start (a permute that moves only size-1 dims, a
// slice of a whole dim, an expand that broadcasts nothing). The memory planner puts such an
// output on its input's bytes and the backends then move nothing.
bool reads_input_in_order(const Node& n, const Graph& g);

// The bytes of one element of a full node's output of dtype `t`, zero-padded to 8: an integer
// value exactly for i64, else the value stored as `t` (store_double's conversion).
uint64_t full_value_bits(const Attrs& attrs, DType t);

}  // namespace kiln
