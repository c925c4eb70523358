// Work split over a few threads of the call's own: the file checksum's chunks, the upload lanes,
// a CUDA build's kernel workers. Not the CPU backend's kernel pool (src/backends/cpu/parallel.cpp):
// these parts block on I/O, DMA or compiles, some set a device on their thread, and they run
// outside any kernel.
#pragma once

#include <cstddef>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

namespace kiln {

// Runs part(t) for every t in [0, parts): part 0 on the calling thread, the others on threads
// started for them. Where no thread can be started, the calling thread runs the parts that have
// none. Returns once every part has finished; then rethrows the first part's exception, if any.
template <class Part>
void run_parts(size_t parts, const Part& part) {
  std::vector<std::exception_ptr> errors(parts);
  auto run = [&](size_t t) {
    try {
      part(t);
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  size_t t = 1;
  try {
    for (; t < parts; ++t) threads.emplace_back(run, t);
  } catch (const std::system_error&) {
    for (; t < parts; ++t) run(t);
  }
  if (parts) run(0);
  for (std::thread& th : threads) th.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace kiln
