// Kiln bundles (kiln/bundle.h): the glue routes values between engine calls as written, the
// writer refuses programs that do not fit their engines, a damaged file is refused with a
// kiln::Error naming the cause, mutated files only ever throw kiln::Error, and kiln-run runs a
// bundle as Bundle::run does.
//
// Field offsets are computed here from the layout in src/runtime/bundle_file.h, so the tests pin
// the documented format. The seed bundles are tools/fuzz_bundle.h's.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>

#include "error_test_util.h"
#include "kiln/bundle.h"
#include "kiln/kiln.h"
#include "src/serialize/npy.h"
#include "tools/fuzz_bundle.h"

using namespace kiln;
namespace fs = std::filesystem;
using test::expect_error;

namespace {

uint64_t get_le(const Bytes& b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(b.at(at + size_t(i))) << (8 * i);
  return v;
}
void put_le(Bytes& b, size_t at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.at(at + size_t(i)) = uint8_t(v >> (8 * i));
}

// Offsets of glue fields, walked from the documented layout.
struct GlueOffsets {
  std::vector<size_t> input_dtype;   // per program input
  std::vector<size_t> step_engine;   // per step
  std::vector<size_t> step_args;     // per step: its first argument's i32 step
  std::vector<size_t> output_dtype;  // per program output
  size_t nsteps = 0, ranges = 0, engines = 0;  // the step count; the range count; the engine count
};
GlueOffsets walk(const Bytes& b) {
  GlueOffsets g;
  size_t at = 20;
  auto skip_str = [&] { at += 4 + size_t(get_le(b, at, 4)); };
  auto skip_tensor = [&](std::vector<size_t>& dtype_at) {
    dtype_at.push_back(at);
    at += 1;
    const size_t rank = size_t(get_le(b, at, 4));
    at += 4;
    for (size_t d = 0; d < rank; ++d) {
      at += 8;  // the extent
      skip_str();  // the symbol ("" for a static dim)
      at += 16;    // min, max
    }
  };
  skip_str();  // the Kiln version
  const size_t ninputs = size_t(get_le(b, at, 4));
  at += 4;
  for (size_t i = 0; i < ninputs; ++i) {
    skip_str();
    skip_tensor(g.input_dtype);
  }
  g.nsteps = at;
  const size_t nsteps = size_t(get_le(b, at, 4));
  at += 4;
  for (size_t s = 0; s < nsteps; ++s) {
    skip_str();
    g.step_engine.push_back(at);
    const size_t nargs = size_t(get_le(b, at + 4, 4));
    at += 8;
    g.step_args.push_back(at);
    at += 8 * nargs;
  }
  const size_t noutputs = size_t(get_le(b, at, 4));
  at += 4;
  for (size_t o = 0; o < noutputs; ++o) {
    skip_str();
    at += 8;  // the ref
    skip_tensor(g.output_dtype);
  }
  g.ranges = at;
  EXPECT_EQ(get_le(b, at, 4), 0u);  // a static program's bundle has no engine ranges
  at += 4;
  g.engines = at;
  return g;
}

void reseal(Bytes& b) { fuzz::reseal(b); }

std::shared_ptr<Bundle> read(const Bytes& b) { return Bundle::deserialize(b.data(), b.size()); }

Bytes random_bytes(const TensorType& t, uint64_t seed) {
  fuzz::Rng rng{seed};
  return fuzz::random_tensor(t, rng);
}

// The outputs of one engine call on host buffers.
std::vector<Bytes> call(const Engine& e, const std::vector<const Bytes*>& ins) {
  std::vector<Bytes> outs;
  std::vector<const void*> in;
  std::vector<void*> out;
  for (const Bytes* b : ins) in.push_back(b->data());
  for (const IOTensor& o : e.outputs()) outs.emplace_back(o.type.nbytes());
  for (Bytes& o : outs) out.push_back(o.data());
  e.create_execution_context()->execute(in, out);
  return outs;
}

class BundleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { seeds_ = new std::vector<Bytes>(fuzz::seed_bundles()); }
  static void TearDownTestSuite() {
    delete seeds_;
    seeds_ = nullptr;
  }
  const Bytes& routed() const { return (*seeds_)[0]; }  // x, y, u -> z2, z, y, probs, z (fuzz_bundle.h)
  const Bytes& conv() const { return (*seeds_)[1]; }
  static std::vector<Bytes>* seeds_;
};
std::vector<Bytes>* BundleTest::seeds_ = nullptr;

}  // namespace

