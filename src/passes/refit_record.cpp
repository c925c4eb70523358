// RefitRecorder (see refit_record.h for why constants are tracked by their bytes).
#include <unordered_set>

#include "kiln/errors.h"
#include "src/passes/refit_record.h"

namespace kiln::passes {

namespace {
thread_local RefitRecorder* g_active = nullptr;
}  // namespace

RefitRecorder::Scope::Scope(RefitRecorder* recorder) : previous_(g_active) { g_active = recorder; }
RefitRecorder::Scope::~Scope() { g_active = previous_; }
RefitRecorder* RefitRecorder::active() { return g_active; }

ValueId RefitRecorder::value_of(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  auto it = of_bytes_.find(val.data.get());
  if (it != of_bytes_.end()) return it->second;
  ValueId id = kNoValue;
  if (val.is_weight) {
    auto w = weight_.find(val.name);
    if (w != weight_.end()) {
      KILN_CHECK(record_.type(w->second) == val.type, kInternal, "two weights named '", val.name,
                 "': ", record_.type(w->second).to_string(), " and ", val.type.to_string());
      id = w->second;
    } else {
      id = record_.add_input(val.name, val.type);
      weight_.emplace(val.name, id);
    }
  } else {
    id = record_.add_constant("", val.type, val.data);
  }
  data_.resize(size_t(record_.num_values()));
  if (!data_[size_t(id)]) data_[size_t(id)] = val.data;
  of_bytes_[val.data.get()] = id;
  return id;
}

void RefitRecorder::record_fold(const Graph& g, const Node& n,
                                const std::vector<std::shared_ptr<HostBuffer>>& results) {
  std::vector<ValueId> ins;
  for (ValueId in : n.inputs) ins.push_back(in == kNoValue ? kNoValue : value_of(g, in));
  const std::vector<ValueId> outs = n.body ? record_.insert_fused(record_.nodes().size(), ins, n.body, n.name)
                                           : record_.add_node(n.op, ins, n.attrs, n.name);
  KILN_CHECK(outs.size() == results.size(), kInternal, "recording ", op_name(n.op), ": ", outs.size(), " outputs, ",
             results.size(), " results");
  data_.resize(size_t(record_.num_values()));
  for (size_t k = 0; k < outs.size(); ++k) {
    data_[size_t(outs[k])] = results[k];
    of_bytes_[results[k].get()] = outs[k];
  }
}

Graph RefitRecorder::finish(Graph& plan) const {
  const size_t n = size_t(record_.num_values());
  std::vector<char> dep(n, 0), needed(n, 0);
  for (ValueId in : record_.inputs()) dep[size_t(in)] = 1;
  for (const auto& node : record_.nodes()) {
    bool d = false;
    for (ValueId in : node->inputs) d = d || (in != kNoValue && dep[size_t(in)]);
    for (ValueId out : node->outputs) dep[size_t(out)] = d;
  }

  // The plan constants derived from weights (top level, and scalars copied into fused bodies),
  // with the record value that computes each.
  std::vector<std::pair<ValueId, Value*>> targets;  // (record value, plan or body value)
  std::unordered_map<std::string, int> uses;        // names taken in the plan and its bodies
  auto scan = [&](Graph& graph) {
    for (ValueId v = 0; v < graph.num_values(); ++v)
      if (!graph.value(v).name.empty()) ++uses[graph.value(v).name];
    for (ValueId c : graph.constants()) {
      Value& v = graph.value(c);
      if (v.is_weight || graph.num_uses(c) == 0) continue;  // weights are refitted as they are
      auto it = of_bytes_.find(v.data.get());
      if (it == of_bytes_.end() || !dep[size_t(it->second)]) continue;
      targets.emplace_back(it->second, &v);
      needed[size_t(it->second)] = 1;
    }
  };
  scan(plan);
  for (const auto& node : plan.nodes())
    if (node->body) scan(*node->body);
  for (size_t i = record_.nodes().size(); i-- > 0;) {
    const Node& node = *record_.nodes()[i];
    bool any = false;
    for (ValueId out : node.outputs) any = any || needed[size_t(out)];
    if (!any) continue;
    for (ValueId in : node.inputs)
      if (in != kNoValue && dep[size_t(in)]) needed[size_t(in)] = 1;
  }

  Graph program;
  std::vector<ValueId> map(n, kNoValue);
  for (ValueId in : record_.inputs())
    if (needed[size_t(in)]) map[size_t(in)] = program.add_input(record_.value(in).name, record_.type(in));
  auto get = [&](ValueId v) {
    if (v == kNoValue) return kNoValue;
    if (map[size_t(v)] == kNoValue) {
      KILN_CHECK(!dep[size_t(v)] && data_[size_t(v)], kInternal, "refit program: value %", v, " has no source");
      map[size_t(v)] = program.add_constant("", record_.type(v), data_[size_t(v)]);  // a literal
    }
    return map[size_t(v)];
  };
  for (const auto& node : record_.nodes()) {
    bool any = false;
    for (ValueId out : node->outputs) any = any || needed[size_t(out)];
    if (!any) continue;
    std::vector<ValueId> ins;
    for (ValueId in : node->inputs) ins.push_back(get(in));
    const std::vector<ValueId> outs = node->body
                                          ? program.insert_fused(program.nodes().size(), ins, node->body, node->name)
                                          : program.add_node(node->op, ins, node->attrs, node->name);
    for (size_t k = 0; k < outs.size(); ++k) map[size_t(node->outputs[k])] = outs[k];
  }

  // Output names: the plan constant's own name when it is unique, else a new one.
  for (ValueId in : program.inputs()) ++uses[program.value(in).name];
  int next = 0;
  for (const auto& [rv, pv] : targets) {
    std::string& name = pv->name;
    if (name.empty() || uses[name] > 1) {
      if (!name.empty()) --uses[name];
      do name = "refit." + std::to_string(next++);
      while (uses.count(name) && uses[name] > 0);
      ++uses[name];
    }
    program.mark_output(get(rv), name);
  }
  if (!program.outputs().empty()) program.verify();  // empty: nothing is derived from weights
  return program;
}

}  // namespace kiln::passes
