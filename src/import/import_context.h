// What every ATen importer shares: reading a node's arguments by schema position or keyword
// (NodeArgs), emitting Kiln nodes for it (ImportContext; both in import_context.cpp), the table
// entry type, and PyTorch's dim and dtype promotion rules (import_rules.cpp).
//
// An importer is a pair of plain functions in a per-family table (src/import/aten_*.cpp):
//   check(args):   throws kUnsupported with the reason when Kiln cannot take the node; it reads
//                  only arguments and metadata, so partitioning can ask cheaply;
//   convert(cx):   emits Kiln nodes and returns one ValueId per FX output (kNoValue for an
//                  output nobody uses).
// The driver (aten.cpp) checks each returned value against the FX metadata, so an importer
// needs no self-checks beyond what PyTorch would reject anyway.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/errors.h"
#include "kiln/import.h"
#include "kiln/ir.h"

namespace kiln::aten {

// Position of a keyword-only schema argument.
inline constexpr size_t kKwOnly = std::numeric_limits<size_t>::max();

// Typed access to one node's arguments. Readers throw kUnsupported naming the argument when it
// has another kind than the schema says (the front end sent something Kiln does not model).
class NodeArgs {
 public:
  NodeArgs(const ImportNode& node, const ImportGraph& graph) : node_(node), graph_(graph) {}
  const ImportNode& node() const { return node_; }
  const ImportGraph& graph() const { return graph_; }

  // The argument at schema position `pos` (positional) or keyword `name`; null when not given.
  const ImportArg* find(size_t pos, std::string_view name) const;
  // Given and not None.
  bool given(size_t pos, std::string_view name) const;

  int64_t get_int(size_t pos, std::string_view name) const;
  int64_t get_int(size_t pos, std::string_view name, int64_t fallback) const;
  bool get_bool(size_t pos, std::string_view name, bool fallback) const;
  // A Scalar or float argument (bool, int or float).
  double get_float(size_t pos, std::string_view name) const;
  double get_float(size_t pos, std::string_view name, double fallback) const;
  // The raw ImportArg of a Scalar (so that ints keep their exact value and Python type).
  const ImportArg& get_scalar(size_t pos, std::string_view name) const;
  // int[] arguments; a single int stands for a list of one (ATen's int[N] shorthand).
  std::vector<int64_t> get_ints(size_t pos, std::string_view name) const;
  std::vector<int64_t> get_ints(size_t pos, std::string_view name, const std::vector<int64_t>& fallback) const;
  std::string get_string(size_t pos, std::string_view name, const std::string& fallback) const;
  std::optional<DType> get_dtype(size_t pos, std::string_view name) const;
  // Tensor arguments: the tensor id (checked against ImportGraph::tensors).
  int32_t tensor_id(size_t pos, std::string_view name) const;
  std::optional<int32_t> opt_tensor_id(size_t pos, std::string_view name) const;
  const ImportTensor& tensor(int32_t id) const;
  const ImportTensor& tensor_arg(size_t pos, std::string_view name) const { return tensor(tensor_id(pos, name)); }
  // Tensor[] / Tensor?[] arguments: ids, -1 for a None entry.
  std::vector<int32_t> tensor_list(size_t pos, std::string_view name) const;

  // FX outputs.
  size_t num_outputs() const { return node_.outputs.size(); }
  bool out_used(size_t i) const { return i < node_.outputs.size() && node_.outputs[i] >= 0; }
  const ImportTensor& out(size_t i = 0) const;
  // Rejects the node when output i (which Kiln cannot produce) is used.
  void require_unused(size_t i, std::string_view what) const;
  // Rejects the node unless every output from `from` on is unused.
  void require_unused_from(size_t from, std::string_view what) const;

 private:
  const ImportNode& node_;
  const ImportGraph& graph_;
};

// Emits Kiln nodes for one FX node into `graph`. `values` maps FX tensor ids to Kiln values.
class ImportContext {
 public:
  ImportContext(Graph& graph, const NodeArgs& args, const std::vector<ValueId>& values)
      : graph(graph), args(args), values_(values) {}

