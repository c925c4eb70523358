"""Kiln against eager PyTorch and TorchInductor on a GPU, in one process.

    python3 benchmarks/gpu_models.py [--models resnet50,bert] [--batches 1,32] [--dtypes fp16,fp32]
                                     [--backends eager,inductor,ro,kiln,kiln-aot] [--runs 100] [--out DIR]
    python3 benchmarks/gpu_models.py --merge RUN1/gpu_models.json RUN2/gpu_models.json ... [--out DIR]

Models are built from configs with random weights (nothing is downloaded) and every parameter
is re-randomized first (some heads start at zero, which would make any comparison pass):
torchvision resnet50, mobilenet_v3_large and vit_b_16 at 224x224, transformers BertModel
(base config) at sequence length 128. Backends: eager, inductor (torch.compile's default mode), ro
(reduce-overhead), kiln (torch.compile(backend="kiln")) and kiln-aot (kiln.compile: the same
engines without Dynamo's guards and frame in front of every call). Per row (model, batch,
precision, backend):

  ms          median of --runs timed forwards (CUDA events, after warm-up), each synchronized:
              the host time until the device work is issued plus the device time
  host_ms     host time of one call (perf_counter around it, the device idle before), median
  pipe_ms     time per call when --runs calls are issued back to back (the larger of the host's
              and the device's time per call)
  vs_ro       inductor reduce-overhead's ms / this backend's ms (> 1: faster than ro)
  rel_err     ||out - ref|| / ||ref|| against eager FP32 on the same inputs, computed with TF32
              off (TF32 keeps FP16's 10-bit mantissa: a TF32 reference is itself as far from FP32
              as an FP16 row can be, 4e-2 for MobileNetV3)
  rel_same    the same against eager in the row's own precision, as the row runs (FP32 rows:
              TF32 allowed); what the backend's arithmetic adds, where rel_err also holds the
              model's own sensitivity to FP16 / BF16 / TF32 rounding
  compile_s   compile and first call, seconds, from empty caches (Kiln's timing cache, inductor's
              and Triton's compiled code), after the backend's one-time setup (see peak_mib)
  warm_s      Kiln only: the same compile again in this process after torch._dynamo.reset(),
              with the timing cache filled by the first
  peak_mib    device memory in use at the peak of this backend's runs, over what was in use
              before it started (the model and its weights already on the device;
              torch.cuda.mem_get_info, so Kiln's own allocations count). Each backend's one-time
              setup of the process (library handles and their workspaces, compiler start-up) is
              not in it: before the first row every backend compiles and runs a small conv + linear
              model, and what that left in use is reported once, above the table
  weights_mib the model's parameters and buffers in the row's precision (Kiln's target: its
              peak at most eager's plus one copy of the weights)

FP32 rows allow TF32 (torch.backends.cuda.matmul.allow_tf32 and cuDNN's), as Kiln does; the
FP32 reference of rel_err does not.
Results go to DIR/gpu_models.json and DIR/gpu_models.md (a Markdown table).

--merge (no device needed) writes the table of several runs' JSON files, one process each: per
row, the median of each column over the runs, and vs_ro from the median ms. A `kiln` or `ro` row
is the host time in front of the device work plus the device time, and the host part of a whole
row can double when the machine's host is slow for a few seconds; the median of three or more
processes is not decided by one such row.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import kiln
from kiln.testing import first_output, randomize_weights, relative_error, tf32_allowed

log = logging.getLogger("kiln.bench.gpu_models")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclasses.dataclass
class Row:
    model: str
    batch: int
    dtype: str
    backend: str
    ms: float = float("nan")
    host_ms: float = float("nan")
    pipe_ms: float = float("nan")
    vs_ro: float = float("nan")
    rel_err: float = float("nan")
    rel_same: float = float("nan")
    compile_s: float = float("nan")
    warm_s: float = float("nan")
    peak_mib: float = float("nan")
    weights_mib: float = float("nan")
    note: str = ""


def build_model(name: str, batch: int) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    if name == "bert":
        import transformers
        model = transformers.BertModel(transformers.BertConfig())
        ids = torch.randint(0, model.config.vocab_size, (batch, 128), generator=gen)
        return model, [ids, torch.ones(batch, 128, dtype=torch.int64)]
    import torchvision
    model = getattr(torchvision.models, name)()
    return model, [torch.randn(batch, 3, 224, 224, generator=gen)]


def model_on_gpu(name: str, batch: int, dtype: torch.dtype) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """The model with re-randomized weights on the GPU in `dtype`, and its inputs; allows TF32.
    `name` is one of this script's models or any model of the zoo (zoo_models.py, built as
    benchmarks/zoo.py builds it)."""
    import zoo_models  # type: ignore[import-not-found]
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    if name in zoo_models.MODELS:
        model, inputs = zoo_models.MODELS[name].create_randomized(batch)
    else:
        model, inputs = build_model(name, batch)
        randomize_weights(model.eval())
    model = model.cuda().to(dtype)
    return model, [x.cuda().to(dtype) if x.is_floating_point() else x.cuda() for x in inputs]


def used_bytes() -> int:
    free, total = torch.cuda.mem_get_info()
    return total - free


def median_ms(fn: Callable[[], Any], runs: int) -> tuple[float, int]:
    """Median ms of `runs` calls timed with CUDA events, and the peak device bytes in use."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    peak = used_bytes()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    peak = max(peak, used_bytes())
    return statistics.median(times), peak


