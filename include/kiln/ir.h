// Kiln IR: a Graph of Nodes (Kiln ops) over Values (tensors).
//
// A Value is a tensor with a dtype and a shape. It is produced by exactly one of: a graph
// input, a constant (data held by the graph; named constants are the engine's *weights*),
// or a node output. Nodes are kept in topological order; every tensor inside Kiln is dense
// and row-major (importers turn strided views into explicit ops).
//
// Shapes: every dimension has a concrete extent. A dimension may also name a symbol with a
// [min, max] range (dynamic shapes); the concrete extent is then the one the graph was
// traced with. Shape rules compute concrete extents; symbols are carried from graph inputs.
//
// Lifecycle: a Graph is built (add_input / add_constant / add_node / mark_output), verified,
// rewritten in place by passes (nodes are erased or inserted; values that lose every use
// stay until compact()), then frozen inside an Engine.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/ops.h"

namespace kiln {

struct Dim {
  int64_t extent = 0;
  std::string symbol;  // empty: static
  int64_t min = 0, max = 0;

  bool is_static() const { return symbol.empty(); }
  bool operator==(const Dim& o) const {
    return extent == o.extent && symbol == o.symbol && min == o.min && max == o.max;
  }
};

struct TensorType {
  DType dtype = DType::kF32;
  std::vector<Dim> dims;

  TensorType() = default;
  TensorType(DType dt, const std::vector<int64_t>& shape);
  int64_t rank() const { return static_cast<int64_t>(dims.size()); }
  std::vector<int64_t> shape() const;  // concrete extents
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  std::string to_string() const;  // "f32[2,3]", symbols as "f32[N=2:1..8,3]"
  bool operator==(const TensorType& o) const { return dtype == o.dtype && dims == o.dims; }
};

// Attribute values. Lists of ints are used for shapes, axes, strides, paddings.
using AttrValue =
    std::variant<bool, int64_t, double, std::string, std::vector<int64_t>, std::vector<double>, DType>;

class Attrs {
 public:
  bool has(const std::string& key) const { return map_.count(key) != 0; }
  void set(const std::string& key, AttrValue v) { map_[key] = std::move(v); }
  void erase(const std::string& key) { map_.erase(key); }
  const std::map<std::string, AttrValue>& items() const { return map_; }

  // Typed getters throw kInvalidArgument naming the key when absent or of another type.
  // get_float also accepts an int attribute.
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key) const;
  bool get_bool(const std::string& key, bool fallback) const;
  const std::string& get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  const std::vector<int64_t>& get_ints(const std::string& key) const;
  std::vector<int64_t> get_ints(const std::string& key, const std::vector<int64_t>& fallback) const;
  const std::vector<double>& get_floats(const std::string& key) const;
  DType get_dtype(const std::string& key) const;
  DType get_dtype(const std::string& key, DType fallback) const;

  bool operator==(const Attrs& o) const { return map_ == o.map_; }

 private:
  std::map<std::string, AttrValue> map_;
};

using ValueId = int32_t;
inline constexpr ValueId kNoValue = -1;  // an absent optional input

class Node;
class Graph;

using Bytes = std::vector<uint8_t>;

// Host bytes of a constant: a buffer of its own, or a view of memory that an owner keeps alive
// (an engine file mapped copy-on-write by Engine::load_mapped: the constants are the file's
// pages, read in as they are used, and a refit's writes stay private to the process). Shared
// so that passes and engines can hold the same data. A copy always owns its bytes.
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(size_t n, uint8_t fill = 0) : own_(n, fill) {}
  explicit HostBuffer(Bytes bytes) : own_(std::move(bytes)) {}
  HostBuffer(const uint8_t* first, const uint8_t* last) : own_(first, last) {}
  // A view of `size` bytes at `data`, which `owner` keeps alive and which may be written.
  HostBuffer(std::shared_ptr<void> owner, uint8_t* data, size_t size)
      : owner_(std::move(owner)), view_(data), view_size_(size) {}
  HostBuffer(const HostBuffer& other) : own_(other.begin(), other.end()) {}
  HostBuffer& operator=(const HostBuffer& other) {
    if (this != &other) *this = HostBuffer(other);
    return *this;
  }
  HostBuffer(HostBuffer&&) noexcept = default;
  HostBuffer& operator=(HostBuffer&&) noexcept = default;

  uint8_t* data() { return owner_ ? view_ : own_.data(); }
  const uint8_t* data() const { return owner_ ? view_ : own_.data(); }
  size_t size() const { return owner_ ? view_size_ : own_.size(); }
  bool empty() const { return size() == 0; }
  bool is_view() const { return owner_ != nullptr; }
  uint8_t* begin() { return data(); }
  uint8_t* end() { return data() + size(); }
  const uint8_t* begin() const { return data(); }
  const uint8_t* end() const { return data() + size(); }
  uint8_t operator[](size_t i) const { return data()[i]; }
  friend bool operator==(const HostBuffer& a, const HostBuffer& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }

 private:
  Bytes own_;
  std::shared_ptr<void> owner_;
  uint8_t* view_ = nullptr;
  size_t view_size_ = 0;
};

