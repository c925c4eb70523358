// The conv family's tactic choice as bytes: what the timing cache stores per conv signature and
// what Kernel::state() carries (inside pack_state, next to the epilogue's or the depthwise
// kernel's cubin, or the GEMM kernel's own state, when there is one), so that loading an engine
// rebuilds the exact cuDNN execution plan (or the other tactic) without heuristics or timing.
//
// Three tactics: a cuDNN execution plan; the generated depthwise kernel (depthwise.h), which the
// build times against the cuDNN plans for depthwise convs; and, for a conv that is one GEMM
// (a channels-last 1x1 conv: conv.cpp's gemm_conv), the linear family's cuBLASLt GEMM, timed
// against the cuDNN plan. Whichever is faster is kept.
//
// Layout (little endian): "KCV1", u8 version (3; version 2, written before plans were
// serialized, is read with an empty plan_json; a version-1 state, which had no tactic byte, is
// refused as kCorrupted rather than misread), u8 tactic (0 cuDNN, 1 generated depthwise, 2 GEMM), u8
// fused, u64 signature (a hash of the conv's shapes, dtypes and attributes, so a state from
// another node is refused), u64 kernel hash (FNV-1a of the generated depthwise source, so a
// cubin from another generator is refused; 0 otherwise), i64 engine global index (-1 for the
// depthwise kernel and the GEMM), u32 knob count, per knob (i32 type, i64 value), version 3: u32 plan_json
// length and its bytes, then u64 FNV-1a of everything before. decode_conv_choice throws
// kCorrupted naming what is wrong. No CUDA header here: the layout is tested on machines
// without a GPU.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kiln/errors.h"
#include "kiln/ir.h"

