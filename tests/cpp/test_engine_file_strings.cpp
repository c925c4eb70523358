// Strings in engine files are UTF-8 (Python sees them as str): the reader refuses any other
// bytes as kCorrupted naming the field, even in a file whose checksum holds, and the writer
// refuses to write a file no reader would take. Any valid UTF-8 round-trips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/refit.h"
#include "src/serialize/byte_io.h"
#include "tests/cpp/engine_file_test_util.h"

using namespace kiln;
using namespace kiln::engine_file_test;

namespace {

// x -> linear (weight named `weight_name`) -> pad (mode "reflect") named `node_name`.
Graph named_network(const std::string& weight_name, const std::string& node_name) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4}));
  ValueId h = g.add_node1(OpKind::kLinear, {x, weight(g, weight_name, {3, 4}, 1), kNoValue});
  Attrs pad;
  pad.set("pads", std::vector<int64_t>{0, 0, 1, 1});
  pad.set("mode", std::string("reflect"));
  g.mark_output(g.add_node1(OpKind::kPad, {h}, pad, node_name), "y");
  return g;
}

Bytes named_file() {
  BuilderConfig c;
  c.fuse_pointwise = false;
  return Builder(c).build(named_network("weight_marker", "node_marker"))->serialize();
}

// The offset of the first byte of the length-prefixed string `s` in `b`.
size_t string_at(const Bytes& b, const std::string& s) {
  Bytes want(4 + s.size());
  put_le(want, 0, s.size(), 4);
  std::memcpy(want.data() + 4, s.data(), s.size());
  auto it = std::search(b.begin(), b.end(), want.begin(), want.end());
  EXPECT_NE(it, b.end()) << "no string '" << s << "'";
  return size_t(it - b.begin()) + 4;
}

}  // namespace

TEST(Utf8, WellFormedOnly) {
  auto at = [](const std::string& s) {
    return serialize::utf8_invalid_at(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  const std::vector<std::string> good = {"",
                                         "ascii",
                                         "caf\xc3\xa9",
                                         "\xe6\x97\xa5\xe6\x9c\xac",
                                         "\xf0\x9f\x98\x80",
                                         "\xef\xbf\xbd",
                                         "\xf4\x8f\xbf\xbf",
                                         std::string("nul\0inside", 10)};
  for (const std::string& ok : good) EXPECT_EQ(at(ok), ok.size()) << ok;
  const std::vector<std::pair<std::string, size_t>> bad = {
      {"\xff", 0},                  // never in UTF-8
      {"ab\x80", 2},                // a continuation byte alone
      {"\xc0\x80", 0},              // overlong NUL
      {"\xe0\x80\x80", 0},          // overlong three-byte form
      {"x\xed\xa0\x80", 1},         // a surrogate
      {"\xf4\x90\x80\x80", 0},      // past U+10FFFF
      {"\xe6\x97", 0},              // cut short
      {"ok\xc3(", 2},               // a lead byte without its continuation
  };
  for (const auto& [s, first] : bad) EXPECT_EQ(at(s), first) << s;
}

TEST(EngineFileStrings, NonUtf8IsCorruptedNamingTheField) {
  const Bytes file = named_file();
  ASSERT_NO_THROW(Engine::deserialize(file.data(), file.size()));
  const Layout l = parse_layout(file);
  struct Case {
    size_t at;  // a byte inside the string
    const char* field;
  };
  const std::vector<Case> cases = {
      {string_at(file, "weight_marker") + 3, "a value name"},
      {string_at(file, "node_marker"), "a node name"},
      {string_at(file, "reflect") + 1, "a string attribute"},
      {string_at(file, "mode"), "an attribute key"},
      {string_at(file, "pad"), "an op name"},
      {section(l, "BLOG").payload_at + 4, "the build log"},
      {24, "the Kiln version"},
      {l.backend_at + 4, "the backend name"},
  };
  for (const Case& c : cases)
    for (uint8_t b : {uint8_t(0xff), uint8_t(0x80), uint8_t(0xc0)}) {
      Bytes damaged = file;
      damaged[c.at] = b;
      reseal(damaged);  // the checksum holds: only the string is wrong
      std::string msg;
      EXPECT_EQ(code_of(damaged, &msg), ErrorCode::kCorrupted) << c.field << ": " << msg;
      EXPECT_NE(msg.find(c.field), std::string::npos) << msg;
      EXPECT_NE(msg.find("is not valid UTF-8"), std::string::npos) << msg;
    }
}

TEST(EngineFileStrings, UnicodeNamesRoundTrip) {
  const std::string name = "poids_\xc3\xa9_\xe9\x87\x8d\xe3\x81\xbf_\xf0\x9f\x98\x80";
  const std::string node = "n\xc5\x93ud";
  BuilderConfig c;
  c.fuse_pointwise = false;
  const Bytes file = Builder(c).build(named_network(name, node))->serialize();
  auto loaded = Engine::deserialize(file.data(), file.size());
  EXPECT_EQ(loaded->weight_names(), std::vector<std::string>{name});
  EXPECT_EQ(Refitter(loaded).weight_names(), std::vector<std::string>{name});
  bool found = false;
  for (const auto& n : loaded->graph().nodes()) found = found || n->name == node;
  EXPECT_TRUE(found) << loaded->graph().to_string();
}

TEST(EngineFileStrings, WriterRefusesWhatNoReaderTakes) {
  BuilderConfig c;
  c.fuse_pointwise = false;
  auto engine = Builder(c).build(named_network("latin1_\xe9", "node"));
  try {
    engine->serialize();
    ADD_FAILURE() << "a file with a Latin-1 name was written";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("a value name is not valid UTF-8"), std::string::npos) << e.what();
  }
}
