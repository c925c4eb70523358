#!/usr/bin/env bash
# Runs benchmarks/zoo.py on every GPU of the machine at once, then joins the results.
#
#   bash scripts/zoo_gpus.sh OUT [zoo.py ARGS...]
#
# Shard i of N (models i, i+N, ... of the selection: zoo.py --shard) runs on GPU i with its own
# N-th of the CPU cores, so that one shard's compiles do not slow another's timed calls. Each
# shard starts from the stored reduce-overhead rows (benchmarks/zoo_baseline) and writes its rows
# to OUT/shardI; then zoo.py --merge joins them into OUT/zoo.json and OUT/zoo.md, and the
# reduce-overhead rows into OUT/zoo_baseline (copy that file into benchmarks/zoo_baseline/).
# KILN_ZOO_GPUS sets N (default: every GPU nvidia-smi lists). ARGS go to every shard, e.g.
# --baseline measure --time-budget 420 --resume-from OUT_OF_AN_EARLIER_RUN/zoo.json.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bash scripts/zoo_gpus.sh OUT [zoo.py ARGS...]"; exit 2; }
out=$(mkdir -p "$1" && cd "$1" && pwd)
shift
src=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
n=${KILN_ZOO_GPUS:-$(nvidia-smi -L | wc -l)}
[ "$n" -ge 1 ] || { echo "zoo_gpus.sh: no GPU found"; exit 1; }
per=$(( $(nproc) / n ))
mkdir -p "$out/zoo_baseline"
cp "$src"/benchmarks/zoo_baseline/*.json "$out/zoo_baseline/" 2>/dev/null || true
pids=()
for i in $(seq 0 $((n - 1))); do
  mkdir -p "$out/shard$i/baseline"
  cp "$out"/zoo_baseline/*.json "$out/shard$i/baseline/" 2>/dev/null || true
  CUDA_VISIBLE_DEVICES=$i taskset -c $((i * per))-$((i * per + per - 1)) \
    "$py" "$src/benchmarks/zoo.py" --shard "$i/$n" --out "$out/shard$i" --baseline-dir "$out/shard$i/baseline" \
    "$@" >"$out/shard$i.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
folders=$(for i in $(seq 0 $((n - 1))); do [ -f "$out/shard$i/zoo.json" ] && printf '%s,' "$out/shard$i"; done)
[ -n "$folders" ] || { echo "zoo_gpus.sh: no shard wrote results"; tail -5 "$out"/shard*.log; exit 1; }
"$py" "$src/benchmarks/zoo.py" --merge "${folders%,}" --out "$out" --baseline-dir "$out/zoo_baseline" >"$out/merge.log" 2>&1
exit $status
