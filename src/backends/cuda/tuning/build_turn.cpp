// The build turn (build_turn.h). No CUDA call, so it is testable on any machine.
#include <chrono>
#include <condition_variable>

#include "src/backends/cuda/tuning/build_turn.h"

namespace kiln::cuda {

namespace {

using Clock = std::chrono::steady_clock;

struct Turn {
  std::mutex mu;  // the turn itself
  // Under `gate_mu`: the foreground threads holding or waiting for the turn, and when one last
  // gave it up; background threads wait on `gate` for both to let them in.
  std::mutex gate_mu;
  std::condition_variable gate;
  int foreground = 0;
  Clock::time_point last_foreground{};
};

Turn& turn() {
  static Turn t;
  return t;
}

// The lock of the turn that the thread is inside, if any, and that turn's priority.
thread_local std::unique_lock<std::mutex>* current = nullptr;
thread_local TurnPriority current_priority = TurnPriority::kForeground;

// Whether a background thread must keep off the turn now (under gate_mu); else when to ask again.
bool foreground_busy(const Turn& t, Clock::time_point* until) {
  *until = t.last_foreground + std::chrono::milliseconds(kQuietMs);
  return t.foreground > 0 || Clock::now() < *until;
}

void take(std::unique_lock<std::mutex>& lock, TurnPriority priority) {
  Turn& t = turn();
  if (priority == TurnPriority::kForeground) {
    {
      const std::lock_guard<std::mutex> g(t.gate_mu);
      ++t.foreground;
    }
    lock.lock();
    return;
  }
  while (true) {
    {
      std::unique_lock<std::mutex> g(t.gate_mu);
      for (Clock::time_point until; foreground_busy(t, &until);) {
        if (t.foreground > 0) t.gate.wait(g);
        else t.gate.wait_until(g, until);
      }
    }
    lock.lock();
    {
      // A foreground thread that came between the gate and the lock goes first.
      const std::lock_guard<std::mutex> g(t.gate_mu);
      if (t.foreground == 0) return;
    }
    lock.unlock();
  }
}

void give(std::unique_lock<std::mutex>& lock, TurnPriority priority) {
  lock.unlock();
  if (priority == TurnPriority::kBackground) return;
  Turn& t = turn();
  {
    const std::lock_guard<std::mutex> g(t.gate_mu);
    --t.foreground;
    t.last_foreground = Clock::now();
  }
  t.gate.notify_all();
}

}  // namespace

BuildTurn::BuildTurn(TurnPriority priority) : lock_(turn().mu, std::defer_lock), priority_(priority) {
  take(lock_, priority_);
  current = &lock_;
  current_priority = priority_;
}

BuildTurn::~BuildTurn() {
  current = nullptr;
  if (lock_.owns_lock()) give(lock_, priority_);
}

OffTurn::OffTurn() {
  if (current && current->owns_lock()) {
    given_ = current;
    priority_ = current_priority;
    give(*given_, priority_);
  }
}

OffTurn::~OffTurn() {
  if (given_) take(*given_, priority_);
}

DeviceTurn::DeviceTurn() : lock_(turn().mu, std::defer_lock), outer_(current) {
  if (holds_build_turn()) return;
  take(lock_, TurnPriority::kForeground);
  current = &lock_;
  outer_priority_ = current_priority;
  current_priority = TurnPriority::kForeground;
}

DeviceTurn::~DeviceTurn() {
  if (current != &lock_) return;
  current = outer_;
  current_priority = outer_priority_;
  give(lock_, TurnPriority::kForeground);
}

void yield_build_turn() {
  if (!current || !current->owns_lock() || current_priority != TurnPriority::kBackground) return;
  Turn& t = turn();
  {
    const std::lock_guard<std::mutex> g(t.gate_mu);
    Clock::time_point until;
    if (!foreground_busy(t, &until)) return;
  }
  give(*current, TurnPriority::kBackground);
  take(*current, TurnPriority::kBackground);
}

bool holds_build_turn() { return current && current->owns_lock(); }

}  // namespace kiln::cuda
