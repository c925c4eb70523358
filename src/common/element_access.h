// Reading and writing one element of any dtype as double or float, and whole buffers as f32:
// the CPU backend's kernels, constant folding, the importers' constant reads and the CUDA
// backend's host-side setup all use these. f16 and bf16 go through f32.
#pragma once

#include <cstdint>
#include <cstring>

#include "kiln/dtype.h"

namespace kiln {

inline double load_as_double(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF64: return static_cast<const double*>(p)[i];
    case DType::kF16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::kI32: return static_cast<const int32_t*>(p)[i];
    case DType::kI8: return static_cast<const int8_t*>(p)[i];
    case DType::kU8: return static_cast<const uint8_t*>(p)[i];
    case DType::kBool: return static_cast<const uint8_t*>(p)[i] ? 1.0 : 0.0;
  }
  return 0.0;
}

inline void store_double(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::kF64: static_cast<double*>(p)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v)); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::kI64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DType::kI32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::kI8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case DType::kU8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case DType::kBool: static_cast<uint8_t*>(p)[i] = v != 0.0 ? 1 : 0; break;
  }
}

// Element i of an i64 or i32 buffer (an index), exactly.
inline int64_t load_index(const void* p, DType t, int64_t i) {
  return t == DType::kI64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

inline float load_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<float>(load_as_double(p, t, i));
  }
}

inline void store_f32(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = float_to_half(v); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(v); break;
    default: store_double(p, t, i, v); break;
  }
}

// Converts n elements of `src` (dtype t) to f32 in `dst`, and back.
inline void to_f32(const void* src, DType t, float* dst, int64_t n) {
  if (t == DType::kF32) {
    std::memcpy(dst, src, size_t(n) * 4);
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = load_f32(src, t, i);
}

inline void from_f32(const float* src, DType t, void* dst, int64_t n) {
  if (t == DType::kF32) {
    std::memcpy(dst, src, size_t(n) * 4);
    return;
  }
  for (int64_t i = 0; i < n; ++i) store_f32(dst, t, i, src[i]);
}

}  // namespace kiln
