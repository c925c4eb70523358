// The build policy (kiln/build_policy.h): the tactic budget of each optimization level, pinned
// to each CUDA search's own rule for its count (written out below); BuilderConfig's
// validation naming the field; the policy in the build log and the engine; engine files that
// keep it (format version 4, the PLCY section), files of the default policy that keep format
// version 3's layout, a file written before the policy existed, and damaged policy sections.
// With the CUDA backend: the conv family's explicit support predicate.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "tests/cpp/engine_file_test_util.h"
#ifdef KILN_WITH_CUDA
#include "src/backends/cuda/kernels.h"
#include "src/backends/cuda/kernels/conv_graph.h"
#endif

using namespace kiln;
using namespace kiln::engine_file_test;

namespace {

constexpr size_t kAll = TacticBudget::kAll;

// ---- the budget -------------------------------------------------------------------------
// Each search's count as a rule of the level, written out apart from tactic_budget's table so that
// the two check each other: the timed candidates (tactics.cpp), cuBLASLt's heuristics
// (cublaslt_plan.cpp), conv plans (conv_tactic.cpp), the runtime-compiled plans' level (conv.cpp)
// and cuDNN's attention plans (attention.cpp).
size_t ref_candidates(int level) {  // of "available" candidates; kAll: all of them
  if (level <= 0) return 1;
  if (level >= 5) return kAll;
  return size_t(1) << level;
}
size_t ref_heuristics(int level) { return level <= 0 ? 1 : level >= 5 ? 32 : size_t(1) << level; }
size_t ref_conv_plans(int level) {
  static const size_t kCount[] = {1, 2, 4, 8, 16, 64};
  return kCount[std::min(std::max(level, 0), 5)];
}
int ref_compiled_level(int level) { return level < 5 ? std::min(level, 1) : level; }
size_t ref_attention_plans(int level, bool masked) {
  size_t plans = (size_t(1) << std::clamp(level, 1, 4)) - 1;
  if (masked && level < 5) plans = std::min<size_t>(plans, 2);
  return plans;
}

TEST(TacticBudget, EveryLevelGivesEachSearchsOwnRule) {
  for (int level = 0; level <= 5; ++level) {
    SCOPED_TRACE(level);
    const TacticBudget b = tactic_budget(level);
    EXPECT_EQ(b.timed, level > 0);  // every search times only above level 0
    EXPECT_EQ(b.timed_candidates, ref_candidates(level));
    EXPECT_EQ(b.cublaslt_heuristics, ref_heuristics(level));
    EXPECT_EQ(b.conv_plans, ref_conv_plans(level));
    EXPECT_EQ(b.compiled_conv_plans, ref_conv_plans(ref_compiled_level(level)));
    EXPECT_EQ(b.compiled_timed_candidates, ref_candidates(ref_compiled_level(level)));
    EXPECT_EQ(b.timed, ref_compiled_level(level) > 0);  // the compiled search times when the level does
    EXPECT_EQ(b.cudnn_attention_plans, ref_attention_plans(level, false));
    EXPECT_EQ(b.cudnn_masked_attention_plans, ref_attention_plans(level, true));
  }
}

TEST(TacticBudget, TheTableLevelByLevel) {
  struct Row {
    bool timed;
    size_t timed_candidates, heuristics, conv, compiled_conv, compiled_timed, attention, masked;
  };
  const Row table[] = {
      {false, 1, 1, 1, 1, 1, 1, 1},         // 0
      {true, 2, 2, 2, 2, 2, 1, 1},          // 1
      {true, 4, 4, 4, 2, 2, 3, 2},          // 2
      {true, 8, 8, 8, 2, 2, 7, 2},          // 3, the default
      {true, 16, 16, 16, 2, 2, 15, 2},      // 4
      {true, kAll, 32, 64, 64, kAll, 15, 15}  // 5
  };
  for (int level = 0; level <= 5; ++level) {
    SCOPED_TRACE(level);
    const Row& r = table[level];
    const TacticBudget b = tactic_budget(level);
    EXPECT_EQ(b.timed, r.timed);
    EXPECT_EQ(b.timed_candidates, r.timed_candidates);
    EXPECT_EQ(b.cublaslt_heuristics, r.heuristics);
    EXPECT_EQ(b.conv_plans, r.conv);
    EXPECT_EQ(b.compiled_conv_plans, r.compiled_conv);
    EXPECT_EQ(b.compiled_timed_candidates, r.compiled_timed);
    EXPECT_EQ(b.cudnn_attention_plans, r.attention);
    EXPECT_EQ(b.cudnn_masked_attention_plans, r.masked);
  }
  // Outside 0..5 the nearest level (a file's level is checked on reading; this is the backstop).
  EXPECT_EQ(tactic_budget(-1), tactic_budget(0));
  EXPECT_EQ(tactic_budget(9), tactic_budget(5));
}

TEST(TacticBudget, DefaultsAreTheDefaultLevels) {
  EXPECT_EQ(TacticBudget{}, tactic_budget(3));
  EXPECT_EQ(KernelOptions{}.budget(), tactic_budget(BuilderConfig{}.optimization_level));
  KernelOptions o;
  o.optimization_level = 0;
  EXPECT_EQ(o.budget(), tactic_budget(0));
  EXPECT_EQ(tactic_budget(0).to_string(),
            "times nothing (first candidates); cuBLASLt heuristics 1, cuDNN conv plans 1 (runtime-compiled 1, 1 "
            "timed), cuDNN attention plans 1 (masked 1)");
  EXPECT_EQ(tactic_budget(5).to_string(),
            "times up to all candidates; cuBLASLt heuristics 32, cuDNN conv plans 64 (runtime-compiled 64, all "
            "timed), cuDNN attention plans 15 (masked 15)");
}

// ---- the policy and its validation ----------------------------------------------------------
std::string message_of(const std::function<void()>& f, ErrorCode want) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), want) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