TEST_F(BundleTest, RoutesValuesBetweenEngineCallsAsWritten) {
  auto b = read(routed());
  ASSERT_EQ(b->engines().size(), 2u);
  EXPECT_EQ(b->device(), Device{});
  EXPECT_EQ(b->kiln_version(), kKilnVersion);
  ASSERT_EQ(b->outputs().size(), 5u);
  EXPECT_EQ(b->outputs()[3].name, "probs");
  EXPECT_EQ(b->outputs()[3].type.to_string(), "f32[2,4]");

  const Engine& pointwise = *b->engines()[0];
  const Engine& linear = *b->engines()[1];
  auto ctx = b->create_context();
  for (uint64_t seed : {1u, 2u}) {  // one context, two sets of inputs
    const Bytes x = random_bytes(b->inputs()[0].type, seed), y = random_bytes(b->inputs()[1].type, seed + 10),
                u = random_bytes(b->inputs()[2].type, seed + 20);
    const Bytes z = call(pointwise, {&x, &y})[0];
    const Bytes z2 = call(pointwise, {&z, &y})[0];
    const Bytes probs = call(linear, {&u})[0];
    ASSERT_NE(z, z2);
    const std::vector<Bytes> got = ctx->run({x, y, u});
    ASSERT_EQ(got.size(), 5u);
    EXPECT_EQ(got[0], z2);
    EXPECT_EQ(got[1], z);
    EXPECT_EQ(got[2], y);
    EXPECT_EQ(got[3], probs);
    EXPECT_EQ(got[4], z);
    EXPECT_EQ(b->run({x, y, u}), got);  // a context of its own
  }
}

TEST_F(BundleTest, OfEngineRunsTheEngineAndWritesAsABundle) {
  auto conv_bundle = read(conv());
  std::shared_ptr<Engine> engine = conv_bundle->engines()[0];
  auto b = Bundle::of_engine(engine);
  ASSERT_EQ(b->inputs().size(), 1u);
  EXPECT_EQ(b->inputs()[0].type, engine->inputs()[0].type);
  ASSERT_EQ(b->outputs().size(), 2u);
  EXPECT_EQ(b->outputs()[1].name, "features");
  const Bytes x = random_bytes(b->inputs()[0].type, 5);
  EXPECT_EQ(b->run({x}), call(*engine, {&x}));
  // Its program written with the engine's bytes reads back the same.
  const Bytes e = engine->serialize();
  auto again = read(write_bundle({std::span<const uint8_t>(e)}, b->program()));
  EXPECT_EQ(again->run({x}), call(*engine, {&x}));
  expect_error([&] { b->run({x, x}); }, ErrorCode::kInvalidArgument, {"the bundle takes 1 inputs, got 2"});
  expect_error([&] { b->run({Bytes(3)}); }, ErrorCode::kInvalidArgument,
               {"bundle input 0 'x' (f32[1,3,8,8]) takes 768 bytes, got 3"});
}

TEST_F(BundleTest, WriteRefusesProgramsThatDoNotFitTheirEngines) {
  auto b = read(routed());
  const Bytes pointwise = b->engines()[0]->serialize(), linear = b->engines()[1]->serialize();
  const std::vector<std::span<const uint8_t>> engines = {std::span<const uint8_t>(pointwise),
                                                         std::span<const uint8_t>(linear)};
  EXPECT_NO_THROW(write_bundle(engines, b->program()));
  auto refused = [&](const std::function<void(BundleProgram&)>& edit, const std::string& message) {
    BundleProgram p = b->program();
    edit(p);
    expect_error([&] { write_bundle(engines, p); }, ErrorCode::kInvalidArgument,
                 {"cannot write the bundle: " + message});
  };
  refused([](BundleProgram& p) { p.steps[1].engine = 2; }, "step 1 ('second') calls engine 2, there are 2");
  refused([](BundleProgram& p) { p.steps[0].args.pop_back(); },
          "step 0 ('first') passes 1 arguments to engine 0, which takes 2");
  refused([](BundleProgram& p) { p.steps[0].args[0] = {1, 0}; },
          "step 0 ('first') argument 0 is output 0 of step 1, which is not a program input or an earlier step's "
          "output");
  refused([](BundleProgram& p) { p.steps[2].args[0] = {-1, 0}; },
          "step 2 ('linear') passes program input 0 'x' (f32[2,3,4]) to engine 1 input 0 'x' (f32[2,8])");
  refused([](BundleProgram& p) { p.outputs[3].type.dtype = DType::kF64; },
          "program output 3 ('probs') is f64[2,4], its value output 0 of step 2 'probs' is f32[2,4]");
  refused([](BundleProgram& p) { p.outputs[0].ref = {-1, 3}; },
          "program output 0 ('z2') is program input 3, which is not a program input or a step's output");
  expect_error([&] { write_bundle({}, b->program()); }, ErrorCode::kInvalidArgument,
               {"cannot write the bundle: it holds no engine"});
  Bytes damaged = linear;
  damaged[damaged.size() / 2] ^= 1;
  expect_error(
      [&] { write_bundle({std::span<const uint8_t>(pointwise), std::span<const uint8_t>(damaged)}, b->program()); },
      ErrorCode::kCorrupted,
      {"cannot write the bundle: engine 1 (called by step 2 ('linear')): engine file checksum mismatch"});
}

