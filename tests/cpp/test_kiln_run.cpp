// .npy files and the kiln-run command-line runner.
//
// The .npy checks use headers written out by hand here (as NumPy writes them), not the
// library's encoder, and the kiln-run test reads its output files with a separate parser.
// The kiln-run binary is found through $KILN_RUN (set by CTest); without it those tests skip.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "kiln/kiln.h"
#include "src/serialize/npy.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

// A .npy file as NumPy writes it: magic, version, little-endian header length, header, data.
Bytes npy_bytes(int major, const std::string& header, const Bytes& data) {
  const int len_bytes = major == 1 ? 2 : 4;
  Bytes b;
  b.reserve(8 + len_bytes + header.size() + data.size());
  for (uint8_t c : {uint8_t(0x93), uint8_t('N'), uint8_t('U'), uint8_t('M'), uint8_t('P'), uint8_t('Y'),
                    uint8_t(major), uint8_t(0)})
    b.push_back(c);
  for (int i = 0; i < len_bytes; ++i) b.push_back(uint8_t(header.size() >> (8 * i)));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

Bytes floats_bytes(const std::vector<float>& v) {
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::string error_of(const Bytes& b) {
  try {
    npy::parse(b.data(), b.size(), "t.npy");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  ADD_FAILURE() << "parsed";
  return "";
}

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
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace

TEST(Npy, ReadsVersion1And2HeadersAsNumpyWritesThem) {
  std::vector<float> v = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  h.append(128 - 10 - 1 - h.size(), ' ');  // NumPy pads to a 64-byte multiple, then '\n'
  h += '\n';
  for (int major : {1, 2}) {
    Bytes file = npy_bytes(major, h, floats_bytes(v));
    npy::Array a = npy::parse(file.data(), file.size(), "t.npy");
    EXPECT_EQ(a.dtype, DType::kF32);
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(a.data, floats_bytes(v));
  }
  // Key order and spacing are free; a 1-d shape is "(n,)"; a scalar is "()".
  Bytes bools = npy_bytes(1, "{\"shape\":(4,),\"fortran_order\":False,\"descr\":\"|b1\"}\n", Bytes{1, 0, 1, 1});
  npy::Array b = npy::parse(bools.data(), bools.size(), "t.npy");
  EXPECT_EQ(b.dtype, DType::kBool);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{4}));
  Bytes scalar = npy_bytes(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (), }\n", Bytes(8, 0));
  scalar[scalar.size() - 8] = 42;
  npy::Array s = npy::parse(scalar.data(), scalar.size(), "t.npy");
  EXPECT_EQ(s.dtype, DType::kI64);
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.data[0], 42);
}

TEST(Npy, EncodeMatchesTheNumpyLayoutForEveryDtype) {
  for (int i = 0; i < kNumDTypes; ++i) {
    DType t = static_cast<DType>(i);
    std::vector<int64_t> shape = {3, 1, 2};
    Bytes data(6 * dtype_size(t));
    std::mt19937 rng{static_cast<uint32_t>(i)};
    for (auto& x : data) x = uint8_t(rng());
    if (t == DType::kBool)
      for (auto& x : data) x &= 1;
    Bytes file = npy::encode(t, shape, data.data(), data.size());
    // NumPy aligns the data to 64 bytes and ends the header with a newline.
    size_t hlen = size_t(file[8]) | size_t(file[9]) << 8;
    EXPECT_EQ((10 + hlen) % 64, 0u) << dtype_name(t);
    EXPECT_EQ(file[10 + hlen - 1], '\n');
    std::string header(file.begin() + 10, file.begin() + 10 + long(hlen));
    EXPECT_NE(header.find(std::string("'descr': '") + npy::descr(t) + "'"), std::string::npos) << header;
    EXPECT_NE(header.find("'shape': (3, 1, 2)"), std::string::npos) << header;
    npy::Array a = npy::parse(file.data(), file.size(), "t.npy");
    EXPECT_EQ(a.dtype, t);
    EXPECT_EQ(a.shape, shape);
    EXPECT_EQ(a.data, data);
  }
  EXPECT_STREQ(npy::descr(DType::kBF16), "<u2");
  Bytes one = npy::encode(DType::kF32, {5}, floats_bytes({1, 2, 3, 4, 5}).data(), 20);
  EXPECT_NE(std::string(one.begin(), one.end()).find("(5,)"), std::string::npos);
}

TEST(Npy, RejectsWhatKilnCannotRead) {
  auto with = [](const std::string& descr, const std::string& order, const std::string& shape, size_t bytes) {
    return npy_bytes(1, "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': " + shape + ", }\n",
                     Bytes(bytes, 0));
  };
  EXPECT_NE(error_of(with("<f4", "True", "(2, 2)", 16)).find("Fortran order"), std::string::npos);
  EXPECT_NE(error_of(with(">f4", "False", "(2, 2)", 16)).find("big-endian"), std::string::npos);
  EXPECT_NE(error_of(with("<c8", "False", "(2,)", 16)).find("'<c8'"), std::string::npos);
  EXPECT_NE(error_of(with("<f4", "False", "(2, 2)", 12)).find("12 data bytes"), std::string::npos);
  EXPECT_NE(error_of(with("<f4", "False", "(99999999999, 99999999999)", 16)).find("shape needs more"),
            std::string::npos);
  EXPECT_NE(error_of(with("<f4", "Maybe", "(2,)", 8)).find("True or False"), std::string::npos);
  EXPECT_NE(error_of(Bytes{'P', 'K', 3, 4, 0, 0, 0, 0, 0, 0}).find("not a .npy file"), std::string::npos);
  Bytes cut = with("<f4", "False", "(2,)", 8);
  cut.resize(20);
  EXPECT_NE(error_of(cut).find("past the end"), std::string::npos);
  try {
    npy::read_file("/nonexistent/dir/x.npy");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.npy"), std::string::npos);
  }
}

