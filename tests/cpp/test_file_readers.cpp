// File readers take only regular files of bounded size and never block: a FIFO, a device or a
// directory is refused with kIo naming the path and what it is, by Engine::load,
// Engine::load_mapped, npy::read_file and kiln-run. Every read runs under a time limit, so a
// reader that blocks or reads without end fails the test instead of hanging it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/kiln.h"
#include "src/serialize/input_file.h"
#include "src/serialize/npy.h"
#include "tests/cpp/engine_file_test_util.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

struct Outcome {
  bool threw = false;
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
};

// Runs `read` on a thread of its own and returns the kiln::Error it threw. A read still going
// after 20 s fails the test: a writer opened on `fifo` (when given) releases a reader blocked
// there; a reader that cannot be released ends the process, since the test could never end.
Outcome bounded(const std::function<void()>& read, const std::string& fifo = "") {
  auto result = std::make_shared<std::promise<Outcome>>();
  std::future<Outcome> done = result->get_future();
  std::thread([read, result] {
    Outcome o;
    try {
      read();
    } catch (const Error& e) {
      o = {true, e.code(), e.what()};
    }
    result->set_value(o);
  }).detach();
  if (done.wait_for(std::chrono::seconds(20)) == std::future_status::ready) return done.get();
  ADD_FAILURE() << "the read did not finish within 20 s";
  if (!fifo.empty()) {
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
    if (done.wait_for(std::chrono::seconds(5)) == std::future_status::ready) return done.get();
  }
  std::fprintf(stderr, "a file read blocked and cannot be released; ending the test process\n");
  std::_Exit(1);
}

// Every reader refuses `path` with kIo naming it and saying `what` it is.
void expect_refused(const std::string& path, const std::string& what, const std::string& fifo = "") {
  const std::function<void()> readers[] = {
      [&] { Engine::load(path); },
      [&] { Engine::load_mapped(path); },
      [&] { npy::read_file(path); },
  };
  for (const auto& read : readers) {
    const Outcome o = bounded(read, fifo);
    ASSERT_TRUE(o.threw) << path << " was read";
    EXPECT_EQ(o.code, ErrorCode::kIo) << o.message;
    EXPECT_NE(o.message.find("'" + path + "'"), std::string::npos) << o.message;
    EXPECT_NE(o.message.find(what), std::string::npos) << o.message;
  }
}

class FileReaders : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_file_readers_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

}  // namespace

TEST_F(FileReaders, FifoIsRefusedWithoutBlocking) {
  const std::string fifo = path("entry.kiln");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_refused(fifo, "a FIFO", fifo);
}

TEST_F(FileReaders, DevicesAreRefusedUnread) {
  if (!fs::exists("/dev/zero")) GTEST_SKIP() << "no /dev/zero";
  expect_refused("/dev/zero", "a character device");
  // A link is followed: what it names is what counts.
  const std::string link = path("zero.kiln");
  fs::create_symlink("/dev/zero", link);
  expect_refused(link, "a character device");
}

TEST_F(FileReaders, DirectoryIsRefused) {
  const std::string d = path("a_directory.kiln");
  fs::create_directories(d);
  expect_refused(d, "a directory");
}

TEST_F(FileReaders, MissingFileNamesThePathAndTheReason) { expect_refused(path("missing.kiln"), "No such file"); }

TEST_F(FileReaders, SizeIsBoundedBeforeReading) {
  const std::string p = path("big.bin");
  std::ofstream(p, std::ios::binary) << std::string(100, 'x');
  std::string message;
  try {
    serialize::InputFile f(p, "engine file", 16);
    ADD_FAILURE() << "a 100-byte file passed a 16-byte bound";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    message = e.what();
  }
  EXPECT_NE(message.find("100 bytes, more than the 16"), std::string::npos) << message;
  serialize::InputFile f(p, "engine file", 100);
  ASSERT_EQ(f.size(), 100u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.read_all().get()), 100), std::string(100, 'x'));
}

TEST_F(FileReaders, RegularFilesLoadAsBefore) {
  const Bytes file = engine_file_test::small_file();
  const std::string p = path("small.kiln");
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(file.data()), long(file.size()));
  auto direct = Engine::deserialize(file.data(), file.size());
  const auto in = engine_file_test::random_inputs(*direct, 3);
  const auto want = engine_file_test::run(*direct, in);
  EXPECT_EQ(engine_file_test::run(*Engine::load(p), in), want);
  EXPECT_EQ(engine_file_test::run(*Engine::load_mapped(p), in), want);
  // An empty regular file is a truncated engine, not an I/O problem.
  const std::string empty = path("empty.kiln");
  std::ofstream(empty, std::ios::binary).flush();
  const Outcome o = bounded([&] { Engine::load_mapped(empty); });
  EXPECT_EQ(o.code, ErrorCode::kTruncated) << o.message;
}

// kiln-run on a device, a FIFO and a directory: exit status 1 with the reason, within the
// `timeout` it runs under (status 124 would mean it was still reading).
TEST_F(FileReaders, KilnRunRefusesWhatIsNotARegularFile) {
  const char* bin = std::getenv("KILN_RUN");
  if (!bin || !*bin) GTEST_SKIP() << "KILN_RUN is not set (CTest sets it to the kiln-run binary)";
  const std::string fifo = path("pipe.kiln");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::vector<std::pair<std::string, std::string>> targets = {
      {"/dev/zero", "a character device"}, {fifo, "a FIFO"}, {dir_.string(), "a directory"}};
  for (const auto& [target, what] : targets) {
    FILE* p = ::popen(("timeout 20 " + std::string(bin) + " " + target + " 2>&1").c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int status = ::pclose(p);
    ASSERT_TRUE(WIFEXITED(status)) << out;
    EXPECT_EQ(WEXITSTATUS(status), 1) << target << ":\n" << out;
    EXPECT_NE(out.find("kiln-run: error:"), std::string::npos) << out;
    EXPECT_NE(out.find(what), std::string::npos) << out;
  }
}
