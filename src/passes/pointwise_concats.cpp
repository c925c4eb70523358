// fuse_pointwise_concats: a concat whose parts are computed by fused pointwise kernels that
// nothing else reads, or read through strided views, becomes one fused_pointwise node whose
// body ends in that concat. Its kernel computes each output element from the part its column
// falls in, reading only that part's inputs, so the parts are never written out and copied.
//
// GPT-NeoX's partial rotary embedding is the case: per layer, q and k are each the rotation of
// their first columns (a fused kernel) joined to the columns that pass, a strided view of the
// qkv projection. As a plain concat that is the rotation, a strided copy of the view and the
// concat's copy, three launches for each; fused, one. A concat of several strided views (Swin's
// merge of the four shifted patches) is likewise one launch instead of one copy per part.
//
// The body's parts keep their own inputs: a node input read by two parts is two inputs (each
// read in its part's columns). A concat whose parts are all read dense stays a concat, whose
// kernel copies whole rows in wide words, as does one that would take more inputs than a
// pointwise kernel reads (kMaxInputs). Static shapes. Run it after fold_input_views.
#include <unordered_map>

#include "kiln/passes.h"
#include "src/ops/shape_rules.h"
#include "src/passes/pass_util.h"

namespace kiln {

namespace {

constexpr size_t kMaxInputs = 16;  // non-scalar inputs a generated pointwise kernel reads

// Part i of concat c as a fused kernel of its own that nothing else reads, or null.
const Node* computed_part(const Graph& g, const Node& c, size_t i) {
  const Node* p = g.value(c.inputs[i]).producer;
  if (p == nullptr || p->op != OpKind::kFusedPointwise || p->outputs.size() != 1 || !p->body) return nullptr;
  if (c.attrs.has(input_view_key(i)) || !passes::read_once(g, c.inputs[i])) return nullptr;
  return p;
}

// The launches the concat's parts cost as they are: one per computed part and per part read
// through a strided view, plus the concat's own for the parts it copies whole.
size_t launches_now(const Graph& g, const Node& c) {
  size_t launches = 0;
  bool copies = false;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (computed_part(g, c, i) != nullptr) {
      ++launches;
      copies = true;
    } else if (input_view(c.op, c.attrs, i, g.type(c.inputs[i])).dense()) {
      copies = true;
    } else {
      ++launches;
    }
  }
  return launches + (copies ? 1 : 0);
}

bool fusable(const Graph& g, const Node& c) {
  if (c.op != OpKind::kConcat || c.outputs.size() != 1 || !passes::all_static(g.type(c.outputs[0]))) return false;
  size_t inputs = 0;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (c.inputs[i] == kNoValue || !passes::all_static(g.type(c.inputs[i]))) return false;
    const Node* p = computed_part(g, c, i);
    inputs += p != nullptr ? p->inputs.size() : 1;
  }
  return inputs <= kMaxInputs && launches_now(g, c) >= 2;
}

// Replaces concat `pos` by one fused node: the bodies of its computed parts copied in, its other
// parts body inputs, the concat last.
void fuse(Graph& g, size_t pos) {
  const Node& c = *g.nodes()[pos];
  auto body = std::make_shared<Graph>();
  std::vector<ValueId> inputs, parts;
  Attrs attrs;
  // A body input reading node input v the way `from` reads its input k.
  auto add_input = [&](ValueId v, const Attrs& from, size_t k, const TensorType& type) {
    const std::string key = input_view_key(k);
    if (from.has(key)) attrs.set(input_view_key(inputs.size()), from.get_ints(key));
    inputs.push_back(v);
    return body->add_input("in" + std::to_string(inputs.size() - 1), type);
  };
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Node* p = computed_part(g, c, i);
    if (p == nullptr) {
      parts.push_back(add_input(c.inputs[i], c.attrs, i, input_view(c.op, c.attrs, i, g.type(c.inputs[i])).logical));
      continue;
    }
    const Graph& pb = *p->body;
    std::unordered_map<ValueId, ValueId> to_body;
    for (size_t k = 0; k < pb.inputs().size(); ++k)
      to_body[pb.inputs()[k]] = add_input(p->inputs[k], p->attrs, k, pb.type(pb.inputs()[k]));
    for (ValueId k : pb.constants()) to_body[k] = body->add_constant("", pb.type(k), pb.value(k).data);
    for (const auto& n : pb.nodes()) {
      std::vector<ValueId> ins;
      for (ValueId v : n->inputs) ins.push_back(to_body.at(v));
      const std::vector<ValueId> outs = body->add_node(n->op, ins, n->attrs, n->name);
      for (size_t k = 0; k < outs.size(); ++k) to_body[n->outputs[k]] = outs[k];
    }
    parts.push_back(to_body.at(pb.outputs()[0]));
  }
  Attrs concat;
  concat.set("axis", c.attrs.get_int("axis"));
  body->mark_output(body->add_node1(OpKind::kConcat, parts, concat, c.name), "out0");
  const ValueId old = c.outputs[0];
  const std::string name = c.name;
  const ValueId y = g.insert_fused(pos, inputs, std::move(body), name, attrs)[0];
  g.replace_all_uses(old, y);
  g.erase_node(pos + 1);
}

}  // namespace

bool fuse_pointwise_concats(Graph& g) {
  bool changed = false;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos)
    if (fusable(g, *g.nodes()[pos])) {
      fuse(g, pos);
      changed = true;
    }
  if (changed) eliminate_dead_code(g);
  return changed;
}

}  // namespace kiln
