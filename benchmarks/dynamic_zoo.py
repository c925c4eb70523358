"""Dynamic shapes across the model zoo: one compile per model serving a range of batch sizes or
sequence lengths, against a static Kiln engine.

    python3 benchmarks/dynamic_zoo.py [--models segformer_b0,swin_t] [--axis batch|sequence]
                                      [--device cpu|cuda] [--precision fp32|fp16|bf16]
                                      [--range 1..16] [--opt 8] [--sizes 1,3,13,16] [--small]
                                      [--iters 30] [--out dynamic_zoo.md]

Per model of benchmarks/zoo_models.py (random weights, nothing downloaded; ``--axis sequence``
takes the models whose inputs are token ids) the script compiles once with
``kiln.compile(..., dynamic_shapes=...)``, the axis a ``Dim`` over ``--range`` and the example
inputs at ``--opt``; calls the program once at each of ``--sizes`` (each call synchronized) and
counts the engines those calls built; waits for the instances' background tactic timing; then
times the steady latency (median of ``--iters`` calls) at the largest size beside a static Kiln
engine compiled for that size. Errors are relative to eager FP32 on the same inputs, eager's own
error in the precision beside them. Defaults: a batch of 1..16 built at 8 (``--small``: 1..8 at
2), a sequence from 16 (``--small``: 4) to the model's length built at half of it; sizes are the
range's ends and two between.

Exits with status 1 when a model fails or an error exceeds max(1e-2, 3x eager's own) (1e-4 in
FP32), after printing the table.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo  # noqa: E402
import zoo_models  # noqa: E402

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _timed(fn: Callable[[], Any], device: str) -> tuple[Any, float]:
    """fn's result and its seconds, the device synchronized before and after."""
    zoo.synchronize(device)
    start = time.perf_counter()
    out = fn()
    zoo.synchronize(device)
    return out, time.perf_counter() - start


def _steady_ms(fn: Callable[[], Any], iters: int, device: str) -> float:
    for _ in range(3):
        fn()
    return statistics.median(_timed(fn, device)[1] for _ in range(iters)) * 1e3


def takes_token_ids(entry: zoo_models.ZooModel) -> bool:
    """Whether the model's inputs are token ids (and attention masks): [batch, sequence] integers."""
    return all(x.dim() == 2 and not x.is_floating_point() for x in entry.make_inputs(1, small=True))


def dynamic_dims(model: torch.nn.Module, inputs: Sequence[torch.Tensor], axis: int, dim: Any) -> tuple[Any, ...]:
    """``axis`` of every input is ``dim``; a forward that takes ``*inputs`` takes them as one tuple."""
    dims = tuple({axis: dim} for _ in inputs)
    params = list(inspect.signature(model.forward).parameters.values())
    return (dims,) if params and params[0].kind == inspect.Parameter.VAR_POSITIONAL else dims


def _parse_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("..")
    if not sep or not lo.isdigit() or not hi.isdigit() or not 1 <= int(lo) <= int(hi):
        raise ValueError(f"--range must be LO..HI with 1 <= LO <= HI, got {text!r}")
    return int(lo), int(hi)


