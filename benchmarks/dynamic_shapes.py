"""What a new size costs in a dynamic-shape program, against static compiles and reduce-overhead.

    python3 benchmarks/dynamic_shapes.py [--models resnet18,resnet50,bert] [--device cpu|cuda]
                                         [--precision fp32|fp16] [--sizes 12] [--iters 20]
                                         [--reduce-overhead] [--no-instances] [--repeat 1]
                                         [--back-to-back] [--out dynamic_shapes.md]

Models (random weights, nothing downloaded): torchvision resnet18 / resnet50 at 224x224 with a
dynamic batch 1..8 (opt 2); ``resnet50-b32``, batch 1..32 (opt 8); a small transformers BertModel
(hidden 256, 4 layers, 4 heads) with a dynamic sequence 16..128 at batch 2 (opt 64); ``bert-base``
(the default BertConfig) with a dynamic sequence 16..512 at batch 8 (opt 128). Per model the
script:

* in a process of its own, warmed up on a small model (CUDA context, cuDNN, cuBLASLt,
  torch.export), compiles the model statically at the opt size with a timing cache of its own
  ("one static build": what a user's first build of one shape costs, with none of the kernels
  that this process's builds compiled);
* warms this process up the same way;
* compiles once with ``kiln.compile(..., dynamic_shapes=...)`` (export, lowering, partitioning,
  the opt shape's engines and the range fit: "dynamic compile"), with a new timing cache; on a
  GPU the opt engines build untimed and their tactics are timed in the background, which the
  steady latencies and ``--repeat``'s first calls wait for (not counted);
* then, per size, times the first call at that size ("first call": binding, then per block an
  instance of the opt engine (kiln/instances.py) or, with ``--no-instances`` or where a block's
  plan does not fit one, a concrete copy and its engine build; then the run) and the steady
  latency (median of ``--iters`` calls, after the instances' background tactic timing);
* compiles the same model statically at each size ("static compile") for comparison, and
  reports the total time to serve ``--sizes`` sizes both ways: one dynamic compile plus every
  new size's first call, against one static compile per size, and that total over one static
  build;
* with ``--repeat N``, also measures the one static build and the dynamic compile with its first
  calls (each first call followed by the instances' background timing) in N new processes each,
  and reports the medians and their ratio;
* with ``--reduce-overhead``, does the same with ``torch.compile(mode="reduce-overhead",
  dynamic=True)``: its first call at each size and its steady latency there.

``--back-to-back`` measures serving instead: after the dynamic compile, every size is called
once in order and then once more, each call synchronized but none waiting for the instances'
background tactic timing, as requests that come one after another would; it reports the ms of
each call of both passes and how many specializations the second pass made (a size that comes
back should make none), and on a GPU the device memory in use after the compile and after the
sizes were served and their instances timed.

Every output is checked against eager PyTorch (relative error at most 1e-4 on the CPU, 2e-3 on
CUDA in fp32, 1e-2 in fp16); the script exits with status 1 when one is off (after printing the
table). The engine cache is off and the tactic timing caches are new files of this run's, so every
build is a real build (the per-size static compiles, which follow the dynamic program's builds,
find the same shapes' timings in its cache; the one static build has a cache of its own). Run it
with ``CUDA_CACHE_DISABLE=1`` for cold builds in both processes (the driver's on-disk kernel cache
would give the later one the earlier one's kernels).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


Spec = tuple[torch.nn.Module, Callable[[int, str], list[torch.Tensor]], dict[str, Any], list[int]]


def _resnet(name: str, max_batch: int = 8, opt: int = 2,
            sizes: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)) -> Spec:
    import torchvision

    model = getattr(torchvision.models, name)(weights=None).eval()

    def inputs(b: int, device: str) -> list[torch.Tensor]:
        return [torch.randn(b, 3, 224, 224, device=device)]
    return model, inputs, {"dims": ({0: torch.export.Dim("batch", min=1, max=max_batch)},), "opt": opt}, list(sizes)


def _bert(base: bool) -> Spec:
    from transformers import BertConfig, BertModel

    if base:
        cfg, batch, max_seq, opt = BertConfig(), 8, 512, 128
        sizes = [16, 32, 48, 64, 96, 128, 160, 200, 256, 320, 384, 512]
    else:
        cfg = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
        batch, max_seq, opt = 2, 128, 64
        sizes = [16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128]
    model = BertModel(cfg).eval()

    def inputs(s: int, device: str) -> list[torch.Tensor]:
        ids = torch.randint(1, cfg.vocab_size, (batch, s), device=device)
        mask = torch.ones(batch, s, dtype=torch.long, device=device)
        mask[1, s // 2:] = 0
        return [ids, mask]
    seq = torch.export.Dim("seq", min=16, max=max_seq)
    return model, inputs, {"dims": ({1: seq}, {1: seq}), "opt": opt}, sizes


_MODELS: dict[str, Callable[[], Spec]] = {
    "resnet18": lambda: _resnet("resnet18"),
    "resnet50": lambda: _resnet("resnet50"),
    "resnet50-b32": lambda: _resnet("resnet50", 32, 8, (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32)),
    "bert": lambda: _bert(False),
    "bert-base": lambda: _bert(True),
}


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
        times.append(_timed(fn, device)[1])
    return statistics.median(times)


def _timed(fn: Callable[[], Any], device: str) -> tuple[Any, float]:
    _sync(device)
    t = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - t


def _warm_up(device: str, dtype: torch.dtype, timing_cache: str) -> None:
    """One small build and run, so that neither timed compile pays the process's first-use costs."""
    import kiln

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 6 * 6, 4)).to(device, dtype).eval()
    x = torch.randn(2, 3, 8, 8, device=device, dtype=dtype)
    with torch.no_grad():
        kiln.compile(model, [x], enabled_precisions={dtype}, timing_cache_path=timing_cache)(x)
        kiln.compile(model, [x], dynamic_shapes=({0: torch.export.Dim("b", min=1, max=4)},),
                     enabled_precisions={dtype}, timing_cache_path=timing_cache)(x)


