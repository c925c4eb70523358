// The build turn (src/backends/cuda/tuning/build_turn.h) and TimingClaim (tactics.h), with which a CUDA
// build makes several kernels at once: one thread at a time holds the turn; one that gives it up
// (OffTurn) lets another in and gets it back; a second claim of a timing key waits, off its
// turn, for the first; a graph's recording (DeviceTurn) keeps build workers out; background turns
// come after foreground ones. No device is needed, except for the support kernel case (skipped
// without one): build workers that ask for one kernel at once get it, none left waiting.
#ifdef KILN_WITH_CUDA

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kiln/kiln.h"
#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/tuning/build_turn.h"
#include "src/backends/cuda/tuning/tactics.h"
#include "src/common/run_parts.h"

namespace {

using namespace kiln::cuda;
using namespace std::chrono_literals;

// Waits up to 10 s for `done`; a broken turn shows as a failed wait, not a hung test.
bool wait_for(std::atomic<bool>& done) {
  for (int i = 0; i < 10000 && !done; ++i) std::this_thread::sleep_for(1ms);
  return done;
}

TEST(BuildTurn, OneThreadAtATimeHoldsIt) {
  std::atomic<int> inside{0}, most{0};
  kiln::run_parts(6, [&](size_t) {
    for (int k = 0; k < 50; ++k) {
      const BuildTurn turn;
      EXPECT_TRUE(holds_build_turn());
      const int now = ++inside;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      std::this_thread::sleep_for(10us);
      --inside;
    }
  });
  EXPECT_EQ(most.load(), 1);
  EXPECT_FALSE(holds_build_turn());
}

TEST(BuildTurn, OffTurnLetsAnotherThreadInAndTakesTheTurnBack) {
  std::atomic<bool> a_off{false}, b_ran{false};
  std::thread a([&] {
    const BuildTurn turn;
    {
      const OffTurn off;
      EXPECT_FALSE(holds_build_turn());
      a_off = true;
      EXPECT_TRUE(wait_for(b_ran)) << "the other thread never got the turn";
    }
    EXPECT_TRUE(holds_build_turn());
  });
  ASSERT_TRUE(wait_for(a_off));
  std::thread b([&] {
    const BuildTurn turn;  // would wait forever if OffTurn had not given the turn up
    b_ran = true;
  });
  b.join();
  a.join();
}

TEST(BuildTurn, ADeviceTurnExcludesBuildWorkersAndNestsInsideATurn) {
  std::atomic<bool> worker_in{false};
  std::thread worker;
  {
    const DeviceTurn turn;  // a graph being recorded
    EXPECT_TRUE(holds_build_turn());
    {
      const DeviceTurn nested;  // a whole-device synchronize inside it: no second lock
      EXPECT_TRUE(holds_build_turn());
    }
    EXPECT_TRUE(holds_build_turn());
    worker = std::thread([&] {
      const BuildTurn build;  // a build worker timing a kernel waits for the recording
      worker_in = true;
    });
    std::this_thread::sleep_for(20ms);
    EXPECT_FALSE(worker_in.load()) << "a build worker ran while a graph was being recorded";
  }
  EXPECT_FALSE(holds_build_turn());
  worker.join();
  EXPECT_TRUE(worker_in.load());
  {
    const BuildTurn build;  // and a device turn inside a build's turn takes nothing more
    const DeviceTurn inside;
    EXPECT_TRUE(holds_build_turn());
  }
  EXPECT_FALSE(holds_build_turn());
}

TEST(BuildTurn, OffTurnWithoutATurnDoesNothing) {
  EXPECT_FALSE(holds_build_turn());
  {
    const OffTurn off;
    const OffTurn nested;
    EXPECT_FALSE(holds_build_turn());
  }
  const BuildTurn turn;
  {
    const OffTurn off;
    const OffTurn nested;  // the turn is already given up: nothing more to give
    EXPECT_FALSE(holds_build_turn());
  }
  EXPECT_TRUE(holds_build_turn());
}

// Background turns (an instance timed while calls are served) come after foreground ones: not
// while one is held or wanted, nor within kQuietMs of the last one's end.
TEST(BuildTurn, ABackgroundTurnWaitsForForegroundTurnsAndTheirQuietTime) {
  std::atomic<bool> background_in{false};
  std::chrono::steady_clock::time_point released, entered;
  std::thread background;
  {
    const BuildTurn turn;  // foreground
    background = std::thread([&] {
      const BuildTurn mine(TurnPriority::kBackground);
      entered = std::chrono::steady_clock::now();
      background_in = true;
    });
    std::this_thread::sleep_for(20ms);
    EXPECT_FALSE(background_in.load());
    released = std::chrono::steady_clock::now();
  }
  ASSERT_TRUE(wait_for(background_in));
  background.join();
  EXPECT_GE(entered - released, std::chrono::milliseconds(kQuietMs) - 1ms)
      << "a background turn was taken before the foreground had been quiet for kQuietMs";
}

TEST(BuildTurn, ABackgroundTurnYieldsToAForegroundOneBetweenItsSteps) {
  std::this_thread::sleep_for(std::chrono::milliseconds(2 * kQuietMs));  // earlier tests' foreground turns
  std::mutex mu;
  std::vector<std::string> events;
  auto note = [&](const char* e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(e);
  };
  std::atomic<bool> stepping{false}, foreground_done{false};
  std::thread background([&] {
    const BuildTurn turn(TurnPriority::kBackground);
    yield_build_turn();  // nobody else wants the turn: it stays
    EXPECT_TRUE(holds_build_turn());
    note("background step 1");
    stepping = true;
    for (int i = 0; i < 10000 && !foreground_done; ++i) {
      std::this_thread::sleep_for(1ms);  // a timing round
      yield_build_turn();
      EXPECT_TRUE(holds_build_turn());
    }
    note("background step 2");
  });
  ASSERT_TRUE(wait_for(stepping));
  std::thread foreground([&] {
    const BuildTurn turn;  // waits for the background's next step only
    note("foreground");
    foreground_done = true;
  });
  foreground.join();
  background.join();
  EXPECT_EQ(events, (std::vector<std::string>{"background step 1", "foreground", "background step 2"}));
}

TEST(BuildTurn, YieldingOutsideABackgroundTurnDoesNothing) {
  yield_build_turn();
  EXPECT_FALSE(holds_build_turn());
  const BuildTurn turn;
  yield_build_turn();
  EXPECT_TRUE(holds_build_turn());
}

// Worker A holds the turn and a claim; worker B, holding the turn once A gives it up, claims the
// same key: B must wait for A's release without keeping the turn, or A could never finish.
TEST(TimingClaim, ASecondClaimOfAKeyWaitsForTheFirstOffItsTurn) {
  const std::string key = "build-turn-test|same key";
  std::mutex mu;
  std::vector<std::string> events;
  auto note = [&](const char* e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(e);
  };
  std::atomic<bool> a_claimed{false};
  std::thread a([&] {
    const BuildTurn turn;
    {
      const TimingClaim claim(key);
      note("a claimed");
      a_claimed = true;
      {
        const OffTurn off;  // compiling, say: B gets the turn meanwhile
        std::this_thread::sleep_for(50ms);
      }
      note("a releases");
    }
  });
  ASSERT_TRUE(wait_for(a_claimed));
  std::thread b([&] {
    const BuildTurn turn;
    const TimingClaim claim(key);
    EXPECT_TRUE(holds_build_turn());
    note("b claimed");
  });
  a.join();
  b.join();
  EXPECT_EQ(events, (std::vector<std::string>{"a claimed", "a releases", "b claimed"}));
}

TEST(TimingClaim, ClaimsOfOtherKeysDoNotWait) {
  const TimingClaim first("build-turn-test|key 1");
  std::atomic<bool> done{false};
  std::thread other([&] {
    const TimingClaim second("build-turn-test|key 2");
    done = true;
  });
  EXPECT_TRUE(wait_for(done));
  other.join();
}

// Each worker holds the turn when it asks, as a build's workers do when a kernel they time needs
// the launch fence; compiling gives the turn up, so a lock held across the compile would leave
// the next worker waiting on it with the turn, and the compiling one waiting for the turn.
TEST(BuildTurn, WorkersAskingForOneSupportKernelAtOnceAllGetIt) {
  if (!kiln::backend_available(kiln::DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  struct Shared {  // outlives the test if the workers are stuck (the thread is then detached)
    std::vector<cudaKernel_t> got = std::vector<cudaKernel_t>(6, nullptr);
    std::atomic<int> done{0};
    std::atomic<bool> all{false};
  };
  auto shared = std::make_shared<Shared>();
  std::thread watched([shared] {
    kiln::run_parts(shared->got.size(), [&](size_t i) {
      const BuildTurn turn;
      shared->got[i] = Module::support_kernel("extern \"C\" __global__ void kiln_turn_test(int* p) { if (p) *p = 1; }",
                                              "kiln_turn_test", "the build turn test kernel");
      ++shared->done;
    });
    shared->all = true;
  });
  if (!wait_for(shared->all)) {
    ADD_FAILURE() << shared->done.load() << " of " << shared->got.size()
                  << " workers got the kernel; the rest are stuck";
    watched.detach();
    return;
  }
  watched.join();
  for (cudaKernel_t k : shared->got) EXPECT_EQ(k, shared->got[0]);
  EXPECT_NE(shared->got[0], nullptr);
}

}  // namespace

#endif  // KILN_WITH_CUDA
