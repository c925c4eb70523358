// Kiln engine files: the bytes Engine::serialize writes and Engine::deserialize reads.
//
// Layout, all integers little-endian; str = u32 byte length + UTF-8 bytes:
//
//   offset 0   magic "KILNENG\0"                       8 bytes
//   offset 8   u32 format version: kEngineFormatVersion when the file has a PLCY section, else
//              kEngineFormatVersionNoPolicy (the lowest version whose readers read it all)
//   offset 12  u64 file size in bytes, trailer included (tells truncation from corruption)
//   offset 20  header: str kiln version, str backend name ("cpu", "cuda"),
//              str device name (Backend::device_name()), u32 section count
//              sections, each: u32 tag (four characters, first in the lowest byte, so the
//              file reads "PLAN"), u64 payload length, payload
//   size - 8   trailer: u64 checksum64 (src/serialize/byte_io.h) of every byte before it
//
// Sections (each exactly once, except BLOG which is optional; unknown tags are skipped so
// that backends can add their own blobs):
//   PLAN  the plan Graph:
//           graph := u32 nvalues, value*, u32 nnodes, node*, u32 ninputs, i32 id*,
//                    u32 noutputs, i32 id*
//           value := u8 flags (1 input, 2 weight, 4 constant), type, str name,
//                    [u64 WGTS blob index, when a constant]
//           type  := u8 dtype (DType enum), u32 rank, rank x (i64 extent, str symbol,
//                    i64 min, i64 max)
//           node  := str op name (names, not enum values, so renumbering ops never breaks
//                    files), u32 n, i32 input id* (-1: absent), u32 n, i32 output id*,
//                    u32 nattrs, (str key, u8 kind, payload)*, str name,
//                    u8 has_body, [graph: the fused_pointwise body, recursively]
//           attr kinds (AttrValue order): 0 bool (u8 0|1), 1 i64, 2 f64 (IEEE bits),
//                    3 str, 4 u32 n + i64*, 5 u32 n + f64*, 6 dtype (u8)
//         Value ids are dense; graph_codec.h says how they are kept across a round trip.
//   WGTS  constant data: u64 count, then per blob u64 size, zero padding to the next file
//         offset that is a multiple of 64, the bytes. Constants sharing bytes share a blob.
//   OPTS  KernelOptions: i32 optimization level, u64 workspace limit (its policy: PLCY).
//   BLOG  the build log, str.
//   KERN  per plan node, in order: u32 node count, then per node u64 length + the bytes of
//         Kernel::state() (the tactic and generated code; empty for most CPU kernels).
//         Optional: absent means every state is empty.
//   RFIT  the refit program (include/kiln/refit.h), a graph in the PLAN encoding whose
//         constants are blobs of the same WGTS section: inputs named by the source weights,
//         outputs named by the plan constants they re-derive. Optional: absent means the engine
//         was built with immutable weights. Read like PLAN (bounds checked, rebuilt, verified),
//         then Engine::create checks that its names and types fit the plan (kCorrupted).
//   SWID  str: Engine::source_weights_id(), an opaque label of the weights the constants came
//         from (the engine cache's fingerprint). Optional: absent means none.
//   PLCY  KernelOptions::policy (kiln/build_policy.h): u8 allow_tf32 (0|1), u8 exact_gelu (0|1),
//         u8 attention_tactic (AttentionTactic). Written only when the policy is not the default
//         one, and then the file is format version 4: a version 3 reader, which would make the
//         kernels with the default numerics, refuses it. Absent (every version 3 file): the
//         default policy. Present in a version 3 file, or absent from a version 4 one: kCorrupted.
//
// Reading checks, in order: magic (kCorrupted), format version (3 or 4, else kVersionMismatch
// naming both), file size (kTruncated when short, kCorrupted when long), then the checksum before
// anything else is parsed (kCorrupted "checksum mismatch"), then backend and device name
// against the loading backend (kDeviceMismatch, naming both). Every later read is bounds
// checked (kTruncated naming the bytes needed, the offset and the section), counts are
// checked against the bytes left before allocating, and the plan is rebuilt and verified
// (kCorrupted naming the value, node or op).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/backend.h"
#include "kiln/ir.h"

namespace kiln::serialize {

inline constexpr char kEngineMagic[8] = {'K', 'I', 'L', 'N', 'E', 'N', 'G', '\0'};
// 2: checksum64 replaced FNV-1a; 3: summed by chunks; 4: the PLCY section (a build policy).
inline constexpr uint32_t kEngineFormatVersion = 4;
// The version of a file without a PLCY section (the default policy), which version 3 readers read.
inline constexpr uint32_t kEngineFormatVersionNoPolicy = 3;
inline constexpr size_t kEngineHeaderFixedBytes = 20;  // magic, version, file size
inline constexpr size_t kEngineTrailerBytes = 8;

struct EngineFile {
  std::string kiln_version;
  std::string backend;      // Backend::name() of the backend that built it
  std::string device_name;  // Backend::device_name()
  Graph plan;
  KernelOptions options;
  std::string build_log;
  std::vector<Bytes> kernel_states;  // one per plan node, or empty
  std::shared_ptr<const Graph> refit_program;  // null: immutable weights
  std::string source_weights_id;               // Engine::source_weights_id(); empty: no SWID section
};

Bytes write_engine_file(const EngineFile& file);

struct EngineFileHeader {
  uint32_t format_version = 0;
  std::string kiln_version, backend, device_name;
};
// Checks magic, version, size and checksum and returns the header, without the sections
// (to pick the device an engine file needs before loading it).
EngineFileHeader read_engine_header(const uint8_t* data, size_t size);

// Reads and checks a file for a backend named `backend` on a device named `device_name`. With an
// `owner`, the constants are views of `data` (which the owner keeps alive and which the engine
// may write, e.g. a private mapping) instead of copies.
EngineFile read_engine_file(const uint8_t* data, size_t size, const std::string& backend,
                            const std::string& device_name, const std::shared_ptr<void>& owner = nullptr);

// Recomputes the trailer of an engine file that was edited in place (tests, fuzzing).
void reseal_engine_file(Bytes& file);

}  // namespace kiln::serialize
