"""Kiln on CPU vs eager PyTorch on CPU for the four reference architectures.

    python3 benchmarks/cpu_models.py [--runs 20] [--models resnet18,vit]

Each model is built from a config with random weights (nothing is downloaded) and run at
batch 1 on small inputs (the sizes the end-to-end tests use; --image-size changes the CNNs').
For each model the script prints the dry-run coverage (ops inside engines), then compiles it
with ``torch.compile(backend="kiln")`` and reports the median latency of eager and Kiln, their
ratio, and the largest absolute difference between the two outputs.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torchvision

import kiln  # noqa: F401  (registers the backend)
from kiln.testing import first_output, randomize_weights

log = logging.getLogger("kiln.bench.cpu_models")


def build(name: str, image_size: int) -> tuple[torch.nn.Module, list[Any]]:
    if name == "resnet18":
        return torchvision.models.resnet18(num_classes=10), [torch.randn(1, 3, image_size, image_size)]
    if name == "mobilenet_v3_small":
        return torchvision.models.mobilenet_v3_small(num_classes=10), [torch.randn(1, 3, image_size, image_size)]
    if name == "vit":
        model = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4,
                                                     hidden_dim=64, mlp_dim=128, num_classes=10)
        return model, [torch.randn(1, 3, 32, 32)]
    if name == "bert":
        import transformers
        config = transformers.BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=128, max_position_embeddings=64)
        ids = torch.randint(0, 512, (1, 16), generator=torch.Generator().manual_seed(1))
        return transformers.BertModel(config), [ids, torch.ones(1, 16, dtype=torch.int64)]
    raise ValueError(f"unknown model {name!r}")


def median_ms(fn: Callable[[], Any], runs: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def dry_run_coverage(model: torch.nn.Module, inputs: list[Any]) -> list[str]:
    """The coverage lines of the dry-run report of every graph Dynamo hands over."""
    handler = _Collect()
    logger = logging.getLogger("kiln.dryrun")
    logger.addHandler(handler)
    old, propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        torch._dynamo.reset()
        torch.compile(model, backend="kiln", options={"dryrun": True}, dynamic=False)(*inputs)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
        logger.propagate = propagate
    lines = []
    for text in handler.messages:
        head = text.splitlines()
        lines.append("; ".join(line.strip() for line in head if line.strip().startswith(("total ops", "coverage"))))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v3_small,vit,bert")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0,
                        help="threads for both PyTorch and Kiln (0: each library's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["KILN_NUM_THREADS"] = str(args.threads)  # read when Kiln's pool starts
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    rows = []
    with torch.no_grad():
        for name in args.models.split(","):
            torch.manual_seed(0)
            model, inputs = build(name, args.image_size)
            model = randomize_weights(model).eval()
            for line in dry_run_coverage(model, inputs):
                log.info("%-20s dry run: %s", name, line)
            torch._dynamo.reset()
            t0 = time.perf_counter()
            fast = torch.compile(model, backend="kiln", dynamic=False)
            out = first_output(fast(*inputs))
            compile_s = time.perf_counter() - t0
            ref = first_output(model(*inputs))
            err = (out - ref).abs().max().item()
            eager = median_ms(lambda: model(*inputs), args.runs)
            kiln_ms = median_ms(lambda: fast(*inputs), args.runs)
            rows.append((name, eager, kiln_ms, compile_s, err))
    log.info("")
    log.info("threads: torch %d, kiln %s", torch.get_num_threads(), os.environ.get("KILN_NUM_THREADS", "default"))
    log.info("%-20s %10s %10s %8s %10s %10s", "model (CPU, batch 1)", "eager ms", "kiln ms", "speedup",
             "compile s", "max |diff|")
    for name, eager, kiln_ms, compile_s, err in rows:
        log.info("%-20s %10.3f %10.3f %7.2fx %10.1f %10.2e", name, eager, kiln_ms, eager / kiln_ms, compile_s, err)


if __name__ == "__main__":
    main()
