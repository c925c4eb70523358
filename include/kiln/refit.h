// Refitter: replaces an engine's weights by name without rebuilding it.
//
// The builder transforms some weights on their way into the plan (a batch norm folded into a
// conv, a cast to f16, a relayout). A refittable engine (BuilderConfig::refittable, the default)
// keeps a *refit program*: a Graph whose inputs are the source weights, by name, and whose
// outputs are the plan constants derived from them, named as in the plan; it is made of exactly
// the nodes fold_constants evaluated at build time. A refit runs the affected part of the
// program on the constant evaluator fold_constants used (src/passes/constant_eval.h): on the CPU
// reference kernels, node by node as fold_constants did, except chains of large f32/f64
// add/sub/mul/div and casts (a batch-norm fold of a conv weight, ending in the cast to an f16
// engine's dtype), which it evaluates row by row on several threads with the kernels' own scalar
// operations, without intermediates, reading the weights where the caller holds them and writing
// straight into the engine's constant; either way the refitted constants have the bits a fresh
// build with the new weights would have. Then it writes them, and every plan weight given, in
// place, through the engine's calls for that (Engine::write_constant, publish_constants): into
// the engine's own host copies on the CPU, into the device buffers the kernels already read on
// other devices. Kernels that read constants when they were made (packed GEMM operands, scalars
// inside fused kernels) are made again, and contexts that replay a captured graph capture again
// on their next call. Contexts created before the refit see the new weights; serialize() writes
// them.
//
// Weights needed together: a plan constant derived from several weights (W' from the conv
// weight and the batch norm's four parameters) is only re-derived from all of them. A weight
// that is also a plan weight has a current value; one that exists only as a program input does
// not (the engine stores what it runs, not the model), so refit() asks for it
// (missing_weights() lists them). Refitting everything a model has is always complete.
//
// Lifecycle: Refitter(engine) -> set_weight() / set_weight_view()* -> refit() (the values given are applied and
// forgotten) -> set_weight()* -> refit() ... No context of the engine may execute while
// refit() runs. An engine built with immutable weights (refittable = false) or loaded from a
// file without a refit program cannot be refitted: the constructor throws kUnsupported.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/engine.h"
#include "kiln/ir.h"

namespace kiln {

class Refitter {
 public:
  explicit Refitter(std::shared_ptr<Engine> engine);

  // Every weight the engine can take: its plan weights and the refit program's inputs, sorted.
  std::vector<std::string> weight_names() const;
  // The type `name` must have (kInvalidArgument naming the weight when it has none).
  TensorType weight_type(const std::string& name) const;
  // Copies `host_data` (dense, row-major, type.nbytes() bytes) as the new value of `name`.
  // A name the engine does not have, another shape or another dtype throws kInvalidArgument
  // naming the weight and what it expects; nothing is kept then.
  void set_weight(const std::string& name, const TensorType& type, const void* host_data);
  // The same without the copy: `host_data` is read by the next refit() (or dropped by another
  // set_weight of that name), so it must stay valid and unchanged until then. A refit then
  // copies a plan weight once, straight into the engine.
  void set_weight_view(const std::string& name, const TensorType& type, const void* host_data);
  // Weights that must still be given before refit() (see "Weights needed together").
  std::vector<std::string> missing_weights() const;
  // Applies the weights given since the last refit (kInvalidArgument naming the missing ones,
  // changing nothing, when missing_weights() is not empty).
  void refit();
  // What the last refit() did and how long each part took, in the form "refit: N weights,
  // program T ms (N outputs), host writes T ms, device copies T ms, N kernels remade in T ms";
  // empty before the first.
  const std::string& report() const { return report_; }

  const std::shared_ptr<Engine>& engine() const { return engine_; }

 private:
  struct Pending {
    std::shared_ptr<const HostBuffer> owned;  // set_weight's copy, or made from `view` when the program reads it
    const void* view = nullptr;          // set_weight_view's buffer
    size_t size = 0;
    const uint8_t* bytes() const { return owned ? owned->data() : static_cast<const uint8_t*>(view); }
  };
  void check_weight(const std::string& name, const TensorType& type, const void* host_data) const;

  std::shared_ptr<Engine> engine_;
  std::map<std::string, Pending> pending_;
  std::string report_;
};

}  // namespace kiln
