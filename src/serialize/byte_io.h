// Little-endian byte writer and bounds-checked byte reader for engine files.
//
// Values are written byte by byte (not memcpy of host integers) so the format is
// little-endian on any host. The reader never reads past its span: every read checks the
// bytes left and throws kTruncated naming how many bytes it needed, the absolute file offset
// and the part of the file ("header", "section PLAN"); counts read from the file are checked
// against the bytes left before anything is allocated for them.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kiln/errors.h"
#include "kiln/ir.h"

namespace kiln::serialize {

// The engine file checksum (format version 3). A block of up to kChecksumChunk bytes is summed
// by four independent 64-bit lanes over its little-endian u64 words, word i going to lane i % 4;
// each lane absorbs a word as lane = rotl((lane ^ word) * kM, 31). The last 1..7 bytes form one
// zero-padded word. The block's sum mixes its byte count and then each lane in order with
// h = xorshift((h ^ lane) * kM). Data of up to kChecksumChunk bytes is one block; longer data is
// cut into kChecksumChunk-byte chunks (the last may be shorter), and the checksum is the block
// sum of the chunks' block sums written as u64 words: the chunks are independent, so they are
// summed on several threads, and the result does not depend on how many.
// Every step is a bijection of the lane (or of h) given the word, so a change confined to the
// words of one lane of one chunk (any damage within one aligned 8-byte word, a single byte
// included) always changes its chunk's sum, hence the checksum; other damage goes unnoticed
// with probability about 2^-64. Four lanes keep four multiplies in flight, so a thread sums at
// near memory speed, where format version 1's byte-at-a-time FNV-1a waited on a multiply per
// byte.
inline constexpr size_t kChecksumChunk = size_t(1) << 20;

namespace checksum_detail {
inline constexpr uint64_t kM = 0x9e3779b97f4a7c15ull;  // odd: multiplying by it is a bijection
inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t absorb(uint64_t lane, uint64_t word) { return rotl((lane ^ word) * kM, 31); }
inline uint64_t word_at(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  if constexpr (std::endian::native == std::endian::big) w = __builtin_bswap64(w);
  return w;
}

// The sum of one block.
inline uint64_t block_sum(const uint8_t* data, size_t n) {
  uint64_t lane[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    lane[0] = absorb(lane[0], word_at(data + i));
    lane[1] = absorb(lane[1], word_at(data + i + 8));
    lane[2] = absorb(lane[2], word_at(data + i + 16));
    lane[3] = absorb(lane[3], word_at(data + i + 24));
  }
  size_t k = 0;  // the next lane: word (i / 8) goes to lane (i / 8) % 4, and i is a multiple of 32 here
  for (; i + 8 <= n; i += 8, ++k) lane[k] = absorb(lane[k], word_at(data + i));
  if (i < n) {
    uint8_t last[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(last, data + i, n - i);
    lane[k] = absorb(lane[k], word_at(last));
  }
  uint64_t h = uint64_t(n) * kM;
  for (uint64_t l : lane) {
    h = (h ^ l) * kM;
    h ^= h >> 32;
  }
  return h;
}
}  // namespace checksum_detail

// Defined in byte_io.cpp: data over a few chunks is summed on up to 8 threads.
uint64_t checksum64(const uint8_t* data, size_t n);

// The index of the first byte of [p, p + n) that is not part of well-formed UTF-8 (no
// overlong forms, surrogates or code points above U+10FFFF), or n when all of it is. Engine
// file strings are UTF-8 on both sides: Python sees them as str.
size_t utf8_invalid_at(const uint8_t* p, size_t n);

// Two hex digits, for messages about bytes.
inline std::string hex_byte(uint8_t b) {
  const char* digits = "0123456789abcdef";
  return {digits[b >> 4], digits[b & 15]};
}

class ByteWriter {
 public:
  void u8(uint8_t v) { buf_.push_back(v); }
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void i32(int32_t v) { put(static_cast<uint32_t>(v), 4); }
  void i64(int64_t v) { put(static_cast<uint64_t>(v), 8); }
  void f64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    put(bits, 8);
  }
  // `field` names the string in the error for one that is not UTF-8 (no reader would take it)
  // or too long for its u32 length.
  void str(const std::string& s, const char* field) {
    const auto* p = reinterpret_cast<const uint8_t*>(s.data());
    const size_t bad = utf8_invalid_at(p, s.size());
    KILN_CHECK(bad == s.size(), kInvalidArgument, "cannot write the engine file: ", field,
               " is not valid UTF-8 (byte 0x", hex_byte(p[bad < s.size() ? bad : 0]), " at index ", bad, ")");
    KILN_CHECK(s.size() <= UINT32_MAX, kInvalidArgument, "cannot write the engine file: ", field, " has ", s.size(),
               " bytes, more than a u32 length holds");
    u32(static_cast<uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  void bytes(const void* p, size_t n) {
    size_t at = buf_.size();
    buf_.resize(at + n);
    if (n) std::memcpy(buf_.data() + at, p, n);
  }
  // Room for `n` more bytes without reallocating (large sections: no copies while growing).
  void reserve(size_t n) { buf_.reserve(buf_.size() + n); }
  // Zero bytes up to the next multiple of `alignment` from the start of the buffer.
  void pad_to(size_t alignment) { buf_.resize((buf_.size() + alignment - 1) / alignment * alignment, 0); }
  void patch_u64(size_t at, uint64_t v) {
    for (int i = 0; i < 8; ++i) buf_[at + size_t(i)] = static_cast<uint8_t>(v >> (8 * i));
  }
  size_t size() const { return buf_.size(); }
  Bytes& buffer() { return buf_; }

 private:
  void put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) buf_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  Bytes buf_;
};

class ByteReader {
 public:
  // A reader over [data, data + size), which sits at absolute offset `base` of the file.
  ByteReader(const uint8_t* data, size_t size, size_t base, std::string where)
      : data_(data), size_(size), base_(base), where_(std::move(where)) {}

