// View analysis for the layout passes: which value a chain of reshape, permute and slice nodes
// reads, and how, as one strided view (offset, sizes, strides in elements of that value).
//
// Kiln's IR is dense, so each permute and slice in a head split is a copy. A consumer that can
// read strided operands (sdpa with q_view / k_view / v_view, see src/ops/attention.cpp) can
// instead read the value at the start of the chain, if the chain's composite map from output
// index to input element is one strided view. strided_view_of finds that start.
//
// What composes: permute (strides move), slice with any step > 0 (offset and stride), an output
// of split (a slice of step 1), and
// reshape where the standard view rule allows it (as torch.Tensor.view) -- judged on the whole
// chain, not step by step: torchvision's head split reshapes [S, B, 3E] -> [S, B*H, D], which
// is no strided view when B > 1, and later splits B*H again; the composite [B, H, S, D] is one.
// So the walk keeps each dim as a row-major list of (size, stride) atoms (a dim merged from
// non-adjacent memory holds several) and asks only at the end that every dim be one atom.
// A slice of a dim of several atoms composes when it takes whole blocks of the inner atoms.
//
// atom_view_of keeps the atoms (a dim merged from non-adjacent memory, such as the B * H batch
// of [B, S, H, D] read as [B * H, S, D], stays several atoms) for a caller that can split such
// dims itself, and may also look through expand (a broadcast dim is one atom of stride 0).
//
// Does not: look through copy, cast or anything else (nor expand, for strided_view_of); handle
// zero-size tensors (the value itself is returned); check alignment (the caller decides what its
// kernels need).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "kiln/ir.h"

namespace kiln::passes {

// Element (i0, i1, ...) of a value is element offset + sum(ik * strides[k]) of `base` (dense,
// row-major). A dim of extent 1 has stride 0.
struct ValueView {
  ValueId base = kNoValue;
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
  // Whether reading the view is reading `base` itself: a reshape chain (offset 0, every element
  // of base, row-major order), which the memory planner already makes free.
  bool whole_base(const Graph& g) const;
};

// `v` as a view of the furthest value it reaches through reshape / permute / slice / split nodes whose
// composite map is one strided view (the longest such chain); {v, 0, shape, row-major strides}
// when none.
ValueView strided_view_of(const Graph& g, ValueId v);

// One factor of a dim: `size` indices `stride` elements apart (0: a broadcast).
struct Atom {
  int64_t size, stride;
};
// Index i of dim d of the value is decomposed in mixed radix over dims[d]'s atoms (outermost
// first); element offset + sum(digit * stride) of `base` is read. A dim of extent 1 has no atoms;
// neighbouring atoms that are contiguous are merged.
struct AtomView {
  ValueId base = kNoValue;
  int64_t offset = 0;
  std::vector<std::vector<Atom>> dims;
  // Whether the view reads every element of `base` in row-major order (a reshape chain).
  bool in_order(const Graph& g) const;
};
// `v` as an AtomView of the furthest value its chain of reshape / permute / slice / split nodes
// (and expand nodes, with `through_expand`) reaches for which `accept` holds; v's own dense view
// when none does.
AtomView atom_view_of(const Graph& g, ValueId v, bool through_expand,
                      const std::function<bool(const AtomView&)>& accept);

// Operands of a batched op (matmul, sdpa) read as AtomViews whose last two dims are the matrix:
// their batch dims (right-aligned against `batch`, the broadcast batch extents) split into the
// common refinement of every operand's atoms, so that each refined dim is one atom in each
// operand ([B * H] read as [B] x [H]; a stride-0 group of heads as its own dim).
struct RefinedBatches {
  std::vector<std::vector<int64_t>> groups;  // per batch dim: its refined sizes, outermost first
  std::vector<std::vector<Atom>> atoms;      // per operand: one atom per refined dim (stride 0: broadcast)
};
// nullopt when a cut of one operand falls inside another's atom without dividing it.
std::optional<RefinedBatches> refine_batches(const std::vector<const AtomView*>& operands,
                                             const std::vector<int64_t>& batch);

// `operand` (read as `v`) over the refined batch atoms `batch` and its last two dims: the shape
// there, and the element strides of v's base (0 where an extent is 1).
struct RefinedOperand {
  std::vector<int64_t> shape, strides;
};
RefinedOperand refined_operand(const Graph& g, ValueId operand, const AtomView& v, const std::vector<Atom>& batch);

// A strided view in the form of an attribute: [offset, size0, stride0, size1, stride1, ...]
// (sdpa's q_view / k_view / v_view, matmul's a_view / b_view, a fused node's or concat's view<i>).
std::vector<int64_t> view_attribute(int64_t offset, const std::vector<int64_t>& sizes,
                                    const std::vector<int64_t>& strides);

}  // namespace kiln::passes
