// Shared pieces of the engine file tests: the checksum and byte layout re-implemented from
// the format description in src/serialize/engine_file.h (so the tests pin the documented
// format), and the engines the tests write and read.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::engine_file_test {

// ---- independent format helpers -------------------------------------------------------
// checksum64 as byte_io.h describes it, byte by byte and word by word, one chunk at a time.
inline uint64_t block_sum_ref(const uint8_t* p, size_t n) {
  const uint64_t m = 0x9e3779b97f4a7c15ull;
  uint64_t lane[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull};
  for (size_t word = 0; word * 8 < n; ++word) {
    uint64_t w = 0;
    for (size_t j = 0; j < 8 && word * 8 + j < n; ++j) w |= uint64_t(p[word * 8 + j]) << (8 * j);
    uint64_t x = (lane[word % 4] ^ w) * m;
    lane[word % 4] = (x << 31) | (x >> 33);
  }
  uint64_t h = uint64_t(n) * m;
  for (uint64_t l : lane) {
    h = (h ^ l) * m;
    h ^= h >> 32;
  }
  return h;
}
inline uint64_t checksum_ref(const uint8_t* p, size_t n) {
  const size_t chunk = size_t(1) << 20;
  if (n <= chunk) return block_sum_ref(p, n);
  std::vector<uint8_t> sums;
  for (size_t at = 0; at < n; at += chunk) {
    const uint64_t h = block_sum_ref(p + at, std::min(chunk, n - at));
    for (int b = 0; b < 8; ++b) sums.push_back(uint8_t(h >> (8 * b)));
  }
  return block_sum_ref(sums.data(), sums.size());
}
inline uint64_t get_le(const Bytes& b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(b.at(at + size_t(i))) << (8 * i);
  return v;
}
inline void put_le(Bytes& b, size_t at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.at(at + size_t(i)) = uint8_t(v >> (8 * i));
}
// Rewrites the size field and the trailing checksum after an edit.
inline void reseal(Bytes& b) {
  put_le(b, 12, b.size(), 8);
  put_le(b, b.size() - 8, checksum_ref(b.data(), b.size() - 8), 8);
}

struct SectionAt {
  std::string tag;
  size_t length_at, payload_at;
  uint64_t length;
};
struct Layout {
  size_t backend_at, device_at, count_at;  // offsets of the header's length-prefixed fields
  std::vector<SectionAt> sections;
};
inline Layout parse_layout(const Bytes& b) {
  Layout l;
  size_t at = 20;
  at += 4 + get_le(b, at, 4);  // kiln version
  l.backend_at = at;
  at += 4 + get_le(b, at, 4);
  l.device_at = at;
  at += 4 + get_le(b, at, 4);
  l.count_at = at;
  uint64_t n = get_le(b, at, 4);
  at += 4;
  for (uint64_t i = 0; i < n; ++i) {
    SectionAt s;
    s.tag = std::string(reinterpret_cast<const char*>(&b[at]), 4);
    s.length_at = at + 4;
    s.length = get_le(b, at + 4, 8);
    s.payload_at = at + 12;
    at = s.payload_at + s.length;
    l.sections.push_back(s);
  }
  EXPECT_EQ(at + 8, b.size()) << "sections must end at the trailer";
  return l;
}
// The tag is a string_view: a std::string parameter would bind a temporary, which g++ 13's
// -Wdangling-reference takes for the referent of the returned reference.
inline const SectionAt& section(const Layout& l, std::string_view tag) {
  for (const auto& s : l.sections)
    if (s.tag == tag) return s;
  throw std::runtime_error("no section " + std::string(tag));
}
// Replaces the length-prefixed string at `at` with `s`.
inline void replace_string(Bytes& b, size_t at, const std::string& s) {
  size_t old = size_t(get_le(b, at, 4));
  Bytes repl(4 + s.size());
  put_le(repl, 0, s.size(), 4);
  std::memcpy(repl.data() + 4, s.data(), s.size());
  b.erase(b.begin() + long(at), b.begin() + long(at + 4 + old));
  b.insert(b.begin() + long(at), repl.begin(), repl.end());
  reseal(b);
}

