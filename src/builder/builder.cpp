// Builder: network -> passes -> memory plan -> kernels -> Engine.
#include "kiln/builder.h"

#include <algorithm>
#include <optional>
#include <sstream>
#include <string>

#include "kiln/errors.h"
#include "kiln/passes.h"
#include "src/passes/refit_record.h"

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
  policy.validate("BuilderConfig.policy.");
}

namespace {

// The narrow compute type a build uses, if any: f16 before bf16 when both are enabled. Only GPU
// backends compute faster in them; the CPU backend computes every type through f32, so a CPU
// build keeps f32 (the engine's results then match the f32 reference) unless f32 is not enabled.
std::optional<DType> reduced_precision(const BuilderConfig& c) {
  auto enabled = [&](DType t) { return std::find(c.enabled_precisions.begin(), c.enabled_precisions.end(), t) !=
                                       c.enabled_precisions.end(); };
  if (c.device.type == DeviceType::kCPU && enabled(DType::kF32)) return std::nullopt;
  if (enabled(DType::kF16)) return DType::kF16;
  if (enabled(DType::kBF16)) return DType::kBF16;
  return std::nullopt;
}

}  // namespace

Builder::Builder(BuilderConfig config) : config_(std::move(config)) { config_.validate(); }

Graph Builder::optimize(const Graph& network, std::ostream& log, std::shared_ptr<const Graph>* refit_program) const {
  network.verify();
  Graph g = network;
  // Records every fold of a weight while the passes run (the refit program, kiln/refit.h).
  std::optional<passes::RefitRecorder> recorder;
  if (config_.refittable && refit_program != nullptr) recorder.emplace();
  passes::RefitRecorder::Scope recording(recorder ? &*recorder : nullptr);

  auto run = [&](const std::string& name, auto&& pass) {
    size_t n = g.nodes().size();
    bool changed = pass(g);
    log << "pass " << name << ": " << (changed ? "changed" : "no change") << ", " << n << " -> " << g.nodes().size()
        << " nodes\n";
  };
  run("eliminate_dead_code", &eliminate_dead_code);
  run("broadcast_gather_indices", &broadcast_gather_indices);
  run("fold_constants", &fold_constants);
  run("fold_batch_norm", &fold_batch_norm);
  run("convs_to_linears", &convs_to_linears);
  // Batch norm folds in f32 first; the narrowed weights are then cast once, at build time.
  if (std::optional<DType> compute = reduced_precision(config_))
    run(std::string("lower_precision(") + dtype_name(*compute) + ")",
        [&](Graph& graph) { return lower_precision(graph, *compute); });
  run("fold_constants", &fold_constants);
  run("eliminate_common_subexpressions", &eliminate_common_subexpressions);
  run("name_activations", &name_activations);
  // CUDA's attention kernels (fused and fallback) read strided operands; the CPU's copy them.
  const AttentionFilter foldable =
      config_.device.type == DeviceType::kCUDA ? strided_attention_shape : fused_attention_shape;
  run("form_attention", &form_attention);
  run("fuse_sibling_linears",
      [&](Graph& graph) { return fuse_sibling_linears(graph, foldable, config_.fuse_pointwise); });
  run("fuse_epilogue", [&](Graph& graph) { return fuse_epilogue(graph, config_.fuse_pointwise); });
  run("simplify_attention_masks", &simplify_attention_masks);
  run("causal_attention_masks", &causal_attention_masks);
  if (config_.device.type == DeviceType::kCUDA) run("additive_attention_masks", &additive_attention_masks);
  run("fold_attention_layout", [&](Graph& graph) { return fold_attention_layout(graph, foldable); });
  run("fold_matmul_views", &fold_matmul_views);
  // Tensor-core convolutions want channels-last tensors; the CPU's run channels-first.
  if (config_.device.type == DeviceType::kCUDA) {
    run("to_channels_last", &to_channels_last);
    run("dense_convs_to_linears", &dense_convs_to_linears);
    run("pool_before_epilogue", &pool_before_epilogue);
  }
  run("collapse_view_chains", &collapse_view_chains);
  run("chains_to_row_gathers", &chains_to_row_gathers);
  run("gather_concats", &gather_concats);
  run("interleave_concats", &interleave_concats);
  run("fold_constants", &fold_constants);
  // The layout passes leave a layer scale and the residual add after it next to their linear or
  // conv (a permute sat between them before): fold the one into the weights, fuse the other.
  run("fold_channel_scales", &fold_channel_scales);
  run("fuse_epilogue", [&](Graph& graph) { return fuse_epilogue(graph, config_.fuse_pointwise); });
  run("fold_constants", &fold_constants);
  run("broadcast_expands", &broadcast_expands);
  run("square_into_reductions", &square_into_reductions);
  run("form_rms_norms", &form_rms_norms);
  if (config_.fuse_pointwise) {
    run("fuse_pointwise", &fuse_pointwise);
    run("fold_input_views", &fold_input_views);
    // The generated CUDA kernel computes each part in its columns; the CPU's runs the parts apart.
    if (config_.device.type == DeviceType::kCUDA) run("fuse_pointwise_concats", &fuse_pointwise_concats);
  }
  run("eliminate_dead_code", &eliminate_dead_code);
  if (recorder) {
    *refit_program = std::make_shared<const Graph>(recorder->finish(g));
    log << "refit program: " << (*refit_program)->inputs().size() << " weights -> "
        << (*refit_program)->outputs().size() << " derived constants, " << (*refit_program)->nodes().size()
        << " nodes\n";
  } else if (refit_program != nullptr) {
    log << "immutable weights: no refit program\n";
  }
  g.verify();
  return g;
}

Graph Builder::optimize(const Graph& network) const {
  std::ostringstream log;
  return optimize(network, log, nullptr);
}

std::shared_ptr<Engine> Builder::build(const Graph& network, const BorrowedWeights& borrowed) const {
  Backend& backend = get_backend(config_.device);
  const std::future<std::string> libraries = backend.warm_up();  // overlaps the passes
  std::ostringstream log;
  log << "policy: " << config_.policy.to_string() << "; optimization level " << config_.optimization_level << ": "
      << tactic_budget(config_.optimization_level).to_string() << "\n";
  const size_t before = network.nodes().size();
  std::shared_ptr<const Graph> refit_program;
  Graph g = optimize(network, log, &refit_program);

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
  options.policy = config_.policy;
  auto engine = Engine::create(std::move(g), config_.device, options, log.str(), std::move(refit_program), borrowed);
  get_backend(config_.device).build_finished();
  return engine;
}

ImportSupport BuildTrial::add(const ImportNode& node, const ImportGraph& graph) {
  return trial_.add(node, graph, [this](const Graph& g, size_t first) {
    std::string why;
    for (size_t i = first; i < g.nodes().size(); ++i) {
      const Node& n = *g.nodes()[i];
      if (!device_supports(device_, n, g, &why))
        return detail::concat("the ", device_ == DeviceType::kCUDA ? "CUDA" : "CPU", " backend cannot run ",
                              op_name(n.op), ": ", why);
    }
    return std::string();
  });
}

}  // namespace kiln
