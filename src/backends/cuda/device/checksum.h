// The word checksum (kiln/backend.h) of device memory, computed on the device; see checksum.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kiln/backend.h"

namespace kiln::cuda {

// The checksum kernel of the current device, compiled on first use (the backend's warm-up
// asks for it ahead of any engine cache hit).
cudaKernel_t checksum_kernel();
// The word checksum of `buffers` (device memory of the current device) laid end to end, read
// after the work already queued on `stream`; returns once it is computed.
uint64_t word_checksum_on_device(const std::vector<Backend::Span>& buffers, cudaStream_t stream);

}  // namespace kiln::cuda
