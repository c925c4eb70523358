// The timing cache (tactics.h): a process-wide map from timing key to chosen candidate, backed
// by a file (format in timing_cache.h). No CUDA call here.
//
// State machine of the process-wide cache: UNLOADED (no file read for the current path) ->
// first find/insert reads the file and merges it under the entries already in memory ->
// LOADED; insert marks the key dirty; timing_cache_flush re-reads the file (another process
// may have added entries), overlays the dirty entries, writes it atomically and clears the
// dirty set; set_timing_cache_path with another path goes back to UNLOADED, keeping memory.
// One mutex guards it all, so builds on several threads may share it. TimingClaim (tactics.h)
// keeps two searches of one key from running at once.
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "kiln/errors.h"
#include "src/backends/cuda/tuning/build_turn.h"
#include "src/backends/cuda/tuning/tactics.h"
#include "src/backends/cuda/tuning/timing_cache.h"
#include "src/serialize/input_file.h"

namespace kiln::cuda {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'T', 'C', 'A', 'C'};
constexpr uint64_t kMaxTimingCacheBytes = uint64_t(64) << 20;  // far more than any tactic table

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

void put_u32(Bytes& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i)));
}

class Reader {
 public:
  Reader(const Bytes& b, size_t end) : b_(b), end_(end) {}
  bool u32(uint32_t* v) {
    if (end_ - pos_ < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= uint32_t(b_[pos_ + size_t(i)]) << (8 * i);
    pos_ += 4;
    return true;
  }
  bool bytes(size_t n, const uint8_t** p) {
    if (end_ - pos_ < n) return false;
    *p = b_.data() + pos_;
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == end_; }

 private:
  const Bytes& b_;
  size_t end_;
  size_t pos_ = 0;
};

struct Cache {
  std::mutex mu;
  TimingEntries entries;
  std::set<std::string> dirty;
  std::string explicit_path;
  bool loaded = false;
};

Cache& cache() {
  static Cache c;
  return c;
}

std::string resolve_path(const Cache& c) {
  if (const char* env = std::getenv("KILN_TIMING_CACHE"); env && *env) return env;
  if (!c.explicit_path.empty()) return c.explicit_path;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/kiln/timing.cache";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/kiln/timing.cache";
  return {};  // nowhere to keep it: memory only
}

void ensure_loaded(Cache& c) {
  if (c.loaded) return;
  c.loaded = true;
  const std::string path = resolve_path(c);
  if (path.empty()) return;
  for (auto& [k, v] : read_timing_cache_file(path)) c.entries.emplace(k, std::move(v));  // memory wins
}

}  // namespace

Bytes encode_timing_cache(const TimingEntries& entries) {
  Bytes b(kMagic, kMagic + 8);
  put_u32(b, kTimingCacheVersion);
  put_u32(b, uint32_t(entries.size()));
  for (const auto& [k, v] : entries) {
    put_u32(b, uint32_t(k.size()));
    b.insert(b.end(), k.begin(), k.end());
    put_u32(b, uint32_t(v.size()));
    b.insert(b.end(), v.begin(), v.end());
  }
  const uint64_t sum = fnv1a(b.data(), b.size());
  for (int i = 0; i < 8; ++i) b.push_back(uint8_t(sum >> (8 * i)));
  return b;
}

std::optional<TimingEntries> decode_timing_cache(const Bytes& bytes, std::string* why) {
  auto bad = [&](const char* cause) -> std::optional<TimingEntries> {
    if (why) *why = cause;
    return std::nullopt;
  };
  if (bytes.size() < 8 + 4 + 4 + 8) return bad("shorter than a header");
  if (std::memcmp(bytes.data(), kMagic, 8) != 0) return bad("not a Kiln timing cache (bad magic)");
  const size_t body = bytes.size() - 8;
  uint64_t stored = 0;
  for (int i = 0; i < 8; ++i) stored |= uint64_t(bytes[body + size_t(i)]) << (8 * i);
  Reader r(bytes, body);
  const uint8_t* skip = nullptr;
  r.bytes(8, &skip);
  uint32_t version = 0, count = 0;
  r.u32(&version);
  if (version != kTimingCacheVersion) return bad("another format version");
  if (stored != fnv1a(bytes.data(), body)) return bad("checksum mismatch");
  r.u32(&count);
  TimingEntries out;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t kn = 0, vn = 0;
    const uint8_t *kp = nullptr, *vp = nullptr;
    if (!r.u32(&kn) || !r.bytes(kn, &kp) || !r.u32(&vn) || !r.bytes(vn, &vp)) return bad("entry runs past the end");
    out[std::string(reinterpret_cast<const char*>(kp), kn)] = Bytes(vp, vp + vn);
  }
  if (!r.done()) return bad("trailing bytes after the entries");
  return out;
}

