// The one way Kiln opens a file it reads (engine files, .npy inputs): only a regular file, of
// a bounded size, opened so that nothing can block.
//
// The path is stat()ed first, so a device, FIFO, socket or directory is refused without being
// opened; the open itself uses O_NONBLOCK (a FIFO swapped in after the stat still cannot block)
// and the descriptor is checked again. Every refusal is kIo naming the path and the reason
// ("is a directory", "is a FIFO", "is 2 TiB, more than ..."); sizes are known before anything
// is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kiln::serialize {

// More than any engine file or input Kiln takes; a larger file is refused unread.
inline constexpr uint64_t kMaxInputFileBytes = uint64_t(1) << 40;

class InputFile {
 public:
  // Opens `path`; `kind` names the file in messages ("engine file", ".npy file").
  InputFile(const std::string& path, const char* kind, uint64_t max_bytes = kMaxInputFileBytes);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // The whole file, size() bytes (kIo when reading fails or the file shrinks meanwhile). The
  // buffer is not zeroed first: a large engine file costs one pass over its pages.
  std::unique_ptr<uint8_t[]> read_all() const;

  // kIo "cannot <verb> <kind> '<path>': <strerror(err)>".
  [[noreturn]] void fail(const char* verb, int err) const;

 private:
  std::string path_;
  const char* kind_;
  int fd_ = -1;
  size_t size_ = 0;
};

}  // namespace kiln::serialize
