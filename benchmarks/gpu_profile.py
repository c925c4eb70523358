"""Where a Kiln engine's GPU time goes: the kernels of one forward, by total time.

    python3 benchmarks/gpu_profile.py --model resnet50 --batch 32 --dtype fp16 [--top 25] [--backend kiln|ro]

Builds the model as benchmarks/gpu_models.py does, or a model of the zoo as benchmarks/zoo.py
does (random weights), compiles it with Kiln
(`use_cuda_graphs=False`, so every kernel launch is visible to the profiler) or with inductor,
runs a few forwards under torch.profiler and prints, per kernel name, its calls and device
microseconds per forward, largest first, with the sum against the forward's CUDA-event time.
"""

from __future__ import annotations

import argparse
import collections
import logging

import torch

from gpu_models import DTYPES, median_ms, model_on_gpu  # type: ignore[import-not-found]

log = logging.getLogger("kiln.bench.gpu_profile")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dtype", default="fp16", choices=sorted(DTYPES))
    parser.add_argument("--backend", default="kiln", choices=["kiln", "ro", "inductor"])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--build-log", help="append Kiln's build logs (passes, kernel per node) to this file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.build_log:
        handler = logging.FileHandler(args.build_log)  # appends
        handler.setLevel(logging.DEBUG)
        logging.getLogger("kiln.compile").addHandler(handler)
        logging.getLogger("kiln.compile").setLevel(logging.DEBUG)
    dtype = DTYPES[args.dtype]
    model, inputs = model_on_gpu(args.model, args.batch, dtype)
    if args.backend == "kiln":
        fn = torch.compile(model, backend="kiln", options={"enabled_precisions": {dtype}, "min_block_size": 1,
                                                           "use_cuda_graphs": False})
    else:
        fn = torch.compile(model, mode="reduce-overhead" if args.backend == "ro" else "default")
    with torch.no_grad():
        ms, _ = median_ms(lambda: fn(*inputs), 30)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                fn(*inputs)
            torch.cuda.synchronize()
    per_kernel: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            k = per_kernel[ev.name[:110]]
            k[0] += 1
            k[1] += ev.device_time
    rows = sorted(per_kernel.items(), key=lambda kv: -kv[1][1])
    total = sum(v[1] for _, v in rows) / args.iters
    log.info("%s b%d %s %s: %.3f ms per forward (events, no graphs for kiln); kernels sum %.3f ms, %d kernels",
             args.model, args.batch, args.dtype, args.backend, ms, total / 1e3,
             sum(v[0] for _, v in rows) // args.iters)
    for name, (calls, us) in rows[:args.top]:
        log.info("%8.1f us %5.1f%% %4d x  %s", us / args.iters, 100 * us / args.iters / total, calls // args.iters, name)


if __name__ == "__main__":
    main()
