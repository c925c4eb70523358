// Engine construction (constants to the device, one kernel per node: a build or a load), the
// in-place constant changes of a refit, and ExecutionContext.
#include <algorithm>
#include <cstring>
#include <iomanip>
#include <numeric>
#include <sstream>
#include <unordered_map>

#include "kiln/engine.h"
#include "kiln/errors.h"
#include "src/common/stopwatch.h"
#include "src/runtime/device_block.h"

namespace kiln {

void Engine::choose_kernels(const std::vector<Bytes>* kernel_states, Assembly& assembly) {
  Backend& be = *backend_;
  const Graph& g = plan_;
  KILN_CHECK(kernel_states == nullptr || kernel_states->empty() || kernel_states->size() == g.nodes().size(),
             kCorrupted, kernel_states->size(), " kernel states for a plan of ", g.nodes().size(), " nodes");
  if (!options_.derived) options_.derived = std::make_shared<DerivedConstants>();
  const Stopwatch kernels_watch;
  std::vector<std::unique_ptr<Kernel>> kernels = be.make_kernels(
      g, options_, kernel_states && !kernel_states->empty() ? kernel_states : nullptr, &assembly.kernel_ms);
  assembly.kernels_ms = kernels_watch.ms();
  KILN_CHECK(kernels.size() == g.nodes().size(), kInternal, "backend ", be.name(), " made ", kernels.size(),
             " kernels for ", g.nodes().size(), " nodes");
  for (size_t i = 0; i < kernels.size(); ++i) {
    KILN_CHECK(kernels[i] != nullptr, kInternal, "backend ", be.name(), " returned no kernel for ",
               op_name(g.nodes()[i]->op));
    workspace_ = std::max(workspace_, kernels[i]->workspace_size());
    kernel_states_.push_back(kernels[i]->state());
    kernels_.push_back(std::move(kernels[i]));
  }
  // The memory plan follows the kernels: a kernel that may write its output over an input's
  // bytes lets the planner put them there (Kernel::writes_over_input).
  memory_ = plan_memory(g, be.alignment(), true,
                        [this](size_t node, size_t input) { return kernels_[node]->writes_over_input(input); });
  KILN_CHECK(workspace_ <= options_.workspace_limit, kInvalidArgument, "the plan needs ", workspace_,
             " bytes of workspace, over the workspace limit of ", options_.workspace_limit);
}

std::shared_ptr<Engine> Engine::assemble(Graph plan, const Device& device, const KernelOptions& options,
                                         std::shared_ptr<const Graph> refit_program, const BorrowedWeights& borrowed,
                                         const std::vector<Bytes>* kernel_states, Assembly& assembly) {
  plan.verify();
  std::shared_ptr<Engine> e(new Engine());
  e->plan_ = std::move(plan);
  e->device_ = device;
  e->options_ = options;
  e->backend_ = &get_backend(device);
  if (refit_program) {
    if (!refit_program->outputs().empty()) refit_program->verify();
    KILN_CHECK(!refit_program->outputs().empty() || refit_program->nodes().empty(), kCorrupted,
               "the refit program has ", refit_program->nodes().size(), " nodes but no outputs");
    e->refit_program_ = std::move(refit_program);
    e->own_refittable_constants();
  }
  Backend& be = *e->backend_;
  const Graph& g = e->plan_;

  for (ValueId in : g.inputs()) e->inputs_.push_back({g.value(in).name, g.type(in)});
  for (ValueId out : g.outputs()) e->outputs_.push_back({g.value(out).name, g.type(out)});

  e->constant_ptr_.assign(size_t(g.num_values()), nullptr);
  e->device_copy_.assign(size_t(g.num_values()), nullptr);
  e->borrowed_.assign(size_t(g.num_values()), nullptr);
  // A plan weight holds the bytes of the weight of its name: a borrowed one that fits is read in place.
  std::vector<ValueId> own;
  for (ValueId c : g.constants()) {
    const Value& v = g.value(c);
    auto it = v.is_weight ? borrowed.find(v.name) : borrowed.end();
    if (it != borrowed.end() && it->second.data && it->second.size == v.data->size() &&
        reinterpret_cast<uintptr_t>(it->second.data) % be.alignment() == 0) {
      e->constant_ptr_[c] = it->second.data;
      e->borrowed_[c] = it->second.owner;
    } else {
      own.push_back(c);
    }
  }
  if (device.type == DeviceType::kCPU)
    for (ValueId c : own)
      e->constant_ptr_[c] = g.value(c).data->data();  // the plan owns the bytes for the engine's lifetime
  e->choose_kernels(kernel_states, assembly);
  // Kernels take constants by address when they run, so the device copies follow the kernels.
  // One device block holds the constants (the driver rounds each allocation up to whole 2 MiB
  // pages, so one per constant wastes most of a page per few-MiB weight) and, where
  // context_joins_block says so, one context's arena and workspace: the first context's; later
  // ones allocate their own.
  if (device.type != DeviceType::kCPU) {
    std::vector<size_t> offset;
    size_t total = 0;
    for (ValueId c : own) {
      offset.push_back(total);
      total += block_rounded(be.alignment(), g.value(c).data->size());
    }
    size_t context_bytes = block_rounded(be.alignment(), e->memory_.arena_bytes) + e->workspace_;
    if (!context_joins_block(total, context_bytes)) context_bytes = 0;
    assembly.block_bytes = total + context_bytes;
    if (assembly.block_bytes) e->constant_memory_ = be.allocate(assembly.block_bytes);
    if (context_bytes) e->context_memory_ = static_cast<uint8_t*>(e->constant_memory_.get()) + total;
    std::vector<Backend::HostCopy> copies;
    for (size_t i = 0; i < own.size(); ++i) {
      void* p = static_cast<uint8_t*>(e->constant_memory_.get()) + offset[i];
      copies.push_back({p, g.value(own[i]).data->data(), g.value(own[i]).data->size()});
      e->constant_ptr_[own[i]] = p;
      e->device_copy_[own[i]] = p;
    }
    const Stopwatch upload_watch;
    if (!copies.empty()) be.upload(copies);
    assembly.constants_ms = upload_watch.ms();
  }
  return e;
}

std::string Engine::slowest_kernels(const std::vector<double>& kernel_ms) const {
  const Graph& g = plan_;
  std::vector<size_t> slowest(g.nodes().size());
  std::iota(slowest.begin(), slowest.end(), size_t(0));
  const size_t top = std::min<size_t>(3, slowest.size());
  std::partial_sort(slowest.begin(), slowest.begin() + long(top), slowest.end(),
                    [&](size_t a, size_t b) { return kernel_ms[a] > kernel_ms[b]; });
  std::ostringstream log;
  log << std::fixed << std::setprecision(1);
  for (size_t j = 0; j < top; ++j) {
    const Node& n = *g.nodes()[slowest[j]];
    log << (j ? ", " : " (slowest: ") << op_name(n.op) << " '" << n.name << "' " << kernel_ms[slowest[j]] << " ms";
  }
  log << (top ? ")\n" : "\n");
  return log.str();
}

std::shared_ptr<Engine> Engine::create(Graph plan, const Device& device, const KernelOptions& options,
                                       std::string build_log, std::shared_ptr<const Graph> refit_program,
                                       const BorrowedWeights& borrowed) {
  Assembly a;
  std::shared_ptr<Engine> e =
      assemble(std::move(plan), device, options, std::move(refit_program), borrowed, nullptr, a);
  const Graph& g = e->plan_;
  // Which kernel each node got, and where the kernels' time went (the slowest to make: cuDNN
  // plans to finalize, tactics to time).
  std::ostringstream log;
  log << build_log;
  for (size_t i = 0; i < e->kernels_.size(); ++i) {
    std::string d = e->kernels_[i]->describe();
    if (!d.empty()) log << "kernel " << op_name(g.nodes()[i]->op) << ": " << d << "\n";
  }
  log << std::fixed << std::setprecision(1);
  log << "kernels: " << g.nodes().size() << " made in " << a.kernels_ms << " ms" << e->slowest_kernels(a.kernel_ms);
  log << "memory: arena " << e->memory_.arena_bytes << " bytes (naive " << e->memory_.naive_bytes << ")";
  if (e->memory_.in_place_values) log << ", " << e->memory_.in_place_values << " outputs written in place";
  if (size_t b = e->borrowed_bytes()) log << ", weights read in place " << b << " bytes";
  if (e->constant_memory_)
    log << ", device block " << a.block_bytes << " bytes" << (e->context_memory_ ? " (with one context)" : "");
  log << "\n";
  e->log_ = log.str();
  return e;
}

std::shared_ptr<Engine> Engine::restore(Graph plan, const Device& device, const KernelOptions& options, std::string log,
                                        const std::vector<Bytes>& kernel_states,
                                        std::shared_ptr<const Graph> refit_program) {
  Assembly a;
  std::shared_ptr<Engine> e =
      assemble(std::move(plan), device, options, std::move(refit_program), {}, &kernel_states, a);
  std::ostringstream line;
  line << std::fixed << std::setprecision(1) << "load: constants " << a.constants_ms << " ms, "
       << e->plan_.nodes().size() << " kernels " << a.kernels_ms << " ms" << e->slowest_kernels(a.kernel_ms);
  e->log_ = std::move(log) + line.str();
  return e;
}

void Engine::own_refittable_constants() {
  Graph& g = plan_;
  const Graph& rp = *refit_program_;
  // Fused bodies become the engine's own: a body may be shared with other copies of the plan.
  for (const auto& n : g.nodes())
    if (n->body) n->body = std::make_shared<Graph>(*n->body);
  std::unordered_map<std::string, Value*> by_name;  // named constants, the top level first
  auto index = [&](Graph& graph) {
    for (ValueId c : graph.constants())
      if (!graph.value(c).name.empty()) by_name.emplace(graph.value(c).name, &graph.value(c));
  };
  index(g);
  for (const auto& n : g.nodes())
    if (n->body) index(*n->body);
  for (ValueId out : rp.outputs()) {
    const Value& o = rp.value(out);
    auto it = by_name.find(o.name);
    KILN_CHECK(it != by_name.end() && !it->second->is_weight, kCorrupted, "refit program output '", o.name,
               "' names no derived constant of the plan");
    KILN_CHECK(it->second->type == o.type, kCorrupted, "refit program output '", o.name, "' is ", o.type.to_string(),
               ", the plan constant of that name is ", it->second->type.to_string());
    refit_targets_.push_back(it->second);
  }
  for (ValueId in : rp.inputs()) {
    const Value& i = rp.value(in);
    auto it = by_name.find(i.name);
    KILN_CHECK(it == by_name.end() || !it->second->is_weight || it->second->type == i.type, kCorrupted,
               "refit program input '", i.name, "' is ", i.type.to_string(), ", the plan weight of that name is ",
               it == by_name.end() ? std::string() : it->second->type.to_string());
  }
  // Private, writable copies of every weight and refit target; body constants that shared their
  // bytes share the copies (a refit writes both at once). Bytes this value alone holds are the
  // engine's already and are not copied: an engine read from a file, whose reader made each
  // buffer (not const) for this plan alone, copies or views of a private, writable mapping.
  std::unordered_map<const HostBuffer*, std::shared_ptr<HostBuffer>> copies;
  auto own = [&](Value& v) {
    std::shared_ptr<HostBuffer>& c = copies[v.data.get()];
    if (!c)
      c = v.data.use_count() == 1 ? std::const_pointer_cast<HostBuffer>(v.data) : std::make_shared<HostBuffer>(*v.data);
    v.data = c;
  };
  for (ValueId c : g.constants())
    if (g.value(c).is_weight) own(g.value(c));
  for (Value* t : refit_targets_) own(*t);
  for (const auto& n : g.nodes()) {
    if (!n->body) continue;
    for (ValueId c : n->body->constants()) {
      auto it = copies.find(n->body->value(c).data.get());
      if (it != copies.end()) n->body->value(c).data = it->second;
    }
  }
  for (auto& [from, copy] : copies) writable_.emplace(copy.get(), std::move(copy));
}

const Value& Engine::refit_target(size_t output) const {
  KILN_CHECK(output < refit_targets_.size(), kInvalidArgument, "refit program output ", output, " of ",
             refit_targets_.size());
  return *refit_targets_[output];
}

uint8_t* Engine::writable_bytes(const Value& constant) {
  auto it = writable_.find(constant.data.get());
  return it == writable_.end() ? nullptr : it->second->data();
}

void Engine::write_constant(const Value& constant, const void* bytes, size_t size) {
  KILN_CHECK(constant.data && constant.data->size() == size, kInternal, "refit: constant '", constant.name, "' holds ",
             constant.data ? constant.data->size() : 0, " bytes, its new value ", size);
  auto it = writable_.find(constant.data.get());
  KILN_CHECK(it != writable_.end(), kInternal, "refit: constant '", constant.name,
             "' is not one the engine lets a refit write");
  HostBuffer& dst = *it->second;
  if (size && dst.data() != bytes) std::memcpy(dst.data(), bytes, size);
  written_.insert(&dst);
}

Engine::Published Engine::publish_constants() {
  const std::unordered_set<const HostBuffer*> written = std::move(written_);
  written_.clear();
  Published done;
  Stopwatch watch;
  Backend& be = *backend_;
  const Graph& plan = plan_;
  const bool on_host = device_.type == DeviceType::kCPU;
  if (!on_host) be.synchronize(nullptr);  // a forward still running on any stream reads the old values, whole
  // A weight read in place from its owner's memory is never written there: it becomes the
  // engine's own, with its new bytes (contexts take its new address on their next call).
  std::unordered_set<ValueId> moved;
  for (ValueId c : plan.constants())
    if (written.count(plan.value(c).data.get()) && borrowed_[size_t(c)]) {
      stop_borrowing(c);
      moved.insert(c);
    }
  if (!on_host) {
    std::vector<Backend::HostCopy> copies;
    for (ValueId c : plan.constants())
      if (written.count(plan.value(c).data.get()) && device_copy_[size_t(c)] && !moved.count(c))
        copies.push_back({device_copy_[size_t(c)], plan.value(c).data->data(), plan.value(c).data->size()});
    be.upload(copies);
  }
  done.device_ms = watch.lap();
  // Kernels that may have read a written constant when they were made are made again, deriving
  // their data from the new bytes.
  if (options_.derived) options_.derived->clear();
  for (size_t i = 0; i < plan.nodes().size(); ++i) {
    const Node& n = *plan.nodes()[i];
    bool reads = false;
    for (ValueId in : n.inputs)
      reads = reads || (in != kNoValue && plan.value(in).is_constant() && written.count(plan.value(in).data.get()));
    if (n.body)
      for (ValueId c : n.body->constants()) reads = reads || written.count(n.body->value(c).data.get());
    if (!reads || !kernels_[i]->bakes_constants()) continue;
    auto k = be.make_kernel(n, plan, options_, &kernel_states_[i]);
    KILN_CHECK(k != nullptr && k->workspace_size() <= workspace_, kInternal, "refit: the kernel of ", op_name(n.op),
               " made again needs more workspace than the engine has");
    kernels_[i] = std::move(k);
    ++done.kernels_remade;
  }
  done.kernels_ms = watch.ms();
  ++weights_version_;
  source_weights_id_.clear();
  return done;
}

std::shared_ptr<void> Engine::take_context_memory() const {
  if (!context_memory_ || context_memory_taken_.exchange(true)) return nullptr;
  std::shared_ptr<const Engine> self = shared_from_this();  // the block lives as long as the engine
  return std::shared_ptr<void>(context_memory_, [self](void*) { self->context_memory_taken_ = false; });
}

size_t Engine::borrowed_bytes() const {
  size_t n = 0;
  for (ValueId c : plan_.constants())
    if (borrowed_[size_t(c)]) n += plan_.value(c).data->size();
  return n;
}

void Engine::stop_borrowing(ValueId c) {
  if (!borrowed_[size_t(c)]) return;
  const HostBuffer& bytes = *plan_.value(c).data;  // the weight's bytes, as the plan holds them
  if (device_.type == DeviceType::kCPU) {
    constant_ptr_[size_t(c)] = bytes.data();
  } else {
    std::shared_ptr<void> copy = backend_->allocate(bytes.size());
    backend_->upload({{copy.get(), bytes.data(), bytes.size()}});
    constant_ptr_[size_t(c)] = copy.get();
    device_copy_[size_t(c)] = copy.get();
    own_copies_.push_back(std::move(copy));
  }
  borrowed_[size_t(c)].reset();
}

std::vector<std::string> Engine::weight_names() const {
  std::vector<std::string> names;
  for (ValueId c : plan_.constants())
    if (plan_.value(c).is_weight) names.push_back(plan_.value(c).name);
  return names;
}

std::unique_ptr<ExecutionContext> Engine::create_execution_context(bool use_graphs,
                                                                   std::shared_ptr<SharedArena> arena) const {
  return std::make_unique<ExecutionContext>(shared_from_this(), use_graphs, std::move(arena));
}

std::shared_ptr<SharedArena> Engine::allocate_arena(size_t bytes) const {
  auto arena = std::make_shared<SharedArena>();
  arena->bytes = bytes;
  if (bytes) arena->data = backend_->allocate(bytes);
  return arena;
}

size_t Engine::arena_bound(const Graph& plan, size_t alignment) { return plan_memory(plan, alignment).arena_bytes; }

ExecutionContext::ExecutionContext(std::shared_ptr<const Engine> engine, bool use_graphs,
                                   std::shared_ptr<SharedArena> arena)
    : engine_(std::move(engine)), use_graphs_(use_graphs && engine_ && engine_->device_.type != DeviceType::kCPU) {
  KILN_CHECK(engine_ != nullptr, kInvalidArgument, "ExecutionContext needs an engine");
  const Engine& e = *engine_;
  const Graph& g = e.plan_;
  Backend& be = *e.backend_;
  if (arena && arena->data && arena->bytes >= e.memory_.arena_bytes) {
    arena_ = std::shared_ptr<void>(arena, arena->data.get());  // keeps the SharedArena alive
    shares_arena_ = true;
    if (e.workspace_) workspace_ = be.allocate(e.workspace_);
  } else if (std::shared_ptr<void> block = e.take_context_memory()) {  // the engine's block has room for one context
    uint8_t* base = static_cast<uint8_t*>(block.get());
    if (e.memory_.arena_bytes) arena_ = std::shared_ptr<void>(block, base);
    if (e.workspace_)
      workspace_ = std::shared_ptr<void>(block, base + block_rounded(be.alignment(), e.memory_.arena_bytes));
  } else {
    if (e.memory_.arena_bytes) arena_ = be.allocate(e.memory_.arena_bytes);
    if (e.workspace_) workspace_ = be.allocate(e.workspace_);
  }
  slot_.assign(size_t(g.num_values()), nullptr);
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (e.memory_.offsets[v] >= 0) slot_[v] = static_cast<uint8_t*>(arena_.get()) + e.memory_.offsets[v];
  bind_constants();
  size_t max_in = 0, max_out = 0;
  for (const auto& n : g.nodes()) {
    node_in_.push_back(n->inputs);
    node_out_.push_back(n->outputs);
    max_in = std::max(max_in, n->inputs.size());
    max_out = std::max(max_out, n->outputs.size());
  }
  in_ptrs_.resize(max_in);
  out_ptrs_.resize(max_out);
}

void ExecutionContext::bind_constants() {
  const Engine& e = *engine_;
  for (ValueId c : e.plan_.constants()) slot_[c] = const_cast<void*>(e.constant_ptr_[c]);
  bound_version_ = e.weights_version_;
}

void ExecutionContext::bind(const std::vector<const void*>& inputs, const std::vector<void*>& outputs) {
  const Graph& g = engine_->plan_;
  for (size_t i = 0; i < inputs.size(); ++i) slot_[g.inputs()[i]] = const_cast<void*>(inputs[i]);
  for (size_t i = 0; i < outputs.size(); ++i) slot_[g.outputs()[i]] = outputs[i];
}

bool ExecutionContext::overlapping(const std::vector<const void*>& inputs, const std::vector<void*>& outputs) const {
  const Graph& g = engine_->plan_;
  auto meet = [](const void* a, size_t an, const void* b, size_t bn) {
    const auto *pa = static_cast<const uint8_t*>(a), *pb = static_cast<const uint8_t*>(b);
    return pa < pb + bn && pb < pa + an;
  };
  for (size_t o = 0; o < outputs.size(); ++o) {
    const size_t on = g.type(g.outputs()[o]).nbytes();
    for (size_t i = 0; i < inputs.size(); ++i)
      if (meet(outputs[o], on, inputs[i], g.type(g.inputs()[i]).nbytes())) return true;
    for (size_t k = 0; k < o; ++k)
      if (meet(outputs[o], on, outputs[k], g.type(g.outputs()[k]).nbytes())) return true;
  }
  return false;
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
  e.check_current();
  KILN_CHECK(inputs.size() == g.inputs().size(), kInvalidArgument, "engine takes ", g.inputs().size(), " inputs, got ",
             inputs.size());
  KILN_CHECK(outputs.size() == g.outputs().size(), kInvalidArgument, "engine gives ", g.outputs().size(),
             " outputs, got ", outputs.size(), " output buffers");
  for (size_t i = 0; i < inputs.size(); ++i)
    KILN_CHECK(inputs[i] != nullptr || g.type(g.inputs()[i]).nbytes() == 0, kInvalidArgument, "input '",
               e.inputs_[i].name, "' has a null buffer");
  for (size_t i = 0; i < outputs.size(); ++i)
    KILN_CHECK(outputs[i] != nullptr || g.type(g.outputs()[i]).nbytes() == 0, kInvalidArgument, "output '",
               e.outputs_[i].name, "' has a null buffer");
  if (bound_version_ != e.weights_version_) bind_constants();  // refitted: a weight may have moved
  if (!use_graphs_) {
    bind(inputs, outputs);
    launch_all(stream);
    return;
  }
  Backend& be = *e.backend_;
  const size_t nin = inputs.size();
  if (captured_version_ != e.weights_version_) {  // refitted: kernels may be new
    graph_.reset();
    direct_.clear();
    captured_version_ = e.weights_version_;
  }
  for (const DirectGraph& d : direct_)
    if (d.buffers.same(inputs, outputs)) {
      d.graph->replay(stream);
      return;
    }
  const auto seen = std::find_if(seen_.begin(), seen_.end(), [&](const Buffers& b) { return b.same(inputs, outputs); });
  const bool first = !graph_ && direct_.empty();  // no graph yet (or none since a refit)
  if ((first || seen != seen_.end()) && direct_captures_ < kMaxDirectCaptures && !overlapping(inputs, outputs)) {
    // A graph on the caller's own buffers, replayed with no copies whenever they come again.
    if (seen != seen_.end()) seen_.erase(seen);
    ++direct_captures_;
    bind(inputs, outputs);
    std::string why;
    std::unique_ptr<CapturedGraph> direct = be.capture([this](void* s) { launch_all(s); }, stream, &why);
    if (direct) {
      ++graph_captures_;
      if (direct_.size() == kMaxDirectGraphs) direct_.erase(direct_.begin());
      direct_.push_back(DirectGraph{Buffers{inputs, outputs}, std::move(direct)});
      direct_.back().graph->replay(stream);
      return;
    }
    if (first) {  // the backend cannot capture: run directly from now on
      graph_refusal_ = why;
      use_graphs_ = false;
      launch_all(stream);
      return;
    }
    direct_captures_ = kMaxDirectCaptures;  // refused: stay with the staging graph
  } else if (seen == seen_.end()) {
    if (seen_.size() == kMaxDirectGraphs) seen_.erase(seen_.begin());
    seen_.push_back(Buffers{inputs, outputs});
  }
  if (!graph_) {
    if (staging_.empty()) {  // made once, by the first call whose buffers have no graph of their own
      for (ValueId v : g.inputs()) staging_.push_back(be.allocate(g.type(v).nbytes()));
      for (ValueId v : g.outputs()) staging_.push_back(be.allocate(g.type(v).nbytes()));
    }
    std::vector<const void*> staged_in(nin);
    std::vector<void*> staged_out(outputs.size());
    for (size_t i = 0; i < nin; ++i) staged_in[i] = staging_[i].get();
    for (size_t i = 0; i < outputs.size(); ++i) staged_out[i] = staging_[nin + i].get();
    bind(staged_in, staged_out);
    graph_ = be.capture([this](void* s) { launch_all(s); }, stream, &graph_refusal_);
    if (!graph_) {  // the backend cannot capture: run directly from now on
      use_graphs_ = false;
      staging_.clear();
      bind(inputs, outputs);
      launch_all(stream);
      return;
    }
    ++graph_captures_;
  }
  for (size_t i = 0; i < nin; ++i)
    be.copy_on_device(staging_[i].get(), inputs[i], g.type(g.inputs()[i]).nbytes(), stream);
  graph_->replay(stream);
  for (size_t i = 0; i < outputs.size(); ++i)
    be.copy_on_device(outputs[i], staging_[nin + i].get(), g.type(g.outputs()[i]).nbytes(), stream);
}

void ExecutionContext::execute_checked(const std::vector<const void*>& inputs,
                                       const std::vector<TensorType>& input_types, const std::vector<void*>& outputs,
                                       const std::vector<TensorType>& output_types, void* stream) {
  const Engine& e = *engine_;
  auto check = [](const std::vector<IOTensor>& want, const std::vector<TensorType>& got, const char* what) {
    KILN_CHECK(want.size() == got.size(), kInvalidArgument, "engine has ", want.size(), " ", what, "s, got ",
               got.size());
    for (size_t i = 0; i < want.size(); ++i) {
      KILN_CHECK(want[i].type.dtype == got[i].dtype, kInvalidArgument, what, " '", want[i].name, "' must be ",
                 dtype_name(want[i].type.dtype), ", got ", dtype_name(got[i].dtype));
      KILN_CHECK(want[i].type.shape() == got[i].shape(), kShapeMismatch, what, " '", want[i].name, "' has shape ",
                 got[i].to_string(), ", the engine was built for ", want[i].type.to_string());
    }
  };
  check(e.inputs_, input_types, "input");
  check(e.outputs_, output_types, "output");
  execute(inputs, outputs, stream);
}

}  // namespace kiln
