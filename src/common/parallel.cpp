// parallel_for on a small persistent thread pool.
//
// One caller at a time owns the pool (a try_lock); any other caller, including a nested call
// from inside a chunk, runs its loop on its own thread. That keeps concurrent execution
// contexts correct without oversubscribing two cores.
#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "src/common/parallel.h"

namespace kiln {

namespace {

int configured_threads() {
  if (const char* env = std::getenv("KILN_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Returns false when the pool is busy (the caller then runs serially).
  bool run(int64_t chunks, const std::function<void(int64_t)>& body) {
    std::unique_lock<std::mutex> owner(owner_, std::try_to_lock);
    if (!owner.owns_lock()) return false;
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lk(m_);
      body_ = &body;
      chunks_ = chunks;
      next_ = 0;
      pending_ = chunks;
      error_ = nullptr;
      gen = ++generation_;
    }
    cv_.notify_all();
    work(gen);
    std::unique_lock<std::mutex> lk(m_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    body_ = nullptr;
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  // Claims chunks of generation `gen` until none is left. Chunks are few (4 per thread), so
  // claiming under the mutex costs nothing measurable and keeps generations apart.
  void work(uint64_t gen) {
    while (true) {
      const std::function<void(int64_t)>* body;
      int64_t c;
      {
        std::lock_guard<std::mutex> lk(m_);
        if (generation_ != gen || next_ >= chunks_) return;
        c = next_++;
        body = body_;
      }
      try {
        (*body)(c);
      } catch (...) {
        std::lock_guard<std::mutex> lk(m_);
        if (!error_) error_ = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(m_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
  void loop() {
    uint64_t seen = 0;
    while (true) {
      uint64_t gen;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stop_ || (generation_ != seen && body_ != nullptr); });
        if (stop_) return;
        gen = seen = generation_;
      }
      work(gen);
    }
  }

  std::vector<std::thread> workers_;
  std::mutex owner_, m_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t)>* body_ = nullptr;
  int64_t chunks_ = 0, pending_ = 0, next_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool p(configured_threads());
  return p;
}

thread_local bool t_inside = false;

}  // namespace

int num_threads() { return pool().size(); }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int threads = num_threads();
  int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, int64_t(threads) * 4);
  if (chunks <= 1 || threads == 1 || t_inside) {
    fn(0, n);
    return;
  }
  int64_t step = (n + chunks - 1) / chunks;
  chunks = (n + step - 1) / step;
  std::function<void(int64_t)> body = [&](int64_t c) {
    bool was = t_inside;
    t_inside = true;
    try {
      fn(c * step, std::min(n, (c + 1) * step));
    } catch (...) {
      t_inside = was;
      throw;
    }
    t_inside = was;
  };
  if (!pool().run(chunks, body)) fn(0, n);
}

}  // namespace kiln
