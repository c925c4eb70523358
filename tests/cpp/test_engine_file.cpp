// Engine files: a round trip keeps the plan (text, value ids, weights, options, fused bodies,
// every attribute kind) and the outputs; save/load go through the file system with kIo
// errors naming the path. The damaged-file cases are in test_engine_file_damage.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numbers>

#include "src/serialize/byte_io.h"
#include "tests/cpp/engine_file_test_util.h"

using namespace kiln;
using namespace kiln::engine_file_test;
namespace fs = std::filesystem;

namespace {

void expect_same_engine(const Engine& a, const Engine& b) {
  EXPECT_EQ(a.graph().to_string(), b.graph().to_string());
  EXPECT_EQ(a.weight_names(), b.weight_names());
  EXPECT_EQ(a.kernel_options().optimization_level, b.kernel_options().optimization_level);
  EXPECT_EQ(a.kernel_options().workspace_limit, b.kernel_options().workspace_limit);
  ASSERT_EQ(a.graph().num_values(), b.graph().num_values());
  for (ValueId v = 0; v < a.graph().num_values(); ++v) {
    const Value &x = a.graph().value(v), &y = b.graph().value(v);
    EXPECT_EQ(x.type, y.type) << "%" << v;
    EXPECT_EQ(x.name, y.name) << "%" << v;
    EXPECT_EQ(x.is_weight, y.is_weight) << "%" << v;
    ASSERT_EQ(x.is_constant(), y.is_constant()) << "%" << v;
    if (x.is_constant()) {
      EXPECT_EQ(*x.data, *y.data) << "%" << v;
    }
  }
  ASSERT_EQ(a.graph().nodes().size(), b.graph().nodes().size());
  for (size_t i = 0; i < a.graph().nodes().size(); ++i) {
    const Node &n = *a.graph().nodes()[i], &m = *b.graph().nodes()[i];
    EXPECT_EQ(n.op, m.op);
    EXPECT_EQ(n.inputs, m.inputs);
    EXPECT_EQ(n.outputs, m.outputs);
    EXPECT_TRUE(n.attrs == m.attrs) << "node " << i;
    EXPECT_EQ(n.name, m.name);
    EXPECT_EQ(n.body != nullptr, m.body != nullptr);
    if (n.body && m.body) {
      EXPECT_EQ(n.body->to_string(), m.body->to_string());
    }
  }
  auto in = random_inputs(a, 11);
  auto oa = run(a, in), ob = run(b, in);
  ASSERT_EQ(oa.size(), ob.size());
  for (size_t i = 0; i < oa.size(); ++i) EXPECT_EQ(oa[i], ob[i]) << "output " << i;
}


}  // namespace

TEST(EngineFile, MlpRoundTripKeepsPlanAndOutputs) {
  auto e = mlp_engine();
  Bytes file = e->serialize();
  EXPECT_EQ(std::memcmp(file.data(), "KILNENG\0", 8), 0);
  EXPECT_EQ(get_le(file, 8, 4), 3u);  // format version 3: checksum64 by chunks
  EXPECT_EQ(get_le(file, 12, 8), file.size());
  EXPECT_EQ(get_le(file, file.size() - 8, 8), checksum_ref(file.data(), file.size() - 8));
  auto loaded = Engine::deserialize(file.data(), file.size());
  expect_same_engine(*e, *loaded);
  // Writing the loaded engine gives the same plan, weights and options bytes (the build log
  // section differs: loading adds to it).
  Bytes again = loaded->serialize();
  Layout la = parse_layout(file), lb = parse_layout(again);
  for (const char* tag : {"PLAN", "WGTS", "OPTS"}) {
    const SectionAt &x = section(la, tag), &y = section(lb, tag);
    EXPECT_EQ(x.payload_at, y.payload_at) << tag;
    EXPECT_TRUE(x.length == y.length && std::equal(file.begin() + long(x.payload_at),
                                                   file.begin() + long(x.payload_at + x.length),
                                                   again.begin() + long(y.payload_at)))
        << tag;
  }
}

