// The engine file container: magic, version, file size, header, sections, checksum.
// The section payloads are in graph_write.cpp / graph_read.cpp; the layout is in engine_file.h.
#include "src/serialize/engine_file.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "kiln/errors.h"
#include "src/serialize/byte_io.h"
#include "src/serialize/graph_codec.h"

namespace kiln::serialize {

namespace {

constexpr uint32_t fourcc(const char (&s)[5]) {
  return uint32_t(uint8_t(s[0])) | uint32_t(uint8_t(s[1])) << 8 | uint32_t(uint8_t(s[2])) << 16 |
         uint32_t(uint8_t(s[3])) << 24;
}
constexpr uint32_t kTagPlan = fourcc("PLAN");
constexpr uint32_t kTagWeights = fourcc("WGTS");
constexpr uint32_t kTagOptions = fourcc("OPTS");
constexpr uint32_t kTagLog = fourcc("BLOG");
constexpr uint32_t kTagKernels = fourcc("KERN");
constexpr uint32_t kTagRefit = fourcc("RFIT");
constexpr uint32_t kTagSourceWeights = fourcc("SWID");
constexpr uint32_t kTagPolicy = fourcc("PLCY");
constexpr size_t kMinSectionBytes = 4 + 8;

std::string tag_name(uint32_t tag) {
  std::string s;
  for (int i = 0; i < 4; ++i) {
    char c = char(tag >> (8 * i));
    if (c < 0x20 || c > 0x7e) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "0x%08x", tag);
      return hex;
    }
    s += c;
  }
  return s;
}

uint64_t load_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

template <typename Body>
void write_section(ByteWriter& w, uint32_t tag, Body&& body) {
  w.u32(tag);
  size_t length_at = w.size();
  w.u64(0);
  size_t start = w.size();
  body();
  w.patch_u64(length_at, w.size() - start);
}

struct Section {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  size_t offset = 0;
  bool present = false;
};

void expect_consumed(const ByteReader& r) {
  if (!r.done()) r.fail_corrupted(detail::concat(r.remaining(), " unread bytes at offset ", r.offset()));
}

// The one string a section holds (the build log, the source weights' fingerprint).
std::string read_string_section(const Section& s, const char* what, const char* field) {
  ByteReader r(s.data, s.size, s.offset, what);
  std::string v = r.str(field);
  expect_consumed(r);
  return v;
}

// The PLCY section: three bytes, each checked.
BuildPolicy read_policy(const Section& s) {
  ByteReader r(s.data, s.size, s.offset, "section PLCY");
  BuildPolicy p;
  auto flag = [&](const char* field) {
    const uint8_t v = r.u8();
    if (v > 1) r.fail_corrupted(detail::concat(field, " is ", int(v), ", not 0 or 1"));
    return v == 1;
  };
  p.allow_tf32 = flag("allow_tf32");
  p.exact_gelu = flag("exact_gelu");
  const uint8_t tactic = r.u8();
  if (tactic > uint8_t(AttentionTactic::kCudnn))
    r.fail_corrupted(detail::concat("attention_tactic ", int(tactic), " is not one of ", kAttentionTacticNames));
  p.attention_tactic = AttentionTactic(tactic);
  expect_consumed(r);
  return p;
}

}  // namespace

