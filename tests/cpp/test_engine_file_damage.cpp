// Damaged engine files: every prefix, flipped bytes, other magic / version / backend /
// device, impossible counts, section errors and random mutations are each rejected with the
// right ErrorCode and a message naming the cause, and never crash the reader.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "tests/cpp/engine_file_test_util.h"

using namespace kiln;
using namespace kiln::engine_file_test;

TEST(EngineFileDamage, EveryPrefixIsTruncated) {
  Bytes file = small_file();
  for (size_t n = 0; n < file.size(); ++n) {
    Bytes cut(file.begin(), file.begin() + long(n));
    std::string msg;
    EXPECT_EQ(code_of(cut, &msg), ErrorCode::kTruncated) << "prefix " << n << ": " << msg;
  }
}

TEST(EngineFileDamage, FlippedBytesAreRejected) {
  Bytes file = small_file();
  for (size_t pos = 0; pos < file.size(); ++pos)
    for (uint8_t mask : {uint8_t(0x01), uint8_t(0x80), uint8_t(0xff)}) {
      Bytes b = file;
      b[pos] ^= mask;
      std::string msg;
      ErrorCode c = code_of(b, &msg);
      if (pos < 8) {
        EXPECT_EQ(c, ErrorCode::kCorrupted) << pos;
        EXPECT_NE(msg.find("magic"), std::string::npos) << msg;
      } else if (pos < 12) {
        EXPECT_EQ(c, ErrorCode::kVersionMismatch) << pos;
      } else if (pos < 20) {
        EXPECT_TRUE(c == ErrorCode::kTruncated || c == ErrorCode::kCorrupted) << pos << ": " << msg;
      } else {
        EXPECT_EQ(c, ErrorCode::kCorrupted) << pos;
        EXPECT_NE(msg.find("checksum mismatch"), std::string::npos) << pos << ": " << msg;
      }
    }
}

TEST(EngineFileDamage, WrongMagicAndTrailingBytes) {
  Bytes file = small_file();
  Bytes b = file;
  std::memcpy(b.data(), "GGUF\0\0\0\0", 8);
  std::string msg;
  EXPECT_EQ(code_of(b, &msg), ErrorCode::kCorrupted);
  EXPECT_NE(msg.find("magic"), std::string::npos) << msg;
  b = file;
  b.push_back(0);
  EXPECT_EQ(code_of(b, &msg), ErrorCode::kCorrupted);
  EXPECT_NE(msg.find("past the end"), std::string::npos) << msg;
}

