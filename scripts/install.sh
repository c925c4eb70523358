#!/usr/bin/env bash
# Installs everything Kiln needs on a fresh Debian/Ubuntu machine with Python 3.10+, then
# builds and installs the `kiln` package (C++ core + kiln._C + kiln-run) into the current
# Python environment. Safe to run again: finished steps are quick no-ops.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
SUDO=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo"

need_apt=()
[ -f /usr/lib/x86_64-linux-gnu/cmake/GTest/GTestConfig.cmake ] || [ -f /usr/lib/aarch64-linux-gnu/cmake/GTest/GTestConfig.cmake ] \
  || [ -f /usr/local/lib/cmake/GTest/GTestConfig.cmake ] || need_apt+=(libgtest-dev libgmock-dev)
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v ccache >/dev/null || need_apt+=(ccache)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "kiln install: apt packages: ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# PyTorch is pinned to the release this machine image carries (nothing large is downloaded).
"$PY" -m pip install -q --disable-pip-version-check \
  "torch==2.14.1" "torchvision==0.29.1" "transformers==5.23.0" \
  "nanobind==3.1.0" "scikit-build-core==1.1.2" numpy pytest \
  "ruff==0.17.5" "mypy==2.4.1" "clang-format==23.1.5"
"$PY" -m pip install -q --disable-pip-version-check --no-build-isolation .
echo "kiln install: done ($("$PY" -c 'import kiln, torch; print("kiln", kiln.__version__, "torch", torch.__version__)'))"
