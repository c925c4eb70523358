// BuildPolicy's names and checks, and the tactic budget of each optimization level
// (kiln/build_policy.h).
#include <algorithm>
#include <array>
#include <sstream>

#include "kiln/build_policy.h"
#include "kiln/errors.h"

namespace kiln {

const char* attention_tactic_name(AttentionTactic t) {
  switch (t) {
    case AttentionTactic::kAuto: return "auto";
    case AttentionTactic::kGenerated: return "generated";
    case AttentionTactic::kCudnn: return "cudnn";
  }
  return "?";
}

AttentionTactic parse_attention_tactic(const std::string& name, const std::string& field) {
  for (AttentionTactic t : {AttentionTactic::kAuto, AttentionTactic::kGenerated, AttentionTactic::kCudnn})
    if (name == attention_tactic_name(t)) return t;
  KILN_FAIL(kInvalidArgument, field, " must be one of ", kAttentionTacticNames, ", got \"", name, "\"");
}

std::string BuildPolicy::to_string() const {
  return detail::concat("allow_tf32=", allow_tf32 ? "true" : "false", ", exact_gelu=", exact_gelu ? "true" : "false",
                        ", attention_tactic=", attention_tactic_name(attention_tactic));
}

void BuildPolicy::validate(const std::string& prefix) const {
  KILN_CHECK(attention_tactic == AttentionTactic::kAuto || attention_tactic == AttentionTactic::kGenerated ||
                 attention_tactic == AttentionTactic::kCudnn,
             kInvalidArgument, prefix, "attention_tactic must be one of ", kAttentionTacticNames, ", got the value ",
             int(attention_tactic));
}

namespace {

std::string count(size_t n) { return n == TacticBudget::kAll ? std::string("all") : std::to_string(n); }

}  // namespace

std::string TacticBudget::to_string() const {
  std::ostringstream os;
  if (timed) os << "times up to " << count(timed_candidates) << " candidates";
  else os << "times nothing (first candidates)";
  os << "; cuBLASLt heuristics " << count(cublaslt_heuristics) << ", cuDNN conv plans " << count(conv_plans)
     << " (runtime-compiled " << count(compiled_conv_plans) << ", " << count(compiled_timed_candidates)
     << " timed), cuDNN attention plans " << count(cudnn_attention_plans) << " (masked "
     << count(cudnn_masked_attention_plans) << ")";
  return os.str();
}

TacticBudget tactic_budget(int level) {
  constexpr size_t kAll = TacticBudget::kAll;
  // One column per optimization level 0..5.
  constexpr std::array<size_t, 6> timed_candidates = {1, 2, 4, 8, 16, kAll};
  constexpr std::array<size_t, 6> cublaslt_heuristics = {1, 2, 4, 8, 16, 32};
  constexpr std::array<size_t, 6> conv_plans = {1, 2, 4, 8, 16, 64};
  // Runtime-compiled cuDNN plans: level 1's counts below the exhaustive level.
  constexpr std::array<size_t, 6> compiled_conv_plans = {1, 2, 2, 2, 2, 64};
  constexpr std::array<size_t, 6> compiled_timed_candidates = {1, 2, 2, 2, 2, kAll};
  constexpr std::array<size_t, 6> cudnn_attention_plans = {1, 1, 3, 7, 15, 15};
  constexpr std::array<size_t, 6> cudnn_masked_attention_plans = {1, 1, 2, 2, 2, 15};
  const size_t l = size_t(std::clamp(level, 0, 5));
  TacticBudget b;
  b.timed = l > 0;
  b.timed_candidates = timed_candidates[l];
  b.cublaslt_heuristics = cublaslt_heuristics[l];
  b.conv_plans = conv_plans[l];
  b.compiled_conv_plans = compiled_conv_plans[l];
  b.compiled_timed_candidates = compiled_timed_candidates[l];
  b.cudnn_attention_plans = cudnn_attention_plans[l];
  b.cudnn_masked_attention_plans = cudnn_masked_attention_plans[l];
  return b;
}

}  // namespace kiln
