// The PLAN and WGTS payloads of an engine file: a plan Graph (fused bodies recursively) and
// the constant bytes it refers to by index. The byte layout is documented in engine_file.h.
//
// Writing numbers values as Graph::compact() would (values nothing produces or uses are not
// stored), so the plan of a built engine comes back with the same ValueIds and the same text.
//
// Reading rebuilds the graph through the public Graph API (add_input, add_constant,
// insert_node, insert_fused, mark_output) in ValueId order, so every node's shape rule runs
// again, and then compares every rebuilt value (type with symbols, name, flags) with the
// stored one. A node may use a value whose id is higher than its own outputs' (fusion inserts
// nodes before older users); such an input is created first as a stand-in constant of the
// stored type and rewired once its producer exists, and compact() then drops the stand-ins.
// Any inconsistency throws kCorrupted naming the value or node; reads past the end throw
// kTruncated.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "kiln/ir.h"
#include "src/serialize/byte_io.h"

namespace kiln::serialize {

using Blob = std::shared_ptr<const HostBuffer>;

// Constants to store, one entry per distinct buffer (constants sharing bytes share a blob).
class BlobTable {
 public:
  uint64_t add(const Blob& data);
  const std::vector<Blob>& blobs() const { return blobs_; }

 private:
  std::vector<Blob> blobs_;
  std::unordered_map<const HostBuffer*, uint64_t> index_;
};

// Value flags in the PLAN payload.
inline constexpr uint8_t kValueIsInput = 1, kValueIsWeight = 2, kValueIsConstant = 4;

// Blob data starts at file offsets that are multiples of this.
inline constexpr size_t kBlobAlignment = 64;
// Fused bodies nest at most this deep in a file.
inline constexpr int kMaxBodyDepth = 8;

void write_graph(ByteWriter& w, const Graph& g, BlobTable& blobs);
void write_blobs(ByteWriter& w, const BlobTable& blobs);

// With an `owner`, the blobs are views of the reader's bytes (which the owner keeps alive and
// which the engine may write) instead of copies.
std::vector<Blob> read_blobs(ByteReader& r, const std::shared_ptr<void>& owner = nullptr);
Graph read_graph(ByteReader& r, const std::vector<Blob>& blobs);

}  // namespace kiln::serialize
