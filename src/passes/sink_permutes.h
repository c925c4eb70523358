// Moving permutes towards the outputs, where they meet other permutes and cancel: the layout
// propagation of to_channels_last (channels_last.cpp).
//
// A permute is a copy in Kiln's dense IR. Where an op reads permute(v, P) and computes the same
// thing on v in another axis order, the op runs on v and one permute follows it:
//   op(permute(v, P), ...) -> permute(op'(v, ...), P')
// op' is op with its axes renumbered (concat, slice, split, index_select, pad, reductions), its
// other operands read in v's order (binary and where: operands permuted by the same P, a single
// element, a constant, or a broadcast operand whose dims of extent > 1 keep their order, which
// needs only a reshape), or a reshape of v when the reshape merges and splits only dims that are
// adjacent and in order in v. A reshape that merges dims adjacent in v but in another order (a
// channel shuffle over channels-last memory) reads v with that block reordered in place: the
// permute becomes the reorder, and the rest of it moves past the reshape. Repeated, a conv's
// output permute reaches the next conv's input permute through the activations, norms, concats,
// channel shuffles and upsampling between them and both go.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kiln/ir.h"

namespace kiln::passes {

// Replaces the node at `at` by op(ins) {attrs}, its output k followed by a permute by perms[k]
// (none for an identity), and moves every use of the old outputs there; `at` advances past
// what it inserts.
void replace_permuted(Graph& g, size_t& at, OpKind op, const std::vector<ValueId>& ins, const Attrs& attrs,
                      const std::vector<std::vector<int64_t>>& perms);

// The rewrite of the node at `pos`, when one of the rules above applies to it (the permute it
// read stays for eliminate_dead_code, or for its other users). Returns whether it changed g.
// Without `all_rules`, only the rules that never enlarge a permute: unary ops and casts, and
// binary / where ops whose operands are all permuted by the same P or single elements. With
// `row_gathers` too, a reshape that no other rule moves a permute past, but that keeps v's
// innermost dim whole, reads a row gather of v (row_gathers.h) followed by a permute that
// moves that dim where the reshape has it.
bool sink_permute(Graph& g, size_t pos, bool all_rules, bool row_gathers = false);

// A permute that only moves dims of extent 1 becomes a reshape (which the memory planner makes
// free). Returns whether it changed g.
bool permute_to_reshape(Graph& g, size_t pos);

// Bytes the permutes and gathers of g write (those of constants aside): what layout
// propagation tries to make smaller.
int64_t moved_bytes(const Graph& g);

}  // namespace kiln::passes
