"""Per-call cost of the weight check: how a compiled model notices weights changed in place.

    python3 benchmarks/weight_check.py [--models resnet50,bert] [--device cpu|cuda] [--iters 20000]

Every call of a model from kiln.compile (and of each Dynamo graph from torch.compile) asks its
WeightWatch whether any weight changed since the engines took it: one pass summing the weights'
version counters (kiln/refit.py), after the launch for a graph that runs again alike, before it
for any other (docs/safety.md). Per model (torchvision resnet50, transformers
BERT-base from its config, random weights, batch 1; FP16 on a GPU, FP32 on the CPU) and per
path (``aot``: kiln.compile, ``dynamo``: torch.compile(backend="kiln")) the script reports:

  check         WeightWatch.changed() alone, microseconds per call (median over repeats of
                the mean over ``--iters`` calls), and the number of tensors it watches;
  data ptrs     a pass over the same tensors' data pointers, which would also see ``p.data =
                t`` (not part of the check), for scale;
  call with     a call of the compiled model, microseconds (median of ``--calls`` calls; on a
                GPU each call is followed by a synchronize);
  call without  the same calls with the check skipped.

The model's outputs are checked against eager once per path.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import kiln
from kiln.testing import first_output, randomize_weights, relative_error

log = logging.getLogger("kiln.bench.weight_check")


def resnet50() -> tuple[torch.nn.Module, list[torch.Tensor]]:
    import torchvision
    return randomize_weights(torchvision.models.resnet50().eval()), [torch.randn(1, 3, 224, 224)]


def bert() -> tuple[torch.nn.Module, list[torch.Tensor]]:
    import transformers
    model = transformers.BertModel(transformers.BertConfig()).eval()
    return randomize_weights(model), [torch.randint(0, 30522, (1, 128))]


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, list[torch.Tensor]]]] = {"resnet50": resnet50, "bert": bert}


def per_call_us(fn: Callable[[], Any], iters: int, repeats: int) -> float:
    for _ in range(min(iters, 1000)):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(samples)


def call_us(fn: Callable[[], Any], calls: int, device: str) -> float:
    fn()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


def watches_of(compiled: Any, path: str) -> list[Any]:
    if path == "aot":
        return [compiled.weight_watch]
    from kiln.pipeline import LIVE_GRAPHS
    return [b.watch for g in LIVE_GRAPHS for b in g.compiled.values() if b.watch is not None]


def measure(name: str, path: str, device: str, iters: int, repeats: int, calls: int) -> dict[str, float]:
    model, inputs = MODELS[name]()
    dtype = torch.float16 if device == "cuda" else torch.float32
    model = model.to(device=device, dtype=dtype)
    inputs = [x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device) for x in inputs]
    torch._dynamo.reset()
    with torch.no_grad():
        if path == "aot":
            compiled = kiln.compile(model, inputs, enabled_precisions={dtype})
        else:
            compiled = torch.compile(model, backend="kiln", options={"enabled_precisions": {dtype}})
        error = relative_error(first_output(compiled(*inputs)).float(), first_output(model(*inputs)).float())
        (watch,) = watches_of(compiled, path)
        assert not watch.changed()
        check = per_call_us(watch.changed, iters, repeats)
        pointers = per_call_us(lambda: list(map(torch.Tensor.data_ptr, watch.tensors)), iters, repeats)
        with_check = call_us(lambda: compiled(*inputs), calls, device)
        watch.changed = lambda: False  # an instance attribute hides the method
        without = call_us(lambda: compiled(*inputs), calls, device)
        del watch.changed
    return {"tensors": len(watch.tensors), "check_us": check, "pointers_us": pointers,
            "with_us": with_check, "without_us": without, "error": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--paths", default="aot,dynamo")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in args.models.split(","):
        for path in args.paths.split(","):
            r = measure(name, path, args.device, args.iters, args.repeats, args.calls)
            log.info("%-9s %-6s %4d tensors  check %6.2f us/call (data ptrs %6.2f)  call with %8.1f us, "
                     "without %8.1f us  (rel. error %.1e)", name, path, r["tensors"], r["check_us"],
                     r["pointers_us"], r["with_us"], r["without_us"], r["error"])


if __name__ == "__main__":
    main()
