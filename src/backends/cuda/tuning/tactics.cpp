// Timing tactic candidates with CUDA events (tactics.h) and the timing cache's key. The cache
// itself (map + file) is in timing_cache.cpp, apart from CUDA.
//
// Each candidate runs on a private non-blocking stream: two direct warm-up runs (first-use
// work stays out of the numbers; they also size a sample: a sample repeats the candidate until
// it lasts about 50 us), then up to 7 samples, each timed over replays of a CUDA graph holding the
// sample's runs; its time is the median of its samples. An engine replays its launches from a
// graph, so that is what a candidate is measured as: timed as direct launches, a microsecond
// kernel measures its host launch cost instead (a library call's host time can exceed a small
// kernel's device time, so small library kernels would lose to generated ones that are slower on
// the device). A candidate that cannot be recorded into a graph is timed over direct launches.
//
// The samples are taken in rounds, one sample of every candidate per round, so that a change
// of the device's clock while the candidates are timed (it idles at a fraction of its boost
// clock and ramps up under load) moves every candidate's median alike instead of making the
// first ones timed look slow. After kPruneAfter rounds, a candidate whose fastest sample is more
// than kPruneRatio times the fastest candidate's is not sampled again: it cannot win, and timing
// it would add to the build (a large convolution's sample lasts milliseconds). Where even the
// fastest candidate's run lasts kLongRunMs, the samples end there: the launch's jitter is small
// against such a run.
//
// A candidate that throws is skipped and noted in the report; if every candidate throws the
// first error is rethrown. An asynchronous fault inside a candidate would poison the context,
// so candidates must only be configurations the library itself accepted.
#include <cublasLt.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <sstream>

#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/tuning/build_turn.h"
#include "src/backends/cuda/tuning/tactics.h"

namespace kiln::cuda {

namespace {

constexpr int kWarmup = 2;
constexpr int kSamples = 7;
constexpr float kSampleTargetMs = 0.05f;
constexpr int kMaxRepeats = 64;
constexpr int kReplays = 2;  // graph replays per sample: the first one's start-up overlaps the rest
constexpr int kPruneAfter = 3;  // rounds every candidate is sampled in
constexpr float kPruneRatio = 2.0f;
constexpr float kLongRunMs = 0.5f;  // from this long a run, kPruneAfter rounds are all the samples

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

  // Prepares c for sampling: warms it up and records `repeats` runs of it into a graph sized
  // to last about kSampleTargetMs (no graph when c cannot be recorded: sampled directly).
  struct Prepared {
    GraphExecPtr exec;
    int repeats = 1;
  };
  Prepared prepare(const Candidate& c) {
    const float warm = time(c, kWarmup) / float(kWarmup);
    Prepared p;
    p.repeats = std::clamp(int(kSampleTargetMs / std::max(warm, 1e-4f)), 1, kMaxRepeats);
    p.exec = record(c, p.repeats);
    if (p.exec && p.repeats < kMaxRepeats) {
      // The direct warm-up counted host launch costs: with the device time, size again.
      const float replay = time_graph(p.exec.get(), 1) / float(p.repeats);
      const int more = std::clamp(int(kSampleTargetMs / std::max(replay, 1e-4f)), 1, kMaxRepeats);
      if (more > p.repeats) {
        p.repeats = more;
        p.exec = record(c, p.repeats);
      }
    }
    return p;
  }

  // Milliseconds of one run of c, from one sample.
  float sample(const Candidate& c, const Prepared& p) {
    return p.exec ? time_graph(p.exec.get(), kReplays) / float(kReplays * p.repeats)
                  : time(c, p.repeats) / float(p.repeats);
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
  std::exception_ptr first_error;
  std::vector<std::optional<std::string>> failed(n);  // why candidate i was dropped
  auto fail = [&](size_t i, const std::exception& e) {
    if (!first_error) first_error = std::current_exception();
    failed[i] = e.what();
    cudaGetLastError();  // clear a non-sticky launch error so the next candidate starts clean
  };
  std::vector<Timer::Prepared> prepared(n);
  // Between candidates and rounds, a background build lets calls being served go first (build_turn.h).
  for (size_t i = 0; i < n; ++i) {
    yield_build_turn();
    try {
      prepared[i] = timer.prepare(candidates[i]);
    } catch (const std::exception& e) {
      fail(i, e);
    }
  }
  std::vector<std::vector<float>> samples(n);
  std::vector<bool> pruned(n, false);
  for (int round = 0; round < kSamples; ++round) {
    yield_build_turn();
    for (size_t i = 0; i < n; ++i) {
      if (failed[i] || pruned[i]) continue;
      try {
        samples[i].push_back(timer.sample(candidates[i], prepared[i]));
      } catch (const std::exception& e) {
        fail(i, e);
      }
    }
    if (round + 1 == kPruneAfter) {  // clear losers, by their fastest sample so far, are not sampled again
      auto fastest = [&](size_t i) { return *std::min_element(samples[i].begin(), samples[i].end()); };
      float best = 0;
      for (size_t i = 0; i < n; ++i)
        if (!failed[i] && (best == 0 || fastest(i) < best)) best = fastest(i);
      for (size_t i = 0; i < n; ++i) pruned[i] = !failed[i] && fastest(i) > kPruneRatio * best;
      if (best >= kLongRunMs) break;  // runs this long vary little: the medians of these rounds hold
    }
  }
  std::ostringstream log;
  size_t best = n;
  float best_ms = 0;
  for (size_t i = 0; i < n; ++i) {
    log << (i ? ", " : "") << "#" << i;
    if (failed[i]) {
      log << " failed (" << *failed[i] << ")";
      continue;
    }
    std::vector<float>& s = samples[i];
    std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
    const float ms = s[s.size() / 2];
    log << " " << ms * 1000.0f << " us" << (pruned[i] ? " (pruned)" : "");
    if (best == n || ms < best_ms) best = i, best_ms = ms;
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