namespace kiln::cuda {

enum class ConvTactic : uint8_t { kCudnn = 0, kDepthwise = 1, kGemm = 2 };

struct ConvChoice {
  ConvTactic tactic = ConvTactic::kCudnn;
  bool fused = true;        // one cuDNN graph with the epilogue; false: conv graph + generated epilogue
  uint64_t signature = 0;   // conv_signature() of the node it was made for
  uint64_t kernel_hash = 0; // kDepthwise: FNV-1a of the generated source; otherwise 0
  int64_t engine = -1;      // kCudnn: cuDNN engine global index; otherwise -1
  std::vector<std::pair<int32_t, int64_t>> knobs;  // (knob type, value); kCudnn only
  // kCudnn: the finalized plan serialized by cuDNN (cudnn_graph.h plan_json), where cuDNN
  // serializes it (runtime-fusion engines, whose plans compile a kernel when finalized):
  // rebuilding the plan from it compiles nothing. Empty otherwise.
  std::string plan_json;
  bool operator==(const ConvChoice& o) const {
    return tactic == o.tactic && fused == o.fused && signature == o.signature && kernel_hash == o.kernel_hash &&
           engine == o.engine && knobs == o.knobs && plan_json == o.plan_json;
  }
};

inline uint64_t fnv1a(const uint8_t* p, size_t n, uint64_t h = 1469598103934665603ull) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

inline uint64_t conv_signature(const std::vector<std::string>& parts) {
  uint64_t h = fnv1a(nullptr, 0);
  for (const auto& s : parts) {
    h = fnv1a(reinterpret_cast<const uint8_t*>(s.data()), s.size(), h);
    const uint8_t sep = '|';
    h = fnv1a(&sep, 1, h);
  }
  return h;
}

namespace conv_state_detail {
inline constexpr uint8_t kMagic[4] = {'K', 'C', 'V', '1'};
inline constexpr uint8_t kVersion = 3;
inline constexpr uint32_t kMaxKnobs = 256;
inline constexpr uint32_t kMaxPlanJson = 64u << 20;

template <typename T>
void put(Bytes& b, T v) {
  const size_t at = b.size();
  b.resize(at + sizeof(T));
  std::memcpy(b.data() + at, &v, sizeof(T));
}

struct Reader {
  const Bytes& b;
  size_t pos = 0;
  template <typename T>
  T get(const char* what) {
    KILN_CHECK(pos + sizeof(T) <= b.size(), kCorrupted, "conv state: truncated at ", what, " (", b.size(), " bytes)");
    T v;
    std::memcpy(&v, b.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
};

// The cuDNN part of a saved choice, as the conv and attention states both store it: u32 knob
// count, per knob (i32 type, i64 value); u32 plan_json length and its bytes. `what` names the
// state in messages ("conv state").
using Knobs = std::vector<std::pair<int32_t, int64_t>>;

inline void put_knobs(Bytes& b, const Knobs& knobs) {
  put<uint32_t>(b, uint32_t(knobs.size()));
  for (const auto& [type, value] : knobs) {
    put<int32_t>(b, type);
    put<int64_t>(b, value);
  }
}

inline Knobs get_knobs(Reader& r, const char* what) {
  const auto n = r.get<uint32_t>("knob count");
  KILN_CHECK(n <= kMaxKnobs, kCorrupted, what, ": ", n, " knobs (at most ", kMaxKnobs, ")");
  Knobs knobs;
  for (uint32_t i = 0; i < n; ++i) {
    const auto type = r.get<int32_t>("knob type");
    knobs.emplace_back(type, r.get<int64_t>("knob value"));
  }
  return knobs;
}

inline void put_plan_json(Bytes& b, const std::string& json, const char* what) {
  KILN_CHECK(json.size() <= kMaxPlanJson, kInternal, what, ": a serialized plan of ", json.size(), " bytes");
  put<uint32_t>(b, uint32_t(json.size()));
  b.insert(b.end(), json.begin(), json.end());
}

inline std::string get_plan_json(Reader& r, const char* what) {
  const auto len = r.get<uint32_t>("plan length");
  KILN_CHECK(len <= kMaxPlanJson && len <= r.b.size() - r.pos, kCorrupted, what, ": a serialized plan of ", len,
             " bytes, with ", r.b.size() - r.pos, " left in the state");
  std::string json(reinterpret_cast<const char*>(r.b.data() + r.pos), len);
  r.pos += len;
  return json;
}
}  // namespace conv_state_detail

inline Bytes encode_conv_choice(const ConvChoice& c) {
  using namespace conv_state_detail;
  Bytes b(kMagic, kMagic + 4);
  put<uint8_t>(b, kVersion);
  put<uint8_t>(b, uint8_t(c.tactic));
  put<uint8_t>(b, c.fused ? 1 : 0);
  put<uint64_t>(b, c.signature);
  put<uint64_t>(b, c.kernel_hash);
  put<int64_t>(b, c.engine);
  put_knobs(b, c.knobs);
  put_plan_json(b, c.plan_json, "conv state");
  put<uint64_t>(b, fnv1a(b.data(), b.size()));
  return b;
}

inline ConvChoice decode_conv_choice(const Bytes& b) {
  using namespace conv_state_detail;
  KILN_CHECK(b.size() >= 4 && std::memcmp(b.data(), kMagic, 4) == 0, kCorrupted,
             "conv state: bad magic (not a conv tactic, ", b.size(), " bytes)");
  Reader r{b, 4};
  const auto version = r.get<uint8_t>("version");
  KILN_CHECK(version == kVersion || version == 2, kCorrupted, "conv state: version ", int(version), ", expected 2 or ",
             int(kVersion));
  ConvChoice c;
  const auto tactic = r.get<uint8_t>("tactic");
  KILN_CHECK(tactic <= 2, kCorrupted, "conv state: tactic ", int(tactic),
             " is not 0 (cuDNN), 1 (depthwise) or 2 (GEMM)");
  c.tactic = ConvTactic(tactic);
  const bool cudnn = c.tactic == ConvTactic::kCudnn, depthwise = c.tactic == ConvTactic::kDepthwise;
  const char* name = cudnn ? "cuDNN" : depthwise ? "depthwise" : "GEMM";
  const auto fused = r.get<uint8_t>("fused flag");
  KILN_CHECK(fused <= 1, kCorrupted, "conv state: fused flag ", int(fused), " is not 0 or 1");
  c.fused = fused == 1;
  c.signature = r.get<uint64_t>("signature");
  c.kernel_hash = r.get<uint64_t>("kernel hash");
  KILN_CHECK(depthwise == (c.kernel_hash != 0), kCorrupted, "conv state: kernel hash ", c.kernel_hash,
             depthwise ? " missing on the depthwise tactic" : " on the " + std::string(name) + " tactic");
  c.engine = r.get<int64_t>("engine index");
  KILN_CHECK(cudnn ? c.engine >= 0 : c.engine == -1, kCorrupted, "conv state: engine index ", c.engine,
             cudnn ? std::string(" is negative") : " on the " + std::string(name) + " tactic (expected -1)");
  c.knobs = get_knobs(r, "conv state");
  KILN_CHECK(cudnn || c.knobs.empty(), kCorrupted, "conv state: ", c.knobs.size(), " knobs on the ", name, " tactic");
  if (version >= 3) {
    c.plan_json = get_plan_json(r, "conv state");
    KILN_CHECK(cudnn || c.plan_json.empty(), kCorrupted, "conv state: a serialized plan on the ", name, " tactic");
  }
  const size_t body = r.pos;
  const auto sum = r.get<uint64_t>("checksum");
  KILN_CHECK(sum == fnv1a(b.data(), body), kCorrupted, "conv state: checksum mismatch (damaged bytes)");
  KILN_CHECK(r.pos == b.size(), kCorrupted, "conv state: ", b.size() - r.pos, " trailing bytes");
  return c;
}

}  // namespace kiln::cuda
