// Graph construction, rewriting and verification.
#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_map>

#include "kiln/errors.h"
#include "kiln/ir.h"
#include "src/ops/shape_rules.h"

namespace kiln {

namespace {

// Body input i of a fused node has the type its node input is read in: the input's own, or the
// sizes of the node's view of it. kInternal naming the input otherwise.
void check_fused_inputs(const Graph& body, const std::vector<const TensorType*>& inputs, const Attrs& attrs) {
  KILN_CHECK(body.inputs().size() == inputs.size(), kInternal, "fused body has ", body.inputs().size(),
             " inputs, node has ", inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorType& read = input_view(OpKind::kFusedPointwise, attrs, i, *inputs[i]).logical;
    KILN_CHECK(body.type(body.inputs()[i]) == read, kInternal, "fused body input ", i, " is ",
               body.type(body.inputs()[i]).to_string(), ", the node reads ", read.to_string());
  }
}

}  // namespace

Graph::Graph(const Graph& other) { *this = other; }

Graph& Graph::operator=(const Graph& other) {
  if (this == &other) return *this;
  values_ = other.values_;
  inputs_ = other.inputs_;
  outputs_ = other.outputs_;
  nodes_.clear();
  nodes_.reserve(other.nodes_.size());
  for (const auto& n : other.nodes_) {
    auto copy = std::make_unique<Node>(*n);
    if (n->body) copy->body = std::make_shared<Graph>(*n->body);
    for (ValueId out : copy->outputs) values_[out].producer = copy.get();
    nodes_.push_back(std::move(copy));
  }
  return *this;
}

ValueId Graph::new_value(const TensorType& t) {
  for (const Dim& d : t.dims)
    KILN_CHECK(d.extent >= 0, kShapeMismatch, "negative extent in ", t.to_string());
  Value v;
  v.type = t;
  values_.push_back(std::move(v));
  return static_cast<ValueId>(values_.size() - 1);
}

ValueId Graph::add_input(const std::string& name, const TensorType& type) {
  KILN_CHECK(!name.empty(), kInvalidArgument, "a graph input needs a name");
  for (ValueId in : inputs_)
    KILN_CHECK(values_[in].name != name, kInvalidArgument, "duplicate graph input name '", name, "'");
  ValueId id = new_value(type);
  values_[id].name = name;
  values_[id].is_input = true;
  inputs_.push_back(id);
  return id;
}

ValueId Graph::add_constant(const std::string& name, const TensorType& type, const void* data, size_t nbytes,
                            bool weight) {
  KILN_CHECK(nbytes == type.nbytes(), kInvalidArgument, "constant '", name, "' of type ", type.to_string(),
             " needs ", type.nbytes(), " bytes, got ", nbytes);
  auto bytes = std::make_shared<HostBuffer>(nbytes);
  if (nbytes) std::memcpy(bytes->data(), data, nbytes);
  return add_constant(name, type, std::move(bytes), weight);
}

ValueId Graph::add_constant(const std::string& name, const TensorType& type, std::shared_ptr<const HostBuffer> data,
                            bool weight) {
  KILN_CHECK(data != nullptr, kInvalidArgument, "constant '", name, "' has no data");
  KILN_CHECK(data->size() == type.nbytes(), kInvalidArgument, "constant '", name, "' of type ",
             type.to_string(), " needs ", type.nbytes(), " bytes, got ", data->size());
  KILN_CHECK(!weight || !name.empty(), kInvalidArgument, "a weight needs a name");
  ValueId id = new_value(type);
  values_[id].name = name;
  values_[id].data = std::move(data);
  values_[id].is_weight = weight;
  return id;
}

std::vector<ValueId> Graph::insert_node(size_t pos, OpKind op, const std::vector<ValueId>& inputs,
                                        const Attrs& attrs, const std::string& name) {
  KILN_CHECK(pos <= nodes_.size(), kInternal, "insert position ", pos, " past the end");
  KILN_CHECK(op != OpKind::kFusedPointwise, kInvalidArgument, "fused_pointwise nodes come from insert_fused");
  std::vector<const TensorType*> in_types;
  in_types.reserve(inputs.size());
  for (ValueId v : inputs) {
    if (v == kNoValue) {
      in_types.push_back(nullptr);
      continue;
    }
    KILN_CHECK(v >= 0 && v < num_values(), kInvalidArgument, op_name(op), ": input id ", v, " out of range");
    in_types.push_back(&values_[v].type);
  }
  std::vector<TensorType> out_types;
  try {
    out_types = infer_types(op, in_types, attrs);
  } catch (const Error& e) {
    if (name.empty()) throw;
    throw Error(e.code(), std::string(e.what()) + " (node '" + name + "')");
  }
  auto node = std::make_unique<Node>();
  node->op = op;
  node->inputs = inputs;
  node->attrs = attrs;
  node->name = name;
  for (size_t i = 0; i < out_types.size(); ++i) {
    ValueId id = new_value(out_types[i]);
    values_[id].producer = node.get();
    values_[id].output_index = static_cast<int>(i);
    node->outputs.push_back(id);
  }
  std::vector<ValueId> outs = node->outputs;
  nodes_.insert(nodes_.begin() + static_cast<std::ptrdiff_t>(pos), std::move(node));
  return outs;
}

std::vector<ValueId> Graph::insert_fused(size_t pos, const std::vector<ValueId>& inputs, std::shared_ptr<Graph> body,
                                         const std::string& name, const Attrs& attrs) {
  KILN_CHECK(body != nullptr, kInternal, "fused node without a body");
  std::vector<const TensorType*> in_types;
  for (ValueId v : inputs) in_types.push_back(&type(v));
  check_fused_inputs(*body, in_types, attrs);
  auto node = std::make_unique<Node>();
  node->op = OpKind::kFusedPointwise;
  node->inputs = inputs;
  node->attrs = attrs;
  node->name = name;
  for (size_t i = 0; i < body->outputs().size(); ++i) {
    ValueId id = new_value(body->type(body->outputs()[i]));
    values_[id].producer = node.get();
    values_[id].output_index = static_cast<int>(i);
    node->outputs.push_back(id);
  }
  node->body = std::move(body);
  std::vector<ValueId> outs = node->outputs;
  nodes_.insert(nodes_.begin() + static_cast<std::ptrdiff_t>(pos), std::move(node));
  return outs;
}

std::vector<ValueId> Graph::add_node(OpKind op, const std::vector<ValueId>& inputs, const Attrs& attrs,
                                     const std::string& name) {
  return insert_node(nodes_.size(), op, inputs, attrs, name);
}

ValueId Graph::add_node1(OpKind op, const std::vector<ValueId>& inputs, const Attrs& attrs, const std::string& name) {
  auto outs = add_node(op, inputs, attrs, name);
  KILN_CHECK(outs.size() == 1, kInvalidArgument, op_name(op), " has ", outs.size(), " outputs, not 1");
  return outs[0];
}

void Graph::mark_output(ValueId v, const std::string& name) {
  KILN_CHECK(v >= 0 && v < num_values(), kInvalidArgument, "output id ", v, " out of range");
  KILN_CHECK(!name.empty(), kInvalidArgument, "a graph output needs a name");
  for (ValueId o : outputs_)
    KILN_CHECK(values_[o].name != name, kInvalidArgument, "duplicate graph output name '", name, "'");
  if (!values_[v].name.empty() && values_[v].name != name) {
    // The value already carries another name (an input, a weight or another output): give the
    // output its own value so every output has exactly its name.
    v = add_node1(OpKind::kCopy, {v});
  }
  values_[v].name = name;
  outputs_.push_back(v);
}

const Value& Graph::value(ValueId v) const {
  KILN_CHECK(v >= 0 && v < num_values(), kInternal, "value id ", v, " out of range");
  return values_[static_cast<size_t>(v)];
}
Value& Graph::value(ValueId v) {
  KILN_CHECK(v >= 0 && v < num_values(), kInternal, "value id ", v, " out of range");
  return values_[static_cast<size_t>(v)];
}

std::vector<ValueId> Graph::constants() const {
  std::vector<ValueId> out;
  for (ValueId v = 0; v < num_values(); ++v)
    if (values_[v].is_constant()) out.push_back(v);
  return out;
}

std::vector<std::vector<int>> Graph::users() const {
  std::vector<std::vector<int>> u(values_.size());
  for (size_t i = 0; i < nodes_.size(); ++i)
    for (ValueId in : nodes_[i]->inputs)
      if (in != kNoValue && (u[in].empty() || u[in].back() != int(i))) u[in].push_back(int(i));
  return u;
}

int Graph::num_uses(ValueId v) const {
  int n = 0;
  for (const auto& node : nodes_)
    for (ValueId in : node->inputs) n += (in == v);
  for (ValueId o : outputs_) n += (o == v);
  return n;
}

void Graph::erase_node(size_t pos) {
  KILN_CHECK(pos < nodes_.size(), kInternal, "erase position ", pos, " out of range");
  for (ValueId out : nodes_[pos]->outputs) values_[out].producer = nullptr;
  nodes_.erase(nodes_.begin() + static_cast<std::ptrdiff_t>(pos));
}

void Graph::replace_all_uses(ValueId from, ValueId to) {
  if (values_[size_t(from)].sized) value(to).sized = true;  // the same type: its size is the symbols' too
  for (auto& n : nodes_)
    for (ValueId& in : n->inputs)
      if (in == from) in = to;
  for (size_t i = 0; i < outputs_.size(); ++i)
    if (outputs_[i] == from) set_output(i, to);
}

void Graph::set_output(size_t i, ValueId v) {
  KILN_CHECK(i < outputs_.size(), kInternal, "output index ", i, " out of range");
  std::string name = values_[outputs_[i]].name;
  Value& nv = value(v);
  if (nv.is_input || nv.is_constant() || (!nv.name.empty() && nv.name != name)) {
    // Keep the output a distinct, named value.
    ValueId c = add_node1(OpKind::kCopy, {v});
    values_[c].name = name;
    outputs_[i] = c;
    return;
  }
  values_[outputs_[i]].name.clear();
  nv.name = name;
  outputs_[i] = v;
}

void Graph::compact() {
  std::vector<char> keep(values_.size(), 0);
  for (ValueId in : inputs_) keep[in] = 1;
  for (ValueId o : outputs_) keep[o] = 1;
  for (const auto& n : nodes_) {
    for (ValueId in : n->inputs)
      if (in != kNoValue) keep[in] = 1;
    for (ValueId out : n->outputs) keep[out] = 1;
  }
  std::vector<ValueId> remap(values_.size(), kNoValue);
  std::vector<Value> kept;
  for (size_t v = 0; v < values_.size(); ++v) {
    if (!keep[v]) continue;
    remap[v] = static_cast<ValueId>(kept.size());
    kept.push_back(std::move(values_[v]));
  }
  values_ = std::move(kept);
  for (ValueId& in : inputs_) in = remap[in];
  for (ValueId& o : outputs_) o = remap[o];
  for (auto& n : nodes_) {
    for (ValueId& in : n->inputs)
      if (in != kNoValue) in = remap[in];
    for (ValueId& out : n->outputs) out = remap[out];
  }
}

void Graph::verify() const {
  std::vector<char> defined(values_.size(), 0);
  std::set<std::string> names;
  for (ValueId in : inputs_) {
    KILN_CHECK(in >= 0 && in < num_values(), kInternal, "verify: input id ", in, " out of range");
    KILN_CHECK(values_[in].is_input, kInternal, "verify: input %", in, " not marked as input");
    defined[in] = 1;
  }
  for (ValueId v = 0; v < num_values(); ++v) {
    const Value& val = values_[v];
    if (val.is_constant()) {
      KILN_CHECK(val.data->size() == val.type.nbytes(), kInternal, "verify: constant %", v, " has ",
                 val.data->size(), " bytes for ", val.type.to_string());
      defined[v] = 1;
    }
    if (val.is_weight) KILN_CHECK(names.insert("w:" + val.name).second, kInternal, "verify: duplicate weight '", val.name, "'");
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = *nodes_[i];
    const OpInfo& info = op_info(n.op);
    for (ValueId in : n.inputs) {
      if (in == kNoValue) continue;
      KILN_CHECK(in >= 0 && in < num_values(), kInternal, "verify: node ", i, " (", info.name, ") input id ", in,
                 " out of range");
      KILN_CHECK(defined[in], kInternal, "verify: node ", i, " (", info.name, ") uses %", in,
                 " before it is defined");
    }
    std::vector<TensorType> expect;
    if (n.op == OpKind::kFusedPointwise) {
      KILN_CHECK(n.body != nullptr, kInternal, "verify: fused node ", i, " has no body");
      n.body->verify();
      std::vector<const TensorType*> in_types;
      for (ValueId in : n.inputs) {
        KILN_CHECK(in != kNoValue, kInternal, "verify: fused node ", i, " has an absent input");
        in_types.push_back(&values_[in].type);
      }
      check_fused_inputs(*n.body, in_types, n.attrs);
      for (ValueId o : n.body->outputs()) expect.push_back(n.body->type(o));
    } else {
      std::vector<const TensorType*> in_types;
      for (ValueId in : n.inputs) in_types.push_back(in == kNoValue ? nullptr : &values_[in].type);
      expect = infer_types(n.op, in_types, n.attrs);
    }
    KILN_CHECK(expect.size() == n.outputs.size(), kInternal, "verify: node ", i, " (", info.name, ") has ",
               n.outputs.size(), " outputs, its rule gives ", expect.size());
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      ValueId out = n.outputs[k];
      KILN_CHECK(out >= 0 && out < num_values(), kInternal, "verify: node ", i, " output id out of range");
      KILN_CHECK(!defined[out], kInternal, "verify: %", out, " defined twice");
      KILN_CHECK(values_[out].producer == &n, kInternal, "verify: %", out, " does not point at its producer");
      KILN_CHECK(values_[out].type.dtype == expect[k].dtype && values_[out].type.shape() == expect[k].shape(),
                 kInternal, "verify: node ", i, " (", info.name, ") output ", k, " is ",
                 values_[out].type.to_string(), ", its rule gives ", expect[k].to_string());
      defined[out] = 1;
    }
  }
  KILN_CHECK(!outputs_.empty(), kInternal, "verify: graph has no outputs");
  for (ValueId o : outputs_) {
    KILN_CHECK(o >= 0 && o < num_values() && defined[o], kInternal, "verify: output %", o, " is not defined");
    KILN_CHECK(names.insert("o:" + values_[o].name).second, kInternal, "verify: duplicate output name '",
               values_[o].name, "'");
  }
}

}  // namespace kiln
