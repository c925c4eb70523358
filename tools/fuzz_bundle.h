// Bundles for the file fuzzer (tools/fuzz_engine_reader.cpp) and tests/cpp/test_bundle.cpp: seed
// bundles built from the seed networks of tools/fuzz_engine.h, and what is done with each input
// (load, then run on random inputs).
//
// A bundle's fixed header and trailer are laid out as an engine file's, so fuzz::mutate and
// fuzz::reseal serve both; run_any tells them apart by their magic.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "kiln/bundle.h"
#include "tools/fuzz_engine.h"

namespace kiln::fuzz {

// Two bundles. The first routes values every way the glue can: one engine called twice, the
// second call taking the first's output, another engine on a third input, and outputs that
// repeat a value or are a program input:
//   inputs x f32[2,3,4], y f32[3,4], u f32[2,8]
//   step 0 "first":  pointwise(x, y) -> z        step 1 "second": pointwise(z, y) -> z2
//   step 2 "linear": linear(u) -> probs, mean
//   outputs z2, z, y, probs, z
// The second is one call of the conv network.
inline std::vector<Bytes> seed_bundles() {
  Rng rng{11};
  const Bytes pointwise = Builder().build(pointwise_network(rng))->serialize();
  const Bytes linear = Builder().build(linear_network(rng))->serialize();
  const Bytes conv = Builder().build(conv_network(rng))->serialize();
  BundleProgram p;
  p.inputs = {{"x", f32({2, 3, 4})}, {"y", f32({3, 4})}, {"u", f32({2, 8})}};
  p.steps = {{"first", 0, {{-1, 0}, {-1, 1}}}, {"second", 0, {{0, 0}, {-1, 1}}}, {"linear", 1, {{-1, 2}}}};
  p.outputs = {{"z2", {1, 0}, f32({2, 3, 4})},
               {"z", {0, 0}, f32({2, 3, 4})},
               {"y", {-1, 1}, f32({3, 4})},
               {"probs", {2, 0}, f32({2, 4})},
               {"z_again", {0, 0}, f32({2, 3, 4})}};
  BundleProgram one;
  one.inputs = {{"x", f32({1, 3, 8, 8})}};
  one.steps = {{"conv", 0, {{-1, 0}}}};
  one.outputs = {{"y", {0, 0}, f32({1, 3})}, {"features", {0, 1}, f32({1, 4, 8, 8})}};
  return {write_bundle({std::span<const uint8_t>(pointwise), std::span<const uint8_t>(linear)}, p),
          write_bundle({std::span<const uint8_t>(conv)}, one)};
}

// Runs a loaded bundle once on random inputs, unless its buffers exceed kMaxRunBytes.
inline void exercise(const std::shared_ptr<Bundle>& bundle, Rng& rng) {
  size_t budget = kMaxRunBytes;
  for (const auto& e : bundle->engines())
    if (!fits(budget, e->memory_plan().arena_bytes) || !fits(budget, e->workspace_size())) return;
  for (const IOTensor& o : bundle->outputs())
    if (!fits(budget, o.type.nbytes())) return;
  std::vector<Bytes> ins;
  if (!buffers_for(bundle->inputs(), rng, budget, ins)) return;
  (void)bundle->run(ins);
}

// One input, an engine file or a bundle: a Kiln error anywhere is a fine outcome; everything
// else escapes. Returns whether the file loaded.
inline bool run_any(const Bytes& file) {
  if (!Bundle::has_bundle_magic(file.data(), file.size())) return run_one(file);
  Rng rng{serialize::checksum64(file.data(), file.size())};
  std::shared_ptr<Bundle> bundle;
  try {
    bundle = Bundle::deserialize(file.data(), file.size());
    exercise(bundle, rng);
  } catch (const Error&) {
  }
  return bundle != nullptr;
}

}  // namespace kiln::fuzz
