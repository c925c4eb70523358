// Helpers for tests of refusals and error paths: the code of the kiln::Error a call throws, and
// a check of its code and message.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "kiln/errors.h"

namespace kiln::test {

// The ErrorCode `fn` throws (its message in *message when given); a test failure and
// kInternal when it throws nothing.
inline ErrorCode code_of(const std::function<void()>& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  if (message) *message = "(no error)";
  ADD_FAILURE() << "no error thrown";
  return ErrorCode::kInternal;
}

// fn throws a kiln::Error of `code` whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& fn, ErrorCode code, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown; expected one containing '" << (parts.empty() ? "" : parts.front()) << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace kiln::test
