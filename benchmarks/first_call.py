"""Time to the first output: a cold process against warm ones, for kiln.compile and torch.compile.

    python3 benchmarks/first_call.py [--models resnet50,bert] [--paths aot,dynamo] [--device cpu|cuda]
                                     [--precision fp32|fp16] [--runs 3] [--out first_call.md]

For each model (torchvision resnet50 at batch 1, 224x224; transformers BertModel from the default
BertConfig at sequence 128; random weights, nothing downloaded) and each path (``aot``:
``kiln.compile``; ``dynamo``: ``torch.compile(backend="kiln")``) the script runs fresh child
processes on one empty cache directory of its own (``cache_built_engines`` and
``reuse_cached_engines``):

* cold: builds every engine and stores engines and the compiled program;
* engines only: a new process with the program cache turned off (``ProgramCache.load`` answers
  a miss): it lowers the graph again and takes only the engines from the cache, as warm
  processes did before the program cache;
* warm (``--runs`` of them): new processes that find the program and its engines.

Each child reports, in seconds: ``import`` (``import torch`` and ``import kiln``); ``model``
(importing torchvision / transformers and making the model: not Kiln's); then, from the
``kiln.compile`` / ``torch.compile`` call on, ``capture`` (torch.export of the model for aot,
none when the module key finds the program; Dynamo's own tracing and guards for dynamo: the
first call less everything measured inside it), ``key`` (the program cache's keys: the module
key and, after torch.export, the ExportedProgram's for aot; the Dynamo graph's for dynamo),
``lowering`` (the Dynamo graph's torch.export for dynamo, decomposition and clean-ups; none on a
program hit), ``compile`` (Kiln's part: partitioning, describing and building on a miss, decoding
the program on a hit; without the engine loads), ``engines`` (loading engines from the cache:
read, tag check, deserialization, refit or its skip), ``first run`` (the compiled module's first
call) and ``first output``, the time from the compile call to the first output, the figure the
warm-start target is about (at most 1 s on the GPU, warm). Warm rows are the median of the runs.

Every child checks its output against eager FP32 (relative error at most 1e-4 in fp32 on the CPU,
2e-3 in fp32 on CUDA, 1e-2 in fp16) and warm outputs must equal the cold process's exactly; the
script exits with status 1 when one does not (after printing the table). ``--device cuda`` runs
the models on the GPU, synchronizing around every timed stage.
"""

from __future__ import annotations

import time

_START = time.perf_counter()

import argparse  # noqa: E402 - the child's clock starts before any import
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

log = logging.getLogger("kiln.bench.first_call")

STAGES = ("import", "model", "capture", "key", "lowering", "compile", "engines", "first run", "first output")


def tolerance(device: str, precision: str) -> float:
    if precision == "fp16":
        return 1e-2
    return 2e-3 if device == "cuda" else 1e-4


# ---- the child ----------------------------------------------------------------------------------

