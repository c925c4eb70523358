// The engine file fuzzer's loop (tools/fuzz_engine.h) as a test: its seed engines load, run
// and refit cleanly, and a fixed-seed run of mutated files through load, execute, refit,
// execute and serialize only ever throws kiln::Error. scripts/test.sh runs the same loop for
// longer in a sanitizer build (tools/fuzz_engine_reader.cpp).
#include <gtest/gtest.h>

#include <exception>
#include <vector>

#include "tools/fuzz_engine.h"

using namespace kiln;

TEST(EngineFuzz, SeedEnginesRunAndRefit) {
  const std::vector<Bytes> seeds = fuzz::seed_files();
  ASSERT_GE(seeds.size(), 6u);
  for (size_t i = 0; i < seeds.size(); ++i) {
    auto engine = Engine::deserialize(seeds[i].data(), seeds[i].size());
    EXPECT_TRUE(engine->refittable()) << "seed " << i;
    fuzz::Rng rng{i};
    EXPECT_NO_THROW(fuzz::exercise(engine, rng)) << "seed " << i;
    EXPECT_EQ(engine->weights_version(), 1u) << "seed " << i << " was not refitted";
  }
}

TEST(EngineFuzz, MutatedFilesOnlyThrowKilnErrors) {
  const std::vector<Bytes> seeds = fuzz::seed_files();
  fuzz::Rng rng{20250101};
  int loaded = 0;
  for (int it = 0; it < 2000; ++it) {
    Bytes file = seeds[size_t(rng.below(seeds.size()))];
    fuzz::mutate(file, seeds, rng);
    try {
      loaded += fuzz::run_one(file);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "mutation " << it << " threw a non-Kiln exception: " << e.what();
    }
  }
  // Mutations of weight bytes load; most others are refused.
  EXPECT_GT(loaded, 0);
  EXPECT_LT(loaded, 2000);
}
