// The ATen import driver: the table of importers (one entry per overload, gathered from the
// per-family files src/import/aten_*.cpp), ImportTrial, can_import and import_aten.
//
// ImportTrial converts a graph node by node as import_aten would, into a trial graph whose inputs
// stand for the tensors no accepted node produced (graph inputs, weights, outputs of refused
// nodes). A node it accepts has passed the same checks, shape rules and metadata checks as in the
// real import, and a refusal's reason is the real one (an unsupported argument, a dtype a Kiln op
// does not take, ...). can_import asks a fresh trial about one node alone. Neither throws.
//
// import_aten builds the graph in FX order and verifies every produced value against the FX
// metadata (dtype and shape): a mismatch is an importer bug and throws kInternal naming the
// node and the target; a node Kiln cannot take throws kUnsupported naming it.
//
// Covering another overload: write its check (optional) and convert functions in the family
// file (src/import/aten_<family>.cpp), add one line to that file's table, and add a case to
// tests/cpp/test_import.cpp.
#include <map>
#include <set>
#include <string_view>

#include "kiln/import.h"
#include "src/import/import_context.h"

namespace kiln {

namespace {

using aten::ImportContext;
using aten::ImportEntry;
using aten::NodeArgs;

const std::map<std::string, ImportEntry, std::less<>>& registry() {
  static const std::map<std::string, ImportEntry, std::less<>> table = [] {
    std::map<std::string, ImportEntry, std::less<>> t;
    for (auto family : {&aten::pointwise_importers, &aten::binary_importers, &aten::linalg_importers,
                        &aten::conv_importers, &aten::norm_importers, &aten::reduce_importers,
                        &aten::shape_importers, &aten::slice_importers, &aten::index_importers,
                        &aten::attention_importers, &aten::misc_importers}) {
      for (const ImportEntry& e : family()) {
        KILN_CHECK(t.emplace(e.target, e).second, kInternal, "two importers for ", e.target);
      }
    }
    return t;
  }();
  return table;
}

const ImportEntry* find_entry(std::string_view target) {
  auto it = registry().find(target);
  return it == registry().end() ? nullptr : &it->second;
}

std::string node_label(const ImportNode& node) { return "node '" + node.name + "' (" + node.target + ")"; }

// An importer's refusal reads as its bare reason; other errors keep their kind ("[shape mismatch] ...").
std::string reason_of(const Error& e) {
  std::string msg = e.what();
  const std::string prefix = std::string("[") + error_code_name(ErrorCode::kUnsupported) + "] ";
  if (e.code() == ErrorCode::kUnsupported && msg.rfind(prefix, 0) == 0) msg.erase(0, prefix.size());
  return msg;
}

// Converts one node and checks what it produced against the FX metadata; returns one value per
// FX output (kNoValue where unused).
std::vector<ValueId> convert_node(const ImportEntry& entry, Graph& g, const NodeArgs& args,
                                  const std::vector<ValueId>& values) {
  ImportContext cx(g, args, values);
  std::vector<ValueId> outs = entry.convert(cx);
  const ImportNode& node = args.node();
  KILN_CHECK(outs.size() <= node.outputs.size(), kInternal, "importer for ", node.target, " returned ", outs.size(),
             " values for ", node.outputs.size(), " outputs of ", node_label(node));
  outs.resize(node.outputs.size(), kNoValue);
  for (size_t i = 0; i < outs.size(); ++i) {
    if (node.outputs[i] < 0) continue;
    const ImportTensor& meta = args.tensor(node.outputs[i]);
    KILN_CHECK(outs[i] != kNoValue, kInternal, "importer for ", node.target, " produced no value for output ", i,
               " of ", node_label(node));
    const TensorType& got = g.type(outs[i]);
    KILN_CHECK(got.dtype == meta.dtype && got.shape() == meta.shape, kInternal, "importer for ", node.target,
               " produced ", got.to_string(), " for output ", i, " of ", node_label(node), ", FX says ",
               dtype_name(meta.dtype), aten::shape_str(meta.shape));
  }
  return outs;
}

void collect_tensor_ids(const ImportArg& a, std::set<int32_t>& ids) {
  if (a.kind == ImportArg::Kind::kTensor) ids.insert(a.tensor);
  for (const ImportArg& e : a.list) collect_tensor_ids(e, ids);
}

}  // namespace

ImportSupport can_import(const ImportNode& node, const ImportGraph& graph) { return ImportTrial().add(node, graph); }

ImportSupport ImportTrial::add(const ImportNode& node, const ImportGraph& graph, const Accept& accept) {
  const size_t first = graph_.nodes().size();
  auto refuse = [&](std::string reason) {  // the node's ops leave the trial graph
    while (graph_.nodes().size() > first) graph_.erase_node(graph_.nodes().size() - 1);
    return ImportSupport{false, std::move(reason)};
  };
  try {
    const ImportEntry* entry = find_entry(node.target);
    if (!entry) return {false, "no importer for " + node.target};
    NodeArgs args(node, graph);
    for (int32_t id : node.outputs) {
      if (id >= 0) args.tensor(id);
    }
    if (entry->check) entry->check(args);
    values_.resize(graph.tensors.size(), kNoValue);
    std::set<int32_t> ids;
    for (const ImportArg& a : node.args) collect_tensor_ids(a, ids);
    for (const auto& kv : node.kwargs) collect_tensor_ids(kv.second, ids);
    for (int32_t id : ids) {  // a graph input, a weight, or the output of a refused node
      args.tensor(id);
      if (values_[size_t(id)] != kNoValue) continue;
      std::string name = "t";
      name += std::to_string(id);
      values_[size_t(id)] = graph_.add_input(name, aten::tensor_type(args.tensor(id)));
    }
    const std::vector<ValueId> outs = convert_node(*entry, graph_, args, values_);
    if (accept) {
      if (std::string why = accept(graph_, first); !why.empty()) return refuse(std::move(why));
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      if (node.outputs[i] >= 0) values_[size_t(node.outputs[i])] = outs[i];
    }
    return {true, ""};
  } catch (const Error& e) {
    return refuse(reason_of(e));
  } catch (const std::exception& e) {
    return refuse(std::string("[internal] ") + e.what());
  } catch (...) {
    return refuse("[internal] unknown error");
  }
}

Graph import_aten(const ImportGraph& graph) {
  Graph g;
  const size_t n = graph.tensors.size();
  std::vector<ValueId> values(n, kNoValue);
  auto define = [&](int32_t id, ValueId v, const std::string& what) {
    KILN_CHECK(id >= 0 && size_t(id) < n, kInvalidArgument, what, ": tensor id ", id, " out of range (", n,
               " tensors)");
    KILN_CHECK(values[size_t(id)] == kNoValue, kInvalidArgument, what, ": tensor ", id, " is defined twice");
    values[size_t(id)] = v;
  };
  auto checked_type = [&](int32_t id, const std::string& what) {
    KILN_CHECK(id >= 0 && size_t(id) < n, kInvalidArgument, what, ": tensor id ", id, " out of range (", n,
               " tensors)");
    return aten::tensor_type(graph.tensors[size_t(id)]);
  };

  for (const auto& [id, name] : graph.inputs) {
    const std::string what = "input '" + name + "'";
    define(id, g.add_input(name, checked_type(id, what)), what);
  }
  std::set<std::string> weight_names;
  for (const ImportConstant& c : graph.constants) {
    const std::string what = "constant '" + c.name + "'";
    TensorType t = checked_type(c.tensor, what);
    KILN_CHECK(c.data != nullptr, kInvalidArgument, what, " has no data");
    KILN_CHECK(c.data->size() == t.nbytes(), kInvalidArgument, what, " of type ", t.to_string(), " needs ",
               t.nbytes(), " bytes, got ", c.data->size());
    KILN_CHECK(!c.weight || weight_names.insert(c.name).second, kInvalidArgument, "duplicate weight name '", c.name,
               "'");
    define(c.tensor, g.add_constant(c.name, t, c.data, c.weight), what);
  }

  for (const ImportNode& node : graph.nodes) {
    const ImportEntry* entry = find_entry(node.target);
    KILN_CHECK(entry != nullptr, kUnsupported, node_label(node), ": no importer for ", node.target);
    NodeArgs args(node, graph);
    std::vector<ValueId> outs;
    try {
      for (int32_t id : node.outputs) {
        if (id >= 0) args.tensor(id);
      }
      if (entry->check) entry->check(args);
      outs = convert_node(*entry, g, args, values);
    } catch (const Error& e) {
      // Importer bugs stay internal; anything else means Kiln cannot take the node.
      if (e.code() == ErrorCode::kInternal) throw;
      KILN_FAIL(kUnsupported, node_label(node), ": ", reason_of(e));
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      if (node.outputs[i] < 0) continue;
      define(node.outputs[i], outs[i], node_label(node));
      if (graph.tensors[size_t(node.outputs[i])].sized) g.value(outs[i]).sized = true;
    }
  }

  KILN_CHECK(!graph.outputs.empty(), kInvalidArgument, "the graph has no outputs");
  for (const auto& [id, name] : graph.outputs) {
    KILN_CHECK(id >= 0 && size_t(id) < n && values[size_t(id)] != kNoValue, kInvalidArgument, "output '", name,
               "': tensor ", id, " is not defined by an input, a constant or a node");
    g.mark_output(values[size_t(id)], name);
  }
  return g;
}

std::vector<std::string> supported_aten_targets() {
  std::vector<std::string> out;
  for (const auto& kv : registry()) out.push_back(kv.first);
  return out;
}

}  // namespace kiln