TEST(BuildPolicy, DefaultsNamesAndText) {
  const BuildPolicy p;
  EXPECT_TRUE(p.allow_tf32);
  EXPECT_FALSE(p.exact_gelu);
  EXPECT_EQ(p.attention_tactic, AttentionTactic::kAuto);
  EXPECT_EQ(p.to_string(), "allow_tf32=true, exact_gelu=false, attention_tactic=auto");
  for (AttentionTactic t : {AttentionTactic::kAuto, AttentionTactic::kGenerated, AttentionTactic::kCudnn})
    EXPECT_EQ(parse_attention_tactic(attention_tactic_name(t)), t);
  EXPECT_EQ(
      message_of([] { parse_attention_tactic("fastest", "options.attention_tactic"); }, ErrorCode::kInvalidArgument),
      "[invalid argument] options.attention_tactic must be one of \"auto\", \"generated\", \"cudnn\", got "
      "\"fastest\"");
  EXPECT_EQ(message_of([] { parse_attention_tactic("Auto"); }, ErrorCode::kInvalidArgument),
            "[invalid argument] attention_tactic must be one of \"auto\", \"generated\", \"cudnn\", got \"Auto\"");
}

TEST(BuildPolicy, BuilderConfigValidationNamesTheField) {
  BuilderConfig c;
  c.policy.attention_tactic = AttentionTactic(7);
  const std::string want =
      "[invalid argument] BuilderConfig.policy.attention_tactic must be one of \"auto\", \"generated\", \"cudnn\", "
      "got the value 7";
  EXPECT_EQ(message_of([&] { c.validate(); }, ErrorCode::kInvalidArgument), want);
  EXPECT_EQ(message_of([&] { Builder b(c); }, ErrorCode::kInvalidArgument), want);
  c.policy.attention_tactic = AttentionTactic::kCudnn;
  c.policy.allow_tf32 = false;
  c.policy.exact_gelu = true;
  EXPECT_NO_THROW(c.validate());
}

// ---- the policy in builds and engine files ---------------------------------------------------
BuildPolicy strict_policy() {
  BuildPolicy p;
  p.allow_tf32 = false;
  p.exact_gelu = true;
  p.attention_tactic = AttentionTactic::kGenerated;
  return p;
}

std::shared_ptr<Engine> build_mlp(const BuildPolicy& policy, int level = 3) {
  BuilderConfig c;
  c.policy = policy;
  c.optimization_level = level;
  return Builder(c).build(mlp_network());
}

TEST(BuildPolicy, ReachesTheEngineAndItsBuildLog) {
  const auto e = build_mlp(strict_policy(), 1);
  EXPECT_EQ(e->kernel_options().policy, strict_policy());
  EXPECT_EQ(e->kernel_options().optimization_level, 1);
  const std::string first_line = e->build_log().substr(0, e->build_log().find('\n'));
  EXPECT_EQ(first_line,
            "policy: allow_tf32=false, exact_gelu=true, attention_tactic=generated; optimization level 1: " +
                tactic_budget(1).to_string());
}

