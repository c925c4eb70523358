// Builder: a verified network Graph + BuilderConfig -> Engine.
//
// build() copies the network, runs the passes (dead code, constant and batch-norm folding,
// pointwise fusion), plans memory, asks the backend for a kernel per node and returns an
// immutable Engine. The builder's log says what each pass did and which kernel each node got.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/backend.h"
#include "kiln/engine.h"
#include "kiln/ir.h"

namespace kiln {

struct BuilderConfig {
  std::vector<DType> enabled_precisions{DType::kF32};  // compute types the builder may use
  size_t workspace_limit = size_t(1) << 30;            // bytes of scratch per context
  int optimization_level = 3;                          // 0..5: how hard to search tactics
  Device device;                                       // cpu by default
  bool fuse_pointwise = true;

  void validate() const;  // throws kInvalidArgument naming the field
};

class Builder {
 public:
  explicit Builder(BuilderConfig config = {});
  std::shared_ptr<Engine> build(const Graph& network) const;
  const BuilderConfig& config() const { return config_; }

 private:
  BuilderConfig config_;
};

}  // namespace kiln
