// Stopwatch: milliseconds since a start point, and tenths() to print them, for the timings in
// the build, load, refit and tactic logs.
#pragma once

#include <chrono>
#include <cstdint>

namespace kiln {

class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  // Milliseconds since construction (or the last lap()).
  double ms() const { return std::chrono::duration<double, std::milli>(Clock::now() - start_).count(); }
  // ms(), and starts counting again from now.
  double lap() {
    const Clock::time_point now = Clock::now();
    const double elapsed = std::chrono::duration<double, std::milli>(now - start_).count();
    start_ = now;
    return elapsed;
  }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
};

// `ms` rounded to a tenth, for log lines.
inline double tenths(double ms) { return double(int64_t(ms * 10 + 0.5)) / 10; }

}  // namespace kiln