TEST_F(BundleTest, DamagedFilesAreRefusedNamingTheCause) {
  const Bytes good = routed();
  EXPECT_EQ(std::string(good.begin(), good.begin() + 8), std::string("KILNBDL\0", 8));
  EXPECT_EQ(get_le(good, 8, 4), 2u);
  EXPECT_EQ(get_le(good, 12, 8), good.size());
  const GlueOffsets g = walk(good);
  ASSERT_EQ(g.step_engine.size(), 3u);
  ASSERT_EQ(g.output_dtype.size(), 5u);
  EXPECT_EQ(get_le(good, g.engines, 4), 2u);

  // Every prefix is truncated (a short magic included), never read past its end.
  for (size_t n = 0; n < good.size(); n += (n < 4096 ? 1 : 97)) {
    const Bytes cut(good.begin(), good.begin() + long(n));
    std::string message;
    const ErrorCode code = test::code_of([&] { read(cut); }, &message);
    EXPECT_EQ(code, ErrorCode::kTruncated) << n << ": " << message;
  }
  // Any byte of the glue changed: the checksum.
  for (size_t at = 20; at < g.engines + 4; ++at) {
    Bytes b = good;
    b[at] ^= 0x20;
    expect_error([&] { read(b); }, ErrorCode::kCorrupted, {"bundle checksum mismatch"});
  }
  Bytes b = good;
  b[0] = 'X';
  expect_error([&] { read(b); }, ErrorCode::kCorrupted, {"not a Kiln bundle: bad magic"});
  b = good;
  put_le(b, 8, 3, 4);
  reseal(b);
  expect_error([&] { read(b); }, ErrorCode::kVersionMismatch,
               {"bundle format version 3, this Kiln reads format version 2"});
  b = good;
  b.push_back(0);
  expect_error([&] { read(b); }, ErrorCode::kCorrupted, {"bundle corrupted: it has 1 bytes past the end"});

  // Resealed edits reach the glue checks.
  auto resealed = [&](size_t at, uint64_t v, int n) {
    Bytes e = good;
    put_le(e, at, v, n);
    reseal(e);
    return e;
  };
  expect_error([&] { read(resealed(g.step_engine[0], 7, 4)); }, ErrorCode::kCorrupted,
               {"bundle corrupted: step 0 ('first') calls engine 7, there are 2"});
  expect_error([&] { read(resealed(g.step_args[1], 5, 4)); }, ErrorCode::kCorrupted,
               {"bundle corrupted: step 1 ('second') argument 0 is output 0 of step 5"});
  expect_error([&] { read(resealed(g.output_dtype[0], uint64_t(DType::kI64), 1)); }, ErrorCode::kCorrupted,
               {"program output 0 ('z2') is i64[2,3,4], its value output 0 of step 1 'z' is f32[2,3,4]"});
  expect_error([&] { read(resealed(g.input_dtype[1], 200, 1)); }, ErrorCode::kCorrupted,
               {"bundle corrupted: program input 'y' has the unknown dtype code 200 in the bundle's glue"});
  expect_error([&] { read(resealed(g.nsteps, 0xffffffff, 4)); }, ErrorCode::kCorrupted,
               {"bundle corrupted: impossible count 4294967295 of steps"});
  expect_error([&] { read(resealed(g.engines, 3, 4)); }, ErrorCode::kTruncated, {"bundle truncated: needed"});
  expect_error([&] { read(resealed(g.engines, 0, 4)); }, ErrorCode::kCorrupted, {"unread bytes"});
  // An embedded engine damaged, the bundle resealed: the engine's own checksum, named.
  auto up64 = [](size_t v) { return (v + 63) / 64 * 64; };
  const size_t first_engine = up64(g.engines + 4 + 8);
  const size_t second_engine = up64(first_engine + get_le(good, g.engines + 4, 8) + 8);
  EXPECT_EQ(std::string(good.begin() + long(second_engine), good.begin() + long(second_engine) + 7), "KILNENG");
  b = good;
  b[second_engine + 300] ^= 1;
  reseal(b);
  expect_error([&] { read(b); }, ErrorCode::kCorrupted,
               {"bundle engine 1 of 2 (called by step 2 ('linear')): engine file checksum mismatch"});
  // An engine file is not a bundle.
  const Bytes engine = read(good)->engines()[0]->serialize();
  expect_error([&] { read(engine); }, ErrorCode::kCorrupted, {"not a Kiln bundle: bad magic"});
  EXPECT_TRUE(Bundle::has_bundle_magic(good.data(), good.size()));
  EXPECT_FALSE(Bundle::has_bundle_magic(engine.data(), engine.size()));
}