TEST(BuildPolicyFile, ANonDefaultPolicyIsFormatVersion4AndRoundTrips) {
  const auto e = build_mlp(strict_policy());
  const Bytes file = e->serialize();
  EXPECT_EQ(get_le(file, 8, 4), 4u);
  const Layout l = parse_layout(file);
  const SectionAt& plcy = section(l, "PLCY");
  ASSERT_EQ(plcy.length, 3u);
  EXPECT_EQ(file[plcy.payload_at], 0);      // allow_tf32
  EXPECT_EQ(file[plcy.payload_at + 1], 1);  // exact_gelu
  EXPECT_EQ(file[plcy.payload_at + 2], 1);  // attention_tactic: generated
  const auto loaded = Engine::deserialize(file.data(), file.size());
  EXPECT_EQ(loaded->kernel_options().policy, strict_policy());
  const auto in = random_inputs(*e, 3);
  EXPECT_EQ(run(*loaded, in), run(*e, in));
  // Written again, the same sections (the log grows on loading).
  const Bytes again = loaded->serialize();
  EXPECT_EQ(get_le(again, 8, 4), 4u);
  const Layout la = parse_layout(again);
  for (const char* tag : {"PLAN", "WGTS", "OPTS", "PLCY"}) {
    const SectionAt &x = section(l, tag), &y = section(la, tag);
    ASSERT_EQ(x.length, y.length) << tag;
    EXPECT_TRUE(std::equal(file.begin() + long(x.payload_at), file.begin() + long(x.payload_at + x.length),
                           again.begin() + long(y.payload_at)))
        << tag;
  }
  // Each field alone away from its default is written too.
  for (int field = 0; field < 3; ++field) {
    BuildPolicy p;
    if (field == 0) p.allow_tf32 = false;
    if (field == 1) p.exact_gelu = true;
    if (field == 2) p.attention_tactic = AttentionTactic::kCudnn;
    const Bytes f = build_mlp(p)->serialize();
    EXPECT_EQ(get_le(f, 8, 4), 4u) << field;
    EXPECT_EQ(Engine::deserialize(f.data(), f.size())->kernel_options().policy, p) << field;
  }
}

TEST(BuildPolicyFile, TheDefaultPolicyKeepsFormatVersion3) {
  const Bytes file = build_mlp(BuildPolicy{})->serialize();
  EXPECT_EQ(get_le(file, 8, 4), 3u);
  const Layout l = parse_layout(file);
  EXPECT_EQ(std::count_if(l.sections.begin(), l.sections.end(), [](const SectionAt& s) { return s.tag == "PLCY"; }), 0);
  EXPECT_EQ(Engine::deserialize(file.data(), file.size())->kernel_options().policy, BuildPolicy{});
}

// x + w on f32[2, 3], w = {0.5, -1, 2, 0.25, -3, 1.5}, at optimization level 2 with a workspace
// limit of 4096, written by Kiln before the build policy existed (format version 3).
const uint8_t kVersion3File[] = {
    0x4b, 0x49, 0x4c, 0x4e, 0x45, 0x4e, 0x47, 0x00, 0x03, 0x00, 0x00, 0x00, 0x4b, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x05, 0x00, 0x00, 0x00, 0x30, 0x2e, 0x31, 0x2e, 0x30, 0x03, 0x00, 0x00, 0x00, 0x63, 0x70, 0x75, 0x03, 0x00,
    0x00, 0x00, 0x63, 0x70, 0x75, 0x04, 0x00, 0x00, 0x00, 0x50, 0x4c, 0x41, 0x4e, 0x0d, 0x01, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x78, 0x06, 0x00, 0x02,
    0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x77, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00,
    0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x01, 0x00, 0x00, 0x00, 0x79, 0x01, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x61, 0x64, 0x64, 0x02, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
    0x00, 0x02, 0x00, 0x00, 0x00, 0x57, 0x47, 0x54, 0x53, 0x44, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x3f, 0x00, 0x00, 0x80, 0xbf, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x80,
    0x3e, 0x00, 0x00, 0x40, 0xc0, 0x00, 0x00, 0xc0, 0x3f, 0x4f, 0x50, 0x54, 0x53, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x42, 0x4c, 0x4f, 0x47, 0x87,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x83, 0x00, 0x00, 0x00, 0x6b, 0x65, 0x72, 0x6e, 0x65, 0x6c, 0x20, 0x61,
    0x64, 0x64, 0x3a, 0x20, 0x63, 0x70, 0x75, 0x20, 0x61, 0x64, 0x64, 0x20, 0x66, 0x33, 0x32, 0x20, 0x72, 0x75, 0x6e,
    0x73, 0x20, 0x6f, 0x66, 0x20, 0x36, 0x20, 0x28, 0x73, 0x74, 0x72, 0x69, 0x64, 0x65, 0x73, 0x20, 0x31, 0x2c, 0x31,
    0x29, 0x0a, 0x6b, 0x65, 0x72, 0x6e, 0x65, 0x6c, 0x73, 0x3a, 0x20, 0x31, 0x20, 0x6d, 0x61, 0x64, 0x65, 0x20, 0x69,
    0x6e, 0x20, 0x30, 0x2e, 0x30, 0x20, 0x6d, 0x73, 0x20, 0x28, 0x73, 0x6c, 0x6f, 0x77, 0x65, 0x73, 0x74, 0x3a, 0x20,
    0x61, 0x64, 0x64, 0x20, 0x27, 0x27, 0x20, 0x30, 0x2e, 0x30, 0x20, 0x6d, 0x73, 0x29, 0x0a, 0x6d, 0x65, 0x6d, 0x6f,
    0x72, 0x79, 0x3a, 0x20, 0x61, 0x72, 0x65, 0x6e, 0x61, 0x20, 0x30, 0x20, 0x62, 0x79, 0x74, 0x65, 0x73, 0x20, 0x28,
    0x6e, 0x61, 0x69, 0x76, 0x65, 0x20, 0x30, 0x29, 0x0a, 0x74, 0x45, 0x33, 0xa5, 0x55, 0x1c, 0x8a, 0x60,
};

