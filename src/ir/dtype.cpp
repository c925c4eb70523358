// DType names and sizes, and error-code names.
#include "kiln/dtype.h"

#include "kiln/errors.h"

namespace kiln {

namespace {
struct DTypeRow {
  DType t;
  const char* name;
  size_t size;
};
constexpr DTypeRow kRows[kNumDTypes] = {
    {DType::kF32, "f32", 4}, {DType::kF16, "f16", 2}, {DType::kBF16, "bf16", 2},
    {DType::kF64, "f64", 8}, {DType::kI64, "i64", 8}, {DType::kI32, "i32", 4},
    {DType::kI8, "i8", 1},   {DType::kU8, "u8", 1},   {DType::kBool, "bool", 1},
};
const DTypeRow& row(DType t) {
  auto i = static_cast<size_t>(t);
  KILN_CHECK(i < kNumDTypes, kInvalidArgument, "unknown dtype code ", i);
  return kRows[i];
}
}  // namespace

size_t dtype_size(DType t) { return row(t).size; }
const char* dtype_name(DType t) { return row(t).name; }

DType dtype_from_name(std::string_view name) {
  for (const auto& r : kRows)
    if (name == r.name) return r.t;
  std::string valid;
  for (const auto& r : kRows) valid += std::string(valid.empty() ? "" : ", ") + r.name;
  KILN_FAIL(kInvalidArgument, "unknown dtype '", name, "'; valid: ", valid);
}

bool is_floating(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kF64;
}
bool is_integral(DType t) {
  return t == DType::kI64 || t == DType::kI32 || t == DType::kI8 || t == DType::kU8;
}

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kShapeMismatch: return "shape mismatch";
    case ErrorCode::kTruncated: return "truncated";
    case ErrorCode::kCorrupted: return "corrupted";
    case ErrorCode::kVersionMismatch: return "version mismatch";
    case ErrorCode::kDeviceMismatch: return "device mismatch";
    case ErrorCode::kIo: return "io";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

}  // namespace kiln
