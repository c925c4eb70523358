// Device-free checks of the CUDA GEMM families (matmul, attention): every generated source
// compiles for sm_90 through NVRTC (no GPU needed), and the timing cache's file survives a
// round trip and ignores damaged files. GPU runs of the kernels are tests/python/test_cuda_ops.py.
#ifdef KILN_WITH_CUDA

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>

#include "kiln/errors.h"
#include "src/backends/cuda/codegen/gemm_sources.h"
#include "src/backends/cuda/libs/batch_plan.h"
#include "src/backends/cuda/tuning/timing_cache.h"

namespace kiln::cuda {

Bytes compile_to_cubin(const std::string& source, const std::string& what, int arch);  // nvrtc.h (needs CUDA headers)

namespace {

constexpr int kArch = 90;

TEST(CudaGemmCodegen, EpilogueSourcesCompile) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
    for (const char* name :
         {"none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "hardswish", "hardsigmoid", "clipped_relu"})
      for (bool residual : {false, true}) {
        Attrs a;
        a.set("activation", std::string(name));
        a.set("activation_max", 6.0);
        const pw::Activation act = pw::parse_activation(OpKind::kLinear, a);
        const std::string src = gemm_epilogue_source(dt, act, residual);
        EXPECT_NE(src.find("kiln_gemm_epilogue_vec"), std::string::npos);
        const Bytes cubin = compile_to_cubin(src, std::string("epilogue ") + name, kArch);
        EXPECT_GT(cubin.size(), 100u) << dtype_name(dt) << " " << name;
      }
}

TEST(CudaGemmCodegen, SoftmaxSourcesCompile) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
    for (int mask = 0; mask <= 2; ++mask)
      EXPECT_GT(compile_to_cubin(sdpa_softmax_source(dt, mask), "sdpa softmax", kArch).size(), 100u)
          << dtype_name(dt) << " mask " << mask;
}

TEST(CudaGemmCodegen, FlashAttentionSourcesCompile) {
  for (DType dt : {DType::kF16, DType::kBF16})
    for (int d : {32, 64, 96, 128})
      for (int mask = 0; mask <= 2; ++mask) {
        const std::string src = flash_attention_source(dt, d, mask);
        EXPECT_NE(src.find("mma.sync.aligned.m16n8k16"), std::string::npos);
        EXPECT_GT(compile_to_cubin(src, "flash attention", kArch).size(), 100u)
            << dtype_name(dt) << " d" << d << " mask " << mask;
      }
  EXPECT_THROW(flash_attention_source(DType::kF32, 64, 0), Error);
  EXPECT_THROW(flash_attention_source(DType::kF16, 80, 0), Error);
  EXPECT_THROW(flash_attention_source(DType::kF16, 160, 0), Error);
}

TEST(CudaGemmBatchPlan, AffineBatchesBecomeOneStridedBatch) {
  // a [2,3,M,K] (12 elements a matrix) with b [K,N] broadcast: one group of 6, b's stride 0.
  BatchPlan p = plan_strided_batches({2, 3}, {{0, 0}, {36, 12}, {45, 15}});
  EXPECT_EQ(p.inner, 6);
  EXPECT_EQ(p.outer(), 1u);
  EXPECT_EQ(p.inner_stride, (std::vector<int64_t>{0, 12, 15}));
  // a [2,1,...] against b [5,...]: the out batch [2,5] is not affine in a as one group of 10
  // (a's offset repeats 5 times, then jumps), so it splits into 2 groups of 5.
  p = plan_strided_batches({2, 5}, {{0, 24}, {12, 0}, {90, 18}});
  EXPECT_EQ(p.inner, 5);
  ASSERT_EQ(p.outer(), 2u);
  EXPECT_EQ(p.inner_stride, (std::vector<int64_t>{24, 0, 18}));
  EXPECT_EQ(p.outer_offset[1], (std::vector<int64_t>{0, 12}));
  EXPECT_EQ(p.outer_offset[2], (std::vector<int64_t>{0, 90}));
  // The heads of a [B, S, H, D] view (b stride 60, h stride 4) against a dense output: no single
  // stride reaches every batch, so B groups of H (a matmul reading views runs them through
  // pointer arrays instead).
  p = plan_strided_batches({2, 3}, {{60, 4}, {60, 4}, {75, 25}});
  EXPECT_EQ(p.inner, 3);
  EXPECT_EQ(p.outer(), 2u);
  // No batch dims: one matrix.
  p = plan_strided_batches({}, {{}, {}, {}});
  EXPECT_EQ(p.inner, 1);
  EXPECT_EQ(p.outer(), 1u);
}

class TimingCacheFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kiln_tc_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TimingEntries random_entries(std::mt19937& rng, int n) {
  TimingEntries e;
  for (int i = 0; i < n; ++i) {
    Bytes v(size_t(rng() % 80));
    for (auto& b : v) b = uint8_t(rng());
    e["matmul|f16>f16,m" + std::to_string(rng()) + "|gpu=X"] = v;
  }
  return e;
}

TEST_F(TimingCacheFile, RoundTripThroughAFile) {
  std::mt19937 rng(7);
  const TimingEntries entries = random_entries(rng, 25);
  const std::string path = (dir_ / "sub" / "timing.cache").string();
  write_timing_cache_file(path, entries);  // creates the folders
  EXPECT_EQ(read_timing_cache_file(path), entries);
  for (const auto& f : std::filesystem::directory_iterator(dir_ / "sub"))
    EXPECT_EQ(f.path().filename(), "timing.cache") << "a temporary file was left behind";
  EXPECT_TRUE(read_timing_cache_file((dir_ / "absent").string()).empty());
}

TEST_F(TimingCacheFile, EveryDamageIsDetected) {
  std::mt19937 rng(11);
  const Bytes good = encode_timing_cache(random_entries(rng, 6));
  ASSERT_TRUE(decode_timing_cache(good).has_value());
  std::string why;
  for (size_t cut = 0; cut < good.size(); cut += 7) {  // truncations
    EXPECT_FALSE(decode_timing_cache(Bytes(good.begin(), good.begin() + std::ptrdiff_t(cut)), &why)) << cut;
    EXPECT_FALSE(why.empty());
  }
  for (size_t i = 0; i < good.size(); ++i) {  // single flipped bytes
    Bytes bad = good;
    bad[i] ^= uint8_t(1 + rng() % 255);
    EXPECT_FALSE(decode_timing_cache(bad).has_value()) << "byte " << i;
  }
  Bytes longer = good;
  longer.push_back(0);
  EXPECT_FALSE(decode_timing_cache(longer).has_value());
}

TEST_F(TimingCacheFile, OnlyARegularFileIsRead) {
  // A FIFO, a device or a directory at the path is ignored at once: reading it could block or
  // never end. Each read runs on its own thread so that a regression fails instead of hanging.
  std::filesystem::create_directories(dir_ / "folder");
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {fifo, std::string("/dev/zero"), (dir_ / "folder").string()}) {
    auto read = std::async(std::launch::async, [path] { return read_timing_cache_file(path); });
    ASSERT_EQ(read.wait_for(std::chrono::seconds(20)), std::future_status::ready) << path << " blocked";
    EXPECT_TRUE(read.get().empty()) << path;
  }
}

TEST_F(TimingCacheFile, ProcessCacheIgnoresADamagedFileAndRewritesIt) {
  std::filesystem::create_directories(dir_);
  const std::string path = (dir_ / "timing.cache").string();
  {
    std::ofstream f(path, std::ios::binary);
    f << "KILNTCAC this is not a timing cache";
  }
  set_timing_cache_path(path);
  if (timing_cache_path() != path) GTEST_SKIP() << "KILN_TIMING_CACHE overrides the path";
  const std::string key = "test|damaged|" + std::to_string(::getpid());
  EXPECT_FALSE(timing_cache_find(key).has_value());  // damaged: read as empty, no throw
  const Bytes choice{1, 2, 3, 250};
  timing_cache_insert(key, choice);
  EXPECT_EQ(timing_cache_find(key), choice);
  timing_cache_flush();
  const TimingEntries on_disk = read_timing_cache_file(path);
  ASSERT_EQ(on_disk.count(key), 1u);
  EXPECT_EQ(on_disk.at(key), choice);

  // Another path: memory keeps the entry; the new file receives it on flush only if dirty.
  const std::string other = (dir_ / "other.cache").string();
  write_timing_cache_file(other, {{"test|from-file", Bytes{9}}});
  set_timing_cache_path(other);
  EXPECT_EQ(timing_cache_find("test|from-file"), Bytes{9});
  EXPECT_EQ(timing_cache_find(key), choice);
  set_timing_cache_path("");
}

}  // namespace
}  // namespace kiln::cuda

#endif  // KILN_WITH_CUDA
