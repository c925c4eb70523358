// Device code kept as .cuh files (src/backends/cuda/codegen/cuh/) and embedded into the library
// at build time (cmake/embed_sources.cmake), so that it reads, diffs and checks as CUDA while
// NVRTC compiles it at engine build time as any generated source.
#pragma once

#include <string_view>

namespace kiln::cuda {

// The text of the embedded file `name` (e.g. "flash_attention.cuh"); kInternal when there is none.
std::string_view embedded_source(std::string_view name);

}  // namespace kiln::cuda