TEST_F(BundleTest, LoadNamesTheFile) {
  const fs::path dir = fs::temp_directory_path() / ("kiln_bundle_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "m.kiln").string();
  Bytes b = routed();
  b[40] ^= 1;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), long(b.size()));
  expect_error([&] { Bundle::load(path); }, ErrorCode::kCorrupted,
               {"bundle checksum mismatch", "(file '" + path + "')"});
  expect_error([&] { Bundle::load((dir / "missing.kiln").string()); }, ErrorCode::kIo, {"missing.kiln"});
  expect_error([&] { Bundle::load(dir.string()); }, ErrorCode::kIo, {"is a directory"});
  fs::remove_all(dir);
}

TEST_F(BundleTest, MutatedBundlesOnlyThrowKilnErrors) {
  const std::vector<Bytes> seeds = *seeds_;
  for (size_t i = 0; i < seeds.size(); ++i) {
    fuzz::Rng rng{i};
    EXPECT_NO_THROW(fuzz::exercise(read(seeds[i]), rng)) << "seed " << i;
  }
  fuzz::Rng rng{20250601};
  int loaded = 0;
  for (int it = 0; it < 600; ++it) {
    Bytes file = seeds[size_t(rng.below(seeds.size()))];
    fuzz::mutate(file, seeds, rng);
    try {
      loaded += fuzz::run_any(file);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "mutation " << it << " threw a non-Kiln exception: " << e.what();
    }
  }
  EXPECT_LT(loaded, 600);  // most mutations are refused
}

// ---- kiln-run --------------------------------------------------------------------------

namespace {

struct Result {
  int status;
  std::string output;
};
Result shell(const std::string& cmd) {
  Result r{-1, ""};
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace

TEST_F(BundleTest, KilnRunRunsABundleAsBundleRunDoes) {
  const char* bin = std::getenv("KILN_RUN");
  if (!bin || !*bin) GTEST_SKIP() << "KILN_RUN is not set (CTest sets it to the kiln-run binary)";
  const fs::path dir = fs::temp_directory_path() / ("kiln_run_bundle_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "m.kiln").string();
  const Bytes good = routed();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(good.data()), long(good.size()));
  auto b = read(good);
  std::vector<Bytes> ins;
  std::string inputs;
  for (size_t i = 0; i < b->inputs().size(); ++i) {
    const IOTensor& in = b->inputs()[i];
    ins.push_back(random_bytes(in.type, 30 + i));
    const std::string f = (dir / (in.name + ".npy")).string();
    npy::write_file(f, in.type.dtype, in.type.shape(), ins.back().data(), ins.back().size());
    inputs += (i ? "," : "") + f;
  }
  const std::string out = (dir / "out").string();
  Result r =
      shell(std::string(bin) + " " + path + " --inputs " + inputs + " --iterations 2 --warmup 0 --outputs " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("(" + std::to_string(good.size()) + " bytes, Kiln " + kKilnVersion +
                          ", 2 engines, 3 steps, on cpu)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("1 second: engine 0 (step 0 output 0 'z', y)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2 y: f32[3,4] = y"), std::string::npos) << r.output;
  const std::vector<Bytes> want = b->run(ins);
  for (size_t i = 0; i < want.size(); ++i) {
    const npy::Array a =
        npy::read_file((fs::path(out) / ("out" + std::to_string(i) + "_" + b->outputs()[i].name + ".npy")).string());
    EXPECT_EQ(a.shape, b->outputs()[i].type.shape()) << i;
    EXPECT_EQ(a.data, want[i]) << i;
  }

  // A damaged bundle, a wrong input count and a torch.export archive are errors naming the cause.
  Bytes damaged = good;
  damaged[50] ^= 1;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(damaged.data()), long(damaged.size()));
  r = shell(std::string(bin) + " " + path);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("kiln-run: error: [corrupted] bundle checksum mismatch"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(bundle '" + path + "')"), std::string::npos) << r.output;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(good.data()), long(good.size()));
  r = shell(std::string(bin) + " " + path + " --inputs " + inputs.substr(0, inputs.find(',')));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("the bundle takes 3 inputs, --inputs gives 1 files"), std::string::npos) << r.output;
  const std::string zip = (dir / "m.ep").string();
  std::ofstream(zip, std::ios::binary) << std::string("PK\x03\x04", 4) << std::string(60, '\0');
  r = shell(std::string(bin) + " " + zip);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("is a zip archive"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("output_format=\"kiln_bundle\""), std::string::npos) << r.output;
  fs::remove_all(dir);
}
