"""Engine cache and refit on CPU: cold build vs warm-cache compile in a new process, and refit.

    PYTHONPATH=python python3 benchmarks/engine_cache.py [--models resnet50,bert] [--opt-level 3]

For each model (torchvision resnet50 at batch 1, 224x224; transformers BertModel from the
default BertConfig at sequence 128; random weights, nothing downloaded) the script runs two
child processes on one empty cache directory:

* cold: kiln.compile without the cache (the plain build, for reference), then with
  ``cache_built_engines`` and ``reuse_cached_engines``, which builds every engine and stores it;
  then the process refits the compiled module with other random weights (kiln.refit) and checks
  the refitted outputs against eager PyTorch;
* warm: the same compile in a fresh process finds every engine in the cache, loads it and
  refits the current weights into it.

Times are Kiln's part of kiln.compile (partition, describe, build or load + refit: the
CompileSummary's ``seconds``), without torch.export tracing and lowering, which are reported
separately. Targets: warm at least 10x faster than cold and under 1 s per engine; refit at least
5x faster than the plain build.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

log = logging.getLogger("kiln.bench.engine_cache")


def build(name: str, seed: int) -> tuple[torch.nn.Module, list[Any]]:
    from kiln.testing import randomize_weights
    torch.manual_seed(seed)
    if name == "resnet50":
        import torchvision
        model: torch.nn.Module = torchvision.models.resnet50()
        inputs: list[Any] = [torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))]
    elif name == "bert":
        import transformers
        config = transformers.BertConfig()
        model = transformers.BertModel(config)
        inputs = [torch.randint(0, config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1))]
    else:
        raise ValueError(f"unknown model {name!r}")
    return randomize_weights(model, seed=seed).eval(), inputs


def first(out: Any) -> torch.Tensor:
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return out if isinstance(out, torch.Tensor) else out[0]


def child(name: str, cache_dir: str, phase: str, opt_level: int) -> dict[str, Any]:
    import kiln
    from kiln.cached_build import cache_stats
    model, inputs = build(name, seed=0)
    options = dict(cache_built_engines=True, reuse_cached_engines=True, immutable_weights=False,
                   engine_cache_dir=cache_dir, optimization_level=opt_level)
    result: dict[str, Any] = dict(phase=phase)
    with torch.no_grad():
        if phase == "cold":  # the plain build, without the cache, for reference
            plain = kiln.compile(model, arg_inputs=inputs, immutable_weights=False, optimization_level=opt_level)
            result["nocache_s"] = plain.summary.seconds
            del plain
        t0 = time.perf_counter()
        compiled = kiln.compile(model, arg_inputs=inputs, **options)
        total = time.perf_counter() - t0
        err = (first(compiled(*inputs)) - first(model(*inputs))).abs().max().item()
        result.update(kiln_s=compiled.summary.seconds, total_s=total, engines=compiled.summary.engines,
                      coverage=compiled.summary.coverage, max_err=err, **cache_stats())
        if phase == "cold":
            other, _ = build(name, seed=1)
            try:
                from kiln import refit
                t0 = time.perf_counter()
                refit(compiled, other)
                result["refit_s"] = time.perf_counter() - t0
                result["refit_err"] = (first(compiled(*inputs)) - first(other(*inputs))).abs().max().item()
            except (ImportError, TypeError) as e:  # refit not available in this build
                result["refit_s"] = None
                result["refit_error"] = f"{type(e).__name__}: {e}"
    return result


def run_child(name: str, cache_dir: str, phase: str, opt_level: int) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--cache-dir", cache_dir,
           "--phase", phase, "--opt-level", str(opt_level)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{name} {phase} failed:\n{run.stderr[-4000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--opt-level", type=int, default=3)
    parser.add_argument("--child")
    parser.add_argument("--cache-dir")
    parser.add_argument("--phase")
    args = parser.parse_args()
    if args.child:
        sys.stdout.write(json.dumps(child(args.child, args.cache_dir, args.phase, args.opt_level)) + "\n")
        return
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    rows = []
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="kiln-cache-bench-") as cache_dir:
            cold = run_child(name, cache_dir, "cold", args.opt_level)
            warm = run_child(name, cache_dir, "warm", args.opt_level)
        log.info("%s cold: %s", name, cold)
        log.info("%s warm: %s", name, warm)
        rows.append((name, cold, warm))
    log.info("")
    log.info("%-9s %7s %9s %10s %9s %9s %9s %9s %8s %9s", "model", "engines", "build s", "build+st s",
             "warm s", "warm/eng", "speedup", "refit s", "refit x", "export s")
    for name, cold, warm in rows:
        refit_s = cold.get("refit_s")
        refit = f"{refit_s:9.3f}" if refit_s else f"{'n/a':>9}"
        refit_x = f"{cold['nocache_s'] / refit_s:7.1f}x" if refit_s else f"{'n/a':>8}"
        log.info("%-9s %7d %9.2f %10.2f %9.3f %9.3f %8.1fx %s %s %9.2f", name, cold["engines"], cold["nocache_s"],
                 cold["kiln_s"], warm["kiln_s"], warm["kiln_s"] / max(warm["engines"], 1),
                 cold["nocache_s"] / warm["kiln_s"], refit, refit_x, warm["total_s"] - warm["kiln_s"])
        if warm["hits"] != warm["engines"] or warm["builds"]:
            log.warning("%s: the warm process hit %d of %d engines and built %d", name, warm["hits"],
                        warm["engines"], warm["builds"])
    log.info("build: Kiln's part of kiln.compile without the cache; build+st: with the cache, building "
             "and storing; warm: a new process loading every engine from the cache and refitting its "
             "weights; speedup: build / warm; refit x: build / refit; export s: torch.export + lowering")


if __name__ == "__main__":
    main()
