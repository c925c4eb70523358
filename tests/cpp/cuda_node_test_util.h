// One-node graphs for the CUDA generator tests (test_cuda_gen_codegen.cpp and the family
// predicate tests): a node under test over graph inputs of given types, and attribute lists.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::test {

using Shape = std::vector<int64_t>;

// A graph whose last node is the one under test; a copy points at its own graph's node.
struct Built {
  Graph g;
  Node* node = nullptr;
  Built() = default;
  Built(const Built& o) : g(o.g), node(g.nodes().back().get()) {}
  Built(Built&&) = default;
};

// "x<i>" (appended rather than "x" + std::to_string(i), which trips a false -Wrestrict in GCC 12).
inline std::string input_name(size_t i) {
  std::string s = "x";
  s += std::to_string(i);
  return s;
}

// A graph of one node over inputs of the given types (a null type: an absent input).
inline Built one_node(OpKind op, const std::vector<std::optional<TensorType>>& ins, const Attrs& attrs = {}) {
  Built b;
  std::vector<ValueId> ids;
  for (size_t i = 0; i < ins.size(); ++i) ids.push_back(ins[i] ? b.g.add_input(input_name(i), *ins[i]) : kNoValue);
  b.g.add_node(op, ids, attrs, std::string(op_name(op)) + "_t");
  b.node = b.g.nodes().back().get();
  return b;
}

inline TensorType tt(DType d, Shape s) { return TensorType(d, std::move(s)); }

inline Attrs attrs(std::initializer_list<std::pair<const char*, AttrValue>> kv) {
  Attrs a;
  for (const auto& [k, v] : kv) a.set(k, v);
  return a;
}

}  // namespace kiln::test
