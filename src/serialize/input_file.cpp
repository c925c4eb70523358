// InputFile (input_file.h): regular files only, bounded, never blocking.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "kiln/errors.h"
#include "src/serialize/input_file.h"

namespace kiln::serialize {

namespace {

// What a non-regular file is, for the message.
const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

InputFile::InputFile(const std::string& path, const char* kind, uint64_t max_bytes) : path_(path), kind_(kind) {
  KILN_CHECK(!path.empty(), kInvalidArgument, "no path given for the ", kind);
  auto check_type = [&](const struct stat& st) {
    KILN_CHECK(S_ISREG(st.st_mode), kIo, "cannot read ", kind, " '", path, "': it is ", file_type_name(st.st_mode),
               ", not a regular file");
    KILN_CHECK(uint64_t(st.st_size) <= max_bytes, kIo, "cannot read ", kind, " '", path, "': it has ",
               uint64_t(st.st_size), " bytes, more than the ", max_bytes, " this reader takes");
  };
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) fail("open", errno);
  check_type(st);
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) fail("open", errno);
  try {
    if (::fstat(fd_, &st) != 0) fail("read", errno);
    check_type(st);  // the path may name another file by now
  } catch (...) {
    ::close(fd_);
    throw;
  }
  size_ = size_t(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::unique_ptr<uint8_t[]> InputFile::read_all() const {
  std::unique_ptr<uint8_t[]> data;
  try {
    data = std::make_unique_for_overwrite<uint8_t[]>(size_ > 0 ? size_ : 1);
  } catch (const std::bad_alloc&) {
    KILN_FAIL(kIo, "cannot read ", kind_, " '", path_, "': no memory for its ", size_, " bytes");
  }
  size_t done = 0;
  while (done < size_) {
    const ssize_t n = ::pread(fd_, data.get() + done, size_ - done, off_t(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("read", errno);
    KILN_CHECK(n > 0, kIo, "cannot read ", kind_, " '", path_, "': it ended after ", done, " of its ", size_,
               " bytes (changed while being read)");
    done += size_t(n);
  }
  return data;
}

void InputFile::fail(const char* verb, int err) const {
  KILN_FAIL(kIo, "cannot ", verb, " ", kind_, " '", path_, "': ", std::strerror(err));
}

}  // namespace kiln::serialize
