// The timing cache's file format, apart from any CUDA call so that it is testable without a GPU
// (tactics.h has the process-wide cache that uses it).
//
// File layout (little-endian):
//   "KILNTCAC"  8-byte magic
//   u32         format version (kTimingCacheVersion)
//   u32         entry count
//   per entry:  u32 key length, key bytes, u32 choice length, choice bytes
//   u64         FNV-1a 64 of every byte before it
// A file whose magic, version, lengths or checksum do not check out decodes to nothing (the
// caller logs and ignores it); it is never fatal.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "kiln/ir.h"

namespace kiln::cuda {

inline constexpr uint32_t kTimingCacheVersion = 1;

using TimingEntries = std::map<std::string, Bytes>;

Bytes encode_timing_cache(const TimingEntries& entries);
// Nothing when the bytes are not a valid timing cache of this version; `why` gets the reason.
std::optional<TimingEntries> decode_timing_cache(const Bytes& bytes, std::string* why = nullptr);

// Reads `path`: an absent file gives an empty map; an unreadable or damaged one gives an empty
// map and a line on stderr naming the file and the cause.
TimingEntries read_timing_cache_file(const std::string& path);
// Writes atomically (a temporary file in the same folder, then rename), creating the folder;
// throws kIo naming the path when it cannot.
void write_timing_cache_file(const std::string& path, const TimingEntries& entries);

// The process-wide cache's entry points, as tactics.h declares them (repeated here so that
// device-free code can use them without CUDA headers).
std::optional<Bytes> timing_cache_find(const std::string& key);
void timing_cache_insert(const std::string& key, const Bytes& choice);
void set_timing_cache_path(const std::string& path);
void timing_cache_flush();

// The file the process-wide cache uses now ($KILN_TIMING_CACHE, set_timing_cache_path, or
// ~/.cache/kiln/timing.cache).
std::string timing_cache_path();

}  // namespace kiln::cuda
