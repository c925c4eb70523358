// Builder: network -> passes -> memory plan -> kernels -> Engine.
#include "kiln/builder.h"

#include <algorithm>
#include <sstream>

#include "kiln/errors.h"
#include "kiln/passes.h"

namespace kiln {

void BuilderConfig::validate() const {
  KILN_CHECK(!enabled_precisions.empty(), kInvalidArgument,
             "BuilderConfig.enabled_precisions is empty; give at least one of f32, f16, bf16");
  for (DType t : enabled_precisions)
    KILN_CHECK(t == DType::kF32 || t == DType::kF16 || t == DType::kBF16, kInvalidArgument,
               "BuilderConfig.enabled_precisions: ", dtype_name(t), " is not a compute precision; valid: f32, f16, bf16");
  KILN_CHECK(optimization_level >= 0 && optimization_level <= 5, kInvalidArgument,
             "BuilderConfig.optimization_level must be in 0..5, got ", optimization_level);
  KILN_CHECK(device.index >= 0, kInvalidArgument, "BuilderConfig.device index must be >= 0");
}

Builder::Builder(BuilderConfig config) : config_(std::move(config)) { config_.validate(); }

std::shared_ptr<Engine> Builder::build(const Graph& network) const {
  network.verify();
  Backend& backend = get_backend(config_.device);
  std::ostringstream log;
  Graph g = network;
  size_t before = g.nodes().size();

  auto run = [&](const char* name, bool (*pass)(Graph&)) {
    size_t n = g.nodes().size();
    bool changed = pass(g);
    log << "pass " << name << ": " << (changed ? "changed" : "no change") << ", " << n << " -> " << g.nodes().size()
        << " nodes\n";
  };
  run("eliminate_dead_code", &eliminate_dead_code);
  run("fold_constants", &fold_constants);
  run("fold_batch_norm", &fold_batch_norm);
  run("fold_constants", &fold_constants);
  if (config_.fuse_pointwise) run("fuse_pointwise", &fuse_pointwise);
  run("eliminate_dead_code", &eliminate_dead_code);
  g.verify();

  for (const auto& n : g.nodes()) {
    std::string why;
    KILN_CHECK(backend.supports(*n, g, &why), kUnsupported, "backend ", backend.name(), " cannot run ",
               op_name(n->op), n->name.empty() ? "" : " (node '" + n->name + "')", ": ", why);
  }
  log << "network: " << before << " nodes, plan: " << g.nodes().size() << " nodes on " << backend.device_name()
      << "\n";

  KernelOptions options;
  options.optimization_level = config_.optimization_level;
  options.workspace_limit = config_.workspace_limit;
  return Engine::create(std::move(g), config_.device, options, log.str());
}

}  // namespace kiln