Bytes write_engine_file(const EngineFile& f) {
  const bool policy = f.options.policy != BuildPolicy{};
  if (policy) f.options.policy.validate("engine file policy: ");
  ByteWriter w;
  w.bytes(kEngineMagic, sizeof kEngineMagic);
  w.u32(policy ? kEngineFormatVersion : kEngineFormatVersionNoPolicy);
  size_t size_at = w.size();
  w.u64(0);
  w.str(f.kiln_version, "the Kiln version");
  w.str(f.backend, "the backend name");
  w.str(f.device_name, "the device name");
  w.u32(4 + (f.kernel_states.empty() ? 0 : 1) + (f.refit_program ? 1 : 0) + (f.source_weights_id.empty() ? 0 : 1) +
        (policy ? 1 : 0));
  BlobTable blobs;
  write_section(w, kTagPlan, [&] { write_graph(w, f.plan, blobs); });
  if (f.refit_program) write_section(w, kTagRefit, [&] { write_graph(w, *f.refit_program, blobs); });
  write_section(w, kTagWeights, [&] { write_blobs(w, blobs); });
  write_section(w, kTagOptions, [&] {
    w.i32(f.options.optimization_level);
    w.u64(f.options.workspace_limit);
  });
  if (policy) {
    write_section(w, kTagPolicy, [&] {
      w.u8(f.options.policy.allow_tf32 ? 1 : 0);
      w.u8(f.options.policy.exact_gelu ? 1 : 0);
      w.u8(uint8_t(f.options.policy.attention_tactic));
    });
  }
  write_section(w, kTagLog, [&] { w.str(f.build_log, "the build log"); });
  if (!f.source_weights_id.empty())
    write_section(w, kTagSourceWeights, [&] { w.str(f.source_weights_id, "the source weights id"); });
  if (!f.kernel_states.empty()) {
    write_section(w, kTagKernels, [&] {
      w.u32(uint32_t(f.kernel_states.size()));
      for (const Bytes& b : f.kernel_states) {
        w.u64(b.size());
        w.bytes(b.data(), b.size());
      }
    });
  }
  w.patch_u64(size_at, w.size() + kEngineTrailerBytes);
  w.u64(checksum64(w.buffer().data(), w.size()));
  return std::move(w.buffer());
}

void reseal_engine_file(Bytes& file) {
  if (file.size() < kEngineHeaderFixedBytes + kEngineTrailerBytes) return;
  size_t body = file.size() - kEngineTrailerBytes;
  uint64_t h = checksum64(file.data(), body);
  for (int i = 0; i < 8; ++i) file[body + size_t(i)] = uint8_t(h >> (8 * i));
}

namespace {

// Magic, version, size and checksum; leaves `r` after the header strings.
EngineFileHeader check_and_read_header(const uint8_t* data, size_t size, ByteReader& r) {
  KILN_CHECK(data != nullptr || size == 0, kInvalidArgument, "engine file data is null");
  size_t magic_bytes = std::min(size, sizeof kEngineMagic);
  KILN_CHECK(magic_bytes == 0 || std::memcmp(data, kEngineMagic, magic_bytes) == 0, kCorrupted,
             "not a Kiln engine file: bad magic (expected \"KILNENG\\0\")");
  KILN_CHECK(size >= sizeof kEngineMagic, kTruncated, "engine file truncated: ", size,
             " bytes, shorter than its 8-byte magic");
  ByteReader head(data, size, 0, "header");
  head.take(sizeof kEngineMagic);
  EngineFileHeader h;
  h.format_version = head.u32();
  KILN_CHECK(h.format_version == kEngineFormatVersion || h.format_version == kEngineFormatVersionNoPolicy,
             kVersionMismatch, "engine file format version ", h.format_version, ", this Kiln reads format version ",
             kEngineFormatVersionNoPolicy, " or ", kEngineFormatVersion, "; rebuild the engine with this Kiln");
  uint64_t declared = head.u64();
  KILN_CHECK(declared >= kEngineHeaderFixedBytes + kEngineTrailerBytes, kCorrupted,
             "engine file corrupted: its header records a size of ", declared, " bytes");
  KILN_CHECK(size >= declared, kTruncated, "engine file truncated: it has ", size, " bytes, its header records ",
             declared);
  KILN_CHECK(size == declared, kCorrupted, "engine file corrupted: it has ", size - declared,
             " bytes past the end its header records (", declared, " bytes)");
  const size_t body = size - kEngineTrailerBytes;
  uint64_t stored = load_u64(data + body), computed = checksum64(data, body);
  if (stored != computed) {
    char msg[96];
    std::snprintf(msg, sizeof msg, "stored %016llx, computed %016llx", static_cast<unsigned long long>(stored),
                  static_cast<unsigned long long>(computed));
    KILN_FAIL(kCorrupted, "engine file checksum mismatch (", msg, "): the file is damaged");
  }
  r = ByteReader(data, body, 0, "header");
  r.take(kEngineHeaderFixedBytes);
  h.kiln_version = r.str("the Kiln version");
  h.backend = r.str("the backend name");
  h.device_name = r.str("the device name");
  return h;
}

}  // namespace

EngineFileHeader read_engine_header(const uint8_t* data, size_t size) {
  ByteReader r(nullptr, 0, 0, "header");
  return check_and_read_header(data, size, r);
}

