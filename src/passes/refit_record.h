// Recording how the builder derives constants from weights, so that a refit can derive them
// again (the refit program; see include/kiln/refit.h).
//
// Every constant a pass derives from other constants is made by fold_constants: passes that
// transform weights (batch-norm folding, precision casts, relayouts) insert ordinary nodes on
// the constants and let fold_constants evaluate them. While a RefitRecorder is active on the
// building thread (RefitRecorder::Scope), fold_constants reports each node it evaluates; the
// recorder copies the node into a program graph whose inputs are the weights (by name).
// Constants are identified by their bytes (the shared Bytes object), which survive
// Graph::compact() and renumbering; the recorder keeps every recorded buffer alive so that an
// address is never reused for another constant while it records.
//
// finish() then turns the record into the refit program of a plan: its outputs are the plan
// constants that depend on at least one weight, named as in the plan; everything that depends
// on no weight becomes a literal constant of the program. A refit evaluates it with the
// evaluator fold_constants used (src/passes/constant_eval.h).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/ir.h"

namespace kiln::passes {

class RefitRecorder {
 public:
  // Makes `recorder` (may be null: nothing records) the active one on this thread until the
  // scope ends.
  class Scope {
   public:
    explicit Scope(RefitRecorder* recorder);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    RefitRecorder* previous_;
  };
  static RefitRecorder* active();

  // fold_constants evaluated node `n` of `g` (all inputs constants) into `results`.
  void record_fold(const Graph& g, const Node& n, const std::vector<std::shared_ptr<HostBuffer>>& results);

  // The refit program of `plan` (the graph after every pass). A plan constant the program
  // outputs gets a unique, non-empty name first (renamed in `plan` when needed), since the
  // engine finds the constants a program writes by name.
  Graph finish(Graph& plan) const;

 private:
  Graph record_;                                       // every fold, in order
  std::vector<std::shared_ptr<const HostBuffer>> data_;     // per record_ value: its bytes
  std::unordered_map<const HostBuffer*, ValueId> of_bytes_;  // constant bytes -> record_ value
  std::unordered_map<std::string, ValueId> weight_;     // weight name -> record_ input

  ValueId value_of(const Graph& g, ValueId v);
};

}  // namespace kiln::passes