class KilnRun : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bin = std::getenv("KILN_RUN");
    if (!bin || !*bin) GTEST_SKIP() << "KILN_RUN is not set (CTest sets it to the kiln-run binary)";
    bin_ = bin;
    dir_ = fs::temp_directory_path() / ("kiln_run_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    // logits = x @ w^T + b and relu(logits): two outputs, one with a name unfit for a file.
    Graph g;
    ValueId x = g.add_input("x", TensorType(DType::kF32, {3, 5}));
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<float> w(20), b(4);
    for (float& v : w) v = d(rng);
    for (float& v : b) v = d(rng);
    ValueId wv = g.add_constant("fc.weight", TensorType(DType::kF32, {4, 5}), w.data(), 80, true);
    ValueId bv = g.add_constant("fc.bias", TensorType(DType::kF32, {4}), b.data(), 16, true);
    ValueId h = g.add_node1(OpKind::kLinear, {x, wv, bv});
    g.mark_output(g.add_node1(OpKind::kRelu, {h}), "act/out");
    g.mark_output(h, "logits");
    engine_ = Builder().build(g);
    path_ = (dir_ / "m.kiln").string();
    engine_->save(path_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string bin_, path_;
  fs::path dir_;
  std::shared_ptr<Engine> engine_;
};

TEST_F(KilnRun, GivenInputsGiveTheInProcessOutputs) {
  std::vector<float> x(15);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.7f);
  std::string in_path = (dir_ / "x.npy").string();
  Bytes xin = npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 5), }\n", floats_bytes(x));
  std::ofstream(in_path, std::ios::binary).write(reinterpret_cast<const char*>(xin.data()), long(xin.size()));

  std::string out_dir = (dir_ / "out").string();
  Result r = shell(bin_ + " " + path_ + " --inputs " + in_path + " --iterations 5 --warmup 1 --outputs " + out_dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("x: f32[3,5]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fc.weight: f32[4,5]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("latency: median"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("inferences/s"), std::string::npos) << r.output;

  std::vector<Bytes> want(2, Bytes(48));
  engine_->create_execution_context()->execute({x.data()}, {want[0].data(), want[1].data()});
  const char* files[] = {"out0_act_out.npy", "out1_logits.npy"};
  for (int i = 0; i < 2; ++i) {
    std::ifstream in(fs::path(out_dir) / files[i], std::ios::binary);
    ASSERT_TRUE(in) << files[i] << "\n" << r.output;
    Bytes f((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GE(f.size(), 10u);
    size_t hlen = size_t(f[8]) | size_t(f[9]) << 8;
    std::string header(f.begin() + 10, f.begin() + 10 + long(hlen));
    EXPECT_NE(header.find("'descr': '<f4'"), std::string::npos) << header;
    EXPECT_NE(header.find("'shape': (3, 4)"), std::string::npos) << header;
    EXPECT_EQ(Bytes(f.begin() + 10 + long(hlen), f.end()), want[size_t(i)]) << files[i];
  }
}

TEST_F(KilnRun, RandomInputsInfoAndErrors) {
  Result r = shell(bin_ + " " + path_ + " --iterations=3 --warmup=0 --threads 1");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("random inputs"), std::string::npos) << r.output;
  r = shell(bin_ + " " + path_ + " --info");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("linear("), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("latency"), std::string::npos) << r.output;

  // Usage errors exit 2, runtime errors exit 1, both say "kiln-run: error:".
  for (const std::string& args : {std::string(""), path_ + " --bogus", path_ + " --iterations -3",
                                  path_ + " --iterations"}) {
    r = shell(bin_ + " " + args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("kiln-run: error:"), std::string::npos) << r.output;
  }
  std::string bad = (dir_ / "bad.npy").string();
  Bytes i32 = npy_bytes(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 5), }\n", Bytes(60, 0));
  std::ofstream(bad, std::ios::binary).write(reinterpret_cast<const char*>(i32.data()), long(i32.size()));
  r = shell(bin_ + " " + path_ + " --inputs " + bad);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("kiln-run: error:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("must be f32[3,5]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("i32[3,5]"), std::string::npos) << r.output;
  r = shell(bin_ + " " + path_ + " --inputs " + bad + "," + bad);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("takes 1 inputs"), std::string::npos) << r.output;
  r = shell(bin_ + " " + (dir_ / "missing.kiln").string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("missing.kiln"), std::string::npos) << r.output;
}