  Graph& graph;
  const NodeArgs& args;

  // The Kiln value of FX tensor `id`; throws kInvalidArgument when it has not been defined.
  ValueId value(int32_t id) const;
  ValueId input(size_t pos, std::string_view name) const { return value(args.tensor_id(pos, name)); }
  std::optional<ValueId> opt_input(size_t pos, std::string_view name) const;
  const TensorType& type(ValueId v) const { return graph.type(v); }

  // One node named after the FX node.
  ValueId add(OpKind op, const std::vector<ValueId>& inputs, const Attrs& attrs = {});
  std::vector<ValueId> add_multi(OpKind op, const std::vector<ValueId>& inputs, const Attrs& attrs = {});

  // Helpers that emit nothing when there is nothing to do.
  ValueId cast(ValueId v, DType dt);
  ValueId reshape(ValueId v, const std::vector<int64_t>& shape);
  ValueId permute(ValueId v, const std::vector<int64_t>& perm);
  // An unnamed 0-d constant of dtype dt holding a Scalar argument (exact for ints).
  ValueId scalar(const ImportArg& s, DType dt);
  ValueId scalar(double v, DType dt);
  // A 1-D i64 constant.
  ValueId index_constant(const std::vector<int64_t>& values);
  // Multiplies by `factor` unless it is 1 (alpha / beta of add, sub, addmm).
  ValueId scale(ValueId v, const ImportArg& factor);

 private:
  const std::vector<ValueId>& values_;
};

using CheckFn = void (*)(const NodeArgs&);
using ConvertFn = std::vector<ValueId> (*)(ImportContext&);

struct ImportEntry {
  const char* target;  // str(overload), e.g. "aten.add.Tensor"
  CheckFn check;       // null: nothing beyond what convert verifies
  ConvertFn convert;
};

// The per-family tables (src/import/aten_<family>.cpp).
std::vector<ImportEntry> pointwise_importers();
std::vector<ImportEntry> binary_importers();
std::vector<ImportEntry> linalg_importers();
std::vector<ImportEntry> conv_importers();
std::vector<ImportEntry> norm_importers();
std::vector<ImportEntry> reduce_importers();
std::vector<ImportEntry> shape_importers();
std::vector<ImportEntry> slice_importers();
std::vector<ImportEntry> index_importers();
std::vector<ImportEntry> attention_importers();
std::vector<ImportEntry> misc_importers();

// --- shared rules ---------------------------------------------------------------------

// Throws kUnsupported with the concatenated reason (importers' way to say "not this node").
template <typename... Args>
[[noreturn]] void reject(Args&&... parts) {
  throw Error(ErrorCode::kUnsupported, detail::concat(std::forward<Args>(parts)...));
}

// PyTorch's dim wrapping: d in [-rank, rank) -> [0, rank); rank 0 accepts -1 and 0.
int64_t normalize_dim(int64_t d, int64_t rank, std::string_view what = "dim");
std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t rank, std::string_view what = "dim");

std::string shape_str(const std::vector<int64_t>& v);
TensorType tensor_type(const ImportTensor& t);  // symbols and ranges included

// torch.promote_types over Kiln's dtypes; throws kUnsupported when the result (e.g. int16 for
// u8 with i8) is not a Kiln dtype.
DType promote_types(DType a, DType b);

// An operand of torch.result_type: a tensor with dims, a 0-d tensor or a Python scalar.
struct Operand {
  enum class Kind { kTensor, kZeroDim, kScalar };
  DType dtype;
  Kind kind;
};
Operand operand_of(const ImportTensor& t);
Operand operand_of(const ImportArg& scalar);  // bool -> kBool, int -> kI64, float -> kF32
DType result_type(const std::vector<Operand>& ops);

}  // namespace kiln::aten
