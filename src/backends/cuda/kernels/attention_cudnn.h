// cuDNN's fused attention as a second tactic of sdpa, which the build times against the
// generated flash kernel (attention_fused.h). Two operation graphs, each one flash-attention
// kernel of cuDNN's:
//   - no mask: cuDNN's one SDPA operation (CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, cuDNN
//     9.13 and later), O = softmax(scale * Q K^T) V;
//   - an additive mask (q's dtype), causal, or both: the chain of matmul, pointwise and
//     reduction operations that cuDNN's runtime fusion compiles into its flash kernel with a
//     bias and / or its causal select, O = softmax(causal(scale * Q K^T + mask)) V. A bool mask
//     is not served; CUDA builds turn the bool masks of f16 / bf16 sdpa nodes into additive ones
//     (additive_attention_masks, kiln/passes.h).
//
// It serves f16/bf16, q, k, v and the output as [B, H, S, D] strided views (batch
// rank at most 2, no broadcast batch dim, the head dim contiguous), head dims equal and a
// multiple of 8 up to 256; a mask that broadcasts over batch dims and query rows but not over
// the keys, with 16-byte aligned rows. Any row and batch strides of q, k, v and the output work,
// so layout "bshd" and other strided operands run without copies.
//
// State: pack_state({}, params), params = kCudnnAttentionTag, i64 engine global index, u32 knob
// count, per knob (i32 type, i64 value), u32 plan_json length and its bytes (the plan serialized
// by cuDNN, cudnn_graph.h plan_json: the masked graph's runtime-compiled plans; empty for the
// unmasked operation's, which cuDNN does not serialize). Loading rebuilds the plan without
// heuristics or timing: from its serialized form when there is one, which compiles nothing,
// else (or when this cuDNN refuses the text) by finalizing the engine config, which for the
// masked graph compiles cuDNN's kernel again. States written before the plan was stored end
// after the knobs and read as having no serialized plan. The timing cache stores the same params.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/backend.h"
#include "src/backends/cuda/kernels/attention_fused.h"
#include "src/backends/cuda/libs/cudnn_graph.h"

namespace kiln::cuda {

inline constexpr uint8_t kCudnnAttentionTag = 3;

// Whether the cuDNN operation can express this node (and the loaded cuDNN has it); `why`
// receives the reason when not.
bool cudnn_attention_serves(const AttentionGeometry& geo, std::string* why);

// Up to `limit` kernels, one per engine config cuDNN's heuristics propose that finalizes into
// a plan within `workspace_limit` (none when cuDNN offers nothing; `log` says why).
std::vector<std::unique_ptr<Kernel>> cudnn_attention_candidates(const Node& n, const AttentionGeometry& geo,
                                                                size_t limit, size_t workspace_limit, std::string* log);

// What a state or a timing-cache entry holds: the engine config, and its plan serialized by
// cuDNN (empty where cuDNN does not serialize it).
struct CudnnAttentionChoice {
  EngineId id;
  std::string plan_json;
  bool operator==(const CudnnAttentionChoice& o) const { return id == o.id && plan_json == o.plan_json; }
};

// The kernel of a saved choice (a state or a timing-cache entry): its plan rebuilt from
// plan_json when cuDNN takes the text, else from the engine config; throws kUnsupported when
// this cuDNN cannot rebuild it.
std::unique_ptr<Kernel> make_cudnn_attention(const Node& n, const AttentionGeometry& geo,
                                             const CudnnAttentionChoice& choice, const std::string& note);

// The choice in a state's params (kCorrupted when malformed), and the params of one.
CudnnAttentionChoice decode_cudnn_attention(const Bytes& params);
Bytes encode_cudnn_attention(const CudnnAttentionChoice& choice);

// Bytes operand `which` of `geo` (0-3: q, k, v, the output; 4: an additive mask) spans from its
// base pointer (for scratch buffers).
size_t attention_operand_bytes(const AttentionGeometry& geo, int operand);

}  // namespace kiln::cuda
