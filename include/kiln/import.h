// ATen import: a plain description of an ATen graph (no Python objects) -> Kiln IR.
//
// The front end describes each FX node by its overload name ("aten.convolution.default"),
// its arguments (tensors by id, ints, floats, bools, strings, dtypes, lists, None) and the
// metadata of every tensor. One importer per overload answers "can Kiln take this node?" and
// maps it to Kiln ops; the table of importers is the operator-coverage list
// (src/import/aten_*.cpp; supported_aten_targets() lists it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/ir.h"

namespace kiln {

struct ImportArg {
  enum class Kind : uint8_t { kNone, kBool, kInt, kFloat, kString, kDType, kTensor, kList };
  Kind kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  DType dtype = DType::kF32;
  int32_t tensor = -1;  // id into ImportGraph::tensors
  std::vector<ImportArg> list;

  static ImportArg none() { return {}; }
  static ImportArg of_bool(bool v) { ImportArg a; a.kind = Kind::kBool; a.b = v; return a; }
  static ImportArg of_int(int64_t v) { ImportArg a; a.kind = Kind::kInt; a.i = v; return a; }
  static ImportArg of_float(double v) { ImportArg a; a.kind = Kind::kFloat; a.f = v; return a; }
  static ImportArg of_string(std::string v) { ImportArg a; a.kind = Kind::kString; a.s = std::move(v); return a; }
  static ImportArg of_dtype(DType v) { ImportArg a; a.kind = Kind::kDType; a.dtype = v; return a; }
  static ImportArg of_tensor(int32_t id) { ImportArg a; a.kind = Kind::kTensor; a.tensor = id; return a; }
  static ImportArg of_list(std::vector<ImportArg> v) { ImportArg a; a.kind = Kind::kList; a.list = std::move(v); return a; }
};

struct ImportTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements; empty = contiguous
  // Symbolic dims of graph inputs: empty, or one entry per dim ("" = static).
  std::vector<std::string> symbols;
  std::vector<int64_t> sym_min, sym_max;
  // The tensor's size depends on shape symbols (an input or a node of a dynamic program's concrete
  // copy): a node's Kiln value is marked Value::sized, so that fold_constants leaves it a node, and
  // importers build what has that size from indices rather than as a constant (cumsum's triangle).
  bool sized = false;
};

struct ImportNode {
  std::string target;                                        // "aten.add.Tensor"
  std::string name;                                          // the FX node name, for messages
  std::vector<ImportArg> args;                               // positional arguments
  std::vector<std::pair<std::string, ImportArg>> kwargs;     // keyword arguments
  std::vector<int32_t> outputs;                              // tensor ids; -1 for an output nobody uses
};

struct ImportConstant {
  int32_t tensor = -1;
  std::string name;                    // weights keep their module path ("layer1.0.conv1.weight")
  std::shared_ptr<const HostBuffer> data;  // dense bytes of ImportGraph::tensors[tensor]
  bool weight = true;
};

struct ImportGraph {
  std::vector<ImportTensor> tensors;                      // by id
  std::vector<std::pair<int32_t, std::string>> inputs;    // runtime inputs
  std::vector<ImportConstant> constants;                  // weights and buffers
  std::vector<ImportNode> nodes;                          // topological order
  std::vector<std::pair<int32_t, std::string>> outputs;

  int32_t add_tensor(ImportTensor t) { tensors.push_back(std::move(t)); return int32_t(tensors.size() - 1); }
};

struct ImportSupport {
  bool supported = false;
  std::string reason;  // why not, when not
};

// Is there an importer for node.target, and does it accept these arguments and metadata?
ImportSupport can_import(const ImportNode& node, const ImportGraph& graph);
// The importers asked about a whole graph node by node, in FX order, the way import_aten converts
// it: each accepted node joins one growing graph, so an importer sees what produced its inputs (a
// cumsum over a cast of a mask sums in f32, as in the build), and the outputs of a refused node
// read as plain inputs to the nodes after it. `accept`, when given, is asked about the nodes a
// node converted to (the first of them at `first`) and may refuse them with a reason; a refused
// node's ops leave the graph again. add() never throws.
class ImportTrial {
 public:
  using Accept = std::function<std::string(const Graph& graph, size_t first)>;
  ImportSupport add(const ImportNode& node, const ImportGraph& graph, const Accept& accept = {});

 private:
  Graph graph_;
  std::vector<ValueId> values_;  // by tensor id: the value standing for it in graph_
};

// Imports the whole description; throws kUnsupported naming the first node it cannot take.
Graph import_aten(const ImportGraph& graph);
// Every ATen overload with an importer, sorted.
std::vector<std::string> supported_aten_targets();

}  // namespace kiln
