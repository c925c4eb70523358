// Random tensors that every platform draws the same from one seed: kiln-run's inputs and the
// engine file fuzzer's weights and inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kiln/kiln.h"

namespace kiln::tools {

// splitmix64: small, fast and the same everywhere, so that a seed names one set of numbers.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }
  float uniform() { return float(next() >> 40) / float(1 << 24) * 2.0f - 1.0f; }  // [-1, 1)
};

// Floats in [-1, 1), integers in [0, 3] (valid indices for small tables), bools 0 / 1.
inline Bytes random_tensor(const TensorType& t, Rng& rng) {
  Bytes b(t.nbytes());
  const size_t size = dtype_size(t.dtype);
  for (size_t i = 0; i < b.size() / size; ++i) {
    uint8_t* p = b.data() + i * size;
    const float f = rng.uniform();
    const int64_t k = int64_t(rng.below(4));
    switch (t.dtype) {
      case DType::kF32: std::memcpy(p, &f, 4); break;
      case DType::kF64: {
        const double d = f;
        std::memcpy(p, &d, 8);
        break;
      }
      case DType::kF16: {
        const uint16_t h = float_to_half(f);
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kBF16: {
        const uint16_t h = float_to_bf16(f);
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kI64: std::memcpy(p, &k, 8); break;
      case DType::kI32: {
        const int32_t v = int32_t(k);
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::kI8:
      case DType::kU8: *p = uint8_t(k); break;
      case DType::kBool: *p = uint8_t(k & 1); break;
    }
  }
  return b;
}

}  // namespace kiln::tools