EngineFile read_engine_file(const uint8_t* data, size_t size, const std::string& backend,
                            const std::string& device_name, const std::shared_ptr<void>& owner) {
  ByteReader r(nullptr, 0, 0, "header");
  EngineFileHeader h = check_and_read_header(data, size, r);
  EngineFile f;
  f.kiln_version = h.kiln_version;
  f.backend = h.backend;
  f.device_name = h.device_name;
  KILN_CHECK(f.backend == backend, kDeviceMismatch, "engine file was built for backend '", f.backend,
             "' (device '", f.device_name, "'), it cannot run on backend '", backend, "' (device '", device_name,
             "'); rebuild the engine there");
  KILN_CHECK(f.device_name == device_name, kDeviceMismatch, "engine file was built for ", f.backend,
             " device '", f.device_name, "', this device is '", device_name, "'; rebuild the engine for it");

  Section plan, weights, options, log, kernels, refit, swid, policy;
  uint64_t nsections = r.count32(kMinSectionBytes, "sections");
  for (uint64_t i = 0; i < nsections; ++i) {
    uint32_t tag = r.u32();
    uint64_t length = r.u64();
    size_t offset = r.offset();
    const uint8_t* p = r.take(length);
    Section* s = tag == kTagPlan            ? &plan
                 : tag == kTagWeights       ? &weights
                 : tag == kTagOptions       ? &options
                 : tag == kTagLog           ? &log
                 : tag == kTagKernels       ? &kernels
                 : tag == kTagRefit         ? &refit
                 : tag == kTagSourceWeights ? &swid
                 : tag == kTagPolicy        ? &policy
                                            : nullptr;
    if (!s) continue;  // a section this build does not use
    if (s->present) r.fail_corrupted(detail::concat("section ", tag_name(tag), " appears twice"));
    *s = Section{p, length, offset, true};
  }
  expect_consumed(r);
  for (auto [s, tag] : {std::pair{&plan, kTagPlan}, {&weights, kTagWeights}, {&options, kTagOptions}})
    if (!s->present) r.fail_corrupted(detail::concat("no ", tag_name(tag), " section"));

  ByteReader wr(weights.data, weights.size, weights.offset, "section WGTS");
  std::vector<Blob> blobs = read_blobs(wr, owner);
  expect_consumed(wr);

  ByteReader pr(plan.data, plan.size, plan.offset, "section PLAN");
  f.plan = read_graph(pr, blobs);
  expect_consumed(pr);

  ByteReader orr(options.data, options.size, options.offset, "section OPTS");
  f.options.optimization_level = orr.i32();
  f.options.workspace_limit = orr.u64();
  if (f.options.optimization_level < 0 || f.options.optimization_level > 5)
    orr.fail_corrupted(detail::concat("optimization level ", f.options.optimization_level, " is outside 0..5"));
  expect_consumed(orr);

  // Version 4 exists for the PLCY section: a file has it exactly when it is version 4.
  KILN_CHECK(policy.present == (h.format_version == kEngineFormatVersion), kCorrupted,
             "engine file corrupted: ", policy.present ? "a PLCY section in" : "no PLCY section in",
             " a format version ", h.format_version, " file");
  if (policy.present) f.options.policy = read_policy(policy);
  if (log.present) f.build_log = read_string_section(log, "section BLOG", "the build log");
  if (kernels.present) {
    ByteReader kr(kernels.data, kernels.size, kernels.offset, "section KERN");
    uint64_t n = kr.count32(8, "kernel states");
    if (n != f.plan.nodes().size())
      kr.fail_corrupted(detail::concat(n, " kernel states for a plan of ", f.plan.nodes().size(), " nodes"));
    f.kernel_states.resize(size_t(n));
    for (Bytes& b : f.kernel_states) {
      uint64_t len = kr.u64();
      const uint8_t* p = kr.take(len);
      b.assign(p, p + len);
    }
    expect_consumed(kr);
  }
  if (swid.present) f.source_weights_id = read_string_section(swid, "section SWID", "the source weights id");
  if (refit.present) {
    ByteReader rr(refit.data, refit.size, refit.offset, "section RFIT");
    f.refit_program = std::make_shared<const Graph>(read_graph(rr, blobs));
    expect_consumed(rr);
  }
  return f;
}

}  // namespace kiln::serialize
