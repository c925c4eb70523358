"""Engine cache and refit: cold build vs warm-cache compile in a new process, and refit.

    python3 benchmarks/engine_cache.py [--models resnet50,bert] [--opt-level 3]
                                                         [--device cpu|cuda] [--precision fp32|fp16]

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

``--device cuda`` puts the model and its inputs on the GPU and builds CUDA engines (it stops
at once, naming the cause, when PyTorch sees no GPU or Kiln has no CUDA backend); timings are
taken between ``torch.cuda.synchronize()`` calls. ``--precision fp16`` compiles with
``enabled_precisions={torch.half}`` (the model and its inputs stay FP32: the engines compute in
FP16 behind FP32 inputs and outputs); the default fp32 uses Kiln's default precisions. On the
GPU the CUDA builder times tactics and keeps the choices in a timing cache
(``$KILN_TIMING_CACHE``): every child process gets ``KILN_TIMING_CACHE`` pointing at a fresh
file of this run (any value in the environment is overridden), so the cold build starts with
an empty timing cache, and a third child process (tc) repeats the plain build with the timing
cache file the cold process left (the cold build with a filled timing cache). The cold process
also builds once more after its plain build ("rebuild": the same process, with the timing and
NVRTC caches filled in memory).

After the warm process the script times, in its own process, what a hit spends on the entries
before deserializing them: reading each file into memory, and reading it and checking its tag
(``DiskEngineCache.read_entry``); the difference is the cost of authenticating the entries.

Every compiled output (and the refitted one) is compared with eager FP32 PyTorch by relative
error ``||out - ref|| / ||ref||``; the run exits with status 1 (after printing the table) when
one is over the tolerance of its precision: 1e-4 in fp32 on the CPU, 2e-3 in fp32 on CUDA (TF32
is allowed there), 1e-2 in fp16.
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

PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16}


def tolerance(device: str, precision: str) -> float:
    """The largest relative error against eager FP32 accepted for this device and precision."""
    if precision == "fp16":
        return 1e-2
    return 2e-3 if device == "cuda" else 1e-4


def require_device(device: str) -> None:
    """Stops with a message naming the cause when ``device`` cannot run Kiln engines here."""
    if device != "cuda":
        return
    if not torch.cuda.is_available():
        raise SystemExit(f"--device cuda needs a CUDA GPU, but PyTorch sees none (torch.cuda.is_available() is "
                         f"False; torch {torch.__version__}, CUDA {torch.version.cuda}). Run on a GPU machine, "
                         f"e.g. bash scripts/gpu_check.sh py benchmarks/{os.path.basename(sys.argv[0])} --device cuda")
    import kiln
    if not kiln._C.cuda_available():
        raise SystemExit(f"--device cuda: Kiln's CUDA backend is not available ({kiln._C.__file__} was built "
                         "without -DKILN_CUDA=ON, or sees no device); scripts/gpu_check.sh builds one")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


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


def compile_options(device: str, precision: str, opt_level: int) -> dict[str, Any]:
    """The settings every compile of this run shares (the CPU fp32 run passes what it always did)."""
    options: dict[str, Any] = dict(immutable_weights=False, optimization_level=opt_level)
    if precision != "fp32":
        options["enabled_precisions"] = {PRECISIONS[precision]}
    if device == "cuda":
        options["device"] = "cuda"
    return options


def child(name: str, cache_dir: str, phase: str, opt_level: int, device: str, precision: str) -> dict[str, Any]:
    import kiln
    from kiln.cached_build import cache_stats
    from kiln.testing import relative_error
    model, inputs = build(name, seed=0)
    model, inputs = model.to(device), [x.to(device) for x in inputs]
    base = compile_options(device, precision, opt_level)
    options = dict(base, cache_built_engines=True, reuse_cached_engines=True, engine_cache_dir=cache_dir)
    result: dict[str, Any] = dict(phase=phase, device=device, precision=precision)

    def timed_compile(m: torch.nn.Module, **opts: Any) -> tuple[Any, float]:
        sync(device)
        t0 = time.perf_counter()
        compiled = kiln.compile(m, arg_inputs=inputs, **opts)
        sync(device)
        return compiled, time.perf_counter() - t0

    with torch.no_grad():
        ref = first(model(*inputs)).float()  # eager FP32; also initializes the device's libraries
        sync(device)
        if phase in ("cold", "tc"):  # the plain build, without the cache, for reference
            plain, _ = timed_compile(model, **base)
            result["nocache_s"] = plain.summary.seconds
            result["nocache_rel_err"] = relative_error(first(plain(*inputs)).float(), ref)
            del plain
            if phase == "tc":
                path = os.environ.get("KILN_TIMING_CACHE", "")
                result["timing_cache_bytes"] = os.path.getsize(path) if path and os.path.exists(path) else 0
                return result
            if device == "cuda":  # again in this process: timing and NVRTC caches filled in memory
                again, _ = timed_compile(model, **base)
                result["rebuild_s"] = again.summary.seconds
                del again
        compiled, total = timed_compile(model, **options)
        got = first(compiled(*inputs)).float()
        sync(device)
        err = (got - ref).abs().max().item()
        result.update(kiln_s=compiled.summary.seconds, total_s=total, engines=compiled.summary.engines,
                      coverage=compiled.summary.coverage, max_err=err, rel_err=relative_error(got, ref),
                      **cache_stats())
        if phase == "cold":
            other, _ = build(name, seed=1)
            other = other.to(device)
            try:
                from kiln import refit
                sync(device)
                t0 = time.perf_counter()
                refit(compiled, other)
                sync(device)
                result["refit_s"] = time.perf_counter() - t0
                got, want = first(compiled(*inputs)).float(), first(other(*inputs)).float()
                result["refit_err"] = (got - want).abs().max().item()
                result["refit_rel_err"] = relative_error(got, want)
            except (ImportError, TypeError) as e:  # refit not available in this build
                result["refit_s"] = None
                result["refit_error"] = f"{type(e).__name__}: {e}"
    return result


def run_child(name: str, cache_dir: str, phase: str, args: argparse.Namespace,
              env: dict[str, str] | None = None) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--cache-dir", cache_dir,
           "--phase", phase, "--opt-level", str(args.opt_level), "--device", args.device,
           "--precision", args.precision]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"{name} {phase} failed:\n{run.stderr[-4000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def accuracy_failures(name: str, cold: dict[str, Any], warm: dict[str, Any], tc: dict[str, Any] | None,
                      tol: float) -> list[str]:
    """The relative errors of this model's runs that are over ``tol``, as messages."""
    checks = [("cold build", cold.get("nocache_rel_err")), ("cold build+store", cold.get("rel_err")),
              ("refitted", cold.get("refit_rel_err")), ("warm", warm.get("rel_err"))]
    if tc is not None:
        checks.append(("tc build", tc.get("nocache_rel_err")))
    return [f"{name} {what}: relative error {err:.2e} against eager FP32 is over {tol:.0e}"
            for what, err in checks if err is not None and not err <= tol]


