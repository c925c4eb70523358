// Small pieces the graph passes share: reading a constant's elements as doubles, making a
// derived constant from doubles, the rule that names constants a pass creates, and the
// permute helpers of the layout passes (channels_last.cpp, fold_attention_layout.cpp).
//
// Element conversion goes through the CPU backend's accessors so that a constant folded by a
// pass holds exactly the bits the reference kernels would have produced.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/errors.h"
#include "kiln/ir.h"
#include "kiln/passes.h"
#include "src/common/element_access.h"

namespace kiln::passes {

// Every element of constant `v`, converted to double.
inline std::vector<double> constant_as_doubles(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  KILN_CHECK(val.is_constant(), kInternal, "value %", v, " is not a constant");
  const int64_t n = val.type.numel();
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = load_as_double(val.data->data(), val.type.dtype, i);
  return out;
}

// Input i of n, or kNoValue where n has fewer inputs (an optional bias, residual or mask).
inline ValueId input_or_none(const Node& n, size_t i) { return i < n.inputs.size() ? n.inputs[i] : kNoValue; }

// Whether v is a constant of a floating dtype (kNoValue is not).
inline bool is_float_constant(const Graph& g, ValueId v) {
  return v != kNoValue && g.value(v).is_constant() && is_floating(g.type(v).dtype);
}

// The value of v when it is a one-element floating constant (a number a model writes: an eps, a
// formula's coefficient), else nothing.
inline std::optional<double> floating_scalar(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  if (!val.is_constant() || val.type.numel() != 1 || !is_floating(val.type.dtype)) return std::nullopt;
  return constant_as_doubles(g, v)[0];
}

// The bytes of a `dt` tensor holding `xs` (rounded as the CPU backend rounds).
inline std::shared_ptr<const HostBuffer> bytes_from_doubles(DType dt, const std::vector<double>& xs) {
  auto bytes = std::make_shared<HostBuffer>(xs.size() * dtype_size(dt));
  for (size_t i = 0; i < xs.size(); ++i) store_double(bytes->data(), dt, int64_t(i), xs[i]);
  return bytes;
}

// Constants made by passes are not weights (a refit cannot address them by a model name);
// their name only tells a reader of the plan where they came from. `tag` says which pass.
inline std::string derived_constant_name(const Graph& g, const char* tag) {
  return std::string(tag) + "." + std::to_string(g.num_values());
}

// Puts a node of `op` on `inputs` with `attrs`, named as the one-output node at `pos`, in its
// place, gives its output every use of the old one and erases the old one (the IR has no
// in-place edit of a node). Returns the new output.
inline ValueId replace_node(Graph& g, size_t pos, OpKind op, const std::vector<ValueId>& inputs, const Attrs& attrs) {
  const std::string name = g.nodes()[pos]->name;
  const ValueId old = g.nodes()[pos]->outputs[0];
  const ValueId y = g.insert_node(pos, op, inputs, attrs, name)[0];
  g.replace_all_uses(old, y);
  g.erase_node(pos + 1);
  return y;
}

// Calls rewrite(g, pos) at every position in order (a rewrite may insert nodes, which the sweep
// then visits too) and, when one returned true, drops what no longer reaches an output.
template <typename Rewrite>
bool rewrite_each(Graph& g, Rewrite&& rewrite) {
  bool changed = false;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) changed = rewrite(g, pos) || changed;
  if (changed) eliminate_dead_code(g);
  return changed;
}

// Inserts nodes at consecutive positions from `pos` (which advances), each named `name`: the
// arithmetic a pass builds in front of the node it rewrites.
struct NodeInserter {
  Graph& g;
  size_t pos;
  std::string name;

  ValueId node(OpKind op, const std::vector<ValueId>& ins, const Attrs& a = {}) {
    return g.insert_node(pos++, op, ins, a, name)[0];
  }
  ValueId cast(ValueId v, DType to) {
    if (g.type(v).dtype == to) return v;
    Attrs a;
    a.set("dtype", to);
    return node(OpKind::kCast, {v}, a);
  }
  ValueId reshape(ValueId v, const std::vector<int64_t>& shape) {
    if (g.type(v).shape() == shape) return v;
    Attrs a;
    a.set("shape", shape);
    return node(OpKind::kReshape, {v}, a);
  }
  // v broadcast to `shape` (leading dims of 1 added first when v has fewer).
  ValueId expand(ValueId v, const std::vector<int64_t>& shape) {
    if (g.type(v).shape() == shape) return v;
    std::vector<int64_t> full(shape.size() - size_t(g.type(v).rank()), 1);
    for (const Dim& d : g.type(v).dims) full.push_back(d.extent);
    Attrs a;
    a.set("shape", shape);
    return node(OpKind::kExpand, {reshape(v, full)}, a);
  }
};

// Whether every dim of t is a number (no symbol): what passes that write sizes into attributes
// or fold values need.
inline bool all_static(const TensorType& t) {
  return std::all_of(t.dims.begin(), t.dims.end(), [](const Dim& d) { return d.is_static(); });
}