def _in_new_process(mode: str, name: str, args: argparse.Namespace, tmp: str) -> float:
    """The seconds that ``--one-static-build`` or ``--one-dynamic-serve`` measures in a new process
    (with a folder of its own: every process starts with empty timing caches)."""
    command = [sys.executable, os.path.abspath(__file__), mode, name, "--device", args.device,
               "--precision", args.precision, "--sizes", str(args.sizes), "--tmp", tempfile.mkdtemp(dir=tmp)]
    if not args.instances:
        command.append("--no-instances")
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1])


def _prepared(name: str, args: argparse.Namespace) -> tuple[torch.nn.Module, Callable[[int], list[torch.Tensor]],
                                                              dict[str, Any], list[int], torch.dtype]:
    """The model in the run's device and precision, its inputs at a size, its spec, sizes and dtype."""
    model, make, spec, sizes = _MODELS[name]()
    dtype = torch.half if args.precision == "fp16" else torch.float32

    def inputs_at(size: int) -> list[torch.Tensor]:
        return [x.to(dtype) if x.is_floating_point() else x for x in make(size, args.device)]
    return model.to(args.device, dtype), inputs_at, spec, sizes, dtype


def _static_build_only(name: str, args: argparse.Namespace) -> float:
    import kiln

    model, inputs_at, spec, _, dtype = _prepared(name, args)
    inputs = inputs_at(spec["opt"])
    _warm_up(args.device, dtype, os.path.join(args.tmp, "warm-up-static.cache"))
    with torch.no_grad():
        return _timed(lambda: kiln.compile(model, inputs, enabled_precisions={dtype}, timing_cache_path=os.path.join(
            args.tmp, f"{name}-static.cache")), args.device)[1]


def _compiled_dynamic(model: torch.nn.Module, inputs_at: Callable[[int], list[torch.Tensor]], spec: dict[str, Any],
                      dtype: torch.dtype, args: argparse.Namespace, timing_cache: str) -> tuple[Any, float]:
    """The model compiled once with its dynamic shapes at the opt size, and the seconds it took."""
    import kiln

    return _timed(lambda: kiln.compile(model, inputs_at(spec["opt"]), dynamic_shapes=spec["dims"],
                                       enabled_precisions={dtype}, dynamic_instances=args.instances,
                                       timing_cache_path=timing_cache), args.device)