TEST(EngineFileDamage, OtherFormatVersionNamesBoth) {
  Bytes b = small_file();
  put_le(b, 8, 1, 4);  // the format before checksum64
  reseal(b);
  std::string msg;
  EXPECT_EQ(code_of(b, &msg), ErrorCode::kVersionMismatch);
  EXPECT_NE(msg.find("version 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("version 3"), std::string::npos) << msg;
}

TEST(EngineFileDamage, OtherBackendOrDeviceIsADeviceMismatch) {
  Bytes file = small_file();
  Layout l = parse_layout(file);
  Bytes b = file;
  replace_string(b, l.backend_at, "cuda");
  std::string msg;
  EXPECT_EQ(code_of(b, &msg), ErrorCode::kDeviceMismatch);
  EXPECT_NE(msg.find("'cuda'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'cpu'"), std::string::npos) << msg;
  b = file;
  replace_string(b, l.device_at, "NVIDIA H100");
  EXPECT_EQ(code_of(b, &msg), ErrorCode::kDeviceMismatch);
  EXPECT_NE(msg.find("'NVIDIA H100'"), std::string::npos) << msg;
  // The edit itself is sound: restoring the string loads again.
  replace_string(b, l.device_at, "cpu");
  EXPECT_EQ(b, file);
  EXPECT_NO_THROW(Engine::deserialize(b.data(), b.size()));
}

TEST(EngineFileDamage, ImpossibleCountsAndLengths) {
  Bytes file = small_file();
  Layout l = parse_layout(file);
  const SectionAt& plan = section(l, "PLAN");
  const SectionAt& wgts = section(l, "WGTS");
  struct Patch {
    size_t at;
    int bytes;
    uint64_t value;
    ErrorCode code;
    const char* says;
  };
  std::vector<Patch> patches = {
      {plan.payload_at, 4, 0xffffffffu, ErrorCode::kCorrupted, "impossible count"},   // values
      {plan.payload_at + 4 + 1 + 1, 4, 0x7fffffffu, ErrorCode::kCorrupted, "impossible count"},  // rank of %0
      {wgts.payload_at, 8, ~uint64_t(0), ErrorCode::kCorrupted, "impossible count"},  // blobs
      {wgts.payload_at + 8, 8, uint64_t(1) << 60, ErrorCode::kTruncated, "needed"},  // blob size
      {plan.length_at, 8, uint64_t(1) << 62, ErrorCode::kTruncated, "needed"},       // section length
      {l.count_at, 4, 0xffffffffu, ErrorCode::kCorrupted, "impossible count"},       // sections
      {20, 4, 0xfffffff0u, ErrorCode::kTruncated, "needed"},                         // version string
  };
  for (const Patch& p : patches) {
    Bytes b = file;
    put_le(b, p.at, p.value, p.bytes);
    reseal(b);
    std::string msg;
    EXPECT_EQ(code_of(b, &msg), p.code) << "patch at " << p.at << ": " << msg;
    EXPECT_NE(msg.find(p.says), std::string::npos) << msg;
  }
}

TEST(EngineFileDamage, SectionsAreCheckedAndUnknownOnesSkipped) {
  Bytes file = small_file();
  Layout l = parse_layout(file);
  // An extra section with an unknown tag is skipped.
  Bytes b = file;
  Bytes extra = {'X', 'T', 'R', 'A', 3, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3};
  b.insert(b.end() - 8, extra.begin(), extra.end());
  put_le(b, l.count_at, l.sections.size() + 1, 4);
  reseal(b);
  EXPECT_NO_THROW(Engine::deserialize(b.data(), b.size()));
  // Renaming OPTS to PLAN makes a duplicate; renaming it away leaves none.
  const SectionAt& opts = section(l, "OPTS");
  std::string msg;
  b = file;
  std::memcpy(&b[opts.length_at - 4], "PLAN", 4);
  reseal(b);
  EXPECT_EQ(code_of(b, &msg), ErrorCode::kCorrupted);
  EXPECT_NE(msg.find("appears twice"), std::string::npos) << msg;
  b = file;
  std::memcpy(&b[opts.length_at - 4], "OPTX", 4);
  reseal(b);
  EXPECT_EQ(code_of(b, &msg), ErrorCode::kCorrupted);
  EXPECT_NE(msg.find("no OPTS section"), std::string::npos) << msg;
  // An op name the reader does not know.
  b = file;
  auto it = std::search(b.begin(), b.end(), std::begin("add") , std::begin("add") + 3);
  ASSERT_NE(it, b.end());
  std::memcpy(&*it, "abs", 3);  // a valid op, but its shape rule wants one input
  reseal(b);
  EXPECT_EQ(code_of(b, &msg), ErrorCode::kCorrupted);
  std::memcpy(&*it, "qqq", 3);
  reseal(b);
  EXPECT_EQ(code_of(b, &msg), ErrorCode::kCorrupted);
  EXPECT_NE(msg.find("unknown op 'qqq'"), std::string::npos) << msg;
}

TEST(EngineFileDamage, RandomMutationsOnlyEverThrowKilnErrors) {
  std::vector<Bytes> seeds = {small_file(), fused_engine()->serialize()};
  std::mt19937 rng(20240607);
  int rejected = 0, loaded = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    Bytes b = seeds[size_t(iter) % seeds.size()];
    int edits = 1 + int(rng() % 4);
    for (int k = 0; k < edits && !b.empty(); ++k) {
      size_t pos = rng() % b.size();
      switch (rng() % 4) {
        case 0: b[pos] ^= uint8_t(1u << (rng() % 8)); break;
        case 1: b.insert(b.begin() + long(pos), uint8_t(rng())); break;
        case 2: b.erase(b.begin() + long(pos)); break;
        default: b[pos] = uint8_t(rng()); break;
      }
    }
    // Half the time make the size and checksum right, so the mutation reaches the parser.
    if (iter % 2 && b.size() >= 28) reseal(b);
    try {
      Engine::deserialize(b.data(), b.size());
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "mutation " << iter << " threw a non-Kiln exception: " << e.what();
    }
  }
  EXPECT_GT(rejected, 1500);
  RecordProperty("loaded_after_mutation", loaded);
}

// A file with 9 MB of weights: a flipped byte anywhere is the checksum's
// mismatch, even where the parse alone would fail otherwise (a string length, the backend's
// name); a resealed edit that the parse refuses is the parse's error.
TEST(EngineFileDamage, LargeFilesReportTheChecksumBeforeWhatTheParseFinds) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 1024}));
  ValueId y = g.add_node1(OpKind::kLinear, {x, weight(g, "w", {2304, 1024}, 31), weight(g, "b", {2304}, 32)});
  g.mark_output(y, "y");
  const Bytes file = Builder().build(g)->serialize();
  ASSERT_GE(file.size(), size_t(9) << 20);
  const Layout l = parse_layout(file);
  const size_t weights_mid = section(l, "WGTS").payload_at + section(l, "WGTS").length / 2;
  for (size_t pos : {size_t(20), l.backend_at, l.backend_at + 4, l.count_at, section(l, "PLAN").length_at,
                     weights_mid, file.size() - 9}) {
    Bytes b = file;
    b[pos] ^= 0x5a;
    std::string msg;
    EXPECT_EQ(code_of(b, &msg), ErrorCode::kCorrupted) << pos << ": " << msg;
    EXPECT_NE(msg.find("checksum mismatch"), std::string::npos) << pos << ": " << msg;
  }
  Bytes b = file;
  replace_string(b, l.backend_at, "cuda");  // resealed: the checksum holds, the backend does not
  std::string msg;
  EXPECT_EQ(code_of(b, &msg), ErrorCode::kDeviceMismatch) << msg;
  Bytes healthy = file;
  auto loaded = Engine::deserialize(healthy.data(), healthy.size());
  std::vector<std::string> names = loaded->weight_names();
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"b", "w"}));
}
