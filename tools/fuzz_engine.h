// The engine file fuzzer (tools/fuzz_engine_reader.cpp is its driver), shared with a test: a
// portable generator, random tensors, the seed engines, the mutations, and what is done with
// each input (load, execute, refit, execute, serialize).
//
// The seed engines are small valid networks covering the op families whose shape rules take
// attributes (conv and pools, linear and norms, fused pointwise, slices and other views,
// attention, gather and generators), built refittable so that refit runs on what loads.
// Their weights are tiny, so that most mutations land in the plan rather than in weight bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/refit.h"
#include "src/serialize/byte_io.h"
#include "src/serialize/engine_file.h"
#include "tools/random_tensors.h"

namespace kiln::fuzz {

using tools::random_tensor;
using tools::Rng;

inline Attrs attrs(std::initializer_list<std::pair<const char*, AttrValue>> items) {
  Attrs a;
  for (const auto& [key, value] : items) a.set(key, value);
  return a;
}

inline ValueId weight(Graph& g, const std::string& name, const TensorType& t, Rng& rng) {
  const Bytes b = random_tensor(t, rng);
  return g.add_constant(name, t, b.data(), b.size(), true);
}
inline TensorType f32(std::vector<int64_t> shape) { return TensorType(DType::kF32, std::move(shape)); }
using Ints = std::vector<int64_t>;

// conv -> relu -> max_pool -> conv_transpose -> avg_pool -> adaptive_avg_pool -> linear.
inline Graph conv_network(Rng& rng) {
  Graph g;
  ValueId x = g.add_input("x", f32({1, 3, 8, 8}));
  ValueId c = g.add_node1(
      OpKind::kConv, {x, weight(g, "conv.w", f32({4, 3, 3, 3}), rng), weight(g, "conv.b", f32({4}), rng)},
      attrs({{"stride", Ints{1, 1}}, {"padding", Ints{1, 1}}, {"dilation", Ints{1, 1}}, {"groups", int64_t{1}}}));
  ValueId p = g.add_node1(
      OpKind::kMaxPool, {g.add_node1(OpKind::kRelu, {c})},
      attrs({{"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}, {"padding", Ints{0, 0}}, {"dilation", Ints{1, 1}}}));
  ValueId t = g.add_node1(OpKind::kConvTranspose, {p, weight(g, "up.w", f32({4, 2, 2, 2}), rng), kNoValue},
                          attrs({{"stride", Ints{2, 2}}, {"padding", Ints{0, 0}}, {"dilation", Ints{1, 1}}}));
  ValueId a = g.add_node1(
      OpKind::kAvgPool, {t},
      attrs({{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}, {"ceil_mode", true}}));
  ValueId q = g.add_node1(OpKind::kAdaptiveAvgPool, {a}, attrs({{"output_size", Ints{2, 2}}}));
  ValueId r = g.add_node1(OpKind::kReshape, {q}, attrs({{"shape", Ints{1, 8}}}));
  ValueId y = g.add_node1(OpKind::kLinear, {r, weight(g, "fc.w", f32({3, 8}), rng), weight(g, "fc.b", f32({3}), rng)});
  g.mark_output(y, "y");
  g.mark_output(c, "features");
  return g;
}

// linear -> gelu -> layer_norm -> linear -> softmax; group_norm and a mean on the side.
inline Graph linear_network(Rng& rng) {
  Graph g;
  ValueId x = g.add_input("x", f32({2, 8}));
  ValueId h = g.add_node1(OpKind::kLinear,
                          {x, weight(g, "fc1.weight", f32({16, 8}), rng), weight(g, "fc1.bias", f32({16}), rng)});
  ValueId a = g.add_node1(OpKind::kGelu, {h}, attrs({{"approximate", std::string("tanh")}}));
  ValueId n =
      g.add_node1(OpKind::kLayerNorm, {a, weight(g, "ln.weight", f32({16}), rng), weight(g, "ln.bias", f32({16}), rng)},
                  attrs({{"normalized_rank", int64_t{1}}, {"eps", 1e-5}}));
  ValueId y = g.add_node1(OpKind::kLinear, {n, weight(g, "fc2.weight", f32({4, 16}), rng), kNoValue});
  g.mark_output(g.add_node1(OpKind::kSoftmax, {y}, attrs({{"axis", int64_t{1}}})), "probs");
  ValueId r = g.add_node1(OpKind::kReshape, {n}, attrs({{"shape", Ints{2, 4, 4}}}));
  ValueId gn = g.add_node1(OpKind::kGroupNorm, {r, weight(g, "gn.weight", f32({4}), rng), kNoValue},
                           attrs({{"groups", int64_t{2}}, {"eps", 1e-5}}));
  g.mark_output(g.add_node1(OpKind::kReduceMean, {gn}, attrs({{"axes", Ints{2}}, {"keepdim", true}})), "mean");
  return g;
}

// Pointwise ops the builder fuses: arithmetic, comparisons, where, clamp, casts.
inline Graph pointwise_network(Rng& rng) {
  Graph g;
  ValueId x = g.add_input("x", f32({2, 3, 4})), y = g.add_input("y", f32({3, 4}));
  ValueId s = g.add_node1(OpKind::kAdd, {x, y});
  ValueId m = g.add_node1(OpKind::kMul, {s, weight(g, "scale", f32({4}), rng)});
  ValueId c = g.add_node1(OpKind::kClamp, {m}, attrs({{"min", -0.5}, {"max", 0.5}}));
  ValueId w = g.add_node1(OpKind::kWhere, {g.add_node1(OpKind::kGt, {x, y}), g.add_node1(OpKind::kSigmoid, {c}),
                                           g.add_node1(OpKind::kTanh, {s})});
  ValueId h = g.add_node1(OpKind::kCast, {w}, attrs({{"dtype", DType::kF16}}));
  ValueId e = g.add_node1(OpKind::kExp, {h});
  g.mark_output(g.add_node1(OpKind::kCast, {e}, attrs({{"dtype", DType::kF32}})), "z");
  return g;
}

inline Attrs slice_attrs(int64_t axis, int64_t start, int64_t end, int64_t step) {
  return attrs({{"axis", axis}, {"start", start}, {"end", end}, {"step", step}});
}

// slice (with steps), permute, concat, split, pad, expand over one input.
inline Graph slice_network(Rng& rng) {
  Graph g;
  ValueId x = g.add_input("x", f32({4, 6, 5}));
  ValueId s = g.add_node1(OpKind::kSlice, {x}, slice_attrs(1, 1, 6, 2));
  ValueId p = g.add_node1(OpKind::kPermute, {s}, attrs({{"perm", Ints{2, 0, 1}}}));
  ValueId t = g.add_node1(OpKind::kSlice, {p}, slice_attrs(0, 0, 5, 3));
  ValueId c =
      g.add_node1(OpKind::kConcat, {t, t, weight(g, "extra", f32({1, 4, 3}), rng)}, attrs({{"axis", int64_t{0}}}));
  std::vector<ValueId> parts = g.add_node(OpKind::kSplit, {c}, attrs({{"axis", int64_t{1}}, {"sizes", Ints{1, 3}}}));
  ValueId pad = g.add_node1(OpKind::kPad, {parts[1]},
                            attrs({{"pads", Ints{1, 1, 0, 2, 1, 0}}, {"mode", std::string("reflect")}}));
  ValueId e = g.add_node1(OpKind::kExpand, {parts[0]}, attrs({{"shape", Ints{5, 2, 3}}}));
  g.mark_output(pad, "padded");
  g.mark_output(g.add_node1(OpKind::kNeg, {e}), "expanded");
  return g;
}

// sdpa (causal) over a query and two matmuls of it.
inline Graph attention_network(Rng& rng) {
  Graph g;
  ValueId q = g.add_input("q", f32({1, 2, 4, 8}));
  ValueId k = g.add_node1(OpKind::kMatmul, {q, weight(g, "wk", f32({8, 8}), rng)});
  ValueId v = g.add_node1(OpKind::kMatmul, {q, weight(g, "wv", f32({8, 8}), rng)});
  g.mark_output(g.add_node1(OpKind::kSdpa, {q, k, v}, attrs({{"causal", true}})), "attn");
  return g;
}

// index_select with constant indices, arange and full.
inline Graph gather_network(Rng& rng) {
  Graph g;
  ValueId x = g.add_input("x", f32({4, 5}));
  const int64_t idx[3] = {3, 0, 2};
  ValueId i = g.add_constant("idx", TensorType(DType::kI64, {3}), idx, sizeof idx);
  ValueId s = g.add_node1(OpKind::kIndexSelect, {x, i}, attrs({{"axis", int64_t{0}}}));
  ValueId r =
      g.add_node1(OpKind::kArange, {}, attrs({{"start", 0.0}, {"end", 5.0}, {"step", 1.0}, {"dtype", DType::kF32}}));
  ValueId f = g.add_node1(OpKind::kFull, {}, attrs({{"shape", Ints{3, 1}}, {"value", 2.0}, {"dtype", DType::kF32}}));
  ValueId w = g.add_node1(OpKind::kMul, {g.add_node1(OpKind::kAdd, {s, r}), f});
  g.mark_output(g.add_node1(OpKind::kMul, {w, weight(g, "w", f32({5}), rng)}), "y");
  return g;
}

// The seed engine files.
inline std::vector<Bytes> seed_files() {
  Rng rng{7};
  std::vector<Bytes> files;
  for (Graph (*make)(Rng&) :
       {&conv_network, &linear_network, &pointwise_network, &slice_network, &attention_network, &gather_network})
    files.push_back(Builder().build(make(rng))->serialize());
  return files;
}

// Sets the size field and the checksum, so that a mutation reaches the parser behind them.
inline void reseal(Bytes& file) {
  if (file.size() < serialize::kEngineHeaderFixedBytes + serialize::kEngineTrailerBytes) return;
  for (int i = 0; i < 8; ++i) file[12 + size_t(i)] = uint8_t(uint64_t(file.size()) >> (8 * i));
  serialize::reseal_engine_file(file);
}

// One to four edits: bit flips, random bytes, inserted and erased bytes, boundary integers of
// 1, 4 or 8 bytes (extents, attributes, counts) and spans copied from another seed; resealed
// but for one input in sixteen.
inline void mutate(Bytes& file, const std::vector<Bytes>& seeds, Rng& rng) {
  static constexpr uint64_t kBoundary[] = {0,
                                           1,
                                           2,
                                           3,
                                           0x7f,
                                           0x80,
                                           0xff,
                                           0x7fffffff,
                                           0x80000000,
                                           0xffffffff,
                                           uint64_t(1) << 31,
                                           uint64_t(1) << 32,
                                           uint64_t(1) << 62,
                                           0x7fffffffffffffff,
                                           0x8000000000000000,
                                           ~uint64_t(0)};
  const int edits = 1 + int(rng.below(4));
  for (int k = 0; k < edits && !file.empty(); ++k) {
    const size_t pos = size_t(rng.below(file.size()));
    switch (rng.below(6)) {
      case 0: file[pos] ^= uint8_t(1u << rng.below(8)); break;
      case 1: file[pos] = uint8_t(rng.next()); break;
      case 2: file.insert(file.begin() + long(pos), uint8_t(rng.next())); break;
      case 3: file.erase(file.begin() + long(pos)); break;
      case 4: {
        const size_t width = size_t(1) << (rng.below(3) == 0 ? 0 : rng.below(2) == 0 ? 2 : 3);
        const uint64_t v = kBoundary[rng.below(std::size(kBoundary))];
        for (size_t b = 0; b < width && pos + b < file.size(); ++b) file[pos + b] = uint8_t(v >> (8 * b));
        break;
      }
      default: {
        const Bytes& other = seeds[size_t(rng.below(seeds.size()))];
        const size_t from = size_t(rng.below(other.size())), n = size_t(1 + rng.below(32));
        for (size_t b = 0; b < n && from + b < other.size() && pos + b < file.size(); ++b)
          file[pos + b] = other[from + b];
      }
    }
  }
  if (rng.below(16) != 0) reseal(file);
}

// Engines whose buffers (inputs, outputs, arena, workspace, a refitted weight) need more than
// this are loaded but not run: a mutated extent can ask for any size.
inline constexpr size_t kMaxRunBytes = size_t(64) << 20;

inline bool fits(size_t& budget, size_t bytes) {
  if (bytes > budget) return false;
  budget -= bytes;
  return true;
}

// Buffers for each of `ios`, drawn from `rng`; false when they exceed the budget.
inline bool buffers_for(const std::vector<IOTensor>& ios, Rng& rng, size_t& budget, std::vector<Bytes>& out) {
  for (const IOTensor& io : ios) {
    if (!fits(budget, io.type.nbytes())) return false;
    out.push_back(random_tensor(io.type, rng));
  }
  return true;
}

inline void execute(ExecutionContext& ctx, const std::vector<Bytes>& ins, std::vector<Bytes>& outs) {
  std::vector<const void*> in;
  std::vector<void*> out;
  for (const Bytes& b : ins) in.push_back(b.data());
  for (Bytes& b : outs) out.push_back(b.data());
  ctx.execute(in, out);
}

// Runs a loaded engine, refits every weight it takes and runs it again.
inline void exercise(const std::shared_ptr<Engine>& engine, Rng& rng) {
  size_t budget = kMaxRunBytes;
  std::vector<Bytes> ins, outs;
  if (!fits(budget, engine->memory_plan().arena_bytes) || !fits(budget, engine->workspace_size()) ||
      !buffers_for(engine->inputs(), rng, budget, ins) || !buffers_for(engine->outputs(), rng, budget, outs))
    return;
  std::unique_ptr<ExecutionContext> ctx = engine->create_execution_context();
  execute(*ctx, ins, outs);
  if (!engine->refittable()) return;
  Refitter refitter(engine);
  for (const std::string& name : refitter.weight_names()) {
    const TensorType type = refitter.weight_type(name);
    if (!fits(budget, type.nbytes())) return;
    const Bytes data = random_tensor(type, rng);
    refitter.set_weight(name, type, data.data());
  }
  refitter.refit();
  execute(*ctx, ins, outs);
  (void)engine->serialize();
}

// One input: a Kiln error anywhere is a fine outcome; everything else escapes. Returns
// whether the file loaded.
inline bool run_one(const Bytes& file) {
  Rng rng{serialize::checksum64(file.data(), file.size())};  // replaying an input replays its run
  std::shared_ptr<Engine> engine;
  try {
    engine = Engine::deserialize(file.data(), file.size());
    exercise(engine, rng);
  } catch (const Error&) {
  }
  return engine != nullptr;
}

}  // namespace kiln::fuzz