def _dynamic_serve_only(name: str, args: argparse.Namespace) -> float:
    """Seconds of a dynamic compile plus the first call at each other size (each followed by the
    instances' background timing, as in the table's run), in this new warmed-up process."""
    import kiln
    import kiln.dynamic

    model, inputs_at, spec, sizes, dtype = _prepared(name, args)
    _warm_up(args.device, dtype, os.path.join(args.tmp, "warm-up-dynamic.cache"))
    with torch.no_grad():
        compiled, total = _compiled_dynamic(model, inputs_at, spec, dtype, args,
                                            os.path.join(args.tmp, f"{name}-dynamic.cache"))
        table = kiln.dynamic.dynamic_program_of(compiled)
        for size in sizes[:args.sizes]:
            inputs = inputs_at(size)
            first = _timed(lambda: compiled(*inputs), args.device)[1]
            total += first if size != spec["opt"] else 0.0
            if table is not None:
                table.wait_tuned()
    return total


def _device_memory(device: str) -> float | None:
    """MiB of the GPU's memory in use (by every allocator of the process), None on the CPU."""
    if not device.startswith("cuda"):
        return None
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


def back_to_back(name: str, args: argparse.Namespace, tol: float, tmp: str) -> tuple[list[str], bool]:
    """The rows of ``--back-to-back`` for one model: per pass, each size's call in ms."""
    import kiln
    import kiln.dynamic

    device = args.device
    model, inputs_at, spec, all_sizes, dtype = _prepared(name, args)
    _warm_up(device, dtype, os.path.join(tmp, "warm-up.cache"))
    chosen = all_sizes[:args.sizes]
    rows: list[str] = []
    checks: list[tuple[Any, list[torch.Tensor]]] = []
    with torch.no_grad():
        compiled, seconds = _compiled_dynamic(model, inputs_at, spec, dtype, args,
                                              os.path.join(tmp, f"{name}-serve.cache"))
        table = kiln.dynamic.dynamic_program_of(compiled)
        memory = [_device_memory(device)]
        for serve in (1, 2):
            before = {id(s) for s in table.live.values()} if table is not None else set()
            cells = []
            for size in chosen:
                inputs = inputs_at(size)
                out, t = _timed(lambda: compiled(*inputs), device)
                checks.append((out, inputs))
                cells.append(f"{size}: {t * 1e3:.1f}")
            made = len({id(s) for s in table.live.values()} - before) if table is not None else 0
            rows.append(f"| {name} | {serve} | {'; '.join(cells)} | {made} |")
        if table is not None:
            table.wait_tuned()
        memory.append(_device_memory(device))
        errors = [_error(out, model(*inputs)) for out, inputs in checks]
    rows.append(f"| {name} | compile | {seconds:.2f} s; max rel. error {max(errors):.1e} | |")
    if memory[0] is not None:
        rows.append(f"| {name} | device memory | {memory[0]:.0f} MiB after the compile, {memory[1]:.0f} MiB with "
                    f"{len(chosen)} sizes served and tuned | |")
    return rows, max(errors) <= tol


