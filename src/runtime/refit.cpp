// Refitter: new weights by name -> the refit program re-derives what the builder folded ->
// the engine's constants are overwritten in place (see include/kiln/refit.h).
#include "kiln/refit.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_set>

#include "kiln/errors.h"
#include "src/passes/refit_record.h"

namespace kiln {

namespace {

const Value* plan_weight(const Graph& plan, const std::string& name) {
  for (ValueId c : plan.constants())
    if (plan.value(c).is_weight && plan.value(c).name == name) return &plan.value(c);
  return nullptr;
}

ValueId program_input(const Graph& program, const std::string& name) {
  for (ValueId in : program.inputs())
    if (program.value(in).name == name) return in;
  return kNoValue;
}

// The program inputs each program value depends on (by name), for the values `wanted`.
std::set<std::string> inputs_feeding(const Graph& program, const std::vector<ValueId>& wanted) {
  std::set<std::string> names;
  std::vector<char> seen(size_t(program.num_values()), 0);
  std::vector<ValueId> stack(wanted.begin(), wanted.end());
  while (!stack.empty()) {
    ValueId v = stack.back();
    stack.pop_back();
    if (v == kNoValue || seen[size_t(v)]) continue;
    seen[size_t(v)] = 1;
    const Value& val = program.value(v);
    if (val.is_input) names.insert(val.name);
    if (val.producer)
      for (ValueId in : val.producer->inputs) stack.push_back(in);
  }
  return names;
}

}  // namespace

Refitter::Refitter(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {
  KILN_CHECK(engine_ != nullptr, kInvalidArgument, "Refitter needs an engine");
  KILN_CHECK(engine_->refittable(), kUnsupported,
             "this engine cannot be refitted: it was built with immutable weights (BuilderConfig.refittable = "
             "false, Kiln setting immutable_weights=True) or loaded from an engine file without a refit program; "
             "build it refittable to change its weights");
}

std::vector<std::string> Refitter::weight_names() const {
  std::vector<std::string> names = engine_->weight_names();
  for (ValueId in : engine_->refit_program_->inputs()) names.push_back(engine_->refit_program_->value(in).name);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

TensorType Refitter::weight_type(const std::string& name) const {
  if (const Value* w = plan_weight(engine_->plan_, name)) return w->type;
  const Graph& program = *engine_->refit_program_;
  ValueId in = program_input(program, name);
  if (in != kNoValue) return program.type(in);
  const std::vector<std::string> names = weight_names();
  std::string some;
  for (size_t i = 0; i < names.size() && i < 5; ++i) some += (i ? ", '" : "'") + names[i] + "'";
  KILN_FAIL(kInvalidArgument, "the engine has no weight named '", name, "' (it has ", names.size(), " weights",
            names.empty() ? "" : ": ", some, names.size() > 5 ? ", ..." : "", ")");
}

void Refitter::check_weight(const std::string& name, const TensorType& type, const void* host_data) const {
  const TensorType want = weight_type(name);
  KILN_CHECK(type.dtype == want.dtype, kInvalidArgument, "weight '", name, "' must be ", dtype_name(want.dtype),
             " (", want.to_string(), "), got ", dtype_name(type.dtype));
  KILN_CHECK(type.shape() == want.shape(), kInvalidArgument, "weight '", name, "' must have shape ",
             want.to_string(), ", got ", type.to_string());
  KILN_CHECK(host_data != nullptr || want.nbytes() == 0, kInvalidArgument, "weight '", name, "' has no data");
}

void Refitter::set_weight(const std::string& name, const TensorType& type, const void* host_data) {
  check_weight(name, type, host_data);
  auto bytes = std::make_shared<Bytes>(type.nbytes());
  if (!bytes->empty()) std::memcpy(bytes->data(), host_data, bytes->size());
  Pending p;
  p.size = bytes->size();
  p.owned = std::move(bytes);
  pending_[name] = std::move(p);
}

void Refitter::set_weight_view(const std::string& name, const TensorType& type, const void* host_data) {
  check_weight(name, type, host_data);
  Pending p;
  p.view = host_data;
  p.size = type.nbytes();
  pending_[name] = std::move(p);
}

std::vector<std::string> Refitter::missing_weights() const {
  const Graph& program = *engine_->refit_program_;
  std::vector<ValueId> affected;
  for (ValueId out : program.outputs()) {
    std::set<std::string> feeding = inputs_feeding(program, {out});
    for (const std::string& n : feeding)
      if (pending_.count(n)) {
        affected.push_back(out);
        break;
      }
  }
  std::vector<std::string> missing;
  for (const std::string& n : inputs_feeding(program, affected))
    if (!pending_.count(n) && !plan_weight(engine_->plan_, n)) missing.push_back(n);
  return missing;
}

void Refitter::refit() {
  const std::vector<std::string> missing = missing_weights();
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size(); ++i) list += (i ? ", '" : "'") + missing[i] + "'";
    KILN_FAIL(kInvalidArgument, "refit needs weight(s) ", list, " as well: the engine derives constants from them "
              "together with the weights given, and keeps no copy of them");
  }
  Engine& e = *engine_;
  Graph& plan = e.plan_;
  const Graph& program = *e.refit_program_;

  // Which program outputs change, and the nodes that compute them.
  const size_t nv = size_t(program.num_values());
  std::vector<char> changed(nv, 0), needed(nv, 0);
  for (ValueId in : program.inputs()) changed[size_t(in)] = pending_.count(program.value(in).name) != 0;
  for (const auto& node : program.nodes()) {
    bool c = false;
    for (ValueId in : node->inputs) c = c || (in != kNoValue && changed[size_t(in)]);
    for (ValueId out : node->outputs) changed[size_t(out)] = c;
  }
  for (ValueId out : program.outputs()) needed[size_t(out)] = changed[size_t(out)];
  for (size_t i = program.nodes().size(); i-- > 0;) {
    const Node& node = *program.nodes()[i];
    bool any = false;
    for (ValueId out : node.outputs) any = any || needed[size_t(out)];
    if (any)
      for (ValueId in : node.inputs)
        if (in != kNoValue) needed[size_t(in)] = 1;
  }

  // Evaluate: each node alone in a graph whose inputs are constants, as fold_constants saw it.
  std::vector<std::shared_ptr<const Bytes>> value(nv);
  for (ValueId in : program.inputs()) {
    if (!needed[size_t(in)]) continue;
    auto p = pending_.find(program.value(in).name);
    if (p == pending_.end()) {
      value[size_t(in)] = plan_weight(plan, program.value(in).name)->data;
      continue;
    }
    Pending& w = p->second;
    if (!w.owned) w.owned = std::make_shared<Bytes>(w.bytes(), w.bytes() + w.size);  // the program reads it
    value[size_t(in)] = w.owned;
  }
  for (ValueId c : program.constants()) value[size_t(c)] = program.value(c).data;
  std::vector<std::shared_ptr<Bytes>> results;
  for (const auto& node : program.nodes()) {
    bool any = false;
    for (ValueId out : node->outputs) any = any || needed[size_t(out)];
    if (!any) continue;
    Graph one;
    std::vector<ValueId> ins;
    for (ValueId in : node->inputs)
      ins.push_back(in == kNoValue ? kNoValue : one.add_constant("", program.type(in), value[size_t(in)]));
    if (node->body) one.insert_fused(0, ins, node->body, node->name);
    else one.add_node(node->op, ins, node->attrs, node->name);
    KILN_CHECK(passes::evaluate_constant_node(one, *one.nodes().back(), results), kInternal, "refit: no CPU kernel for ",
               op_name(node->op));
    for (size_t k = 0; k < node->outputs.size(); ++k) value[size_t(node->outputs[k])] = std::move(results[k]);
  }

  // Write in place: the plan's (engine-owned) host bytes, and the device copy where there is one.
  Backend& be = *e.backend_;
  const bool on_host = e.device_.type == DeviceType::kCPU;
  std::unordered_set<const Bytes*> written;
  auto write = [&](const Value& target, const uint8_t* src, size_t size) {
    KILN_CHECK(target.data && target.data->size() == size, kInternal, "refit: constant '", target.name,
               "' holds ", target.data ? target.data->size() : 0, " bytes, its new value ", size);
    auto* dst = const_cast<Bytes*>(target.data.get());  // the engine's own copy (Engine::create)
    if (size) std::memcpy(dst->data(), src, size);
    written.insert(dst);
  };
  for (ValueId c : plan.constants())
    if (plan.value(c).is_weight) {
      auto p = pending_.find(plan.value(c).name);
      if (p != pending_.end()) write(plan.value(c), p->second.bytes(), p->second.size);
    }
  for (size_t i = 0; i < program.outputs().size(); ++i) {
    ValueId out = program.outputs()[i];
    if (changed[size_t(out)]) write(*e.refit_targets_[i], value[size_t(out)]->data(), value[size_t(out)]->size());
  }
  if (!on_host) {
    for (ValueId c : plan.constants())
      if (written.count(plan.value(c).data.get()) && e.constant_ptr_[size_t(c)])
        be.copy_from_host(const_cast<void*>(e.constant_ptr_[size_t(c)]), plan.value(c).data->data(),
                          plan.value(c).data->size(), nullptr);
    be.synchronize(nullptr);
  }

  // Kernels that may have read a written constant when they were made are made again.
  for (size_t i = 0; i < plan.nodes().size(); ++i) {
    const Node& n = *plan.nodes()[i];
    bool reads = false;
    for (ValueId in : n.inputs)
      reads = reads || (in != kNoValue && plan.value(in).is_constant() && written.count(plan.value(in).data.get()));
    if (n.body)
      for (ValueId c : n.body->constants()) reads = reads || written.count(n.body->value(c).data.get());
    if (!reads) continue;
    auto k = be.make_kernel(n, plan, e.options_, &e.kernel_states_[i]);
    KILN_CHECK(k != nullptr && k->workspace_size() <= e.workspace_, kInternal, "refit: the kernel of ",
               op_name(n.op), " made again needs more workspace than the engine has");
    e.kernels_[i] = std::move(k);
  }
  ++e.weights_version_;
  e.source_weights_id_.clear();
  pending_.clear();
}

}  // namespace kiln
