// Build policy: what a build may do to the numbers an engine computes, and how hard it searches
// for fast kernels. BuilderConfig holds a BuildPolicy and an optimization level; both reach every
// kernel through KernelOptions (kiln/backend.h) and are saved in the engine file, so that loading
// an engine remakes its kernels with the numerics it was built with. Nothing else (no
// environment variable) changes what an engine computes.
//
// TacticBudget is the one place where the optimization level becomes numbers: each tactic search
// of the CUDA backend reads its count from tactic_budget(level) and from nowhere else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln {

// How a CUDA build chooses between the generated flash-attention kernel and cuDNN's fused
// attention where both serve an sdpa node.
enum class AttentionTactic : uint8_t {
  kAuto = 0,       // timed against each other (optimization level > 0; level 0: the generated one)
  kGenerated = 1,  // the generated kernel, untimed
  kCudnn = 2,      // cuDNN's first plan, untimed (kUnsupported when cuDNN offers none)
};
inline constexpr const char* kAttentionTacticNames = R"("auto", "generated", "cudnn")";

// "auto", "generated", "cudnn"; "?" for a value outside the enum.
const char* attention_tactic_name(AttentionTactic t);
// The tactic named `name`; throws kInvalidArgument naming `field` and the valid names.
AttentionTactic parse_attention_tactic(const std::string& name, const std::string& field = "attention_tactic");

struct BuildPolicy {
  // f32 GEMMs and convolutions may use TF32 tensor cores (10 mantissa bits in the products,
  // f32 accumulation). false: strict f32 (cuBLASLt without TF32; cuDNN engines without tensor
  // cores, FFT or Winograd), at several times the cost.
  bool allow_tf32 = true;
  // true: exact GELU (erf) stays exact everywhere. false: in f16 / bf16 a linear's exact GELU may
  // run as cuBLASLt's tanh-form epilogue, at most 4.7e-4 away (below half precision's resolution).
  bool exact_gelu = false;
  AttentionTactic attention_tactic = AttentionTactic::kAuto;

  bool operator==(const BuildPolicy&) const = default;
  // "allow_tf32=true, exact_gelu=false, attention_tactic=auto"
  std::string to_string() const;
  // Throws kInvalidArgument naming the field as `prefix` + field name (an attention_tactic
  // outside the enum, e.g. cast from an integer).
  void validate(const std::string& prefix = "BuildPolicy.") const;
};

// How many candidates the tactic searches of a build try at one optimization level.
struct TacticBudget {
  static constexpr size_t kAll = SIZE_MAX;  // no bound

  bool timed = true;               // whether any choice is timed (level > 0)
  size_t timed_candidates = 8;     // candidates a search times (the first ones); 1: the first, untimed
  size_t cublaslt_heuristics = 8;  // algorithms asked of cuBLASLt's heuristic per GEMM
  size_t conv_plans = 8;           // cuDNN conv plans finalized (and then timed) per graph
  // The conv plans and timed candidates of a cuDNN graph whose plans are runtime-compiled (a
  // hardswish / hardsigmoid epilogue chain, a depthwise conv's contenders): each compiles for up
  // to a second, so below level 5 the better of the heuristic's first two.
  size_t compiled_conv_plans = 2;
  size_t compiled_timed_candidates = 2;
  size_t cudnn_attention_plans = 7;         // cuDNN fused-attention plans timed against the generated kernel
  size_t cudnn_masked_attention_plans = 2;  // the same with a mask (runtime-compiled plans)

  bool operator==(const TacticBudget&) const = default;
  // One line for build logs.
  std::string to_string() const;
};

// The budget of optimization level `level` (0..5; outside it, the nearest level's).
TacticBudget tactic_budget(int level);

}  // namespace kiln
