// A build makes several kernels at once (CudaBackend::make_kernels), one node per worker
// thread, but most of a kernel's making must not overlap with another's: timing candidates on
// the device, the cuDNN handle everything executes on, the timing cache's search order. So a
// worker holds the build's turn (BuildTurn) while it makes a kernel, and gives it up only for
// host work on data of its own (OffTurn): NVRTC compiling a generated source, cuDNN finalizing
// plans (which compiles its runtime-fusion kernels), and waiting for another worker's result
// (the same source compiling, the same timing key being searched). Those are most of a cold
// build's time, and they overlap; the device work stays one at a time.
//
// Recording a CUDA graph and synchronizing the whole device take the turn too (DeviceTurn): a
// build on another thread (an instance timed in the background) would otherwise synchronize the
// device in the middle of a capture, which ends the capture with an error.
//
// Background work (an instance whose tactics are timed while an untimed one serves calls,
// kiln/instances.py) yields to the work that serves calls: a background turn is taken only when
// no foreground thread holds or waits for the turn and none has given it up for kQuietMs, and
// tactic timing gives it up between its rounds while that is not so (yield_build_turn). A call's
// instance and its graph recording then wait for one timing round at most, not for whole kernels.
//
// The turn is one mutex; it is held only by threads in a BuildTurn or a DeviceTurn. OffTurn on a thread that
// holds none (a load, a sequential build, the warm-up thread) does nothing, so the code that
// compiles need not know who called it. Rule: no other lock may be held across an OffTurn,
// since taking the turn back while holding one could wait on a worker that waits for that lock.
#pragma once

#include <mutex>

namespace kiln::cuda {

enum class TurnPriority { kForeground, kBackground };

// How long after foreground threads last held the turn a background one may take it: calls made
// back to back (each a new instance or a graph recording) keep background timing out between them.
inline constexpr int kQuietMs = 20;

class BuildTurn {
 public:
  explicit BuildTurn(TurnPriority priority = TurnPriority::kForeground);  // waits for the turn
  ~BuildTurn();
  BuildTurn(const BuildTurn&) = delete;
  BuildTurn& operator=(const BuildTurn&) = delete;

 private:
  std::unique_lock<std::mutex> lock_;
  TurnPriority priority_;
};

class OffTurn {
 public:
  OffTurn();   // gives up the calling thread's turn, when it holds one
  ~OffTurn();  // takes it back
  OffTurn(const OffTurn&) = delete;
  OffTurn& operator=(const OffTurn&) = delete;

 private:
  std::unique_lock<std::mutex>* given_ = nullptr;
  TurnPriority priority_ = TurnPriority::kForeground;
};

// The turn for device work outside a build's kernels that must not overlap with them: recording
// a CUDA graph (a build's device-wide synchronization would end another thread's capture) and
// synchronizing the whole device. Takes the turn unless the calling thread holds it already.
class DeviceTurn {
 public:
  DeviceTurn();
  ~DeviceTurn();
  DeviceTurn(const DeviceTurn&) = delete;
  DeviceTurn& operator=(const DeviceTurn&) = delete;

 private:
  std::unique_lock<std::mutex> lock_;  // empty when the thread held the turn already
  std::unique_lock<std::mutex>* outer_ = nullptr;
  TurnPriority outer_priority_ = TurnPriority::kForeground;
};

// Between steps of long device work (tactic timing rounds): a thread holding a background turn
// gives it up while foreground threads want it (as above) and takes it back after them. Does
// nothing on other threads. No other lock may be held across it (as across an OffTurn).
void yield_build_turn();

// Whether the calling thread holds the turn now (for tests).
bool holds_build_turn();

}  // namespace kiln::cuda
