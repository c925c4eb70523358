// Builder: a verified network Graph + BuilderConfig -> Engine.
//
// build() copies the network, runs the passes (dead code, constant and batch-norm folding,
// lowering to f16 / bf16 when enabled on a GPU, epilogue and pointwise fusion), plans memory, asks the backend for a kernel per node and returns an
// Engine. The builder's log says what each pass did and which kernel each node got. With
// `refittable` (the default) every constant folded from weights is recorded into the engine's
// refit program, so that a Refitter can change the weights later (kiln/refit.h). The log also
// names the policy and the tactic budget of the optimization level.
#pragma once

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "kiln/backend.h"
#include "kiln/build_policy.h"
#include "kiln/engine.h"
#include "kiln/import.h"
#include "kiln/ir.h"

namespace kiln {

struct BuilderConfig {
  // Compute types the builder may use. A GPU build with f16 (else bf16) enabled computes in it
  // (lower_precision; the engine's inputs and outputs keep their types); a CPU build computes
  // in f32 whenever f32 is enabled.
  std::vector<DType> enabled_precisions{DType::kF32};
  size_t workspace_limit = size_t(1) << 30;            // bytes of scratch per context
  int optimization_level = 3;  // 0..5: how hard to search tactics (TacticBudget)
  Device device;                                       // cpu by default
  bool fuse_pointwise = true;
  bool refittable = true;                              // false: immutable weights, no refit program
  BuildPolicy policy;  // numerics and tactic choices (kiln/build_policy.h)

  void validate() const;  // throws kInvalidArgument naming the field
};

class Builder {
 public:
  explicit Builder(BuilderConfig config = {});
  // `borrowed`: weights the engine may read in place instead of copying (kiln/engine.h
  // BorrowedWeight), by weight name.
  std::shared_ptr<Engine> build(const Graph& network, const BorrowedWeights& borrowed = {}) const;
  // The plan graph build() would give its backend: the network after the passes this config
  // runs (which depend on the device type, not on a device being present), before kernels are
  // chosen. Lets a user or a test see what the passes made without building.
  Graph optimize(const Graph& network) const;
  const BuilderConfig& config() const { return config_; }

 private:
  // optimize() writing what each pass did to `log`, and with `refit_program` the refit
  // program of the folds it recorded (when the config is refittable).
  Graph optimize(const Graph& network, std::ostream& log, std::shared_ptr<const Graph>* refit_program) const;

  BuilderConfig config_;
};

// The partitioner's question about each node of a graph, asked in FX order: the importers
// (ImportTrial), then the backend for `device` about every op the node converted to
// (device_supports: no device needs to be present). The ops are asked as imported, before the
// builder's passes, so a refusal that only a fused node meets still shows at build.
class BuildTrial {
 public:
  explicit BuildTrial(DeviceType device) : device_(device) {}
  ImportSupport add(const ImportNode& node, const ImportGraph& graph);

 private:
  DeviceType device_;
  ImportTrial trial_;
};

}  // namespace kiln
