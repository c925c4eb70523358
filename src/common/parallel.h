// parallel_for on a small persistent thread pool, for the CPU backend's kernels and for any
// layer with work to split (engine file reading, refit).
#pragma once

#include <cstdint>
#include <functional>

namespace kiln {

// Runs fn(begin, end) over [0, n) split into chunks of at least `grain`, on a pool of
// threads (KILN_NUM_THREADS, default: hardware threads). Nested or concurrent calls (several
// contexts at once) run on the calling thread. Exceptions from fn are rethrown in the caller.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
int num_threads();

}  // namespace kiln