def _plan(entry: zoo_models.ZooModel, args: argparse.Namespace) -> tuple[int, int, int, list[int]]:
    """The range, the opt size and the sizes called, for ``entry``."""
    if args.axis == "batch":
        lo, hi = _parse_range(args.range or ("1..8" if args.small else "1..16"))
        hi = min(hi, entry.max_batch)
        opt = args.opt or (2 if args.small else 8)
    else:
        full = entry.make_inputs(1, small=args.small)[0].shape[1]
        lo, hi = _parse_range(args.range or f"{4 if args.small else 16}..{full}")
        hi = min(hi, full)
        opt = args.opt or max(lo, full // 2)
    sizes = args.sizes or [lo, lo + 2, (lo + hi) // 2 + 1, hi]
    sizes = sorted({s for s in sizes if lo <= s <= hi and s != opt})
    if not lo <= opt <= hi or not sizes:
        raise ValueError(f"opt {opt} and sizes {args.sizes} must lie in {lo}..{hi}")
    return lo, hi, opt, sizes


def measure(name: str, args: argparse.Namespace) -> tuple[str, bool]:
    """The table row of one model and whether its errors are within the tolerance."""
    import kiln
    from kiln.cached_build import cache_stats, reset_cache_stats
    from kiln.dynamic import dynamic_program_of

    entry = zoo_models.MODELS[name]
    device, dtype = args.device, _DTYPES[args.precision]
    lo, hi, opt, sizes = _plan(entry, args)
    reference = entry.create_randomized(opt, small=args.small, device=device)[0]
    model = entry.create_randomized(opt, small=args.small, device=device)[0].to(dtype)

    def inputs(size: int, to: torch.dtype) -> list[torch.Tensor]:
        if args.axis == "batch":
            xs = entry.make_inputs(size, small=args.small, seed=size)
        else:
            xs = [x[:, :size].contiguous() for x in entry.make_inputs(2 if args.small else 8, small=args.small)]
        return [x.to(device, to) if x.is_floating_point() else x.to(device) for x in xs]

    axis = 0 if args.axis == "batch" else 1
    example = inputs(opt, dtype)
    dims = dynamic_dims(model, example, axis, torch.export.Dim(args.axis, min=lo, max=hi))
    ok, firsts, errors = True, [], []  # errors: (Kiln's, eager's own) per size
    with torch.no_grad():
        compiled, seconds = _timed(lambda: kiln.compile(model, example, dynamic_shapes=dims, min_block_size=1,
                                                        enabled_precisions={dtype}), device)
        reset_cache_stats()
        for size in sizes:
            x = inputs(size, dtype)
            out, first = _timed(lambda: compiled(*x), device)
            want = zoo.flat_output(reference(*inputs(size, torch.float32))).float()
            own = zoo.rel_error(zoo.flat_output(model(*x)).float(), want)
            err = zoo.rel_error(zoo.flat_output(out).float(), want)
            ok = ok and err <= (1e-4 if dtype == torch.float32 else max(1e-2, 3 * own))
            firsts.append(f"{size}: {first * 1e3:.1f}")
            errors.append((err, own))
        builds = cache_stats().get("builds", 0)
        table = dynamic_program_of(compiled)
        if table is not None:
            table.wait_tuned()
        x = inputs(sizes[-1], dtype)
        dynamic_ms = _steady_ms(lambda: compiled(*x), args.iters, device)
        static = kiln.compile(model, x, min_block_size=1, enabled_precisions={dtype})
        static_ms = _steady_ms(lambda: static(*x), args.iters, device)
    err, own = max(errors)
    return (f"| {name} | {lo}..{hi} at {opt} | {seconds:.1f} | {builds} | {'; '.join(firsts)} | "
            f"{sizes[-1]}: {dynamic_ms:.3f} / {static_ms:.3f} | {err:.1e} ({own:.1e}) |"), ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=None, help="comma-separated zoo names or patterns (default: all that "
                                                       "the axis applies to)")
    parser.add_argument("--axis", choices=("batch", "sequence"), default="batch")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=sorted(_DTYPES), default="fp32")
    parser.add_argument("--range", default=None, help="LO..HI of the dynamic axis")
    parser.add_argument("--opt", type=int, default=None, help="the size the program is built at")
    parser.add_argument("--sizes", default=None, help="comma-separated sizes to call it at")
    parser.add_argument("--small", action="store_true", help="the models' reduced variants (CPU tests)")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else None
        if args.range:
            _parse_range(args.range)
        entries = zoo_models.select(args.models) if args.models else list(zoo_models.MODELS.values())
    except ValueError as err:
        parser.error(str(err))
    if args.iters < 1:
        parser.error("--iters must be at least 1")
    if args.axis == "sequence":
        entries = [e for e in entries if takes_token_ids(e)]
    if not entries:
        parser.error(f"no zoo model of {args.models!r} takes a dynamic {args.axis}")
    lines = [f"| model | {args.axis} range at opt | compile s | engines built by the calls | first call ms per size | "
             "steady ms at the largest: dynamic / static | max rel. error (eager's own) |",
             "|---|---|---|---|---|---|---|"]
    ok = True
    for entry in entries:
        try:
            row, good = measure(entry.name, args)
        except Exception as err:  # noqa: BLE001 - a failing model is a row with its error
            row, good = f"| {entry.name} | failed: {type(err).__name__}: {str(err).splitlines()[0][:200]} |||||||", False
        print(row, file=sys.stderr, flush=True)  # progress; the table follows on stdout
        lines.append(row)
        ok = ok and good
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    if not ok:
        print("a model failed or an output differs from eager beyond the tolerance", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
