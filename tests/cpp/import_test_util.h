// Builders for ATen import tests (test_import.cpp, test_import_numerics.cpp): an FX-like
// description in a few lines (Fx), argument shorthands, and helpers that import, check a refusal
// or run an imported graph on the CPU backend.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::import_test {

using Shape = std::vector<int64_t>;

inline ImportArg T(int32_t id) { return ImportArg::of_tensor(id); }
inline ImportArg I(int64_t v) { return ImportArg::of_int(v); }
inline ImportArg F(double v) { return ImportArg::of_float(v); }
inline ImportArg B(bool v) { return ImportArg::of_bool(v); }
inline ImportArg S(std::string v) { return ImportArg::of_string(std::move(v)); }
inline ImportArg D(DType v) { return ImportArg::of_dtype(v); }
inline ImportArg N() { return ImportArg::none(); }
inline ImportArg L(std::vector<ImportArg> v) { return ImportArg::of_list(std::move(v)); }
inline ImportArg Ints(const Shape& v) {
  std::vector<ImportArg> l;
  for (int64_t x : v) l.push_back(I(x));
  return L(l);
}

using Kwargs = std::vector<std::pair<std::string, ImportArg>>;

// Builds an ImportGraph the way the front end describes an FX graph.
struct Fx {
  ImportGraph g;
  int counter = 0;

  int32_t tensor(DType dt, const Shape& shape) {
    ImportTensor t;
    t.dtype = dt;
    t.shape = shape;
    return g.add_tensor(t);
  }
  int32_t input(const std::string& name, DType dt, const Shape& shape) {
    int32_t id = tensor(dt, shape);
    g.inputs.push_back({id, name});
    return id;
  }
  int32_t constant(const std::string& name, DType dt, const Shape& shape, std::vector<uint8_t> bytes,
                   bool weight = true) {
    int32_t id = tensor(dt, shape);
    g.constants.push_back({id, name, std::make_shared<const HostBuffer>(std::move(bytes)), weight});
    return id;
  }
  int32_t weight(const std::string& name, const Shape& shape, std::mt19937& rng) {
    TensorType t(DType::kF32, shape);
    std::vector<float> v(size_t(t.numel()));
    std::uniform_real_distribution<float> d(-1, 1);
    for (float& x : v) x = d(rng);
    Bytes b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return constant(name, DType::kF32, shape, std::move(b));
  }
  // A node with one output of the given type; returns the output id.
  int32_t node(const std::string& target, std::vector<ImportArg> args, DType dt, const Shape& shape,
               Kwargs kwargs = {}) {
    return nodes(target, std::move(args), {{dt, shape}}, std::move(kwargs))[0];
  }
  // A node with several outputs; an output whose dtype is nullopt is unused (-1).
  std::vector<int32_t> nodes(const std::string& target, std::vector<ImportArg> args,
                             const std::vector<std::pair<std::optional<DType>, Shape>>& outs, Kwargs kwargs = {}) {
    ImportNode n;
    n.target = target;
    n.name = "n";
    n.name += std::to_string(counter++);
    n.args = std::move(args);
    n.kwargs = std::move(kwargs);
    for (const auto& [dt, shape] : outs) n.outputs.push_back(dt ? tensor(*dt, shape) : -1);
    g.nodes.push_back(n);
    return g.nodes.back().outputs;
  }
  void output(int32_t id, const std::string& name) { g.outputs.push_back({id, name}); }
  const ImportNode& last() const { return g.nodes.back(); }
};

// Occurrences of `needle` in `text`.
inline int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

inline std::string unsupported_reason(const Fx& fx) {
  ImportSupport s = can_import(fx.last(), fx.g);
  EXPECT_FALSE(s.supported);
  return s.reason;
}

// Imports and expects a kUnsupported error naming the node, its target and `cause`.
inline void expect_import_refused(const Fx& fx, const std::string& cause) {
  try {
    import_aten(fx.g);
    ADD_FAILURE() << "import_aten accepted " << fx.last().target;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'" + fx.last().name + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fx.last().target), std::string::npos) << msg;
    EXPECT_NE(msg.find(cause), std::string::npos) << msg;
  }
}


// Imports a single-node graph whose output is the node's first output.
inline Graph import_last(Fx& fx) {
  fx.output(fx.last().outputs[0], "out");
  ImportSupport s = can_import(fx.last(), fx.g);
  EXPECT_TRUE(s.supported) << s.reason;
  Graph g = import_aten(fx.g);
  g.verify();
  return g;
}

template <typename Tv>
Bytes to_bytes(const std::vector<Tv>& v) {
  Bytes b(v.size() * sizeof(Tv));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <typename Tv>
std::vector<Tv> from_bytes(const Bytes& b) {
  std::vector<Tv> v(b.size() / sizeof(Tv));
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// Imports fx, builds it for the CPU and runs it on `inputs` (in ImportGraph::inputs order).
inline std::vector<Bytes> run(const Fx& fx, const std::vector<Bytes>& inputs) {
  for (const ImportNode& n : fx.g.nodes) EXPECT_TRUE(can_import(n, fx.g).supported) << can_import(n, fx.g).reason;
  std::shared_ptr<Engine> engine = Builder().build(import_aten(fx.g));
  std::vector<const void*> in;
  for (const Bytes& b : inputs) in.push_back(b.data());
  std::vector<Bytes> outs;
  for (const IOTensor& o : engine->outputs()) outs.emplace_back(o.type.nbytes());
  std::vector<void*> out;
  for (Bytes& b : outs) out.push_back(b.data());
  engine->create_execution_context()->execute(in, out);
  return outs;
}

inline std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-2, 2);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<int64_t> random_ints(size_t n, int64_t lo, int64_t hi, std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> d(lo, hi);
  std::vector<int64_t> v(n);
  for (int64_t& x : v) x = d(rng);
  return v;
}


}  // namespace kiln::import_test