// Engines whose weights pass 32 MB are read on several threads (read_blobs), each copying
// whole blobs: every weight must come back byte for byte, and the outputs with them.
TEST(EngineFile, LargeWeightsReadOnSeveralThreadsRoundTrip) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 1024}));
  ValueId h = g.add_node1(OpKind::kLinear,
                          {x, weight(g, "fc1.weight", {4096, 1024}, 21), weight(g, "fc1.bias", {4096}, 22)});
  ValueId y = g.add_node1(OpKind::kLinear, {h, weight(g, "fc2.weight", {2048, 4096}, 23), kNoValue});
  ValueId z =
      g.add_node1(OpKind::kLinear, {y, weight(g, "fc3.weight", {8, 2048}, 24), weight(g, "fc3.bias", {8}, 25)});
  g.mark_output(z, "out");
  auto e = Builder().build(g);
  Bytes file = e->serialize();
  ASSERT_GT(file.size(), size_t(48) << 20);
  EXPECT_EQ(get_le(file, file.size() - 8, 8), checksum_ref(file.data(), file.size() - 8));  // chunks summed apart
  auto loaded = Engine::deserialize(file.data(), file.size());
  expect_same_engine(*e, *loaded);
}

TEST(EngineFile, ChecksumAtChunkBoundariesMatchesTheDescription) {
  const size_t chunk = serialize::kChecksumChunk;
  Bytes data(chunk * 9 + 13);
  uint64_t s = 0x2545f4914f6cdd1dull;
  for (uint8_t& b : data) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    b = uint8_t(s >> 24);
  }
  // One block, the chunk's length either side, a few chunks (one thread), many (several).
  for (size_t n : {size_t(0), size_t(5), chunk - 1, chunk, chunk + 1, 3 * chunk + 7, 8 * chunk, data.size()}) {
    const uint64_t sum = serialize::checksum64(data.data(), n);
    EXPECT_EQ(sum, checksum_ref(data.data(), n)) << n << " bytes";
    if (n < 16) continue;
    Bytes damaged(data.begin(), data.begin() + long(n));
    damaged[n / 2] ^= 0x10;  // one bit, in some chunk: always seen
    EXPECT_NE(serialize::checksum64(damaged.data(), n), sum) << n << " bytes";
  }
}

TEST(EngineFile, MlpMatchesNaiveReference) {
  auto e = mlp_engine();
  Bytes file = e->serialize();
  auto loaded = Engine::deserialize(file.data(), file.size());
  const Graph& net = e->graph();
  auto weight_of = [&](const std::string& name) {
    for (ValueId c : net.constants())
      if (net.value(c).name == name) {
        std::vector<float> v(net.value(c).data->size() / 4);
        std::memcpy(v.data(), net.value(c).data->data(), v.size() * 4);
        return v;
      }
    throw std::runtime_error("no weight " + name);
  };
  auto w1 = weight_of("fc1.weight"), b1 = weight_of("fc1.bias"), w2 = weight_of("fc2.weight");
  auto in = random_inputs(*loaded, 3);
  std::vector<float> x(24);
  std::memcpy(x.data(), in[0].data(), 96);
  std::vector<double> hidden(48), act(48), y(12);
  for (int i = 0; i < 3; ++i)
    for (int o = 0; o < 16; ++o) {
      double s = b1[o];
      for (int k = 0; k < 8; ++k) s += double(x[i * 8 + k]) * w1[o * 8 + k];
      double r = std::max(s, 0.0), l = r > 0 ? r : 0.1 * r;
      hidden[i * 16 + o] = r;
      act[i * 16 + o] = 0.5 * l * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (l + 0.044715 * l * l * l)));
    }
  for (int i = 0; i < 3; ++i)
    for (int o = 0; o < 4; ++o) {
      double s = 0;
      for (int k = 0; k < 16; ++k) s += act[i * 16 + k] * w2[o * 16 + k];
      y[i * 4 + o] = s;
    }
  // reshape [3,4] -> [2,6] keeps the flat order; permute gives q[j][i] = p[i][j], q: [6,2].
  std::vector<double> probs(12), sums(6);
  for (int j = 0; j < 6; ++j) {
    double m = std::max(y[0 * 6 + j], y[1 * 6 + j]);
    double e0 = std::exp(y[0 * 6 + j] - m), e1 = std::exp(y[1 * 6 + j] - m);
    probs[j * 2] = e0 / (e0 + e1);
    probs[j * 2 + 1] = e1 / (e0 + e1);
    sums[j] = probs[j * 2] + probs[j * 2 + 1];
  }
  auto out = run(*loaded, in);
  ASSERT_EQ(loaded->outputs().size(), 3u);
  const float* p = reinterpret_cast<const float*>(out[0].data());
  for (int i = 0; i < 12; ++i) EXPECT_NEAR(p[i], probs[i], 1e-5) << i;
  const uint16_t* s = reinterpret_cast<const uint16_t*>(out[1].data());
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(half_to_float(s[i]), sums[i], 1e-3) << i;
  const float* h = reinterpret_cast<const float*>(out[2].data());
  for (int i = 0; i < 48; ++i) EXPECT_NEAR(h[i], hidden[i], 1e-5) << i;
}

