// Timing tactic candidates with CUDA events (tactics.h) and the timing cache's key. The cache
// itself (map + file) is in timing_cache.cpp, apart from CUDA.
//
// Each candidate runs on a private non-blocking stream: two direct warm-up runs (first-use
// work stays out of the numbers; they also size a sample: a sample repeats the candidate until
// it lasts about 50 us), then the median of 7 samples, each timed over replays of a CUDA graph
// holding the sample's runs. An engine replays its launches from a graph, so that is what a
// candidate is measured as: timed as direct launches, a microsecond kernel measures its host launch
// cost instead (a library call's host time can exceed a small kernel's device time, so small
// library kernels would lose to generated ones that are slower on the device). A candidate that
// cannot be recorded into a graph is timed over direct launches. A candidate that throws is skipped
// and noted in the report; if every candidate throws the first error is rethrown. An asynchronous
// fault inside a candidate would poison the context, so candidates must only be configurations the
// library itself accepted.
#include <cublasLt.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <sstream>

#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/tuning/tactics.h"

namespace kiln::cuda {

namespace {

constexpr int kWarmup = 2;
constexpr int kSamples = 7;
constexpr float kSampleTargetMs = 0.05f;
constexpr int kMaxRepeats = 64;
constexpr int kReplays = 2;  // graph replays per sample: the first one's start-up overlaps the rest

struct GraphExecDeleter {
  void operator()(cudaGraphExec_t e) const { (void)cudaGraphExecDestroy(e); }
};
using GraphExecPtr = std::unique_ptr<CUgraphExec_st, GraphExecDeleter>;

// Owns a stream and two events, released whatever happens.
class Timer {
 public:
  Timer() {
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KILN_CUDA_CHECK(cudaEventCreate(&start_));
    KILN_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Timer() {
    if (stop_) cudaEventDestroy(stop_);
    if (start_) cudaEventDestroy(start_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Milliseconds for `repeats` back-to-back runs of c.
  float time(const Candidate& c, int repeats) {
    KILN_CUDA_CHECK(cudaEventRecord(start_, stream_));
    for (int i = 0; i < repeats; ++i) c(stream_);
    KILN_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

  // Median milliseconds of one run of c.
  float measure(const Candidate& c) {
    const float warm = time(c, kWarmup) / float(kWarmup);
    int repeats = std::clamp(int(kSampleTargetMs / std::max(warm, 1e-4f)), 1, kMaxRepeats);
    GraphExecPtr exec = record(c, repeats);
    if (exec && repeats < kMaxRepeats) {
      // The direct warm-up counted host launch costs: with the device time, size again.
      const float replay = time_graph(exec.get(), 1) / float(repeats);
      const int more = std::clamp(int(kSampleTargetMs / std::max(replay, 1e-4f)), 1, kMaxRepeats);
      if (more > repeats) {
        repeats = more;
        exec = record(c, repeats);
      }
    }
    std::vector<float> samples;
    for (int s = 0; s < kSamples; ++s)
      samples.push_back(exec ? time_graph(exec.get(), kReplays) / float(kReplays * repeats)
                             : time(c, repeats) / float(repeats));
    std::nth_element(samples.begin(), samples.begin() + kSamples / 2, samples.end());
    return samples[kSamples / 2];
  }

 private:
  // `repeats` runs of c recorded into an instantiated graph (with the dependencies an engine's
  // graph would give them); null when c cannot be recorded.
  GraphExecPtr record(const Candidate& c, int repeats) {
    try {
      const GraphPtr graph = record_graph(stream_, [&](cudaStream_t s) {
        for (int i = 0; i < repeats; ++i) c(s);
      });
      cudaGraphExec_t exec = nullptr;
      KILN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph.get(), 0));
      return GraphExecPtr(exec);
    } catch (const std::exception&) {
      return nullptr;  // timed over direct launches instead
    }
  }

  // Milliseconds for `replays` back-to-back launches of exec.
  float time_graph(cudaGraphExec_t exec, int replays) {
    KILN_CUDA_CHECK(cudaEventRecord(start_, stream_));
    for (int i = 0; i < replays; ++i) KILN_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    KILN_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace

Candidate kernel_candidate(const Kernel& k, const void* const* ins, void* const* outs, void* workspace, size_t ws) {
  return [&k, ins, outs, workspace, ws](cudaStream_t s) {
    RunContext rc;
    rc.stream = s;
    rc.workspace = workspace;
    rc.workspace_size = ws;
    k.run(ins, outs, rc);
  };
}

size_t time_candidates(const std::vector<Candidate>& candidates, size_t max_timed, std::string* report) {
  KILN_CHECK(!candidates.empty(), kInternal, "time_candidates: no candidate");
  const size_t n = std::min(candidates.size(), max_timed);
  if (n <= 1) {
    if (report) *report += "untimed (first of " + std::to_string(candidates.size()) + ")";
    return 0;
  }
  Timer timer;
  std::ostringstream log;
  std::exception_ptr first_error;
  size_t best = n;
  float best_ms = 0;
  for (size_t i = 0; i < n; ++i) {
    try {
      const float ms = timer.measure(candidates[i]);
      log << (i ? ", " : "") << "#" << i << " " << ms * 1000.0f << " us";
      if (best == n || ms < best_ms) best = i, best_ms = ms;
    } catch (const std::exception& e) {
      if (!first_error) first_error = std::current_exception();
      log << (i ? ", " : "") << "#" << i << " failed (" << e.what() << ")";
      cudaGetLastError();  // clear a non-sticky launch error so the next candidate starts clean
    }
  }
  if (best == n) std::rethrow_exception(first_error);
  if (report)
    *report += "timed " + std::to_string(n) + " of " + std::to_string(candidates.size()) + ": " + log.str() +
               "; chose #" + std::to_string(best);
  return best;
}

std::string timing_key(const std::string& family, const std::vector<std::string>& parts) {
  static const std::string versions = [] {
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    std::ostringstream os;
    // "graph-timed": choices timed over direct launches (host-bound for small kernels) are
    // not reused.
    os << "|cuda=" << runtime << "|cublaslt=" << cublasLtGetVersion() << "|cudnn=" << cudnnGetVersion()
       << "|graph-timed";
    return os.str();
  }();
  std::string key = family;
  for (const std::string& p : parts) key += "|" + p;
  return key + "|gpu=" + current_device().name + versions;
}

}  // namespace kiln::cuda
