"""Where a forward's latency goes beyond its kernels: host time, launch delay and gaps.

    python3 benchmarks/gpu_latency.py --model vit_b_16 --batch 1 [--dtype fp16] [--backends kiln,ro]

The model is one of gpu_models.py's or any model of the zoo (zoo_models.py).

`gpu_models.py` times one synchronized forward at a time, so its number is the host time until
the device work is issued plus the device time from there on. This script splits that number,
per backend (Kiln and inductor reduce-overhead both replay CUDA graphs here), into:

  latency_ms   gpu_models.py's measure: CUDA events around one call, synchronized, median
  host_ms      host time of one call (perf_counter around it, the device idle before), median
  pipelined_ms time per call when calls are issued back to back (the larger of host and device)
  span_ms      device time from the first kernel of a forward to the end of its last, median
               (torch.profiler, graph kernels included)
  busy_ms      the time inside that span in which some kernel runs
  gaps_ms      span - busy: idle time between the kernels of one forward
  kernels      kernels per forward

A large span - busy says the device waits between kernels (dependencies, launch latency inside
the graph); a large latency - span says the host or the work around the graph (input copies,
guards) is on the critical path.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from gpu_models import (DTYPES, compile_for, host_ms, median_ms, model_on_gpu,  # type: ignore[import-not-found]
                        pipelined_ms)

log = logging.getLogger("kiln.bench.gpu_latency")


def device_spans(fn: Callable[[], Any], iters: int) -> tuple[float, float, int]:
    """Median span and busy time (ms) of one forward's kernels, and kernels per forward."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
            torch.cuda.synchronize()
            time.sleep(0.003)  # a gap that separates the forwards in the trace
    events = sorted(((e.time_range.start, e.time_range.end) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda t: t[0])
    groups: list[list[tuple[float, float]]] = []
    for ev in events:
        if not groups or ev[0] - max(e for _, e in groups[-1]) > 1000:
            groups.append([])
        groups[-1].append(ev)
    spans, busies, counts = [], [], []
    for g in groups:
        span = max(e for _, e in g) - g[0][0]
        busy, cur_s, cur_e = 0.0, g[0][0], g[0][1]
        for s, e in g[1:]:
            if s > cur_e:
                busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += cur_e - cur_s
        spans.append(span / 1e3)
        busies.append(busy / 1e3)
        counts.append(len(g))
    return statistics.median(spans), statistics.median(busies), int(statistics.median(counts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_b_16")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", default="fp16", choices=sorted(DTYPES))
    parser.add_argument("--backends", default="kiln,ro")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    dtype = DTYPES[args.dtype]
    model, inputs = model_on_gpu(args.model, args.batch, dtype)
    log.info("%-24s %-6s %10s %8s %12s %8s %8s %8s %7s", "model", "backend", "latency_ms", "host_ms",
             "pipelined_ms", "span_ms", "busy_ms", "gaps_ms", "kernels")
    for backend in args.backends.split(","):
        torch._dynamo.reset()
        fn = compile_for(backend, model, dtype, inputs)
        with torch.no_grad():
            call = lambda: fn(*inputs)  # noqa: E731
            lat, _ = median_ms(call, args.runs)
            host = host_ms(call, args.runs)
            pipe = pipelined_ms(call, args.runs)
            span, busy, kernels = device_spans(call, 10)
        log.info("%-24s %-6s %10.3f %8.3f %12.3f %8.3f %8.3f %8.3f %7d", f"{args.model} b{args.batch} {args.dtype}",
                 backend, lat, host, pipe, span, busy, span - busy, kernels)


if __name__ == "__main__":
    main()