  uint8_t u8() { return static_cast<uint8_t>(get(1)); }
  uint32_t u32() { return static_cast<uint32_t>(get(4)); }
  uint64_t u64() { return get(8); }
  int32_t i32() { return static_cast<int32_t>(u32()); }
  int64_t i64() { return static_cast<int64_t>(u64()); }
  double f64() {
    uint64_t bits = u64();
    double v;
    std::memcpy(&v, &bits, 8);
    return v;
  }
  // A length-prefixed string; `field` names it when it is not UTF-8 (kCorrupted).
  std::string str(const char* field) {
    const size_t at = offset();
    uint32_t n = u32();
    const uint8_t* p = take(n);
    const size_t bad = utf8_invalid_at(p, n);
    if (bad != n)
      fail_corrupted(detail::concat(field, " at offset ", at, " is not valid UTF-8 (byte 0x", hex_byte(p[bad]),
                                    " at offset ", at + 4 + bad, ")"));
    return std::string(reinterpret_cast<const char*>(p), n);
  }
  // Returns a pointer to the next n bytes and skips them.
  const uint8_t* take(uint64_t n) {
    need(n);
    const uint8_t* p = data_ + pos_;
    pos_ += static_cast<size_t>(n);
    return p;
  }
  // Skips the zero padding up to the next multiple of `alignment` of the absolute offset.
  void align(size_t alignment) {
    size_t abs = base_ + pos_;
    size_t pad = (alignment - abs % alignment) % alignment;
    const uint8_t* p = take(pad);
    for (size_t i = 0; i < pad; ++i)
      if (p[i] != 0) fail_corrupted(detail::concat("non-zero padding byte at offset ", abs + i));
  }
  // Reads a u32 (or u64) element count and checks that `count` records of at least
  // `min_record_bytes` each fit in what is left, so a damaged count cannot make us allocate.
  uint64_t count32(size_t min_record_bytes, const char* what) { return check_count(u32(), min_record_bytes, what); }
  uint64_t count64(size_t min_record_bytes, const char* what) { return check_count(u64(), min_record_bytes, what); }
  uint64_t check_count(uint64_t n, size_t min_record_bytes, const char* what) {
    if (min_record_bytes > 0 && n > remaining() / min_record_bytes)
      fail_corrupted(detail::concat("impossible count ", n, " of ", what, " (", remaining(),
                                    " bytes remain) before offset ", offset()));
    return n;
  }

  size_t remaining() const { return size_ - pos_; }
  size_t offset() const { return base_ + pos_; }  // absolute file offset of the next byte
  bool done() const { return pos_ == size_; }
  const std::string& where() const { return where_; }

  [[noreturn]] void fail_corrupted(const std::string& what) const {
    KILN_FAIL(kCorrupted, "engine file corrupted: ", what, " in ", where_);
  }

 private:
  void need(uint64_t n) const {
    if (n > remaining())
      KILN_FAIL(kTruncated, "engine file truncated: needed ", n, " bytes at offset ", offset(), " of ", where_,
                ", only ", remaining(), " remain");
  }
  uint64_t get(int n) {
    const uint8_t* p = take(static_cast<uint64_t>(n));
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t(p[i]) << (8 * i);
    return v;
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  size_t base_;
  std::string where_;
};

}  // namespace kiln::serialize
