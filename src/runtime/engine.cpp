// Engine construction (constants to the device, one kernel per node) and ExecutionContext.
#include "kiln/engine.h"

#include <algorithm>
#include <sstream>

#include "kiln/errors.h"

namespace kiln {

std::shared_ptr<Engine> Engine::create(Graph plan, const Device& device, const KernelOptions& options,
                                       std::string build_log, const std::vector<Bytes>& kernel_states) {
  plan.verify();
  std::shared_ptr<Engine> e(new Engine());
  e->plan_ = std::move(plan);
  e->device_ = device;
  e->options_ = options;
  e->backend_ = &get_backend(device);
  Backend& be = *e->backend_;
  const Graph& g = e->plan_;

  for (ValueId in : g.inputs()) e->inputs_.push_back({g.value(in).name, g.type(in)});
  for (ValueId out : g.outputs()) e->outputs_.push_back({g.value(out).name, g.type(out)});
  e->memory_ = plan_memory(g, be.alignment());

  e->constant_ptr_.assign(size_t(g.num_values()), nullptr);
  for (ValueId c : g.constants()) {
    const Value& v = g.value(c);
    if (device.type == DeviceType::kCPU) {
      e->constant_ptr_[c] = v.data->data();  // the plan owns the bytes for the engine's lifetime
    } else {
      auto mem = be.allocate(v.data->size());
      be.copy_from_host(mem.get(), v.data->data(), v.data->size(), nullptr);
      e->constant_ptr_[c] = mem.get();
      e->constant_memory_.push_back(std::move(mem));
    }
  }
  if (device.type != DeviceType::kCPU) be.synchronize(nullptr);

  KILN_CHECK(kernel_states.empty() || kernel_states.size() == g.nodes().size(), kCorrupted,
             kernel_states.size(), " kernel states for a plan of ", g.nodes().size(), " nodes");
  std::ostringstream log;
  log << build_log;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node* n = g.nodes()[i].get();
    auto k = be.make_kernel(*n, g, options, kernel_states.empty() ? nullptr : &kernel_states[i]);
    KILN_CHECK(k != nullptr, kInternal, "backend ", be.name(), " returned no kernel for ", op_name(n->op));
    e->workspace_ = std::max(e->workspace_, k->workspace_size());
    std::string d = k->describe();
    if (!d.empty() && kernel_states.empty()) log << "kernel " << op_name(n->op) << ": " << d << "\n";
    e->kernel_states_.push_back(k->state());
    e->kernels_.push_back(std::move(k));
  }
  KILN_CHECK(e->workspace_ <= options.workspace_limit, kInvalidArgument, "the plan needs ", e->workspace_,
             " bytes of workspace, over the workspace limit of ", options.workspace_limit);
  log << "memory: arena " << e->memory_.arena_bytes << " bytes (naive " << e->memory_.naive_bytes << ")\n";
  e->log_ = log.str();
  return e;
}

std::vector<std::string> Engine::weight_names() const {
  std::vector<std::string> names;
  for (ValueId c : plan_.constants())
    if (plan_.value(c).is_weight) names.push_back(plan_.value(c).name);
  return names;
}

std::unique_ptr<ExecutionContext> Engine::create_execution_context(bool use_graphs) const {
  return std::make_unique<ExecutionContext>(shared_from_this(), use_graphs);
}

ExecutionContext::ExecutionContext(std::shared_ptr<const Engine> engine, bool use_graphs)
    : engine_(std::move(engine)), use_graphs_(use_graphs && engine_ && engine_->device_.type != DeviceType::kCPU) {
  KILN_CHECK(engine_ != nullptr, kInvalidArgument, "ExecutionContext needs an engine");
  const Engine& e = *engine_;
  const Graph& g = e.plan_;
  Backend& be = *e.backend_;
  if (e.memory_.arena_bytes) arena_ = be.allocate(e.memory_.arena_bytes);
  if (e.workspace_) workspace_ = be.allocate(e.workspace_);
  slot_.assign(size_t(g.num_values()), nullptr);
  for (ValueId v = 0; v < g.num_values(); ++v) {
    if (e.constant_ptr_[v]) slot_[v] = const_cast<void*>(e.constant_ptr_[v]);
    else if (e.memory_.offsets[v] >= 0) slot_[v] = static_cast<uint8_t*>(arena_.get()) + e.memory_.offsets[v];
  }
  size_t max_in = 0, max_out = 0;
  for (const auto& n : g.nodes()) {
    node_in_.push_back(n->inputs);
    node_out_.push_back(n->outputs);
    max_in = std::max(max_in, n->inputs.size());
    max_out = std::max(max_out, n->outputs.size());
  }
  in_ptrs_.resize(max_in);
  out_ptrs_.resize(max_out);
  if (use_graphs_) {
    for (ValueId v : g.inputs()) staging_.push_back(be.allocate(g.type(v).nbytes()));
    for (ValueId v : g.outputs()) staging_.push_back(be.allocate(g.type(v).nbytes()));
  }
}

