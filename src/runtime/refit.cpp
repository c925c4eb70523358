// Refitter: new weights by name -> the refit program re-derives what the builder folded (on
// the constant evaluator fold_constants used: src/passes/constant_eval.h) -> the engine's
// constants are overwritten in place through Engine's refit calls (see include/kiln/refit.h).
#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_map>

#include "kiln/errors.h"
#include "kiln/refit.h"
#include "src/common/stopwatch.h"
#include "src/passes/constant_eval.h"

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
  const Graph& program = *engine_->refit_program();
  for (ValueId in : program.inputs()) names.push_back(program.value(in).name);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

TensorType Refitter::weight_type(const std::string& name) const {
  if (const Value* w = plan_weight(engine_->graph(), name)) return w->type;
  const Graph& program = *engine_->refit_program();
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
  KILN_CHECK(type.dtype == want.dtype, kInvalidArgument, "weight '", name, "' must be ", dtype_name(want.dtype), " (",
             want.to_string(), "), got ", dtype_name(type.dtype));
  KILN_CHECK(type.shape() == want.shape(), kInvalidArgument, "weight '", name, "' must have shape ", want.to_string(),
             ", got ", type.to_string());
  KILN_CHECK(host_data != nullptr || want.nbytes() == 0, kInvalidArgument, "weight '", name, "' has no data");
}

void Refitter::set_weight(const std::string& name, const TensorType& type, const void* host_data) {
  check_weight(name, type, host_data);
  auto bytes = std::make_shared<HostBuffer>(type.nbytes());
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
  const Graph& program = *engine_->refit_program();
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
    if (!pending_.count(n) && !plan_weight(engine_->graph(), n)) missing.push_back(n);
  return missing;
}

void Refitter::refit() {
  const std::vector<std::string> missing = missing_weights();
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size(); ++i) list += (i ? ", '" : "'") + missing[i] + "'";
    KILN_FAIL(kInvalidArgument, "refit needs weight(s) ", list,
              " as well: the engine derives constants from them "
              "together with the weights given, and keeps no copy of them");
  }
  Stopwatch watch;  // each part's time, for report()
  Engine& e = *engine_;
  const Graph& plan = e.graph();
  const Graph& program = *e.refit_program();

  // Which program values change: those that depend on a weight given.
  std::vector<char> changed(size_t(program.num_values()), 0);
  for (ValueId in : program.inputs()) changed[size_t(in)] = pending_.count(program.value(in).name) != 0;
  for (const auto& node : program.nodes()) {
    bool c = false;
    for (ValueId in : node->inputs) c = c || (in != kNoValue && changed[size_t(in)]);
    for (ValueId out : node->outputs) changed[size_t(out)] = c;
  }
  const size_t num_outputs = program.outputs().size();
  std::vector<char> wanted(num_outputs, 0);
  for (size_t i = 0; i < num_outputs; ++i) wanted[i] = changed[size_t(program.outputs()[i])];

  // The program's inputs: the weights given (views read in place), else the plan weights' current
  // bytes. Its outputs may be computed straight into the engine's constants.
  std::unordered_map<std::string, const Value*> weights;
  for (ValueId c : plan.constants())
    if (plan.value(c).is_weight) weights.emplace(plan.value(c).name, &plan.value(c));
  std::vector<passes::ProgramInput> inputs(program.inputs().size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string& name = program.value(program.inputs()[i]).name;
    auto p = pending_.find(name);
    if (p != pending_.end()) {
      inputs[i].owned = p->second.owned;
      inputs[i].view = p->second.bytes();
    } else if (auto w = weights.find(name); w != weights.end()) {
      inputs[i].owned = w->second->data;
    }
  }
  std::vector<uint8_t*> in_place(num_outputs, nullptr);
  for (size_t i = 0; i < num_outputs; ++i) {
    const Value& target = e.refit_target(i);
    if (target.data && target.data->size() == program.type(program.outputs()[i]).nbytes())
      in_place[i] = e.writable_bytes(target);
  }
  const passes::ProgramOutputs values = passes::evaluate_program(program, inputs, wanted, in_place);

  const double program_ms = watch.lap();
  // Write in place: the engine's own host bytes (and then, by publish_constants, the device copy
  // where there is one).
  for (ValueId c : plan.constants())
    if (plan.value(c).is_weight) {
      auto p = pending_.find(plan.value(c).name);
      if (p != pending_.end()) e.write_constant(plan.value(c), p->second.bytes(), p->second.size);
    }
  size_t outputs_changed = 0;
  for (size_t i = 0; i < num_outputs; ++i) {
    if (!wanted[i]) continue;
    e.write_constant(e.refit_target(i), values.bytes[i], program.type(program.outputs()[i]).nbytes());
    ++outputs_changed;
  }
  const double write_ms = watch.lap();
  const bool on_host = e.device().type == DeviceType::kCPU;
  const Engine::Published published = e.publish_constants();
  auto fmt = [](double ms) { return detail::concat(tenths(ms), " ms"); };
  report_ = detail::concat("refit: ", pending_.size(), " weights, program ", fmt(program_ms), " (", outputs_changed,
                           " outputs), host writes ", fmt(write_ms), on_host ? "" : ", device copies ",
                           on_host ? "" : fmt(published.device_ms), ", ", published.kernels_remade,
                           " kernels remade in ", fmt(published.kernels_ms));
  pending_.clear();
}

}  // namespace kiln