def run(name: str, args: argparse.Namespace, tol: float, tmp: str) -> tuple[list[str], bool]:
    import kiln
    import kiln.dynamic

    device, iters = args.device, args.iters
    model, inputs_at, spec, all_sizes, dtype = _prepared(name, args)
    options: dict[str, Any] = {"enabled_precisions": {dtype}, "timing_cache_path": os.path.join(tmp, f"{name}.cache")}
    dynamic_options = {**options, "dynamic_instances": args.instances}
    _warm_up(device, dtype, os.path.join(tmp, "warm-up.cache"))
    chosen = all_sizes[:args.sizes]
    ok = True
    rows: list[str] = []
    one_static = [_in_new_process("--one-static-build", name, args, tmp) for _ in range(args.repeat)]
    with torch.no_grad():
        compiled, dynamic_compile = _timed(
            lambda: kiln.compile(model, inputs_at(spec["opt"]), dynamic_shapes=spec["dims"], **dynamic_options), device)
        ro = torch.compile(model, mode="reduce-overhead", dynamic=True) if args.reduce_overhead else None
        dynamic_total, static_total, ro_total = dynamic_compile, 0.0, 0.0
        for size in chosen:
            inputs = inputs_at(size)
            ref = model(*inputs)
            out, first = _timed(lambda: compiled(*inputs), device)
            if size != spec["opt"]:
                dynamic_total += first
            err = _error(out, ref)
            ok = ok and err <= tol
            table = kiln.dynamic.dynamic_program_of(compiled)
            if table is not None:
                table.wait_tuned()  # steady latency with the instances' timed tactics
            steady = _steady(lambda: compiled(*inputs), iters, device)
            static, static_compile = _timed(lambda: kiln.compile(model, inputs, **options), device)
            static_total += static_compile
            static_steady = _steady(lambda: static(*inputs), iters, device)
            ro_cells = " | "
            if ro is not None:
                ro_out, ro_first = _timed(lambda: ro(*inputs), device)
                ok = ok and _error(ro_out, ref) <= tol
                ro_total += ro_first
                ro_cells = f"{ro_first * 1e3:.1f} | {_steady(lambda: ro(*inputs), iters, device) * 1e3:.2f}"
            rows.append(f"| {name} | {size} | {first * 1e3:.1f} | {steady * 1e3:.2f} | {static_compile * 1e3:.0f} | "
                        f"{static_steady * 1e3:.2f} | {ro_cells} | {err:.1e} |")
        ro_sum = f"reduce-overhead: {ro_total:.2f} s" if ro is not None else ""
        rows.append(f"| {name} | total, {len(chosen)} sizes | dynamic: {dynamic_total:.2f} s "
                    f"(compile {dynamic_compile:.2f} s; {dynamic_total / one_static[0]:.2f}x one static build of "
                    f"{one_static[0]:.2f} s) | | static: {static_total:.2f} s | | {ro_sum} | | |")
    if args.repeat > 1:  # the medians of new processes that do nothing else
        served = [_in_new_process("--one-dynamic-serve", name, args, tmp) for _ in range(args.repeat)]
        d, s = statistics.median(served), statistics.median(one_static)
        rows.append(f"| {name} | median of {args.repeat} processes | dynamic: {d:.2f} s "
                    f"({', '.join(f'{t:.2f}' for t in served)}); {d / s:.2f}x one static build of {s:.2f} s "
                    f"({', '.join(f'{t:.2f}' for t in one_static)}) | | | | | | |")
    return rows, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,resnet50,bert", help=f"comma-separated, of {sorted(_MODELS)}")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=("fp32", "fp16"), default="fp32")
    parser.add_argument("--sizes", type=int, default=12, help="sizes served per model (at most those listed)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--reduce-overhead", action="store_true",
                        help='also torch.compile(mode="reduce-overhead", dynamic=True) at each size')
    parser.add_argument("--out", default=None, help="also write the table to this file")
    parser.add_argument("--no-instances", dest="instances", action="store_false",
                        help="build an engine per size instead of instances of the opt engine (dynamic_instances=False)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="also report the medians over this many processes of the dynamic compile with its "
                             "first calls and of the one static build (each in a new process)")
    parser.add_argument("--back-to-back", action="store_true",
                        help="measure serving instead: every size called twice in order, back to back")
    parser.add_argument("--one-static-build", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--one-dynamic-serve", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_static_build:
        print(_static_build_only(args.one_static_build, args))
        return 0
    if args.one_dynamic_serve:
        print(_dynamic_serve_only(args.one_dynamic_serve, args))
        return 0
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    unknown = [m for m in args.models.split(",") if m.strip() not in _MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {sorted(_MODELS)}")
    if args.sizes < 1:
        parser.error("--sizes must be at least 1")
    torch.manual_seed(0)
    tol = 1e-2 if args.precision == "fp16" else 1e-4 if args.device == "cpu" else 2e-3
    lines = ["| model | size | first call at it (ms) | steady (ms) | static compile (ms) | static steady (ms) | "
             "reduce-overhead first call (ms) | reduce-overhead steady (ms) | max rel. error |",
             "|---|---|---|---|---|---|---|---|---|"]
    if args.back_to_back:
        lines = ["| model | pass | size: ms of its call | specializations made |", "|---|---|---|---|"]
    ok = True
    with tempfile.TemporaryDirectory(prefix="kiln-dynamic-shapes-") as tmp:
        for name in args.models.split(","):
            rows, good = (back_to_back if args.back_to_back else run)(name.strip(), args, tol, tmp)
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
