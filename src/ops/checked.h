// Checked int64 arithmetic for shape rules. Attributes and extents reach the rules from engine
// files and imports, so any value is possible; an operation that would overflow throws
// kInvalidArgument naming the op, what was being computed and both operands, instead of
// wrapping (undefined behaviour for signed integers).
#pragma once

#include <cstdint>

#include "kiln/errors.h"
#include "kiln/ops.h"

namespace kiln {

// Arithmetic on behalf of one op: `what` says what is being computed ("the padded size of
// spatial dim 0"), for the message.
class Checked {
 public:
  Checked(OpKind op, const char* what) : op_(op), what_(what) {}

  int64_t add(int64_t a, int64_t b) const {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r)) fail(a, " + ", b);
    return r;
  }
  int64_t sub(int64_t a, int64_t b) const {
    int64_t r;
    if (__builtin_sub_overflow(a, b, &r)) fail(a, " - ", b);
    return r;
  }
  int64_t mul(int64_t a, int64_t b) const {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r)) fail(a, " * ", b);
    return r;
  }

 private:
  [[noreturn]] void fail(int64_t a, const char* sign, int64_t b) const {
    KILN_FAIL(kInvalidArgument, op_name(op_), ": ", what_, " overflows int64 (", a, sign, b,
              "): an attribute or extent is out of range");
  }

  OpKind op_;
  const char* what_;
};

}  // namespace kiln