class Clock:
    """Accumulates the time spent in wrapped functions, by stage (outermost call only)."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self.sync = sync
        self.seconds: dict[str, float] = {}
        self.depth: dict[str, int] = {}

    def wrap(self, owner: Any, name: str, stage: str) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return

        def timed(*args: Any, **kwargs: Any) -> Any:
            outer = self.depth.get(stage, 0) == 0
            self.depth[stage] = self.depth.get(stage, 0) + 1
            if outer:
                self.sync()
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.depth[stage] -= 1
                if outer:
                    self.sync()
                    self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start
        setattr(owner, name, timed)


def build_model(name: str, device: str) -> tuple[Any, list[Any]]:
    import torch

    from kiln.testing import randomize_weights
    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision
        model = torchvision.models.resnet50()
        inputs = [torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))]
    elif name == "bert":
        import transformers
        config = transformers.BertConfig()
        model = transformers.BertModel(config)
        inputs = [torch.randint(0, config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1))]
    else:
        raise ValueError(f"unknown model {name!r}")
    return randomize_weights(model, seed=0).eval().to(device), [x.to(device) for x in inputs]


def first_tensor(out: Any) -> Any:
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return out if not isinstance(out, (tuple, list)) else out[0]


def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    imported_torch = time.perf_counter()
    import kiln
    import kiln.aot
    import kiln.cached_build
    import kiln.dynamo
    import kiln.lowering
    import kiln.pipeline
    import kiln.program_cache
    from kiln.testing import relative_error
    stages: dict[str, float] = {"import": time.perf_counter() - _START}
    cuda = args.device == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    model, inputs = build_model(args.child, args.device)
    sync()
    stages["model"] = time.perf_counter() - t0
    clock = Clock(sync)
    for owner in (kiln.aot, kiln.lowering):
        clock.wrap(owner, "export_module", "export")
        clock.wrap(owner, "lower_exported_program", "lowering")
    for owner in (kiln.aot, kiln.dynamo, kiln.program_cache):
        clock.wrap(owner, "compile_lowered", "compile")
    clock.wrap(kiln.program_cache.ProgramCache, "load", "program")
    clock.wrap(kiln.program_cache.WarmStart, "load", "program")
    for name in ("for_exported_program", "for_dynamo_graph"):
        clock.wrap(kiln.program_cache.ProgramCache, name, "key")
    clock.wrap(kiln.program_cache.WarmStart, "for_module", "key")
    clock.wrap(kiln.cached_build.CachedBuild, "load", "engines")
    clock.wrap(kiln.pipeline, "build_engine", "build")
    clock.wrap(kiln.dynamo.KilnDynamoGraph, "__call__", "first run")
    if args.phase == "engines only":
        kiln.program_cache.ProgramCache.load = lambda self, weights: None  # type: ignore[method-assign]
    options: dict[str, Any] = dict(cache_built_engines=True, reuse_cached_engines=True, immutable_weights=False,
                                   engine_cache_dir=args.cache_dir)
    if args.precision == "fp16":
        options["enabled_precisions"] = {torch.half}
    if cuda:
        options["device"] = "cuda"
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        if args.path == "aot":
            compiled = kiln.compile(model, arg_inputs=inputs, **options)
            sync()
            t1 = time.perf_counter()
            out = compiled(*inputs)
            sync()
            clock.seconds["first run"] = time.perf_counter() - t1
        else:
            compiled = torch.compile(model, backend="kiln", options=options, dynamic=False)
            out = compiled(*inputs)
        sync()
        stages["first output"] = time.perf_counter() - t0
        got = first_tensor(out).float()
        ref = first_tensor(model(*inputs)).float()
    s = clock.seconds
    inside = s.get("export", 0.0) + s.get("key", 0.0) + s.get("lowering", 0.0) + s.get("compile", 0.0) + \
        s.get("program", 0.0)
    if args.path == "aot":
        stages["capture"] = s.get("export", 0.0)
        stages["lowering"] = s.get("lowering", 0.0)
    else:  # the Dynamo graph's export is part of lowering it; Dynamo's tracing is what is left
        stages["lowering"] = s.get("export", 0.0) + s.get("lowering", 0.0)
        stages["capture"] = stages["first output"] - inside - s.get("first run", 0.0)
    stages["key"] = s.get("key", 0.0)
    stages["engines"] = s.get("engines", 0.0) + s.get("build", 0.0)
    stages["compile"] = s.get("compile", 0.0) + s.get("program", 0.0) - stages["engines"]
    stages["first run"] = s.get("first run", 0.0)
    out_path = os.path.join(args.cache_dir, f"out-{os.getpid()}.pt")
    torch.save(got.cpu(), out_path)
    return dict(stages=stages, stats=kiln.cached_build.cache_stats(), rel_err=relative_error(got, ref),
                output=out_path, import_torch=imported_torch - _START)


# ---- the parent ---------------------------------------------------------------------------------

def run_child(args: argparse.Namespace, model: str, path: str, phase: str, cache_dir: str) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", model, "--path", path, "--phase", phase,
           "--cache-dir", cache_dir, "--device", args.device, "--precision", args.precision]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{model} {path} {phase} failed:\n{run.stderr[-4000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def median_row(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {k: statistics.median(r["stages"].get(k, 0.0) for r in rows) for k in STAGES}


def check(model: str, path: str, phase: str, result: dict[str, Any], cold_out: Any, tol: float) -> list[str]:
    import torch
    problems = []
    if not result["rel_err"] <= tol:
        problems.append(f"{model} {path} {phase}: relative error {result['rel_err']:.2e} against eager is over "
                        f"{tol:.0e}")
    if cold_out is not None and not torch.equal(torch.load(result["output"]), cold_out):
        problems.append(f"{model} {path} {phase}: the output differs from the cold process's")
    s = result["stats"]
    if phase == "warm" and (s["program_hits"] < 1 or s["builds"] or s["lowerings"]):
        problems.append(f"{model} {path} warm: program hits {s['program_hits']}, builds {s['builds']}, "
                        f"lowerings {s['lowerings']} (expected a hit that builds and lowers nothing)")
    return problems


def table(rows: list[tuple[str, str, str, dict[str, float]]], device: str) -> str:
    head = "| model | path | process | " + " | ".join(STAGES) + " |"
    lines = [head, "|" + "---|" * (len(STAGES) + 3)]
    for model, path, phase, stages in rows:
        cells = " | ".join(f"**{stages[k]:.2f}**" if k == "first output" else f"{stages[k]:.2f}" for k in STAGES)
        lines.append(f"| {model} | {path} | {phase} | {cells} |")
    return "\n".join(lines) + f"\n\nSeconds, device {device}. " + (
        "capture: torch.export (aot; none on a module key hit) or Dynamo's tracing (dynamo); key: the program "
        "cache's keys; lowering: decomposition and clean-ups (and the "
        "Dynamo graph's export); compile: Kiln's part without the engines; engines: building (cold) or loading "
        "them from the cache; first output: from the compile call to the first output.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--paths", default="aot,dynamo")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["fp32", "fp16"], default="fp32")
    parser.add_argument("--runs", type=int, default=3, help="warm processes per model and path (default 3)")
    parser.add_argument("--out", help="also write the markdown table to this file")
    parser.add_argument("--child")
    parser.add_argument("--path")
    parser.add_argument("--phase")
    parser.add_argument("--cache-dir")
    args = parser.parse_args()
    if args.child:
        sys.stdout.write(json.dumps(child(args)) + "\n")
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda needs a CUDA GPU, but PyTorch sees none")
    import torch
    rows: list[tuple[str, str, str, dict[str, float]]] = []
    problems: list[str] = []
    tol = tolerance(args.device, args.precision)
    for model in args.models.split(","):
        for path in args.paths.split(","):
            with tempfile.TemporaryDirectory(prefix="kiln-first-call-") as cache_dir:
                cold = run_child(args, model, path, "cold", cache_dir)
                cold_out = torch.load(cold["output"])
                problems += check(model, path, "cold", cold, None, tol)
                engines_only = run_child(args, model, path, "engines only", cache_dir)
                problems += check(model, path, "engines only", engines_only, cold_out, tol)
                warm = [run_child(args, model, path, "warm", cache_dir) for _ in range(args.runs)]
                for w in warm:
                    problems += check(model, path, "warm", w, cold_out, tol)
            log.info("%s %s: cold %s; engines only %s; warm %s", model, path, cold["stages"], engines_only["stages"],
                     [w["stages"] for w in warm])
            rows += [(model, path, "cold", cold["stages"]), (model, path, "engines only", engines_only["stages"]),
                     (model, path, f"warm (median of {len(warm)})", median_row(warm))]
    text = table(rows, torch.cuda.get_device_name() if args.device == "cuda" else "cpu")
    log.info("\n%s", text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    for p in problems:
        log.error("%s", p)
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
