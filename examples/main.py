"""Compile a real model with Kiln and report speed and accuracy against eager PyTorch.

    python3 examples/main.py [--model resnet18] [--batch 1] [--size 224] [--device cpu|cuda]

The model is a torchvision architecture with random weights (nothing is downloaded). The
script compiles it with ``torch.compile(model, backend="kiln")``, checks the output against
eager, and prints the median latency of both and the relative error.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import torch
import torchvision

import kiln  # noqa: F401  (registers the backend; torch also finds it through its entry point)
from kiln.testing import randomize_weights, relative_error

log = logging.getLogger("kiln.example")


def median_ms(fn, x: torch.Tensor, runs: int, device: str) -> float:
    for _ in range(3):
        fn(x)
    times = []
    for _ in range(runs):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(x)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18", help="a torchvision.models constructor name")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    model = getattr(torchvision.models, args.model)().eval().to(args.device)
    randomize_weights(model)
    x = torch.randn(args.batch, 3, args.size, args.size, device=args.device)

    with torch.no_grad():
        ref = model(x)
        t0 = time.perf_counter()
        fast = torch.compile(model, backend="kiln", options={"min_block_size": 1})
        out = fast(x)
        compile_s = time.perf_counter() - t0
        err = relative_error(out, ref)
        eager_ms = median_ms(model, x, args.runs, args.device)
        kiln_ms = median_ms(fast, x, args.runs, args.device)

    log.info("model %s, batch %d, %dx%d, device %s", args.model, args.batch, args.size, args.size, args.device)
    log.info("compile (first call): %.2f s", compile_s)
    log.info("eager: %.3f ms   kiln: %.3f ms   speedup %.2fx", eager_ms, kiln_ms, eager_ms / kiln_ms)
    log.info("relative error vs eager: %.2e (%s)", err, "OK" if err < 1e-4 else "HIGH")


if __name__ == "__main__":
    main()
