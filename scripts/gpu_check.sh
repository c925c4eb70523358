#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: installs Kiln the way a user does (the README's GPU command),
# then runs checks, tests or benchmarks against the installed package from a folder outside the
# source tree. Results and logs go to $OUT (default /tmp/kiln-gpu).
#
#   bash scripts/gpu_check.sh                 # install + smoke test + the CUDA pytest suite
#   bash scripts/gpu_check.sh smoke [ARGS]    # install + python -m kiln.check ARGS
#   bash scripts/gpu_check.sh wheel           # pip wheel, installed into a fresh venv, smoke test there
#   bash scripts/gpu_check.sh tests PYTEST_ARGS...
#   bash scripts/gpu_check.sh bench [ARGS]    # install + benchmarks/gpu_models.py ARGS
#   bash scripts/gpu_check.sh profile MODEL:BATCH[:DTYPE[:BACKEND]]...   # kernels by time, per model
#   bash scripts/gpu_check.sh py SCRIPT.py [ARGS]   # install + any python script (output in $OUT/py.log)
#   bash scripts/gpu_check.sh ctest [CTEST_ARGS]    # the C++ suite with its CUDA cases (CMake, no pip)
#
# The C++ suite needs GoogleTest: an installed one, or its source tree in KILN_GTEST_SOURCE (e.g.
# Debian's /usr/src/googletest, copied to a machine that has none), built once into build/gtest.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
OUT=${OUT:-/tmp/kiln-gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
RUN=$(mktemp -d)  # every check runs here, so that only the installed package can be imported
mode=${1:-all}
[ $# -gt 0 ] && shift
t0=$(date +%s)

# install PYTHON: the README's command, then a check that PYTHON imports the installed copy.
install() {
  "$1" -m pip install --no-build-isolation . >"$OUT/install.log" 2>&1 || { tail -40 "$OUT/install.log"; exit 1; }
  echo "install: $(( $(date +%s) - t0 )) s"
  (cd "$RUN" && "$1" -c "
import kiln, sys
where = kiln.__file__
assert not where.startswith('$SRC/'), f'kiln imported from the source tree: {where}'
print('kiln', kiln.__version__, 'from', where, '| cuda', kiln.cuda_available())")
}

smoke() {  # PYTHON ARGS...: python -m kiln.check, the README's check
  local py=$1; shift
  (cd "$RUN" && "$py" -m kiln.check "$@" 2>&1 | tee -a "$OUT/smoke.log")
}

case "$mode" in
  all)
    install "$PY"; smoke "$PY"
    (cd tests/python && "$PY" -m pytest -q -p no:cacheprovider -m cuda . 2>&1 | tee "$OUT/pytest.log" | tail -40) ;;
  smoke)
    install "$PY"; smoke "$PY" "$@" ;;
  wheel)
    rm -rf "$RUN/dist" "$RUN/venv"
    "$PY" -m pip wheel --no-build-isolation --no-deps . -w "$RUN/dist" >"$OUT/wheel.log" 2>&1 \
      || { tail -40 "$OUT/wheel.log"; exit 1; }
    echo "wheel: $(ls "$RUN"/dist) ($(( $(date +%s) - t0 )) s)"
    # A fresh venv that sees this interpreter's packages (torch, ...) after its own, through a .pth.
    "$PY" -m venv "$RUN/venv"
    site=$("$RUN/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    "$PY" -c "import site; print('\n'.join(site.getsitepackages()))" >"$site/base_env.pth"
    "$RUN/venv/bin/python" -m pip install -q --no-index --no-deps --ignore-installed "$RUN"/dist/kiln-*.whl
    (cd "$RUN" && "$RUN/venv/bin/python" -c "
import kiln
assert kiln.__file__.startswith('$RUN/venv/'), f'kiln imported from outside the new venv: {kiln.__file__}'
print('kiln from', kiln.__file__)")
    smoke "$RUN/venv/bin/python" "$@" ;;
  tests)
    install "$PY"
    (cd tests/python && "$PY" -m pytest -q -p no:cacheprovider -m cuda "$@" . 2>&1 | tee "$OUT/pytest.log" | tail -40) ;;
  bench)
    install "$PY"
    (cd "$RUN" && "$PY" "$SRC/benchmarks/gpu_models.py" --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | tail -60) ;;
  profile)
    install "$PY"
    for spec in "$@"; do
      IFS=: read -r model batch dtype backend <<<"$spec"
      echo "== $model b$batch ${dtype:-fp16} ${backend:-kiln}" >>"$OUT/build_logs.txt"
      (cd "$RUN" && "$PY" "$SRC/benchmarks/gpu_profile.py" --model "$model" --batch "$batch" --dtype "${dtype:-fp16}" \
        --backend "${backend:-kiln}" --build-log "$OUT/build_logs.txt" 2>&1 | grep -v Warning | tee -a "$OUT/profiles.txt")
    done ;;
  py)
    [ $# -gt 0 ] || { echo "py needs a script: bash scripts/gpu_check.sh py SCRIPT.py [ARGS]"; exit 2; }
    install "$PY"
    script=$(realpath "$1"); shift
    (cd "$RUN" && "$PY" "$script" "$@" 2>&1 | tee "$OUT/py.log") ;;
  ctest)
    B=build/gpu
    flags=(-DKILN_BUILD_TESTS=ON -DKILN_BUILD_PYTHON=OFF)
    if [ -n "${KILN_GTEST_SOURCE:-}" ]; then
      G=build/gtest
      if [ ! -f "$G/install/lib/cmake/GTest/GTestConfig.cmake" ]; then
        { cmake -S "$KILN_GTEST_SOURCE" -B "$G" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF \
            -DCMAKE_INSTALL_PREFIX="$PWD/$G/install" && cmake --build "$G" -j "$(nproc)" && cmake --install "$G"; } \
          >"$OUT/gtest.log" 2>&1 || { tail -40 "$OUT/gtest.log"; exit 1; }
      fi
      flags+=(-DGTest_DIR="$PWD/$G/install/lib/cmake/GTest")
    fi
    cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON "${flags[@]}" \
      -DPython_EXECUTABLE="$(command -v "$PY")" >"$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
    cmake --build "$B" -j "$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -60; exit 1; }
    ctest --test-dir "$B" -j "$(nproc)" --output-on-failure "$@" 2>&1 | tee "$OUT/ctest.log" | tail -40 ;;
  *)
    echo "unknown mode '$mode' (all | smoke | wheel | tests | bench | profile | py | ctest)"; exit 2 ;;
esac
