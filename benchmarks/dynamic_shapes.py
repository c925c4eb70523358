"""What a new size costs in a dynamic-shape program, against static compiles.

    python3 benchmarks/dynamic_shapes.py [--models resnet18,resnet50,bert] [--device cpu|cuda]
                                         [--sizes 12] [--iters 20] [--out dynamic_shapes.md]

Per model (torchvision resnet18 / resnet50 at 224x224 with a dynamic batch 1..8; a small
transformers BertModel, hidden 256, 4 layers, 4 heads, with a dynamic sequence 16..128 at batch
2; random weights, nothing downloaded) the script:

* compiles once with ``kiln.compile(..., dynamic_shapes=...)`` (export, lowering, partitioning
  and the opt shape's engines: "dynamic compile");
* then, per size, times the first call at that size ("first call": binding, concrete copies of
  the blocks, their engine builds, the run) and the steady latency (median of ``--iters`` calls);
* compiles the same model statically at each size ("static compile") for comparison, and
  reports the total time to serve ``--sizes`` sizes both ways: one dynamic compile plus every
  new size's first call, against one static compile per size.

Every output is checked against eager PyTorch (relative error at most 1e-4 on the CPU, 2e-3 on
CUDA in fp32); the script exits with status 1 when one is off (after printing the table). The
engine cache is off, so every build is a real build.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _resnet(name: str) -> tuple[torch.nn.Module, Callable[[int, str], list[torch.Tensor]], dict[str, Any], list[int]]:
    import torchvision

    model = getattr(torchvision.models, name)(weights=None).eval()

    def inputs(b: int, device: str) -> list[torch.Tensor]:
        return [torch.randn(b, 3, 224, 224, device=device)]
    return model, inputs, {"dims": ({0: torch.export.Dim("batch", min=1, max=8)},), "opt": 2}, list(range(1, 9))


def _bert() -> tuple[torch.nn.Module, Callable[[int, str], list[torch.Tensor]], dict[str, Any], list[int]]:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
    model = BertModel(cfg).eval()

    def inputs(s: int, device: str) -> list[torch.Tensor]:
        ids = torch.randint(1, cfg.vocab_size, (2, s), device=device)
        mask = torch.ones(2, s, dtype=torch.long, device=device)
        mask[1, s // 2:] = 0
        return [ids, mask]
    seq = torch.export.Dim("seq", min=16, max=128)
    return model, inputs, {"dims": ({1: seq}, {1: seq}), "opt": 64}, [16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128]


_MODELS = {"resnet18": lambda: _resnet("resnet18"), "resnet50": lambda: _resnet("resnet50"), "bert": _bert}


def _first(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    hidden = getattr(out, "last_hidden_state", None)
    return hidden if hidden is not None else out[0]


def _error(out: Any, ref: Any) -> float:
    a, b = _first(out).float(), _first(ref).float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _steady(fn: Callable[[], Any], iters: int, device: str) -> float:
    times = []
    for _ in range(iters):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run(name: str, device: str, sizes: int, iters: int, tol: float) -> tuple[list[str], bool]:
    import kiln

    model, make, spec, all_sizes = _MODELS[name]()
    model = model.to(device)
    chosen = all_sizes[:sizes] if sizes <= len(all_sizes) else all_sizes
    ok = True
    rows: list[str] = []
    with torch.no_grad():
        example = make(spec["opt"], device)
        _sync(device)
        t = time.perf_counter()
        compiled = kiln.compile(model, example, dynamic_shapes=spec["dims"])
        _sync(device)
        dynamic_compile = time.perf_counter() - t
        dynamic_total = dynamic_compile
        static_total = 0.0
        for size in chosen:
            inputs = make(size, device)
            ref = model(*inputs)
            _sync(device)
            t = time.perf_counter()
            out = compiled(*inputs)
            _sync(device)
            first = time.perf_counter() - t
            if size != spec["opt"]:
                dynamic_total += first
            err = _error(out, ref)
            ok = ok and err <= tol
            steady = _steady(lambda: compiled(*inputs), iters, device)
            _sync(device)
            t = time.perf_counter()
            static = kiln.compile(model, inputs)
            _sync(device)
            static_compile = time.perf_counter() - t
            static_total += static_compile
            static_steady = _steady(lambda: static(*inputs), iters, device)
            rows.append(f"| {name} | {size} | {first * 1e3:.1f} | {steady * 1e3:.2f} | {static_compile * 1e3:.0f} | "
                        f"{static_steady * 1e3:.2f} | {err:.1e} |")
        rows.append(f"| {name} | total, {len(chosen)} sizes | dynamic: {dynamic_total:.2f} s "
                    f"(compile {dynamic_compile:.2f} s) | | static: {static_total:.2f} s | | |")
    return rows, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,resnet50,bert")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", type=int, default=12, help="sizes served per model (at most those listed)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args()
    torch.manual_seed(0)
    tol = 1e-4 if args.device == "cpu" else 2e-3
    lines = ["| model | size | first call at it (ms) | steady (ms) | static compile (ms) | static steady (ms) | "
             "max rel. error |", "|---|---|---|---|---|---|---|"]
    ok = True
    for name in args.models.split(","):
        rows, good = run(name.strip(), args.device, args.sizes, args.iters, tol)
        lines += rows
        ok = ok and good
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    if not ok:
        print("an output differs from eager PyTorch beyond the tolerance", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
