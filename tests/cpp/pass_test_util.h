// Helpers shared by the pass and builder tests (fuse_epilogue, lower_precision, layouts, the
// pipeline): random f32 data, constants, running an engine or a graph exactly as given on the
// CPU reference kernels (Engine::create applies no passes), comparing results, and checking an
// error's code and message.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "tests/cpp/error_test_util.h"

namespace kiln::test {

using Shape = std::vector<int64_t>;
using Floats = std::vector<float>;

inline Floats random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Floats v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline size_t numel(const Shape& s) {
  size_t n = 1;
  for (int64_t d : s) n *= size_t(d);
  return n;
}

inline ValueId f32_constant(Graph& g, const std::string& name, const Shape& shape, const Floats& v, bool weight) {
  return g.add_constant(name, TensorType(DType::kF32, shape), v.data(), v.size() * 4, weight);
}

inline ValueId f32_weight(Graph& g, const std::string& name, const Shape& shape, uint32_t seed, float lo = -1.0f,
                          float hi = 1.0f) {
  return f32_constant(g, name, shape, random_floats(numel(shape), seed, lo, hi), true);
}

inline ValueId permute(Graph& g, ValueId v, const Shape& perm) {
  Attrs a;
  a.set("perm", perm);
  return g.add_node1(OpKind::kPermute, {v}, a);
}

inline ValueId reshape(Graph& g, ValueId v, const Shape& shape) {
  Attrs a;
  a.set("shape", shape);
  return g.add_node1(OpKind::kReshape, {v}, a);
}

inline ValueId expand(Graph& g, ValueId v, const Shape& shape) {
  Attrs a;
  a.set("shape", shape);
  return g.add_node1(OpKind::kExpand, {v}, a);
}

inline ValueId slice(Graph& g, ValueId v, int64_t axis, int64_t start, int64_t end, int64_t step = 1) {
  Attrs a;
  a.set("axis", axis);
  a.set("start", start);
  a.set("end", end);
  a.set("step", step);
  return g.add_node1(OpKind::kSlice, {v}, a);
}

inline ValueId concat(Graph& g, const std::vector<ValueId>& parts, int64_t axis) {
  Attrs a;
  a.set("axis", axis);
  return g.add_node1(OpKind::kConcat, parts, a);
}

// An i64 arange(start, end) node; `sized` as an importer marks one in a dynamic program's block
// (fold_constants then leaves it a node).
inline ValueId i64_arange(Graph& g, int64_t start, int64_t end, bool sized) {
  Attrs a;
  a.set("start", double(start));
  a.set("end", double(end));
  a.set("step", 1.0);
  a.set("dtype", DType::kI64);
  const ValueId v = g.add_node1(OpKind::kArange, {}, a);
  g.value(v).sized = sized;
  return v;
}

inline Attrs conv2d_attrs(int64_t stride, int64_t pad, int64_t groups) {
  Attrs a;
  a.set("stride", Shape{stride, stride});
  a.set("padding", Shape{pad, pad});
  a.set("dilation", Shape{1, 1});
  a.set("groups", groups);
  return a;
}

// Runs an engine with f32 inputs and outputs; returns its outputs.
inline std::vector<Floats> run_engine(const std::shared_ptr<Engine>& e, const std::vector<Floats>& inputs) {
  std::vector<const void*> in;
  for (const Floats& x : inputs) in.push_back(x.data());
  std::vector<Floats> outs;
  for (const IOTensor& o : e->outputs()) {
    EXPECT_EQ(o.type.dtype, DType::kF32) << o.name;
    outs.emplace_back(size_t(o.type.numel()), std::nanf(""));
  }
  std::vector<void*> out;
  for (Floats& o : outs) out.push_back(o.data());
  e->create_execution_context()->execute(in, out);
  return outs;
}

// Runs the graph as given (no passes) on f32 inputs; returns its f32 outputs.
inline std::vector<Floats> run_plain(const Graph& g, const std::vector<Floats>& inputs) {
  return run_engine(Engine::create(g, Device{}, KernelOptions{}), inputs);
}

inline std::vector<Floats> random_inputs(const Graph& g, uint32_t seed) {
  std::vector<Floats> in;
  for (ValueId v : g.inputs()) in.push_back(random_floats(size_t(g.type(v).numel()), seed++));
  return in;
}

// |got - want| <= atol + rtol |want| elementwise.
inline void expect_close(const std::vector<Floats>& got, const std::vector<Floats>& want, float rtol, float atol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    ASSERT_EQ(got[k].size(), want[k].size()) << "output " << k;
    for (size_t i = 0; i < got[k].size(); ++i)
      ASSERT_NEAR(got[k][i], want[k][i], atol + rtol * std::fabs(want[k][i])) << "output " << k << " element " << i;
  }
}

// max |got - want| / max(|want|): the relative error of a whole output.
inline double relative_error(const Floats& got, const Floats& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num = std::max(num, double(std::fabs(got[i] - want[i])));
    den = std::max(den, double(std::fabs(want[i])));
  }
  return den > 0 ? num / den : num;
}

// Runs `pass` on a copy of g and checks that it changed the graph, that the result verifies and
// that it computes what g computes on random inputs (expect_close with rtol = atol = tol).
template <typename Pass>
Graph pass_applied(const Graph& g, Pass&& pass, uint32_t seed, float tol) {
  Graph f = g;
  EXPECT_TRUE(pass(f)) << g.to_string();
  f.verify();
  const auto in = random_inputs(g, seed);
  expect_close(run_plain(f, in), run_plain(g, in), tol, tol);
  return f;
}

// pass_applied with to_channels_last, then fold_constants (the permuted constants folded).
inline Graph channels_last_applied(const Graph& g, uint32_t seed, float tol) {
  return pass_applied(
      g,
      [](Graph& f) {
        const bool changed = to_channels_last(f);
        fold_constants(f);
        return changed;
      },
      seed, tol);
}

inline int count_ops(const Graph& g, OpKind op) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node->op == op;
  return n;
}

}  // namespace kiln::test
