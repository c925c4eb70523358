// Kiln's error type. Every failure at the C++ API is a kiln::Error carrying a code
// (what kind of failure) and a message that names the cause. Nothing in Kiln aborts the
// process on bad input: the reader, the importers, the builder and the runtime all throw.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace kiln {

enum class ErrorCode {
  kInvalidArgument,  // a wrong option, attribute or argument
  kUnsupported,      // a valid request Kiln cannot serve (op, dtype, device)
  kShapeMismatch,    // shapes that do not fit an op or an engine's profile
  kTruncated,        // an engine file that ends early
  kCorrupted,        // an engine file whose bytes do not check out
  kVersionMismatch,  // an engine file from another format version
  kDeviceMismatch,   // an engine built for another backend or device
  kIo,               // a file that cannot be read or written
  kInternal,         // a broken invariant inside Kiln (a bug)
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(std::string("[") + error_code_name(code) + "] " + message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// KILN_CHECK(cond, code, parts...): throw Error(code, concat(parts...)) unless cond holds.
#define KILN_CHECK(cond, code, ...)                                               \
  do {                                                                            \
    if (!(cond)) throw ::kiln::Error(::kiln::ErrorCode::code, ::kiln::detail::concat(__VA_ARGS__)); \
  } while (0)

#define KILN_FAIL(code, ...) throw ::kiln::Error(::kiln::ErrorCode::code, ::kiln::detail::concat(__VA_ARGS__))

}  // namespace kiln
