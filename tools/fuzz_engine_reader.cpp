// A libFuzzer entry point for the engine file reader: any input must either load or throw a
// kiln::Error; anything else (a crash, a sanitizer report, another exception) is a bug.
//
//   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DKILN_BUILD_FUZZ=ON
//         -DKILN_SANITIZE=address,undefined -DKILN_BUILD_PYTHON=OFF   (one command)
//   ninja -C build-fuzz fuzz_engine_reader && build-fuzz/fuzz_engine_reader corpus/
//
// Seed the corpus with engine files (Engine::save) each prefixed by one mode byte. The first
// byte picks the mode: even feeds the rest as is (magic, size and checksum checks); odd
// first repairs the size field and the checksum, so that mutations reach the section parser
// behind them. Built with another compiler (KILN_FUZZ_STANDALONE), main() replays the files
// named on the command line through the same entry point, to reproduce a finding.
#include <cstddef>
#include <cstdint>

#include "kiln/engine.h"
#include "kiln/errors.h"
#include "src/serialize/engine_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  kiln::Bytes file(data + 1, data + size);
  if ((data[0] & 1) && file.size() >= kiln::serialize::kEngineHeaderFixedBytes + kiln::serialize::kEngineTrailerBytes) {
    for (int i = 0; i < 8; ++i) file[12 + size_t(i)] = uint8_t(uint64_t(file.size()) >> (8 * i));
    kiln::serialize::reseal_engine_file(file);
  }
  try {
    auto engine = kiln::Engine::deserialize(file.data(), file.size());
    (void)engine->serialize();
  } catch (const kiln::Error&) {
  }
  return 0;
}

#ifdef KILN_FUZZ_STANDALONE
#include <cstdio>
#include <fstream>
#include <iterator>

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "fuzz_engine_reader: cannot open %s\n", argv[i]);
      return 1;
    }
    kiln::Bytes bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    std::printf("%s: ok\n", argv[i]);
  }
  return 0;
}
#endif
