// Kiln bundle files: the bytes write_bundle writes and Bundle::deserialize reads (kiln/bundle.h).
//
// Layout, all integers little-endian; str = u32 byte length + UTF-8 bytes. The fixed header and
// the trailer are laid out as an engine file's (src/serialize/engine_file.h), so the same tools
// reseal both:
//
//   offset 0   magic "KILNBDL\0"                                  8 bytes
//   offset 8   u32 format version (kBundleFormatVersion)
//   offset 12  u64 file size in bytes, trailer included (tells truncation from corruption)
//   offset 20  str kiln version
//              glue:
//                u32 ninputs,  per input:  str name, tensor
//                u32 nsteps,   per step:   str name, u32 engine index, u32 nargs, ref*
//                u32 noutputs, per output: str name, ref, tensor
//                u32 nranges,  per range:  u32 engine, binding built_at, u64 length + the SizeProgram's
//                              bytes (SizeProgram::serialize), binding pinned
//                tensor := u8 dtype (DType enum), u32 rank, per dim: i64 extent, str symbol ("" for a
//                          static dim), i64 min, i64 max (0, 0 for a static dim)
//                binding := u32 count, per symbol: str name, i64 value
//                ref := i32 step (-1: a program input), u32 index (of the program input, or of
//                       the step's engine outputs)
//              u32 nengines, per engine: u64 length, zero padding to the next file offset that is a
//                multiple of 64, the engine file's bytes (each with its own checksum)
//   size - 8   trailer: u64 checksum64 (src/serialize/byte_io.h) of every byte before it
//
// Reading checks, in order: magic (kCorrupted), format version (kVersionMismatch naming both),
// file size (kTruncated when short, kCorrupted when long), the checksum before anything else is
// parsed (kCorrupted), then every read is bounds checked (kTruncated) and every count checked
// against the bytes left before allocating (kCorrupted). The glue is then checked against the
// engines' inputs and outputs (program_problem): a failure is kCorrupted for a file read and
// kInvalidArgument for a program being written. Format 1 (no symbols, no ranges) is refused
// with kVersionMismatch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/bundle.h"

namespace kiln::bundle_file {

inline constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'B', 'D', 'L', '\0'};
inline constexpr uint32_t kBundleFormatVersion = 2;
inline constexpr size_t kFixedHeaderBytes = 20;  // magic, version, file size
inline constexpr size_t kTrailerBytes = 8;
inline constexpr size_t kEngineAlignment = 64;

struct BundleFile {
  std::string kiln_version;
  BundleProgram program;
  std::vector<std::span<const uint8_t>> engines;  // views of the bytes read
};

// The file's bytes; `program` is not checked here (write_bundle checks it first).
Bytes write(const std::string& kiln_version, const BundleProgram& program,
            const std::vector<std::span<const uint8_t>>& engines);
// Checks the container and reads the glue; the engine views point into `data`.
BundleFile read(const uint8_t* data, size_t size);

struct EngineIO {
  std::vector<IOTensor> inputs, outputs;
};
// What is wrong with `program` for engines with these inputs and outputs ("" when nothing is): at
// least one engine, engine indices in range, each step's argument count and types equal to its
// engine's inputs, references only to program inputs and earlier steps' outputs, each program
// output's type that of its value (types compare by dtype and extents; in a dynamic program,
// whose engines were built at sizes of their own, by dtype and rank), each range of a distinct
// engine, its symbols those of the program's inputs. When nothing is wrong and `outputs` is not
// null, it receives the program outputs' names and types.
std::string program_problem(const BundleProgram& program, const std::vector<EngineIO>& engines,
                            std::vector<IOTensor>* outputs);

}  // namespace kiln::bundle_file