TEST(BuildPolicyFile, AFileWrittenBeforeThePolicyLoadsWithTheDefaultPolicy) {
  const auto e = Engine::deserialize(kVersion3File, sizeof kVersion3File);
  EXPECT_EQ(e->kernel_options().policy, BuildPolicy{});
  EXPECT_EQ(e->kernel_options().optimization_level, 2);
  EXPECT_EQ(e->kernel_options().workspace_limit, 4096u);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6}, w = {0.5f, -1, 2, 0.25f, -3, 1.5f};
  std::vector<float> y(6);
  e->create_execution_context()->execute({x.data()}, {y.data()});
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(y[i], x[i] + w[i]) << i;
  // Written again it is still version 3, its sections byte for byte the old ones.
  const Bytes old(kVersion3File, kVersion3File + sizeof kVersion3File), again = e->serialize();
  EXPECT_EQ(get_le(again, 8, 4), 3u);
  const Layout lo = parse_layout(old), la = parse_layout(again);
  for (const char* tag : {"PLAN", "WGTS", "OPTS"}) {
    const SectionAt &x0 = section(lo, tag), &y0 = section(la, tag);
    ASSERT_EQ(x0.length, y0.length) << tag;
    EXPECT_TRUE(std::equal(old.begin() + long(x0.payload_at), old.begin() + long(x0.payload_at + x0.length),
                           again.begin() + long(y0.payload_at)))
        << tag;
  }
}

// `file` without its PLCY section (and its section count one lower), resealed.
Bytes without_policy(const Bytes& file) {
  const Layout l = parse_layout(file);
  const SectionAt& s = section(l, "PLCY");
  Bytes b = file;
  b.erase(b.begin() + long(s.length_at - 4), b.begin() + long(s.payload_at + s.length));
  put_le(b, l.count_at, l.sections.size() - 1, 4);
  reseal(b);
  return b;
}

TEST(BuildPolicyFile, DamagedPolicySectionsAndVersionsAreRefused) {
  const Bytes file = build_mlp(strict_policy())->serialize();
  const size_t at = section(parse_layout(file), "PLCY").payload_at;
  std::string msg;
  // Version 3 with the policy section, version 4 without it.
  Bytes b = file;
  put_le(b, 8, 3, 4);
  reseal(b);
  EXPECT_EQ(code_of(b, &msg), ErrorCode::kCorrupted);
  EXPECT_EQ(msg, "[corrupted] engine file corrupted: a PLCY section in a format version 3 file");
  b = without_policy(file);
  EXPECT_EQ(code_of(b, &msg), ErrorCode::kCorrupted);
  EXPECT_EQ(msg, "[corrupted] engine file corrupted: no PLCY section in a format version 4 file");
  // Without the section and as version 3: an older file, the default policy.
  put_le(b, 8, 3, 4);
  reseal(b);
  EXPECT_EQ(Engine::deserialize(b.data(), b.size())->kernel_options().policy, BuildPolicy{});
  // Bytes out of range, named.
  for (auto [offset, value, field] :
       {std::tuple{0, 2, "allow_tf32 is 2, not 0 or 1"}, std::tuple{1, 255, "exact_gelu is 255, not 0 or 1"},
        std::tuple{2, 3, "attention_tactic 3 is not one of"}}) {
    b = file;
    b[at + size_t(offset)] = uint8_t(value);
    reseal(b);
    EXPECT_EQ(code_of(b, &msg), ErrorCode::kCorrupted) << field;
    EXPECT_NE(msg.find(field), std::string::npos) << msg;
    EXPECT_NE(msg.find("section PLCY"), std::string::npos) << msg;
  }
  // Another format version names the two this Kiln reads.
  b = file;
  put_le(b, 8, 5, 4);
  reseal(b);
  EXPECT_EQ(code_of(b, &msg), ErrorCode::kVersionMismatch);
  EXPECT_EQ(msg,
            "[version mismatch] engine file format version 5, this Kiln reads format version 3 or 4; rebuild the "
            "engine with this Kiln");
}

