// The build turn (build_turn.h). No CUDA call, so it is testable on any machine.
#include "src/backends/cuda/tuning/build_turn.h"

namespace kiln::cuda {

namespace {

std::mutex& turn() {
  static std::mutex mu;
  return mu;
}

// The lock of the BuildTurn that the thread is inside, if any.
thread_local std::unique_lock<std::mutex>* current = nullptr;

}  // namespace

BuildTurn::BuildTurn() : lock_(turn()) { current = &lock_; }

BuildTurn::~BuildTurn() { current = nullptr; }

OffTurn::OffTurn() {
  if (current && current->owns_lock()) {
    given_ = current;
    given_->unlock();
  }
}

OffTurn::~OffTurn() {
  if (given_) given_->lock();
}

DeviceTurn::DeviceTurn() : outer_(current) {
  if (holds_build_turn()) return;
  lock_ = std::unique_lock<std::mutex>(turn());
  current = &lock_;
}

DeviceTurn::~DeviceTurn() {
  if (current == &lock_) current = outer_;
}

bool holds_build_turn() { return current && current->owns_lock(); }

}  // namespace kiln::cuda
