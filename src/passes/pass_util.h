// Small pieces the graph passes share: reading a constant's elements as doubles, making a
// derived constant from doubles, and the rule that names constants a pass creates.
//
// Element conversion goes through the CPU backend's accessors so that a constant folded by a
// pass holds exactly the bits the reference kernels would have produced.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/errors.h"
#include "kiln/ir.h"
#include "src/backends/cpu/kernels.h"

namespace kiln::passes {

// Every element of constant `v`, converted to double.
inline std::vector<double> constant_as_doubles(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  KILN_CHECK(val.is_constant(), kInternal, "value %", v, " is not a constant");
  const int64_t n = val.type.numel();
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = cpu::load_as_double(val.data->data(), val.type.dtype, i);
  return out;
}

// The bytes of a `dt` tensor holding `xs` (rounded as the CPU backend rounds).
inline std::shared_ptr<const Bytes> bytes_from_doubles(DType dt, const std::vector<double>& xs) {
  auto bytes = std::make_shared<Bytes>(xs.size() * dtype_size(dt));
  for (size_t i = 0; i < xs.size(); ++i) cpu::store_double(bytes->data(), dt, int64_t(i), xs[i]);
  return bytes;
}

// Constants made by passes are not weights (a refit cannot address them by a model name);
// their name only tells a reader of the plan where they came from. `tag` says which pass.
inline std::string derived_constant_name(const Graph& g, const char* tag) {
  return std::string(tag) + "." + std::to_string(g.num_values());
}

}  // namespace kiln::passes
