#!/usr/bin/env bash
# Runs every Kiln test: installs (scripts/install.sh), builds the C++ test suite and runs it
# through CTest, then runs the Python tests with pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/lint.sh

JOBS=${KILN_JOBS:-$(nproc)}
cmake -S . -B build/tests -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_PYTHON=OFF >/dev/null
cmake --build build/tests -j "$JOBS"
(cd build/tests && ctest --output-on-failure -j "$JOBS")

# The engine file fuzzer under AddressSanitizer and UBSan, in a folder of its own: mutated engine
# files from a fixed seed through load, execute, refit and serialize (tools/fuzz_engine_reader.cpp).
# Only the core library and the driver are built, at -O1 to keep the build short.
cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1" \
  -DKILN_SANITIZE=address,undefined -DKILN_BUILD_FUZZ=ON -DKILN_FUZZ_LIBFUZZER=OFF -DKILN_BUILD_TESTS=OFF \
  -DKILN_BUILD_PYTHON=OFF -DKILN_BUILD_TOOLS=OFF -DKILN_CUDA=OFF >/dev/null
cmake --build build/asan -j "$JOBS" --target fuzz_engine_reader
ASAN_OPTIONS=allocator_may_return_null=1 build/asan/fuzz_engine_reader --mutate 1 "${KILN_FUZZ_ITERATIONS:-20000}" \
  --keep build/asan/fuzz_last_input.bin

# Deployment without Python: examples/cpp builds against the C++ package the install put in the
# Python package (find_package(Kiln)) and runs a bundle that Python wrote, checked against eager.
cmake -S examples/cpp -B build/example -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$(${PYTHON:-python3} -m kiln.cmake_prefix)" >/dev/null
cmake --build build/example -j "$JOBS"
${PYTHON:-python3} examples/cpp/check_bundle.py build/example/run_bundle

# The installed package is what the Python tests import (run from outside the source tree).
export KILN_BUILD_DIR="$PWD/build/tests"
(cd tests/python && ${PYTHON:-python3} -m pytest -q -p no:cacheprovider .)