TEST(BuildPolicyFile, TheWriterRefusesAPolicyNoReaderTakes) {
  KernelOptions o;
  o.policy.attention_tactic = AttentionTactic(9);
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2}));
  g.mark_output(g.add_node1(OpKind::kRelu, {x}), "y");
  const auto e = Engine::create(std::move(g), Device{}, o);
  EXPECT_EQ(message_of([&] { e->serialize(); }, ErrorCode::kInvalidArgument),
            "[invalid argument] engine file policy: attention_tactic must be one of \"auto\", \"generated\", "
            "\"cudnn\", got the value 9");
}

#ifdef KILN_WITH_CUDA
// ---- the conv family's support predicate (no device needed) -----------------------------------
struct OneNode {
  Graph g;
  const Node* node = nullptr;
};

void conv_node(OneNode& c, OpKind op, DType dt, std::vector<int64_t> x, std::vector<int64_t> w, const Attrs& a) {
  ValueId xi = c.g.add_input("x", TensorType(dt, x)), wi = c.g.add_input("w", TensorType(dt, w));
  c.g.mark_output(c.g.add_node1(op, {xi, wi}, a, "c0"), "y");
  c.g.verify();
  c.node = c.g.nodes().back().get();
}

TEST(CudaConvPredicate, AnswersWithTheReasonAndConvGeometryAgrees) {
  std::string why = "unchanged";
  Attrs plain;
  OneNode ok, f64, t, relu;
  conv_node(ok, OpKind::kConv, DType::kF16, {1, 4, 8, 8}, {8, 4, 3, 3}, plain);
  EXPECT_TRUE(cuda::supports_conv(*ok.node, ok.g, &why));
  EXPECT_EQ(why, "unchanged");  // untouched when the answer is yes
  EXPECT_EQ(cuda::conv_refusal(*ok.node, ok.g), "");
  EXPECT_NO_THROW(cuda::conv_geometry(*ok.node, ok.g));

  conv_node(f64, OpKind::kConv, DType::kF64, {1, 4, 8, 8}, {8, 4, 3, 3}, plain);
  EXPECT_FALSE(cuda::supports_conv(*f64.node, f64.g, &why));
  EXPECT_EQ(why, "conv on CUDA runs f32, f16 and bf16, got f64");

  Attrs op;  // output_padding 1 with stride 1 (the shape rule allows it below the dilation)
  op.set("stride", std::vector<int64_t>{1, 1});
  op.set("dilation", std::vector<int64_t>{2, 2});
  op.set("output_padding", std::vector<int64_t>{1, 1});
  conv_node(t, OpKind::kConvTranspose, DType::kF32, {1, 2, 4, 4}, {2, 2, 3, 3}, op);
  EXPECT_FALSE(cuda::supports_conv(*t.node, t.g, &why));
  EXPECT_EQ(why, "conv_transpose output_padding 1,1 must be smaller than stride 1,1 on CUDA (cuDNN backward data)");
  EXPECT_EQ(message_of([&] { cuda::conv_geometry(*t.node, t.g); }, ErrorCode::kUnsupported), "[unsupported] " + why);

  // Not a conv at all.
  ValueId x = relu.g.add_input("x", TensorType(DType::kF32, {2}));
  relu.g.mark_output(relu.g.add_node1(OpKind::kRelu, {x}), "y");
  relu.node = relu.g.nodes().back().get();
  EXPECT_FALSE(cuda::supports_conv(*relu.node, relu.g, &why));
  EXPECT_EQ(why, "relu is not in the conv family");
}
#endif  // KILN_WITH_CUDA

}  // namespace
