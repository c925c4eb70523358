// The constant evaluator: computes constants on the CPU reference kernels, for fold_constants
// (one node of the graph being built at a time) and for a refit (the refit program recorded
// from those folds, over new weights). Both go through evaluate_constant_node, so a refit
// derives exactly the bits the build folded.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/ir.h"

namespace kiln::passes {

// Runs node `n` of `g`, whose inputs are all constants, on the CPU reference kernel; one buffer
// per output in `results`. Returns false when the CPU backend has no kernel for it.
bool evaluate_constant_node(const Graph& g, const Node& n, std::vector<std::shared_ptr<HostBuffer>>& results);

// One input of evaluate_program: bytes owned by `owned`, or, without it, a view of bytes at
// `view` that the caller keeps valid and unchanged for the call (copied only where a node
// evaluated alone reads it).
struct ProgramInput {
  std::shared_ptr<const HostBuffer> owned;
  const uint8_t* view = nullptr;
  const uint8_t* bytes() const { return owned ? owned->data() : view; }
};

// What evaluate_program computed: per program output, its bytes (null where not asked for),
// valid while this object lives (they lie in `in_place` buffers of the caller or in `buffers`).
struct ProgramOutputs {
  std::vector<const uint8_t*> bytes;
  std::vector<std::shared_ptr<const HostBuffer>> buffers;
};

// Evaluates the outputs of `program` (a graph of inputs, literal constants and the nodes
// fold_constants evaluated; see refit_record.h) flagged in `wanted` (one flag per output), from
// `inputs` (one per program input; those no wanted output depends on are not read and may be
// empty). Only the nodes the wanted outputs depend on run, in program order, each alone on the
// CPU reference kernel as fold_constants ran it, except chains of large f32 / f64 add, sub, mul,
// div and casts (a batch-norm fold of a conv weight, ending in the cast to an f16 engine's
// dtype): those are evaluated row by row on several threads with the kernels' own scalar
// operations, without intermediates, reading view inputs in place. Either way the bits are those
// of the build. `in_place` (empty, or one per output, null where none): host bytes of output i's
// size where such a chain may write output i directly; its ProgramOutputs::bytes then point there.
// Throws kInternal naming the op when a node has no CPU kernel.
ProgramOutputs evaluate_program(const Graph& program, const std::vector<ProgramInput>& inputs,
                                const std::vector<char>& wanted, const std::vector<uint8_t*>& in_place = {});

}  // namespace kiln::passes
