// Fuzzing the engine file and bundle readers and everything a loaded engine does: any input must
// either be refused with a kiln::Error or load, and a loaded engine must then create a context,
// execute on random inputs, refit its weights and execute again (a loaded bundle: run once on
// random inputs), each step either working or throwing a kiln::Error. Anything else (a crash, a
// sanitizer report, another exception) is a bug. Engine files and bundles are told apart by
// their magic (tools/fuzz_bundle.h).
//
// With clang it is a libFuzzer binary:
//   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DKILN_BUILD_FUZZ=ON
//         -DKILN_SANITIZE=address,undefined -DKILN_BUILD_PYTHON=OFF   (one command)
//   ninja -C build-fuzz fuzz_engine_reader && build-fuzz/fuzz_engine_reader corpus/
// Seed the corpus with engine files and bundles each prefixed by one mode byte (`--write-seeds DIR` below
// writes them). Even mode bytes feed the rest as is (magic, size and checksum checks); odd ones
// first repair the size field and the checksum, so that mutations reach the parser behind them.
//
// With another compiler, or -DKILN_FUZZ_LIBFUZZER=OFF (KILN_FUZZ_STANDALONE), main() offers,
// around the same entry point:
//   fuzz_engine_reader FILE...        replay inputs (mode byte first), e.g. a finding
//   fuzz_engine_reader --mutate SEED ITERATIONS [--keep FILE] [--write-seeds DIR]
//       builds its own valid engines (tools/fuzz_engine.h: conv, linear, pointwise, slice,
//       attention and gather networks) and bundles of them (tools/fuzz_bundle.h), then mutates
//       them deterministically from SEED.
//       --keep writes each input to FILE before running it, so that an input that kills the
//       process (a sanitizer report) can be replayed.
#include <cstddef>
#include <cstdint>

#include "kiln/kiln.h"
#include "tools/fuzz_bundle.h"
#include "tools/fuzz_engine.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  kiln::Bytes file(data + 1, data + size);
  if (data[0] & 1) kiln::fuzz::reseal(file);
  kiln::fuzz::run_any(file);
  return 0;
}

#ifdef KILN_FUZZ_STANDALONE
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

using namespace kiln;

bool write_file(const std::string& path, uint8_t mode, const Bytes& file) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.put(char(mode));
  out.write(reinterpret_cast<const char*>(file.data()), std::streamsize(file.size()));
  return bool(out);
}

uint64_t parse_u64(const char* text, const char* what) {
  uint64_t v = 0;
  const char* end = text + std::strlen(text);
  auto [p, ec] = std::from_chars(text, end, v);
  if (ec != std::errc() || p != end) {
    std::fprintf(stderr, "fuzz_engine_reader: %s must be a non-negative integer, got '%s'\n", what, text);
    std::exit(2);
  }
  return v;
}

int replay(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "fuzz_engine_reader: cannot open %s\n", argv[i]);
      return 1;
    }
    Bytes bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    std::printf("%s: ok\n", argv[i]);
  }
  return 0;
}

int mutate_loop(uint64_t seed, uint64_t iterations, const std::string& keep, const std::string& seeds_dir) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<Bytes> seeds = fuzz::seed_files();
  const size_t engines = seeds.size();
  for (Bytes& b : fuzz::seed_bundles()) seeds.push_back(std::move(b));
  if (!seeds_dir.empty())
    for (size_t i = 0; i < seeds.size(); ++i)
      if (!write_file(seeds_dir + "/seed" + std::to_string(i) + ".bin", 1, seeds[i])) {
        std::fprintf(stderr, "fuzz_engine_reader: cannot write into %s\n", seeds_dir.c_str());
        return 1;
      }
  for (size_t i = 0; i < seeds.size(); ++i) {  // the unmutated engines load, run and refit cleanly; bundles run
    try {
      fuzz::Rng r{i};
      if (i < engines) fuzz::exercise(Engine::deserialize(seeds[i].data(), seeds[i].size()), r);
      else fuzz::exercise(Bundle::deserialize(seeds[i].data(), seeds[i].size()), r);
    } catch (const Error& e) {
      std::fprintf(stderr, "fuzz_engine_reader: seed %s %zu fails: %s\n", i < engines ? "engine" : "bundle", i,
                   e.what());
      return 1;
    }
  }
  fuzz::Rng rng{seed};
  uint64_t loaded = 0;
  for (uint64_t it = 0; it < iterations; ++it) {
    Bytes file = seeds[size_t(rng.below(seeds.size()))];
    fuzz::mutate(file, seeds, rng);
    if (!keep.empty()) write_file(keep, 0, file);
    try {
      loaded += fuzz::run_any(file);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fuzz_engine_reader: iteration %llu (seed %llu) threw a non-Kiln exception: %s\n",
                   static_cast<unsigned long long>(it), static_cast<unsigned long long>(seed), e.what());
      if (!keep.empty())
        std::fprintf(stderr, "  the input is in %s (replay: fuzz_engine_reader %s)\n", keep.c_str(), keep.c_str());
      return 1;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz_engine_reader: %llu mutations of %zu engines and bundles from seed %llu, %llu loaded, %.1f s: ok\n",
              static_cast<unsigned long long>(iterations), seeds.size(), static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(loaded), s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--mutate") == 0) {
    if (argc < 4 || (argc - 4) % 2 != 0) {
      std::fprintf(stderr, "usage: fuzz_engine_reader --mutate SEED ITERATIONS [--keep FILE] [--write-seeds DIR]\n");
      return 2;
    }
    std::string keep, seeds_dir;
    for (int i = 4; i + 1 < argc; i += 2) {
      if (std::strcmp(argv[i], "--keep") == 0) keep = argv[i + 1];
      else if (std::strcmp(argv[i], "--write-seeds") == 0) seeds_dir = argv[i + 1];
      else {
        std::fprintf(stderr, "fuzz_engine_reader: unknown option %s\n", argv[i]);
        return 2;
      }
    }
    return mutate_loop(parse_u64(argv[2], "SEED"), parse_u64(argv[3], "ITERATIONS"), keep, seeds_dir);
  }
  return replay(argc, argv);
}
#endif
