#!/usr/bin/env bash
# Runs every Kiln test: installs (scripts/install.sh), builds the C++ test suite and runs it
# through CTest, then runs the Python tests with pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh

JOBS=${KILN_JOBS:-$(nproc)}
cmake -S . -B build/tests -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_PYTHON=OFF >/dev/null
cmake --build build/tests -j "$JOBS"
(cd build/tests && ctest --output-on-failure -j "$JOBS")

# The installed package is what the Python tests import (run from outside the source tree).
export KILN_BUILD_DIR="$PWD/build/tests"
(cd tests/python && ${PYTHON:-python3} -m pytest -q -p no:cacheprovider .)
