// Writing the PLAN payload (a Graph, fused bodies recursively) and the WGTS payload (the
// constant blobs). See engine_file.h for the layout and graph_codec.h for the numbering.
#include <type_traits>
#include <variant>

#include "kiln/errors.h"
#include "src/serialize/graph_codec.h"

namespace kiln::serialize {

namespace {

// A new AttrValue alternative needs a tag here and in graph_read.cpp.
static_assert(std::variant_size_v<AttrValue> == 7, "update the engine file attribute codec");

struct AttrWriter {
  ByteWriter& w;
  void operator()(bool b) const { w.u8(b ? 1 : 0); }
  void operator()(int64_t i) const { w.i64(i); }
  void operator()(double d) const { w.f64(d); }
  void operator()(const std::string& s) const { w.str(s, "a string attribute"); }
  void operator()(const std::vector<int64_t>& v) const {
    w.u32(static_cast<uint32_t>(v.size()));
    for (int64_t x : v) w.i64(x);
  }
  void operator()(const std::vector<double>& v) const {
    w.u32(static_cast<uint32_t>(v.size()));
    for (double x : v) w.f64(x);
  }
  void operator()(DType t) const { w.u8(static_cast<uint8_t>(t)); }
};

void write_type(ByteWriter& w, const TensorType& t) {
  w.u8(static_cast<uint8_t>(t.dtype));
  w.u32(static_cast<uint32_t>(t.dims.size()));
  for (const Dim& d : t.dims) {
    w.i64(d.extent);
    w.str(d.symbol, "a dimension's symbol");
    w.i64(d.min);
    w.i64(d.max);
  }
}

}  // namespace

uint64_t BlobTable::add(const Blob& data) {
  auto it = index_.find(data.get());
  if (it != index_.end()) return it->second;
  uint64_t i = blobs_.size();
  blobs_.push_back(data);
  index_.emplace(data.get(), i);
  return i;
}

void write_graph(ByteWriter& w, const Graph& g, BlobTable& blobs) {
  // Keep exactly what Graph::compact keeps, numbered densely in id order.
  const size_t n = size_t(g.num_values());
  std::vector<char> keep(n, 0);
  for (ValueId in : g.inputs()) keep[size_t(in)] = 1;
  for (ValueId o : g.outputs()) keep[size_t(o)] = 1;
  for (const auto& node : g.nodes()) {
    for (ValueId in : node->inputs)
      if (in != kNoValue) keep[size_t(in)] = 1;
    for (ValueId out : node->outputs) keep[size_t(out)] = 1;
  }
  std::vector<ValueId> id(n, kNoValue);
  uint32_t kept = 0;
  for (size_t v = 0; v < n; ++v)
    if (keep[v]) id[v] = ValueId(kept++);
  auto ref = [&](ValueId v) { return v == kNoValue ? kNoValue : id[size_t(v)]; };

  w.u32(kept);
  for (size_t v = 0; v < n; ++v) {
    if (!keep[v]) continue;
    const Value& val = g.value(ValueId(v));
    KILN_CHECK(val.is_input || val.is_constant() || val.producer != nullptr, kInternal,
               "cannot serialize the plan: value %", v, " has no producer");
    uint8_t flags = (val.is_input ? kValueIsInput : 0) | (val.is_weight ? kValueIsWeight : 0) |
                    (val.is_constant() ? kValueIsConstant : 0);
    w.u8(flags);
    write_type(w, val.type);
    w.str(val.name, "a value name");
    if (val.is_constant()) w.u64(blobs.add(val.data));
  }

  w.u32(static_cast<uint32_t>(g.nodes().size()));
  for (const auto& node : g.nodes()) {
    w.str(op_name(node->op), "an op name");
    w.u32(static_cast<uint32_t>(node->inputs.size()));
    for (ValueId in : node->inputs) w.i32(ref(in));
    w.u32(static_cast<uint32_t>(node->outputs.size()));
    for (size_t k = 0; k < node->outputs.size(); ++k) {
      // Graph::insert_node makes a node's outputs consecutive; the reader relies on it.
      KILN_CHECK(k == 0 || ref(node->outputs[k]) == ref(node->outputs[0]) + ValueId(k), kInternal,
                 "cannot serialize the plan: outputs of ", op_name(node->op), " are not consecutive values");
      w.i32(ref(node->outputs[k]));
    }
    w.u32(static_cast<uint32_t>(node->attrs.items().size()));
    for (const auto& [key, value] : node->attrs.items()) {
      w.str(key, "an attribute key");
      w.u8(static_cast<uint8_t>(value.index()));
      std::visit(AttrWriter{w}, value);
    }
    w.str(node->name, "a node name");
    w.u8(node->body ? 1 : 0);
    if (node->body) write_graph(w, *node->body, blobs);
  }

  w.u32(static_cast<uint32_t>(g.inputs().size()));
  for (ValueId in : g.inputs()) w.i32(ref(in));
  w.u32(static_cast<uint32_t>(g.outputs().size()));
  for (ValueId o : g.outputs()) w.i32(ref(o));
}

void write_blobs(ByteWriter& w, const BlobTable& blobs) {
  size_t total = 8 + (size_t(1) << 20);  // and room for the small sections after it
  for (const Blob& b : blobs.blobs()) total += 8 + kBlobAlignment + b->size();
  w.reserve(total);
  w.u64(blobs.blobs().size());
  for (const Blob& b : blobs.blobs()) {
    w.u64(b->size());
    w.pad_to(kBlobAlignment);
    w.bytes(b->data(), b->size());
  }
}

}  // namespace kiln::serialize
