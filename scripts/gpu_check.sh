#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds Kiln with the CUDA backend, runs the CUDA tests, and
# optionally the GPU benchmark, in one go. Results and logs go to $OUT (default /tmp/kiln-gpu).
#
#   bash scripts/gpu_check.sh                 # build + CUDA op tests + CUDA model tests
#   bash scripts/gpu_check.sh bench [ARGS]    # build + benchmarks/gpu_models.py ARGS
#   bash scripts/gpu_check.sh tests PYTEST_ARGS...
#   bash scripts/gpu_check.sh profile MODEL:BATCH[:DTYPE[:BACKEND]]...   # kernels by time, per model
#   bash scripts/gpu_check.sh py SCRIPT.py [ARGS]   # build + any python script (output in $OUT/py.log)
#   bash scripts/gpu_check.sh ctest [CTEST_ARGS]    # build with the C++ suite + run it (CUDA cases too)
#
# The C++ suite needs GoogleTest: an installed one, or its source tree in KILN_GTEST_SOURCE (e.g.
# Debian's /usr/src/googletest, copied to a machine that has none), built once into build/gtest.
#
# The package is used from the build folder (PYTHONPATH), not pip-installed.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-gpu}
mkdir -p "$OUT"
B=build/gpu
PY=${PYTHON:-python3}
# The system compiler, whose libstdc++ is the one PyTorch's process already has loaded.
export CXX=${KILN_CXX:-/usr/bin/g++}
t0=$(date +%s)
mode=${1:-tests}
[ $# -gt 0 ] && shift
test_flags=(-DKILN_BUILD_TESTS=OFF)
if [ "$mode" = ctest ]; then
  test_flags=(-DKILN_BUILD_TESTS=ON)
  if [ -n "${KILN_GTEST_SOURCE:-}" ]; then
    G=build/gtest
    if [ ! -f "$G/install/lib/cmake/GTest/GTestConfig.cmake" ]; then
      { cmake -S "$KILN_GTEST_SOURCE" -B "$G" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
          -DCMAKE_INSTALL_PREFIX="$PWD/$G/install" && cmake --build "$G" -j "$(nproc)" && cmake --install "$G"; } \
        >"$OUT/gtest.log" 2>&1 || { tail -40 "$OUT/gtest.log"; exit 1; }
    fi
    test_flags+=(-DGTest_DIR="$PWD/$G/install/lib/cmake/GTest")
  fi
fi
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON "${test_flags[@]}" \
  -DPython_EXECUTABLE="$(command -v "$PY")" >"$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
cmake --build "$B" -j "$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
mkdir -p "$B/pyroot/kiln"
for f in python/kiln/*; do ln -sf "$PWD/$f" "$B/pyroot/kiln/"; done
ln -sf "$PWD/$B"/_C*.so "$B/pyroot/kiln/"
export PYTHONPATH="$PWD/$B/pyroot" KILN_BUILD_DIR="$PWD/$B"
"$PY" -c "import kiln; print('kiln', kiln.__version__, 'cuda', kiln._C.cuda_available())"

case "$mode" in
  tests)
    (cd tests/python && "$PY" -m pytest -q -p no:cacheprovider -x -m cuda "$@" . 2>&1 | tee "$OUT/pytest.log" | tail -40) ;;
  bench)
    "$PY" benchmarks/gpu_models.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | tail -60 ;;
  profile)
    for spec in "$@"; do
      IFS=: read -r model batch dtype backend <<<"$spec"
      tag="$model b$batch ${dtype:-fp16} ${backend:-kiln}"
      echo "== $tag" >>"$OUT/build_logs.txt"
      "$PY" benchmarks/gpu_profile.py --model "$model" --batch "$batch" --dtype "${dtype:-fp16}" \
        --backend "${backend:-kiln}" --build-log "$OUT/build_logs.txt" 2>&1 | grep -v Warning | tee -a "$OUT/profiles.txt"
    done ;;
  ctest)
    ctest --test-dir "$B" -j "$(nproc)" --output-on-failure "$@" 2>&1 | tee "$OUT/ctest.log" | tail -40 ;;
  py)
    [ $# -gt 0 ] || { echo "py needs a script: bash scripts/gpu_check.sh py SCRIPT.py [ARGS]"; exit 2; }
    "$PY" "$@" 2>&1 | tee "$OUT/py.log" ;;
  *)
    echo "unknown mode '$mode' (tests | bench | profile | py | ctest)"; exit 2 ;;
esac