TEST(EngineFile, FusedBodyEveryAttrKindAndLaterUseRoundTrip) {
  auto e = fused_engine();
  const Graph& g = e->graph();
  ASSERT_EQ(g.nodes()[0]->op, OpKind::kFusedPointwise);
  ASSERT_GT(g.nodes()[1]->inputs[0], g.nodes()[1]->outputs[0]) << "the test needs a use of a higher id";
  Bytes file = e->serialize();
  auto loaded = Engine::deserialize(file.data(), file.size());
  expect_same_engine(*e, *loaded);
  const Graph& lg = loaded->graph();
  EXPECT_EQ(lg.nodes()[0]->attrs.items().size(), 7u);
  EXPECT_EQ(lg.nodes()[0]->attrs.get_floats("floats"), (std::vector<double>{0.5, -1e300, 3.0}));
  EXPECT_EQ(lg.value(lg.inputs()[0]).type.dims[0].symbol, "B");
  EXPECT_EQ(lg.value(1).data, lg.value(2).data) << "weights sharing bytes share them after loading";
  EXPECT_NE(loaded->build_log().find("hand-made plan"), std::string::npos);
  // y = relu(x * w) + w, checked against a direct computation.
  auto in = random_inputs(*loaded, 4);
  auto out = run(*loaded, in);
  const float* x = reinterpret_cast<const float*>(in[0].data());
  const float* w = reinterpret_cast<const float*>(g.value(1).data->data());
  for (int i = 0; i < 8; ++i) {
    float f = std::max(x[i] * w[i], 0.0f);
    EXPECT_FLOAT_EQ(reinterpret_cast<const float*>(out[1].data())[i], f);
    EXPECT_FLOAT_EQ(reinterpret_cast<const float*>(out[0].data())[i], f + w[i]);
  }
}

TEST(EngineFile, SaveLoadThroughATempDirectory) {
  fs::path dir = fs::temp_directory_path() / ("kiln_engine_file_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto e = fused_engine();
  std::string path = (dir / "model.kiln").string();
  e->save(path);
  e->save(path);  // overwriting is fine
  auto loaded = Engine::load(path);
  expect_same_engine(*e, *loaded);
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) files += entry.is_regular_file();
  EXPECT_EQ(files, 1u) << "no temporary file is left behind";
  try {
    Engine::load((dir / "missing.kiln").string());
    FAIL();
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(err.what()).find("missing.kiln"), std::string::npos);
    EXPECT_NE(std::string(err.what()).find("No such file"), std::string::npos);
  }
  try {
    e->save((dir / "no_such_dir" / "m.kiln").string());
    FAIL();
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(err.what()).find("no_such_dir"), std::string::npos);
  }
  // A damaged file on disk names the path too.
  Bytes bad = e->serialize();
  bad[bad.size() / 2] ^= 0x10;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bad.data()), long(bad.size()));
  try {
    Engine::load(path);
    FAIL();
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kCorrupted);
    EXPECT_NE(std::string(err.what()).find(path), std::string::npos);
  }
  fs::remove_all(dir);
}

