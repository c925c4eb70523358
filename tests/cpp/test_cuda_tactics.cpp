// Tactic timing on a GPU (src/backends/cuda/tuning/tactics.cpp): candidates are measured by their
// device time as a CUDA-graph replay runs them, not by what launching them costs the host; a
// candidate that cannot be recorded into a graph is still timed (directly); one that throws is
// skipped; one far slower than the fastest is pruned after a few rounds of samples. Skipped
// without a CUDA device.
#ifdef KILN_WITH_CUDA

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "kiln/kiln.h"
#include "src/backends/cuda/tuning/tactics.h"

namespace {

using namespace kiln;
using cuda::Candidate;
using cuda::time_candidates;

constexpr size_t kBig = size_t(256) << 20;  // a 256 MiB memset: about 100 us on an H100

struct Buffers {
  std::shared_ptr<void> big, small;
};

Buffers allocate() {
  Backend& gpu = get_backend(Device::parse("cuda:0"));
  return {gpu.allocate(kBig), gpu.allocate(256)};
}

// Device-light, host-heavy: a 1 ms host stall, then a 4-byte memset.
Candidate host_heavy(const Buffers& b) {
  return [p = b.small.get()](cudaStream_t s) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(cudaMemsetAsync(p, 0, 4, s), cudaSuccess);
  };
}

// Device-heavy, host-light: one large memset.
Candidate device_heavy(const Buffers& b) {
  return [p = b.big.get()](cudaStream_t s) { ASSERT_EQ(cudaMemsetAsync(p, 1, kBig, s), cudaSuccess); };
}

// Device-heavier: four large memsets, four times the device time of device_heavy.
Candidate device_heavier(const Buffers& b) {
  return [p = b.big.get()](cudaStream_t s) {
    for (int i = 0; i < 4; ++i) ASSERT_EQ(cudaMemsetAsync(p, 1, kBig, s), cudaSuccess);
  };
}

TEST(CudaTactics, TheCandidateWithLessDeviceTimeWinsHoweverLongItsLaunchTakes) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  const Buffers b = allocate();
  std::string report;
  // Launched directly, the host-heavy candidate would take 1 ms a run against ~0.1 ms.
  EXPECT_EQ(time_candidates({device_heavy(b), host_heavy(b)}, TacticBudget::kAll, &report), 1u) << report;
  report.clear();
  EXPECT_EQ(time_candidates({host_heavy(b), device_heavy(b)}, TacticBudget::kAll, &report), 0u) << report;
}

TEST(CudaTactics, ACandidateThatCannotBeRecordedIsTimedDirectlyAndOneThatThrowsIsSkipped) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  const Buffers b = allocate();
  // Synchronizing a stream is refused while it records: this one runs only directly, where
  // its large memset makes it the slower one.
  const Candidate unrecordable = [p = b.big.get()](cudaStream_t s) {
    (void)cudaMemsetAsync(p, 1, kBig, s);  // fails once the recording is invalidated
    (void)cudaStreamSynchronize(s);
  };
  const Candidate throws = [](cudaStream_t) { throw std::runtime_error("no such tactic"); };
  std::string report;
  EXPECT_EQ(time_candidates({unrecordable, throws, host_heavy(b)}, TacticBudget::kAll, &report), 2u) << report;
  EXPECT_NE(report.find("#0 "), std::string::npos) << report;  // timed, not failed
  EXPECT_NE(report.find("#1 failed (no such tactic)"), std::string::npos) << report;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(CudaTactics, ACandidateFarSlowerThanTheFastestIsPrunedAndTheFastestStillWins) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  const Buffers b = allocate();
  std::string report;
  EXPECT_EQ(time_candidates({device_heavier(b), device_heavy(b), device_heavier(b)}, TacticBudget::kAll, &report), 1u)
      << report;
  EXPECT_NE(report.find("#0 "), std::string::npos) << report;
  EXPECT_NE(report.find(" us (pruned), #1 "), std::string::npos) << report;   // #0
  EXPECT_NE(report.find(" us (pruned); chose #1"), std::string::npos) << report;  // #2
  EXPECT_EQ(report.find("#1 failed"), std::string::npos) << report;
  const size_t one = report.find("#1 ");
  EXPECT_EQ(report.substr(one, report.find(',', one) - one).find("pruned"), std::string::npos) << report;
}

}  // namespace

#endif  // KILN_WITH_CUDA
