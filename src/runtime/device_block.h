// The layout of an engine's one device block (src/runtime/engine.cpp): the constants, then
// possibly the first context's arena and workspace.
#pragma once

#include <cstddef>

namespace kiln {

// The driver hands out device memory in pages of this size: an allocation of a page or more
// takes whole pages of its own, a smaller one may share a page the driver already holds.
inline constexpr size_t kDevicePage = size_t(2) << 20;

inline size_t device_pages(size_t bytes) { return (bytes + kDevicePage - 1) / kDevicePage; }

// Offsets within an engine's device block: multiples of the backend's alignment and of 256 bytes.
inline size_t block_rounded(size_t alignment, size_t bytes) {
  const size_t align = alignment > 256 ? alignment : 256;
  return (bytes + align - 1) / align * align;
}

// Whether a context's memory (`context` bytes) goes in the engine's block after `constants`
// bytes. A context of a page or more does (one block never takes more pages than two); a smaller
// one only where it fits in the block's last page, since on its own it may cost no new page.
inline bool context_joins_block(size_t constants, size_t context) {
  return context >= kDevicePage || device_pages(constants + context) == device_pages(constants);
}

}  // namespace kiln