void ExecutionContext::bind(const std::vector<const void*>& inputs, const std::vector<void*>& outputs) {
  const Graph& g = engine_->plan_;
  for (size_t i = 0; i < inputs.size(); ++i) slot_[g.inputs()[i]] = const_cast<void*>(inputs[i]);
  for (size_t i = 0; i < outputs.size(); ++i) slot_[g.outputs()[i]] = outputs[i];
}

void ExecutionContext::launch_all(void* stream) {
  const Engine& e = *engine_;
  RunContext rc;
  rc.stream = stream;
  rc.workspace = workspace_.get();
  rc.workspace_size = e.workspace_;
  for (size_t k = 0; k < e.kernels_.size(); ++k) {
    const auto& ins = node_in_[k];
    const auto& outs = node_out_[k];
    for (size_t i = 0; i < ins.size(); ++i) in_ptrs_[i] = ins[i] == kNoValue ? nullptr : slot_[ins[i]];
    for (size_t i = 0; i < outs.size(); ++i) out_ptrs_[i] = slot_[outs[i]];
    e.kernels_[k]->run(in_ptrs_.data(), out_ptrs_.data(), rc);
  }
}

void ExecutionContext::execute(const std::vector<const void*>& inputs, const std::vector<void*>& outputs,
                               void* stream) {
  const Engine& e = *engine_;
  const Graph& g = e.plan_;
  KILN_CHECK(inputs.size() == g.inputs().size(), kInvalidArgument, "engine takes ", g.inputs().size(),
             " inputs, got ", inputs.size());
  KILN_CHECK(outputs.size() == g.outputs().size(), kInvalidArgument, "engine gives ", g.outputs().size(),
             " outputs, got ", outputs.size(), " output buffers");
  for (size_t i = 0; i < inputs.size(); ++i)
    KILN_CHECK(inputs[i] != nullptr || g.type(g.inputs()[i]).nbytes() == 0, kInvalidArgument, "input '",
               e.inputs_[i].name, "' has a null buffer");
  for (size_t i = 0; i < outputs.size(); ++i)
    KILN_CHECK(outputs[i] != nullptr || g.type(g.outputs()[i]).nbytes() == 0, kInvalidArgument, "output '",
               e.outputs_[i].name, "' has a null buffer");
  if (!use_graphs_) {
    bind(inputs, outputs);
    launch_all(stream);
    return;
  }
  Backend& be = *e.backend_;
  const size_t nin = inputs.size();
  if (!graph_) {
    std::vector<const void*> staged_in(nin);
    std::vector<void*> staged_out(outputs.size());
    for (size_t i = 0; i < nin; ++i) staged_in[i] = staging_[i].get();
    for (size_t i = 0; i < outputs.size(); ++i) staged_out[i] = staging_[nin + i].get();
    bind(staged_in, staged_out);
    graph_ = be.capture([this](void* s) { launch_all(s); }, stream);
    if (!graph_) {  // the backend cannot capture: run directly from now on
      use_graphs_ = false;
      staging_.clear();
      bind(inputs, outputs);
      launch_all(stream);
      return;
    }
  }
  for (size_t i = 0; i < nin; ++i)
    be.copy_on_device(staging_[i].get(), inputs[i], g.type(g.inputs()[i]).nbytes(), stream);
  graph_->replay(stream);
  for (size_t i = 0; i < outputs.size(); ++i)
    be.copy_on_device(outputs[i], staging_[nin + i].get(), g.type(g.outputs()[i]).nbytes(), stream);
}

void ExecutionContext::execute_checked(const std::vector<const void*>& inputs,
                                       const std::vector<TensorType>& input_types,
                                       const std::vector<void*>& outputs,
                                       const std::vector<TensorType>& output_types, void* stream) {
  const Engine& e = *engine_;
  auto check = [](const std::vector<IOTensor>& want, const std::vector<TensorType>& got, const char* what) {
    KILN_CHECK(want.size() == got.size(), kInvalidArgument, "engine has ", want.size(), " ", what, "s, got ",
               got.size());
    for (size_t i = 0; i < want.size(); ++i) {
      KILN_CHECK(want[i].type.dtype == got[i].dtype, kInvalidArgument, what, " '", want[i].name, "' must be ",
                 dtype_name(want[i].type.dtype), ", got ", dtype_name(got[i].dtype));
      KILN_CHECK(want[i].type.shape() == got[i].shape(), kShapeMismatch, what, " '", want[i].name,
                 "' has shape ", got[i].to_string(), ", the engine was built for ", want[i].type.to_string());
    }
  };
  check(e.inputs_, input_types, "input");
  check(e.outputs_, output_types, "output");
  execute(inputs, outputs, stream);
}

}  // namespace kiln
