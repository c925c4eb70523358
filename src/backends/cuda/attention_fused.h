// The geometry of an sdpa node (shared by attention.cpp's two paths) and the fused
// flash-attention path (attention_fused.cpp; the kernel source is in flash_codegen.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/backend.h"
#include "src/backends/cuda/gemm_codegen.h"
#include "src/backends/cuda/nvrtc.h"

namespace kiln::cuda {

struct AttentionGeometry {
  DType dtype = DType::kF32;
  int64_t L = 0, S = 0, E = 0, Ev = 0;
  float scale = 1.0f;
  bool causal = false;
  std::vector<int64_t> out_batch, q_batch, k_batch, v_batch;  // each operand's own batch dims
  int batch_rank = 0;
  int64_t batch_count = 1;
  // Per output batch dim (size) each operand's batch stride in elements (stride; 0 broadcasts).
  KilnDims q_dims{}, k_dims{}, v_dims{}, o_dims{}, mask_dims{};
  // Elements between consecutive sequence rows: the head dim for layout "bhsd"; heads x head dim
  // for "bshd" ([B, S, H, D], where the batch dims are (B, H) and H's stride is the head dim).
  bool bshd = false;
  int64_t q_row = 0, k_row = 0, v_row = 0, o_row = 0;
  int mask_kind = 0;  // 0 none, 1 bool (keep where true), 2 additive (q's dtype)
  int64_t mask_row_stride = 0, mask_col_stride = 0;
};

AttentionGeometry attention_geometry(const Node& n, const Graph& g);

// Whether the fused kernel can run this node; `why` receives the reason when not.
bool fused_attention_serves(const AttentionGeometry& geo, std::string* why);
// Builds the fused kernel (compiling its source, or loading `saved`'s cubin).
std::unique_ptr<Kernel> make_fused_attention(const Node& n, const AttentionGeometry& geo, const CompiledState* saved);

}  // namespace kiln::cuda