// The attributes of a slice of [start, end) along `axis`, step 1.
inline Attrs slice_attrs(int64_t axis, int64_t start, int64_t end) {
  Attrs a;
  a.set("axis", axis);
  a.set("start", start);
  a.set("end", end);
  a.set("step", int64_t{1});
  return a;
}

// The axis of a linear's or conv's output that holds its output channels: the last for a linear
// and a channels-last conv (layout "nhwc"), 1 for a channels-first conv.
inline int64_t output_channel_axis(const Node& p, int64_t rank) {
  return p.op == OpKind::kLinear || p.attrs.get_string("layout", "nchw") == "nhwc" ? rank - 1 : 1;
}

enum class ChannelForm { kNone, kChannels, kScalar };

// Whether c, broadcast against P's output type `out`, is a per-channel vector (every dim 1 but
// the output-channel axis, which has the channel count: a bias or a per-channel scale) or one
// element.
inline ChannelForm channel_form(const Node& p, const TensorType& c, const TensorType& out) {
  if (c.rank() > out.rank()) return ChannelForm::kNone;
  const int64_t axis = output_channel_axis(p, out.rank()), channels = out.dims[size_t(axis)].extent;
  const int64_t shift = out.rank() - c.rank();  // c's dim i lines up with out's dim i + shift
  bool channels_only = axis >= shift, ones = true;
  for (int64_t i = 0; i < c.rank(); ++i) {
    const int64_t e = c.dims[size_t(i)].extent;
    ones = ones && e == 1;
    if (i + shift == axis) channels_only = channels_only && e == channels;
    else channels_only = channels_only && e == 1;
  }
  if (channels_only) return ChannelForm::kChannels;
  return ones ? ChannelForm::kScalar : ChannelForm::kNone;
}

// ---- permutes ----------------------------------------------------------------------------
using Perm = std::vector<int64_t>;

inline bool is_identity(const Perm& p) {
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != int64_t(i)) return false;
  return true;
}

// The node of `op` producing v, if any (null for kNoValue, inputs and constants).
inline const Node* made_by(const Graph& g, ValueId v, OpKind op) {
  const Node* p = v == kNoValue ? nullptr : g.value(v).producer;
  return p != nullptr && p->op == op ? p : nullptr;
}

// The permute node producing v, if any.
inline const Node* permute_of(const Graph& g, ValueId v) {
  const Node* p = v == kNoValue ? nullptr : g.value(v).producer;
  return p != nullptr && p->op == OpKind::kPermute ? p : nullptr;
}

inline Perm perm_of(const Node& p) { return p.attrs.get_ints("perm"); }

// A permute(v, perm) among the first `before` nodes of g, if any.
inline const Node* permute_before(const Graph& g, ValueId v, const Perm& perm, size_t before) {
  for (size_t i = 0; i < before; ++i) {
    const Node& n = *g.nodes()[i];
    if (n.op == OpKind::kPermute && n.inputs[0] == v && perm_of(n) == perm) return &n;
  }
  return nullptr;
}

inline bool is_graph_output(const Graph& g, ValueId v) {
  return std::find(g.outputs().begin(), g.outputs().end(), v) != g.outputs().end();
}

// Whether v has exactly one reader and is no graph output: a rewrite may consume it.
inline bool read_once(const Graph& g, ValueId v) { return g.num_uses(v) == 1 && !is_graph_output(g, v); }

// Whether the dims of extent > 1 of `shape`, read in the order `order`, keep their order (a
// permute by `order` then moves no data: it is a reshape).
inline bool keeps_order(const std::vector<int64_t>& shape, const Perm& order) {
  int64_t last = -1;
  for (int64_t d : order) {
    if (shape[size_t(d)] == 1) continue;
    if (d < last) return false;
    last = d;
  }
  return true;
}

// permute(permute(v, P), Q) at `pos`: composes in place into permute(v, P o Q), or forwards v
// for an identity (unless the outer permute's output is a graph output). Returns whether it
// changed the graph; the inner permute stays for eliminate_dead_code.
inline bool fold_permutes(Graph& g, size_t pos) {
  Node& n = *g.nodes()[pos];
  const Node* inner = permute_of(g, n.inputs[0]);
  if (n.op != OpKind::kPermute || inner == nullptr) return false;
  const Perm p = perm_of(*inner), q = perm_of(n);
  Perm r(q.size());
  for (size_t i = 0; i < q.size(); ++i) r[i] = p[size_t(q[i])];
  const ValueId v = inner->inputs[0];
  if (is_identity(r)) {
    if (is_graph_output(g, n.outputs[0])) return false;
    g.replace_all_uses(n.outputs[0], v);
    g.erase_node(pos);
    return true;
  }
  n.inputs[0] = v;
  n.attrs.set("perm", r);
  return true;
}

}  // namespace kiln::passes
