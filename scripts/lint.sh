#!/usr/bin/env bash
# Lint checks CI runs (scripts/test.sh): ruff and mypy on the Python front end (settings in
# pyproject.toml), byte-compilation of it by the oldest Python that pyproject.toml claims when one
# is installed, and clang-format (.clang-format) on the C++ lines changed since a base commit, so
# that old code is not reformatted wholesale. Exits non-zero on any finding.
#   KILN_LINT_BASE=<commit>  compare against it instead of the base found below.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
status=0
fail() { echo "kiln lint: $*" >&2; status=1; }

"$PY" -m ruff check --quiet python/kiln tests/python || fail "ruff found problems (above)"
"$PY" -m mypy --cache-dir=/dev/null || fail "mypy found problems (above)"

# Syntax and stdlib names newer than requires-python are caught by ruff's target-version and
# mypy's python_version; where that Python itself is installed, it compiles every file as well.
oldest=$(sed -n 's/^requires-python = ">=\([0-9]*\.[0-9]*\)".*/\1/p' pyproject.toml)
old_py=""
for c in "python$oldest" "${PYENV_ROOT:-$HOME/.pyenv}/versions/$oldest".*/bin/python; do
  if "$c" -c 'import sys; sys.exit(sys.version_info[:2] != tuple(map(int, sys.argv[1].split("."))))' "$oldest" \
      >/dev/null 2>&1; then old_py=$c; break; fi
done
if [ -n "$old_py" ]; then
  # Compiled in memory (nothing written): a syntax error raises.
  "$old_py" - python/kiln tests/python <<'EOF' || fail "python$oldest cannot compile the code (above)"
import pathlib, sys
for root in sys.argv[1:]:
    for f in sorted(pathlib.Path(root).rglob("*.py")):
        compile(f.read_text(), str(f), "exec", dont_inherit=True)
EOF
else
  echo "kiln lint: no python$oldest here; its compile check is skipped"
fi

# The base commit: KILN_LINT_BASE, else the merge-base with origin/main, else HEAD~1 (a fresh CI
# clone of main, or a branch without a remote). On main itself the merge-base is HEAD: HEAD~1 then.
base=${KILN_LINT_BASE:-}
if [ -z "$base" ] && git rev-parse -q --verify origin/main >/dev/null; then
  base=$(git merge-base HEAD origin/main)
  [ "$base" = "$(git rev-parse HEAD)" ] && base=""
fi
if [ -z "$base" ] && git rev-parse -q --verify HEAD~1 >/dev/null; then base=HEAD~1; fi
CF=${CLANG_FORMAT:-clang-format}
if [ -z "$base" ]; then
  echo "kiln lint: no base commit; clang-format check skipped"
elif ! command -v "$CF" >/dev/null || ! command -v git-clang-format >/dev/null; then
  fail "clang-format and git-clang-format are needed (pip install clang-format, scripts/install.sh)"
else
  # Changed lines of the commits since base and of uncommitted work, formatted in memory.
  out=$(git clang-format --binary "$(command -v "$CF")" --diff --extensions c,h,cc,cpp,hpp,cu,cuh \
        "$base" -- src include tests/cpp tools benchmarks examples 2>&1) || true
  case "$out" in
    "" | "no modified files to format" | *"did not modify any files"*) ;;
    *) echo "$out"; fail "clang-format would change the lines above (since $base; run: git clang-format $base)" ;;
  esac
fi

[ "$status" -eq 0 ] && echo "kiln lint: ok"
exit "$status"
