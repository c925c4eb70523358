// Host-to-device upload of many buffers at once (an engine's constants at load and at refit).
//
// A copy from pageable host memory is staged by the driver through pinned memory on the calling
// thread, well below the link's bandwidth, and for a large model that copy is a large part of a
// warm engine-cache hit. The Uploader stages them itself: the bytes are split into contiguous
// shares, one per lane, and each lane (a thread of the call, a non-blocking stream and two pinned
// chunks) copies its share into one chunk while the DMA of the other runs, so host copies and
// transfers overlap. The lanes (up to 16 MiB of pinned host memory in all) are made once per
// backend, on first use or by the backend's warm-up, and are kept for the process; uploads from
// several threads take turns. Where pinned memory cannot be had, upload() returns false having
// copied nothing, and the backend copies one buffer at a time.
//
// The streams are non-blocking, so an upload never waits for nor joins work or a capture on
// the legacy default stream; upload() returns when every copy has landed.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "kiln/backend.h"

namespace kiln::cuda {

class Uploader {
 public:
  explicit Uploader(int device);
  ~Uploader();
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  // Makes the lanes if they are not made yet (pinned memory, streams, events).
  void prepare();
  // False, with nothing copied, where the lanes cannot be made.
  bool upload(const std::vector<Backend::HostCopy>& copies);

 private:
  struct Lane;
  void prepare_locked();
  int device_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Lane>> lanes_;
};

}  // namespace kiln::cuda
