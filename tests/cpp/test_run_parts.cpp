// run_parts (src/common/run_parts.h): every part runs once, and a part's exception reaches the
// caller only after every part has finished.
#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "src/common/run_parts.h"

namespace kiln {
namespace {

TEST(RunParts, EveryPartRunsExactlyOnce) {
  for (size_t parts : {size_t(0), size_t(1), size_t(3), size_t(8)}) {
    std::vector<std::atomic<int>> runs(parts);
    run_parts(parts, [&](size_t t) { runs[t].fetch_add(1); });
    for (size_t t = 0; t < parts; ++t) EXPECT_EQ(runs[t].load(), 1) << "part " << t << " of " << parts;
  }
}

TEST(RunParts, PartZeroRunsOnTheCallingThread) {
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id zero;
  run_parts(4, [&](size_t t) {
    if (t == 0) zero = std::this_thread::get_id();
  });
  EXPECT_EQ(zero, caller);
}

TEST(RunParts, AFailingPartIsRethrownAfterTheOthersFinish) {
  std::atomic<int> finished{0};
  try {
    run_parts(5, [&](size_t t) {
      if (t == 2) throw std::runtime_error("part 2 failed");
      finished.fetch_add(1);
    });
    FAIL() << "run_parts returned normally";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "part 2 failed");
  }
  EXPECT_EQ(finished.load(), 4);
}

}  // namespace
}  // namespace kiln
