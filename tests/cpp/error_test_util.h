// The code of the kiln::Error a call throws, for tests of refusals and error paths.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

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

}  // namespace kiln::test