def entry_read_cost(cache_dir: str, repeats: int = 5) -> dict[str, float]:
    """Medians over ``repeats`` of what a hit spends on its entries before deserializing them:
    reading every entry file into memory alone, and reading plus checking its tag (the store's
    read_entry). Their difference is the authentication's cost; the files are in the page cache."""
    import statistics

    from kiln.cache import DiskEngineCache
    from kiln.cache_auth import read_regular_file
    store = DiskEngineCache(cache_dir)
    entries = store.entries()

    def median_ms(fn: Any) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for e in entries:
                fn(e.key)
            times.append(time.perf_counter() - start)
        return 1e3 * statistics.median(times)

    read_ms = median_ms(lambda key: read_regular_file(store.directory / f"{key}{store.SUFFIX}", None))
    verified_ms = median_ms(store.read_entry)
    return dict(entry_mb=sum(e.size for e in entries) / 1e6, read_ms=read_ms, read_verify_ms=verified_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--opt-level", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the model runs and the engines are built (default cpu)")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32",
                        help="fp16: enabled_precisions={torch.half} (default fp32)")
    parser.add_argument("--child")
    parser.add_argument("--cache-dir")
    parser.add_argument("--phase")
    args = parser.parse_args()
    require_device(args.device)
    if args.child:
        result = child(args.child, args.cache_dir, args.phase, args.opt_level, args.device, args.precision)
        sys.stdout.write(json.dumps(result) + "\n")
        return
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    cuda = args.device == "cuda"
    if cuda:
        log.info("device: %s; precision %s", torch.cuda.get_device_name(), args.precision)
    rows = []
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="kiln-cache-bench-") as cache_dir:
            env = None
            if cuda:  # a timing cache of this run's own: the cold build starts with it empty
                env = dict(os.environ, KILN_TIMING_CACHE=os.path.join(cache_dir, "timing", "timing.cache"))
            cold = run_child(name, cache_dir, "cold", args, env)
            warm = run_child(name, cache_dir, "warm", args, env)
            tc = run_child(name, cache_dir, "tc", args, env) if cuda else None
            cost = entry_read_cost(cache_dir)
        log.info("%s entries: %.1f MB, read %.1f ms, read + tag check %.1f ms (authentication %.1f ms)", name,
                 cost["entry_mb"], cost["read_ms"], cost["read_verify_ms"], cost["read_verify_ms"] - cost["read_ms"])
        log.info("%s cold: %s", name, cold)
        log.info("%s warm: %s", name, warm)
        if tc is not None:
            log.info("%s tc: %s", name, tc)
        rows.append((name, cold, warm, tc))
    log.info("")
    extra = f" {'tc s':>7} {'rebuild s':>9}" if cuda else ""
    log.info("%-9s %7s %9s %10s %9s %9s %9s %9s %8s %9s%s", "model", "engines", "build s", "build+st s",
             "warm s", "warm/eng", "speedup", "refit s", "refit x", "export s", extra)
    failures: list[str] = []
    for name, cold, warm, tc in rows:
        refit_s = cold.get("refit_s")
        refit = f"{refit_s:9.3f}" if refit_s else f"{'n/a':>9}"
        refit_x = f"{cold['nocache_s'] / refit_s:7.1f}x" if refit_s else f"{'n/a':>8}"
        extra = f" {tc['nocache_s']:7.2f} {cold['rebuild_s']:9.2f}" if tc is not None else ""
        log.info("%-9s %7d %9.2f %10.2f %9.3f %9.3f %8.1fx %s %s %9.2f%s", name, cold["engines"], cold["nocache_s"],
                 cold["kiln_s"], warm["kiln_s"], warm["kiln_s"] / max(warm["engines"], 1),
                 cold["nocache_s"] / warm["kiln_s"], refit, refit_x, warm["total_s"] - warm["kiln_s"], extra)
        if warm["hits"] != warm["engines"] or warm["builds"]:
            log.warning("%s: the warm process hit %d of %d engines and built %d", name, warm["hits"],
                        warm["engines"], warm["builds"])
        if tc is not None and not tc.get("timing_cache_bytes"):
            log.warning("%s: the cold process left no timing cache file (KILN_TIMING_CACHE), so the tc build "
                        "started with an empty timing cache as well", name)
        failures += accuracy_failures(name, cold, warm, tc, tolerance(args.device, args.precision))
    log.info("build: Kiln's part of kiln.compile without the cache; build+st: with the cache, building "
             "and storing; warm: a new process loading every engine from the cache and refitting its "
             "weights; speedup: build / warm; refit x: build / refit; export s: torch.export + lowering")
    if cuda:
        log.info("on cuda, build starts with an empty timing cache; tc s: the plain build in a new process "
                 "with the timing cache file the cold process left; rebuild s: the plain build again in the "
                 "cold process (timing and NVRTC caches filled in memory); build+st also comes after it")
    for message in failures:
        log.error("%s", message)
    if failures:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
