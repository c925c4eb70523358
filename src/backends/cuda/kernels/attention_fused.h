// The geometry of an sdpa node (shared by attention.cpp's two paths) and the fused
// flash-attention path (attention_fused.cpp; the kernel source is in flash_attention_source.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/backend.h"
#include "src/backends/cuda/codegen/gemm_sources.h"
#include "src/backends/cuda/codegen/nvrtc.h"

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
  // for "bshd" ([B, S, H, D], where the batch dims are (B, H) and H's stride is the head dim);
  // the view's row stride for operand views (q_view, ...) and the permuted output's (out_perm).
  bool bshd = false;
  int64_t q_row = 0, k_row = 0, v_row = 0, o_row = 0;
  // Elements from each kernel argument's pointer (in[0..2], out[0]) to the operand's first
  // element: a view's offset (q_view etc.; k and v of a qkv linear start E and 2E in), else 0.
  // Every path adds them to its pointers (dtype_size(dtype) bytes each); the row and batch
  // strides above are from that element on.
  int64_t q_off = 0, k_off = 0, v_off = 0, o_off = 0;
  // Whether the node has operand views or an out_perm (sdpa_layout): for descriptions.
  bool views = false;
  int mask_kind = 0;  // 0 none, 1 bool (keep where true), 2 additive (q's dtype)
  int64_t mask_row_stride = 0, mask_col_stride = 0;
};

AttentionGeometry attention_geometry(const Node& n, const Graph& g);

// Whether the fused kernel can run this node; `why` receives the reason when not.
bool fused_attention_serves(const AttentionGeometry& geo, std::string* why);
// Builds the fused kernel (compiling its source, or loading `saved`'s cubin).
std::unique_ptr<Kernel> make_fused_attention(const Node& n, const AttentionGeometry& geo, const CompiledState* saved);

}  // namespace kiln::cuda