inline ErrorCode code_of(const Bytes& b, std::string* message = nullptr) {
  try {
    Engine::deserialize(b.data(), b.size());
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  ADD_FAILURE() << "the damaged file loaded";
  return ErrorCode::kInternal;
}

// ---- engines --------------------------------------------------------------------------
inline std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline ValueId weight(Graph& g, const std::string& name, std::vector<int64_t> shape, uint32_t seed) {
  TensorType t(DType::kF32, shape);
  auto v = random_floats(size_t(t.numel()), seed);
  return g.add_constant(name, t, v.data(), v.size() * 4, true);
}

// x -> linear -> relu -> leaky_relu -> gelu(tanh) -> linear (no bias) -> reshape -> permute
//   -> softmax -> reduce_sum(keepdim) -> cast f16; every attribute kind but float lists.
inline Graph mlp_network() {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {3, 8}));
  ValueId h = g.add_node1(OpKind::kLinear, {x, weight(g, "fc1.weight", {16, 8}, 1), weight(g, "fc1.bias", {16}, 2)});
  ValueId r = g.add_node1(OpKind::kRelu, {h});
  Attrs leaky;
  leaky.set("negative_slope", 0.1);
  ValueId l = g.add_node1(OpKind::kLeakyRelu, {r}, leaky);
  Attrs gelu;
  gelu.set("approximate", std::string("tanh"));
  ValueId ge = g.add_node1(OpKind::kGelu, {l}, gelu, "act");
  ValueId y = g.add_node1(OpKind::kLinear, {ge, weight(g, "fc2.weight", {4, 16}, 3), kNoValue});
  Attrs shape;
  shape.set("shape", std::vector<int64_t>{2, 6});
  ValueId p = g.add_node1(OpKind::kReshape, {y}, shape);
  Attrs perm;
  perm.set("perm", std::vector<int64_t>{1, 0});
  ValueId q = g.add_node1(OpKind::kPermute, {p}, perm);
  Attrs axis;
  axis.set("axis", int64_t{1});
  ValueId s = g.add_node1(OpKind::kSoftmax, {q}, axis);
  Attrs red;
  red.set("axes", std::vector<int64_t>{1});
  red.set("keepdim", true);
  ValueId m = g.add_node1(OpKind::kReduceSum, {s}, red);
  Attrs cast;
  cast.set("dtype", DType::kF16);
  ValueId c = g.add_node1(OpKind::kCast, {m}, cast);
  g.mark_output(s, "probs");
  g.mark_output(c, "sum");
  g.mark_output(r, "hidden");
  return g;
}

inline std::shared_ptr<Engine> mlp_engine() { return Builder().build(mlp_network()); }

// A plan made by hand: a fused_pointwise node carrying every attribute kind, placed before
// an older node that uses it (a use of a higher ValueId), two weights sharing one buffer,
// and a symbolic batch dimension.
inline std::shared_ptr<Engine> fused_engine() {
  TensorType t(DType::kF32, {2, 4});
  t.dims[0].symbol = "B";
  t.dims[0].min = 1;
  t.dims[0].max = 16;
  auto body = std::make_shared<Graph>();
  ValueId a = body->add_input("a", t), b = body->add_input("b", t);
  body->mark_output(body->add_node1(OpKind::kRelu, {body->add_node1(OpKind::kMul, {a, b})}), "out");

  Graph g;
  ValueId x = g.add_input("x", t);
  auto data = random_floats(8, 7);
  auto shared = std::make_shared<const HostBuffer>(reinterpret_cast<const uint8_t*>(data.data()),
                                              reinterpret_cast<const uint8_t*>(data.data()) + 32);
  ValueId w = g.add_constant("scale", t, shared, true);
  ValueId w2 = g.add_constant("scale_copy", t, shared, true);
  ValueId n = g.add_node1(OpKind::kNeg, {x});
  ValueId y = g.add_node1(OpKind::kAdd, {n, w2}, {}, "late_add");
  ValueId f = g.insert_fused(0, {x, w}, body, "fused0")[0];
  Attrs all;
  all.set("b", true);
  all.set("i", int64_t{-42});
  all.set("f", 2.5e-7);
  all.set("s", std::string("text with \"quotes\""));
  all.set("ints", std::vector<int64_t>{1, -2, 1LL << 40});
  all.set("floats", std::vector<double>{0.5, -1e300, 3.0});
  all.set("t", DType::kBF16);
  g.nodes()[0]->attrs = all;
  g.replace_all_uses(n, f);
  g.erase_node(1);  // the neg node, now unused
  g.mark_output(y, "y");
  g.mark_output(f, "f");
  g.compact();
  KernelOptions opts;
  opts.optimization_level = 2;
  opts.workspace_limit = 12345678;
  return Engine::create(std::move(g), Device{}, opts, "hand-made plan\n");
}

// x + w on f32[2,3]: a small file for the damage tests.
inline Bytes small_file() {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3}));
  g.mark_output(g.add_node1(OpKind::kAdd, {x, weight(g, "w", {2, 3}, 5)}), "y");
  BuilderConfig config;
  config.fuse_pointwise = false;
  return Builder(config).build(g)->serialize();
}

inline std::vector<Bytes> run(const Engine& e, const std::vector<Bytes>& inputs) {
  std::vector<Bytes> outs;
  std::vector<const void*> in;
  std::vector<void*> out;
  for (const auto& b : inputs) in.push_back(b.data());
  for (const auto& o : e.outputs()) outs.emplace_back(o.type.nbytes());
  for (auto& b : outs) out.push_back(b.data());
  e.create_execution_context()->execute(in, out);
  return outs;
}

inline std::vector<Bytes> random_inputs(const Engine& e, uint32_t seed) {
  std::vector<Bytes> in;
  for (const auto& i : e.inputs()) {
    auto v = random_floats(size_t(i.type.numel()), seed++);
    in.emplace_back(reinterpret_cast<const uint8_t*>(v.data()), reinterpret_cast<const uint8_t*>(v.data()) + v.size() * 4);
  }
  return in;
}


}  // namespace kiln::engine_file_test