TimingEntries read_timing_cache_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  std::string why = "unreadable";
  std::optional<TimingEntries> e;
  try {  // a regular file of bounded size only: a FIFO or device there must not block or flood
    const serialize::InputFile file(path, "timing cache", kMaxTimingCacheBytes);
    const std::unique_ptr<uint8_t[]> data = file.read_all();
    e = decode_timing_cache(Bytes(data.get(), data.get() + file.size()), &why);
  } catch (const Error& err) {
    why = err.what();
  }
  if (!e) {
    std::fprintf(stderr, "kiln: ignoring timing cache %s: %s (it will be rewritten)\n", path.c_str(), why.c_str());
    return {};
  }
  return std::move(*e);
}

void write_timing_cache_file(const std::string& path, const TimingEntries& entries) {
  namespace fs = std::filesystem;
  static std::atomic<unsigned> counter{0};
  const fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const Bytes bytes = encode_timing_cache(entries);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    f.close();
    if (!f) {
      fs::remove(tmp, ec);
      KILN_FAIL(kIo, "cannot write the timing cache ", tmp);
    }
  }
  fs::rename(tmp, p, ec);
  if (ec) {
    fs::remove(tmp, ec);
    KILN_FAIL(kIo, "cannot rename ", tmp, " to the timing cache ", path);
  }
}

std::string timing_cache_path() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return resolve_path(c);
}

std::optional<Bytes> timing_cache_find(const std::string& key) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  ensure_loaded(c);
  auto it = c.entries.find(key);
  if (it == c.entries.end()) return std::nullopt;
  return it->second;
}

void timing_cache_insert(const std::string& key, const Bytes& choice) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  ensure_loaded(c);
  c.entries[key] = choice;
  c.dirty.insert(key);
}

void set_timing_cache_path(const std::string& path) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (path == c.explicit_path) return;
  c.explicit_path = path;
  c.loaded = false;
}

void timing_cache_flush() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.dirty.empty()) return;
  const std::string path = resolve_path(c);
  if (path.empty()) return;
  TimingEntries merged = read_timing_cache_file(path);
  for (const std::string& k : c.dirty) merged[k] = c.entries[k];
  try {
    write_timing_cache_file(path, merged);
    c.dirty.clear();
  } catch (const Error& e) {
    std::fprintf(stderr, "kiln: timing cache not saved: %s\n", e.what());  // a cache, never fatal
  }
}

namespace {

struct Claims {
  std::mutex mu;
  std::condition_variable released;
  std::set<std::string> held;
};

Claims& claims() {
  static Claims c;
  return c;
}

}  // namespace

TimingClaim::TimingClaim(std::string key) : key_(std::move(key)) {
  Claims& c = claims();
  std::unique_lock<std::mutex> lock(c.mu);
  if (c.held.count(key_)) {
    lock.unlock();
    const OffTurn off;  // the holder may need the turn to finish
    lock.lock();
    c.released.wait(lock, [&] { return !c.held.count(key_); });
    c.held.insert(key_);
    lock.unlock();  // no lock across the OffTurn's end, which takes the turn back
    return;
  }
  c.held.insert(key_);
}

TimingClaim::~TimingClaim() {
  Claims& c = claims();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.held.erase(key_);
  }
  c.released.notify_all();
}

}  // namespace kiln::cuda
