// Code generation for the pointwise family (unary, binary, where, cast, fused_pointwise).
//
// Every pointwise node becomes a Program: its leaves (the node's inputs, then scalar
// constants of a fused body), the ops in order, and which values are the node's outputs. A
// single op node is a one-step program, so one generator serves all five families. Each
// output element computes the whole chain in registers, in the register type of each value's
// dtype (float for f32/f16/bf16, double for f64, the integer type itself for integers, bool);
// only casts round to a narrower dtype, as the CPU's fused kernel does.
//
// A body that ends in a concat (fuse_pointwise_concats) is a concat program: each element
// computes the part its column falls in, loading only that part's leaves, over a strided layout
// of the output's own dims without vectors.
//
// A Layout is the make-time choice of how to index: `flat` when every input is either the
// output's size and contiguous or a single element (no index math, plus a vectorized kernel
// of `vec` elements per thread step), otherwise `rank` collapsed dims with per-input element
// strides (0 on broadcast dims). An input a fused node reads through a view ("view<i>") is
// indexed by the view's strides from its offset, which the kernel adds to the input's pointer.
// A gathered leaf is indexed like an input of its result's shape, then through its index into
// the data. Sizes (a gathered leaf's, and its data view's, included), strides and constant values
// are kernel arguments, so the source depends only on the op chain, the dtypes and the layout: a
// node at another size (an instance of a dynamic-shape engine) compiles nothing new. The sizes a
// kernel divides by come with the multiplier and shift of a 32-bit division (divisor_fields).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/ir.h"
#include "src/ops/pointwise.h"

namespace kiln::cuda::pwgen {

inline constexpr int kMaxRank = 8;       // collapsed dims of a strided layout
inline constexpr int kMaxPointers = 48;  // inputs + outputs of one node

struct Step {
  OpKind op;
  DType out;
  std::vector<int> in;  // value indices
  pw::UnaryParams params;
  int part = -1;  // in a concat program: the part it computes (-1: the concat)
};

// A gathered leaf: index_select(input `data`, input `index`) of a fused body, read straight from
// the data: element e of its virtual [outer, count, inner] result is data element
// (outer * dim + index[(e / inner) % count]) * inner + e % inner. `shape` is the result's. Data
// the node reads through a view (view_sizes non-empty) maps that element, row-major over
// view_sizes, to sum(digit * view_strides) past the input's offset (the kernel's pointer).
struct Gather {
  int data = 0, index = 0;
  DType index_dtype = DType::kI64;
  int64_t count = 0, inner = 1, dim = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> view_sizes, view_strides;
  int part = -1;  // in a concat program: the part it is read by
};

struct Program {
  // per value: leaves first (inputs, then constants, then gathered leaves), then steps
  std::vector<DType> dtype;
  int num_inputs = 0;
  std::vector<double> const_float;    // per constant of floating dtype, in order
  std::vector<int64_t> const_int;     // per constant of integer or bool dtype, in order
  std::vector<int> const_slot;        // per constant: index into const_float or const_int
  std::vector<Gather> gathers;        // gathered leaf k is value num_inputs + constants + k
  std::vector<uint8_t> pointer_only;  // per input: read only by gathers (no value of its own)
  std::vector<Step> steps;            // step k defines value num_leaves() + k
  std::vector<int> outputs;           // value index of each node output
  // A body that ends in a concat (pw::concat_body): the output dim it joins along, each part's
  // first column there and then the total, and per input the part that reads it (-1: a scalar).
  // An element computes only the part its column falls in, and loads only that part's leaves.
  int concat_dim = -1;
  std::vector<int64_t> part_start;
  std::vector<int> input_part;
  int num_leaves() const { return num_inputs + int(const_slot.size() + gathers.size()); }
};

// Whether the generator runs node n: false (with the reason in `why`) for an op outside the
// pointwise families, an op or dtype it has no code for, a fused body it cannot read, or more
// pointers, non-scalar inputs or collapsed broadcast dims than the kernels take. program_of and
// layout_of succeed on every node it accepts.
bool check(const Node& n, const Graph& g, std::string* why);

// The program of a pointwise node; false (with `why`) for what the generator cannot run.
bool program_of(const Node& n, const Graph& g, Program* out, std::string* why);

struct Layout {
  bool flat = true;
  bool wide = false;  // 64-bit indices (numel >= 2^30)
  int rank = 1;       // collapsed dims (strided layouts)
  int vec = 1;        // elements per thread step of the vectorized kernel (1: none)
  std::vector<uint8_t> scalar;          // per input: one element for the whole output
  std::vector<uint8_t> splat;           // per input (strided, vec > 1): one element per vector
  std::vector<int64_t> offsets;  // per input: elements past its pointer where its view starts
  int64_t numel = 0;
  // The gathered leaves' sizes are arguments (argument_block); false only for the kernel of an
  // engine saved by an earlier Kiln, whose source has them as literals.
  bool gather_arguments = true;
  std::vector<int64_t> dims;            // collapsed output dims (strided)
  // per input, then per gathered leaf (strided): element strides per dim (a gather's into its
  // virtual result)
  std::vector<std::vector<int64_t>> strides;
  // Concat programs (strided, uncollapsed): per input, then per gathered leaf, the element offset
  // of output column 0 along the concat dim, -(its part's start) * stride, so that each part is
  // read from its own first column.
  std::vector<int64_t> bases;
};

Layout layout_of(const Node& n, const Graph& g, const Program& p, std::string* why, bool* ok);

// Narrows `l` to the vector width `saved` that an engine saved by an earlier Kiln holds for the
// same layout (1 before strided layouts and splat inputs had a vectorized kernel, 2 for a gather
// by an i64 index before the index stopped counting towards the width), when `saved` divides
// l.vec: every divisor of a width the layout allows is one it allows, and the saved cubin was
// made for it. Any other `saved` leaves `l` as it is (the state check then refuses a mismatch).
void adopt_saved_width(Layout& l, int saved);

// The CUDA source: extern "C" kernels `kiln_pw` (grid-stride, scalar) and, when layout.vec > 1,
// `kiln_pw_vec` (flat, or strided with the innermost dim contiguous or broadcast (splat) in every
// non-scalar input; every non-scalar, non-splat pointer aligned to vec elements).
std::string generate(const Program& p, const Layout& layout);

// The kernel's by-value argument block (8-byte fields in the order generate() declares them).
std::vector<int64_t> argument_block(const Program& p, const Layout& layout);

// A divisor's two fields: d, and for 1 <= d < 2^31 the multiplier m (low word) and shift s (high
// word) with x / d == (umulhi(x, m) + x) >> s for every 32-bit x below 2^31 (s = ceil(log2 d),
// m = 2^32 (2^s - d) / d + 1); else 0.
std::array<int64_t, 2> divisor_fields(int64_t d);

// Register and storage type names of a dtype in generated pointwise code (bool is stored as
// unsigned char, read as != 0 and written as 0 / 1).
const char* reg_type(DType t);
const char* store_type(DType t);

}  // namespace kiln::cuda::pwgen