struct Value {
  TensorType type;
  std::string name;                     // graph inputs, outputs and weights are named
  Node* producer = nullptr;             // non-owning; null for inputs and constants
  int output_index = 0;                 // which output of producer
  std::shared_ptr<const HostBuffer> data;  // set for constants
  bool is_input = false;
  bool is_weight = false;               // a named constant taken from the model (refittable)
  // Its size depends on shape symbols although its plan is concrete (a dynamic program's block):
  // fold_constants does not fold the node making it, so that the constants stay the same at every
  // size (kiln/size_program.h). Set by import; kept by passes (lower_precision copies it, and a
  // value that replaces it takes it: Graph::replace_all_uses); not saved in engine files.
  bool sized = false;
  bool is_constant() const { return data != nullptr; }
};

class Node {
 public:
  OpKind op;
  std::vector<ValueId> inputs;   // kNoValue marks an absent optional input
  std::vector<ValueId> outputs;
  Attrs attrs;
  std::string name;              // origin (e.g. the ATen node name), for messages
  // The body of a fused node (op == kFusedPointwise): a graph whose inputs map one to one to
  // this node's inputs and whose outputs map to this node's outputs.
  std::shared_ptr<Graph> body;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph& other);             // deep copy (nodes, values; constant bytes shared)
  Graph& operator=(const Graph& other);
  Graph(Graph&&) noexcept = default;
  Graph& operator=(Graph&&) noexcept = default;

  // --- building ---
  ValueId add_input(const std::string& name, const TensorType& type);
  // A constant with data (copied); weight=true marks a named, refittable model weight.
  ValueId add_constant(const std::string& name, const TensorType& type, const void* data, size_t nbytes,
                       bool weight = false);
  ValueId add_constant(const std::string& name, const TensorType& type, std::shared_ptr<const HostBuffer> data,
                       bool weight = false);
  // Validates arity and attributes through the op's shape rule, then appends the node and
  // creates its outputs. Throws kInvalidArgument / kShapeMismatch naming the op and the cause.
  std::vector<ValueId> add_node(OpKind op, const std::vector<ValueId>& inputs, const Attrs& attrs = {},
                                const std::string& name = "");
  ValueId add_node1(OpKind op, const std::vector<ValueId>& inputs, const Attrs& attrs = {},
                    const std::string& name = "");
  void mark_output(ValueId v, const std::string& name);

  // --- reading ---
  const Value& value(ValueId v) const;
  Value& value(ValueId v);
  const TensorType& type(ValueId v) const { return value(v).type; }
  int32_t num_values() const { return static_cast<int32_t>(values_.size()); }
  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  const std::vector<ValueId>& inputs() const { return inputs_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  std::vector<ValueId> constants() const;  // every constant value, in id order
  // Users of each value (node indices into nodes()), recomputed on call.
  std::vector<std::vector<int>> users() const;
  int num_uses(ValueId v) const;  // node uses + uses as graph output

  // --- rewriting (passes) ---
  // Insert a node before position `pos` in nodes() (pos == nodes().size() appends). The shape
  // rule runs as in add_node.
  std::vector<ValueId> insert_node(size_t pos, OpKind op, const std::vector<ValueId>& inputs,
                                   const Attrs& attrs = {}, const std::string& name = "");
  void erase_node(size_t pos);
  void replace_all_uses(ValueId from, ValueId to);  // in nodes and graph outputs; `to` takes from's sized
  void set_output(size_t i, ValueId v);
  // Drop values with no producer and no use (except inputs), renumber densely. Invalidates ValueIds.
  void compact();
  // Replace a node's body / add a node whose outputs are given explicitly (fusion). Body input i
  // has node input i's type, or the sizes of the node's attribute "view<i>" (a strided view of
  // that input, src/ops/shape_rules.h input_view) where it has one.
  std::vector<ValueId> insert_fused(size_t pos, const std::vector<ValueId>& inputs, std::shared_ptr<Graph> body,
                                    const std::string& name = "", const Attrs& attrs = {});

  // Throws kInternal naming the first broken invariant: topological order, ids in range,
  // every node's output types equal to its shape rule's, outputs present, unique names.
  void verify() const;
  // Stable text form, for golden tests and debug logs.
  std::string to_string() const;

 private:
  ValueId new_value(const TensorType& t);
  std::vector<Value> values_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<ValueId> inputs_;
  std::vector<ValueId> outputs_;
};

}  // namespace kiln