def host_ms(fn: Callable[[], Any], runs: int) -> float:
    """Median host ms of one call, each started with the device idle."""
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def pipelined_ms(fn: Callable[[], Any], runs: int) -> float:
    """ms per call of `runs` calls issued back to back."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / runs


def compile_for(backend: str, model: torch.nn.Module, dtype: torch.dtype,
                inputs: list[torch.Tensor]) -> Callable[..., Any]:
    """`model` compiled by `backend`. "kiln-aot" is kiln.compile (torch.export, traced on
    `inputs`): the same engines as "kiln", called without Dynamo's guards in front of them."""
    if backend == "eager":
        return model
    if backend == "inductor":
        return torch.compile(model)
    if backend == "ro":
        return torch.compile(model, mode="reduce-overhead")
    if backend == "kiln":
        return torch.compile(model, backend="kiln",
                             options={"enabled_precisions": {dtype}, "min_block_size": 1})
    if backend == "kiln-aot":
        return kiln.compile(model, inputs, enabled_precisions={dtype}, min_block_size=1)
    raise ValueError(f"unknown backend {backend!r}; valid: eager, inductor, ro, kiln, kiln-aot")


@dataclasses.dataclass
class Setup:
    backend: str
    mib: float
    seconds: float


def set_up_backends(backends: list[str], dtype: torch.dtype) -> list[Setup]:
    """Compiles and runs a small conv + linear model with each backend in turn, in a process
    that has run nothing on the device yet: what each leaves in use is its one-time setup of the
    process (eager: PyTorch's cuDNN and cuBLAS handles and workspaces; inductor: its compiler's
    start-up; Kiln: its cuDNN handle and cuBLASLt). Every row then measures its model alone, as
    the eager reference forward in front of each row already did for PyTorch's libraries."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 8))
    model = model.eval().cuda().to(dtype)
    x = torch.randn(2, 3, 32, 32, device="cuda", dtype=dtype)
    done = []
    with torch.no_grad():
        for backend in backends:
            torch.cuda.synchronize()
            before = used_bytes()
            t0 = time.perf_counter()
            fn = compile_for(backend, model, dtype, [x])
            for _ in range(3):
                fn(x)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            del fn
            torch._dynamo.reset()
            gc.collect()
            torch.cuda.empty_cache()
            done.append(Setup(backend, (used_bytes() - before) / 2**20, seconds))
            log.info("one-time setup: %s %.0f MiB, %.1f s", backend, done[-1].mib, seconds)
    return done


def run_row(name: str, batch: int, dtype_name: str, backend: str, runs: int) -> Row:
    row = Row(name, batch, dtype_name, backend)
    dtype = DTYPES[dtype_name]
    model, inputs = build_model(name, batch)
    randomize_weights(model.eval())
    inputs = [x.cuda() for x in inputs]
    with torch.no_grad():
        with tf32_allowed(False):
            ref = first_output(model.cuda()(*inputs)).float()
        model = model.to(dtype)
        row.weights_mib = sum(t.numel() * t.element_size()
                              for t in list(model.parameters()) + list(model.buffers())) / 2**20
        cast = [x.to(dtype) if x.is_floating_point() else x for x in inputs]
        same = first_output(model(*cast)).float()
        torch._dynamo.reset()
        gc.collect()  # the previous row's models and graphs, before measuring what is in use
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        base = used_bytes()
        t0 = time.perf_counter()
        fn = compile_for(backend, model, dtype, cast)
        out = first_output(fn(*cast))
        torch.cuda.synchronize()
        row.compile_s = time.perf_counter() - t0
        row.rel_err = relative_error(out.float(), ref)
        row.rel_same = relative_error(out.float(), same)
        row.ms, peak = median_ms(lambda: fn(*cast), runs)
        row.host_ms = host_ms(lambda: fn(*cast), runs)
        row.pipe_ms = pipelined_ms(lambda: fn(*cast), runs)
        row.peak_mib = (peak - base) / 2**20
        if backend == "kiln":
            torch._dynamo.reset()
            t0 = time.perf_counter()
            again = compile_for(backend, model, dtype, cast)
            again(*cast)
            torch.cuda.synchronize()
            row.warm_s = time.perf_counter() - t0
            del again
        del fn, out
    del model
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return row


def markdown(rows: list[Row], setups: list[Setup], header: str) -> str:
    lines = [header, "",
             "One-time setup of the process, before the first row (device memory it left in use, "
             "seconds; not in any row): " + ", ".join(f"{s.backend} {s.mib:.0f} MiB {s.seconds:.1f} s" for s in setups)
             + ".", "",
             "| model | batch | dtype | backend | ms | host ms | pipelined ms | vs ro | rel err vs FP32 eager (TF32 off) | "
             "vs eager, same dtype | compile s | warm s | peak MiB | weights MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def f(v: float, fmt: str) -> str:
            return "" if v != v else format(v, fmt)
        lines.append(f"| {r.model} | {r.batch} | {r.dtype} | {r.backend}{' (' + r.note + ')' if r.note else ''} | "
                     f"{f(r.ms, '.3f')} | {f(r.host_ms, '.3f')} | {f(r.pipe_ms, '.3f')} | {f(r.vs_ro, '.2f')} | "
                     f"{f(r.rel_err, '.1e')} | {f(r.rel_same, '.1e')} | "
                     f"{f(r.compile_s, '.1f')} | "
                     f"{f(r.warm_s, '.2f')} | {f(r.peak_mib, '.0f')} | {f(r.weights_mib, '.0f')} |")
    for backend, label in (("kiln", "Kiln"), ("kiln-aot", "Kiln through kiln.compile")):
        for dtype in sorted({r.dtype for r in rows}):
            ratios = [r.vs_ro for r in rows if r.backend == backend and r.dtype == dtype and r.vs_ro == r.vs_ro]
            if ratios:
                geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
                lines.append(f"\n{label} vs reduce-overhead, geometric mean over the {len(ratios)} {dtype} rows: "
                             f"{geo:.2f}x")
    return "\n".join(lines) + "\n"


def set_vs_ro(rows: list[Row]) -> None:
    """Each row's vs_ro: reduce-overhead's ms for the same model, batch and dtype over its own."""
    ro = {(r.model, r.batch, r.dtype): r.ms for r in rows if r.backend == "ro"}
    for r in rows:
        r.vs_ro = ro.get((r.model, r.batch, r.dtype), float("nan")) / r.ms


def write_tables(out: Path, rows: list[Row], setups: list[Setup], header: str) -> str:
    (out / "gpu_models.json").write_text(json.dumps(
        {"header": header, "setup": [dataclasses.asdict(x) for x in setups],
         "rows": [dataclasses.asdict(r) for r in rows]}, indent=1))
    table = markdown(rows, setups, header)
    (out / "gpu_models.md").write_text(table)
    return table


def merge(paths: list[str]) -> tuple[list[Row], list[Setup], str]:
    """Rows and setups that are, field by field, the median over several runs' JSON files."""
    runs = [json.loads(Path(p).read_text()) for p in paths]

    def median(values: list[float]) -> float:
        known = [v for v in values if v == v]
        return statistics.median(known) if known else float("nan")

    measured = [f.name for f in dataclasses.fields(Row) if isinstance(f.default, float) and f.name != "vs_ro"]
    grouped: dict[tuple[str, int, str, str], list[dict[str, Any]]] = {}
    for run in runs:
        for r in run["rows"]:
            grouped.setdefault((r["model"], r["batch"], r["dtype"], r["backend"]), []).append(r)
    rows = []
    for (model, batch, dtype, backend), found in grouped.items():
        notes = sorted({r["note"] for r in found if r["note"]})
        row = Row(model, batch, dtype, backend, note="; ".join(notes))
        for name in measured:
            setattr(row, name, median([r[name] for r in found]))
        rows.append(row)
    set_vs_ro(rows)
    by_backend: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for x in run["setup"]:
            by_backend.setdefault(x["backend"], []).append(x)
    setups = [Setup(b, median([x["mib"] for x in xs]), median([x["seconds"] for x in xs])) for b, xs in by_backend.items()]
    headers = sorted({run.get("header", "(a run without a header line)") for run in runs})
    return rows, setups, " / ".join(headers) + f" Per row, the median of {len(runs)} runs, a process each."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,mobilenet_v3_large,vit_b_16,bert")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--dtypes", default="fp16,fp32")
    parser.add_argument("--fp32-models", default="resnet50,bert", help="models that also get FP32 rows")
    parser.add_argument("--backends", default="eager,inductor,ro,kiln")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--out", default=".")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="write the per-row median of these runs' tables")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        log.info("\n%s", write_tables(out, *merge(args.merge)))
        return
    if not torch.cuda.is_available():
        raise SystemExit("gpu_models.py needs a CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    # Cold builds start from empty caches of their own: Kiln's timing cache, and inductor's and
    # Triton's compiled-code caches (a reduce-overhead compile that finds an earlier run's code is
    # not a cold one). Set over whatever the environment names, which may hold an earlier run's.
    scratch = tempfile.mkdtemp(prefix="kiln-bench-")
    for var, leaf in (("KILN_TIMING_CACHE", "timing.cache"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                      ("TRITON_CACHE_DIR", "triton")):
        if os.environ.get(var):
            log.info("%s=%s ignored: the compile columns need empty caches", var, os.environ[var])
        os.environ[var] = os.path.join(scratch, leaf)

    backends = args.backends.split(",")
    setups = set_up_backends(backends, DTYPES[args.dtypes.split(",")[0]])
    rows: list[Row] = []
    table = ""
    header = f"Device: {torch.cuda.get_device_name()}; torch {torch.__version__}; Kiln {kiln.__version__}."
    fp32_models = set(args.fp32_models.split(","))
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            for dtype_name in args.dtypes.split(","):
                if dtype_name == "fp32" and name not in fp32_models:
                    continue
                group: list[Row] = []
                for backend in backends:
                    try:
                        row = run_row(name, batch, dtype_name, backend, args.runs)
                    except Exception as err:  # a failing backend is a row with a note, not a lost run
                        log.exception("%s b%d %s %s failed", name, batch, dtype_name, backend)
                        row = Row(name, batch, dtype_name, backend, note=f"failed: {type(err).__name__}")
                    group.append(row)
                    log.info("%s", row)
                rows.extend(group)
                set_vs_ro(rows)
                table = write_tables(out, rows, setups, header)
    log.info("\n%s", table)


if __name__ == "__main__":
    main()
