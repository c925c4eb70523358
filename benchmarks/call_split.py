"""Where the host time of one torch.compile(backend="kiln") call goes, around the engine launch.

    python3 benchmarks/call_split.py --models deberta_v3,efficientnet_v2_s [--batch 1] [--dtype fp16]
    python3 benchmarks/call_split.py --device cpu --small --models bert --dtype fp32

A synchronized call's latency is the host's time until the launch plus the device's time after it,
so the host work before the launch is the part a backend adds to batch-1 latency. Per model of the
zoo (zoo_models.py, random weights) the script compiles one Dynamo graph with Kiln, then times calls
with the device idle before each (median of ``--calls``, microseconds) and splits each call at the
compiled graph's run (KilnDynamoGraph's specialization, which launches the engines):

  before    Dynamo's guard checks and frame, then Kiln's test of the call's first constant
  run       the compiled graph's run: the engine module (input checks, outputs) and the launch
  after     Kiln's checks after the launch (every constant's identity, the weight watch) and
            Dynamo's return; on a graph that does not run again alike (kiln.pipeline.runs_again_alike)
            the checks are in ``before`` instead
  watch     the weight watch (WeightWatch.changed) alone, and the tensors it watches

On a CPU the run computes the model: only ``before``, ``after`` and ``watch`` mean the same there.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import zoo_models  # type: ignore[import-not-found]
from gpu_models import DTYPES  # type: ignore[import-not-found]

from kiln.dynamo import KilnDynamoGraph
from kiln.pipeline import LIVE_GRAPHS

log = logging.getLogger("kiln.bench.call_split")

def median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def split(name: str, batch: int, dtype: torch.dtype, device: str, small: bool, calls: int) -> dict[str, Any]:
    """One model's split (see the module docstring)."""
    torch._dynamo.reset()
    model, inputs = zoo_models.MODELS[name].create_randomized(batch, small=small)
    model = model.to(device).to(dtype)
    inputs = [x.to(device).to(dtype) if x.is_floating_point() else x.to(device) for x in inputs]
    known = set(LIVE_GRAPHS)
    fn = torch.compile(model, backend="kiln", options={"enabled_precisions": {dtype}, "min_block_size": 1})
    sync: Callable[[], None] = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    with torch.no_grad():
        fn(*inputs)
        graphs = [g for g in LIVE_GRAPHS if g not in known and isinstance(g, KilnDynamoGraph) and g._last is not None]
        if len(graphs) != 1:
            raise RuntimeError(f"{name}: Dynamo gave Kiln {len(graphs)} static graphs; the split needs exactly one")
        graph = graphs[0]
        last = graph._last
        stamps: list[float] = []

        def stamped(*args: Any) -> Any:
            stamps.append(time.perf_counter())
            out = last.run(*args)
            stamps.append(time.perf_counter())
            return out

        graph._last = last._replace(run=stamped)
        segments: list[list[float]] = [[], [], []]
        try:
            for i in range(calls + 10):
                stamps.clear()
                sync()
                start = time.perf_counter()
                fn(*inputs)
                end = time.perf_counter()
                if i >= 10:
                    segments[0].append(stamps[0] - start)
                    segments[1].append(stamps[1] - stamps[0])
                    segments[2].append(end - stamps[1])
        finally:
            graph._last = last
        watch = last.watch
        watch_us = 0.0
        if watch is not None:
            times = []
            for _ in range(calls):
                t = time.perf_counter()
                watch.changed()
                times.append(time.perf_counter() - t)
            watch_us = median_us(times)
    return {"model": name, "batch": batch, "before": median_us(segments[0]), "run": median_us(segments[1]),
            "after": median_us(segments[2]), "watch": watch_us, "watched": len(watch.tensors) if watch else 0,
            "constants": len(graph.constant_idx), "checks_after_launch": last.checks_after_launch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="deberta_v3,efficientnet_v2_s,resnet50")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", default="fp16", choices=sorted(DTYPES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="the zoo's reduced configs (as the CPU tests run)")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("kiln").setLevel(logging.WARNING)  # the compile's own lines
    log.setLevel(logging.INFO)
    log.info("| model | batch | before us | run us | after us | watch us (tensors) | constants | checks after launch |")
    log.info("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        r = split(name, args.batch, DTYPES[args.dtype], args.device, args.small, args.calls)
        log.info("| %s | %d | %.1f | %.1f | %.1f | %.1f (%d) | %d | %s |", r["model"], r["batch"], r["before"],
                 r["run"], r["after"], r["watch"], r["watched"], r["constants"],
                 "yes" if r["checks_after_launch"] else "no")


if __name__ == "__main__":
    main()
