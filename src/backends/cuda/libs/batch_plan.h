// How numpy-broadcast batch dims map onto cuBLASLt's strided batches (cublaslt_plan.cpp);
// free of CUDA headers so that device-free tests can check it.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::cuda {

// How the batch dims of a problem map onto cuBLASLt's strided batches: `outer` groups of
// `inner` matrices; within a group operand t's matrices are inner_stride[t] apart; group o of
// operand t starts at outer_offset[t][o] (elements). Found as the largest inner count for which
// every operand's offsets are affine within each group.
struct BatchPlan {
  int64_t inner = 1;
  std::vector<int64_t> inner_stride;
  std::vector<std::vector<int64_t>> outer_offset;
  size_t outer() const { return outer_offset.empty() ? 1 : outer_offset[0].size(); }
};
// Each operand's strides (elements; 0 broadcasts) per output batch dim `out_batch`.
BatchPlan plan_strided_batches(const std::vector<int64_t>& out_batch, const std::vector<std::vector<int64_t>>& strides);

}  // namespace kiln::cuda
