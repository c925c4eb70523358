// Tactic selection: timing the candidate implementations of one op and keeping the fastest,
// with a persistent timing cache so that a second build of the same model times nothing.
//
// A candidate is a callable that enqueues one run on a stream. time_candidates() runs each
// on scratch buffers the caller provides (warm-up, then the median of several runs measured
// with CUDA events) and returns the index of the fastest; a candidate that throws or fails
// is skipped (and logged), and if all fail the first error is rethrown.
//
// The timing cache maps a key (the family, op signature, shapes, dtypes, attributes, the GPU
// name and the library versions: the caller builds it with timing_key) to the chosen
// candidate's identity (bytes the family defines: an algorithm index, a cuDNN engine config).
// It lives in memory for the process and in a file: $KILN_TIMING_CACHE, or the path given to
// set_timing_cache_path (the Python front end puts it next to the engine cache), default
// ~/.cache/kiln/timing.cache. The file is read once, written atomically after each build that
// added entries, and a damaged file is ignored (and rewritten), never fatal.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kiln/backend.h"
#include "kiln/ir.h"

namespace kiln::cuda {

using Candidate = std::function<void(cudaStream_t)>;

// A candidate that runs kernel `k` on fixed inputs, outputs and a workspace of `ws` bytes (the
// arrays must outlive the candidate).
Candidate kernel_candidate(const Kernel& k, const void* const* ins, void* const* outs, void* workspace, size_t ws);

// Index of the fastest of the first `max_timed` candidates (a TacticBudget count: 1 returns the
// first untimed, TacticBudget::kAll times every one).
size_t time_candidates(const std::vector<Candidate>& candidates, size_t max_timed, std::string* report = nullptr);

// "family|part|part..." plus the device name and CUDA/cuBLASLt/cuDNN versions.
std::string timing_key(const std::string& family, const std::vector<std::string>& parts);

std::optional<Bytes> timing_cache_find(const std::string& key);
void timing_cache_insert(const std::string& key, const Bytes& choice);
void set_timing_cache_path(const std::string& path);
// Writes the file if entries were added since it was read (the builder calls this once per build).
void timing_cache_flush();

// Held while the tactic of timing-cache `key` is looked up and, on a miss, searched. A second
// claim of the same key (a build worker at a node identical to another's, build_turn.h) waits,
// off its turn, until the first is released, and then finds the first's choice in the cache
// instead of timing the same candidates again.
class TimingClaim {
 public:
  explicit TimingClaim(std::string key);
  ~TimingClaim();
  TimingClaim(const TimingClaim&) = delete;
  TimingClaim& operator=(const TimingClaim&) = delete;

 private:
  std::string key_;
};

}  // namespace kiln::cuda
