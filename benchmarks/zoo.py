"""Kiln on a broad zoo of architectures (benchmarks/zoo_models.py), against eager PyTorch and
TorchInductor's reduce-overhead mode.

    python3 benchmarks/zoo.py [--models resnet50,bert,'swin*',unet] [--batches 1,32] [--dtypes fp16,bf16]
                              [--paths dynamo,aot] [--baseline reuse|measure|skip] [--anchors 3]
                              [--time-budget S] [--row-timeout S] [--out DIR] [--resume] [--write-docs]
    python3 benchmarks/zoo.py --list
    python3 benchmarks/zoo.py --device cpu --small --models resnet50,bert --dtypes fp32 --baseline skip

Every model is built from a config with random weights (nothing is downloaded; every parameter is
re-drawn by kiln.testing.randomize_weights after ResNet-style zero-initialized residual norms, and
batch norms' running statistics are then set from a batch of other random inputs:
zoo_models.zero_init_residuals and calibrate_batchnorm say why). Per row (model, batch, precision, backend):

  eager     the model itself, in the row's precision
  ro        torch.compile(mode="reduce-overhead"): TorchInductor with CUDA graphs
  kiln      torch.compile(backend="kiln") (--paths dynamo)
  kiln-aot  kiln.compile, through torch.export (--paths aot)

Columns: ms (median of --runs calls after warm-up, each synchronized; CUDA events on a GPU),
vs_ro (ro's ms / the row's ms: > 1 is faster than reduce-overhead), rel_err (||out - ref|| / ||ref||
over all the model's floating outputs, flattened, against eager FP32 on the same inputs with TF32
off), rel_same (the same against eager in the row's own precision), compile_s (compile and first
call, from empty on-disk caches), kiln_s (Kiln's own part of it: partitioning, describing, building),
coverage (% of the ATen ops Kiln saw that run inside its engines), engines, graphs (Dynamo graphs
handed to Kiln; more than one means graph breaks), fallbacks (Kiln's warnings that a block or a
graph stays in PyTorch), error (the first line of a failure: a failing backend is a row with its
error, never the end of the run).

Isolation: each model runs in worker processes of its own (by default one for eager, ro and the
Dynamo path, one for the kiln.compile path, so that each Kiln path's compile is the first of its
process and finds no timing-cache entries of the other). A row that gives no result within
--row-timeout seconds, or a worker that dies, costs that row only: the worker is killed and a fresh
one carries on with the rows left. After any failed row the worker ends and a fresh one carries
on, so that a broken CUDA context cannot spoil the rows after it.

Reduce-overhead's numbers do not depend on Kiln, so they are kept per machine kind in
benchmarks/zoo_baseline/<device>.json: --baseline measure measures every ro row and writes it
there; --baseline reuse (the default) takes the stored numbers and re-measures --anchors of them
(3 by default) to report this machine's drift against the stored ones (a ro row with no stored
number is measured); --baseline skip runs no ro (e.g. on a CPU).

--time-budget: no row starts after that many seconds (a started one may still take up to
--row-timeout); what is done is written. Results are written after every row to DIR/zoo.json and
DIR/zoo.md; --resume keeps the rows of an existing DIR/zoo.json (--resume-from, of any zoo.json) and
runs only the others (to run a zoo in several commands); --write-docs also puts the table into
docs/zoo.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import dataclasses
import datetime
import gc
import json
import logging
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import zoo_models  # noqa: E402

from kiln.testing import relative_error, tf32_allowed  # noqa: E402

log = logging.getLogger("kiln.bench.zoo")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DTYPE_ALIASES = {"fp16": "fp16", "f16": "fp16", "float16": "fp16", "half": "fp16", "bf16": "bf16",
                 "bfloat16": "bf16", "fp32": "fp32", "f32": "fp32", "float32": "fp32", "float": "fp32"}
PATHS = {"dynamo": "kiln", "aot": "kiln-aot"}
BACKENDS = ("eager", "ro", "kiln", "kiln-aot")
# Rows preferred as anchors of the stored reduce-overhead numbers (then any stored row, in order):
# batch 32 rows follow the device, batch 1 rows the host, which can differ from the stored run's.
ANCHOR_PREFERENCE = [("resnet50", 32, "fp16"), ("bert", 1, "fp16"), ("vit_b_16", 32, "fp16"),
                     ("bert", 32, "fp16"), ("resnet50", 1, "fp16"), ("llama", 32, "fp16")]
DOCS = HERE.parent / "docs" / "zoo.md"
DOCS_START, DOCS_END = "<!-- zoo-table:start -->", "<!-- zoo-table:end -->"
NAN = float("nan")


@dataclasses.dataclass
class Row:
    model: str
    family: str
    batch: int
    dtype: str
    backend: str
    ms: float = NAN
    vs_ro: float = NAN
    rel_err: float = NAN
    rel_same: float = NAN
    compile_s: float = NAN
    kiln_s: float = NAN
    coverage: float = NAN
    ops: int = 0
    engines: int = 0
    graphs: int = 0
    fallbacks: int = 0
    pytorch_ops: str = ""      # Kiln rows: the ops left in PyTorch, most frequent first
    weights_mib: float = NAN
    # "stored": a reduce-overhead row taken from the baseline file; "anchor": a reduce-overhead row
    # measured here that has a stored one too (the pair gives the drift)
    source: str = "measured"
    error: str = ""
    note: str = ""

    @property
    def key(self) -> tuple[str, int, str, str, bool]:
        return self.model, self.batch, self.dtype, self.backend, self.source == "stored"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Row:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def first_line(err: BaseException | str, limit: int = 300) -> str:
    text = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
    line = next((x.strip() for x in text.splitlines() if x.strip()), text.strip())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _finite(v: float) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def geomean(values: Sequence[float]) -> float:
    vals = [v for v in values if _finite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else NAN


# ---- the worker: one process measuring a list of rows of one model ----------------------------

def flat_output(out: Any) -> torch.Tensor:
    """Every floating tensor of a model's output (tensor, tuple, dict, ModelOutput), flattened
    and concatenated, in float32."""
    import torch.utils._pytree as pytree
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not leaves:
        raise ValueError("the model returned no floating tensor")
    return torch.cat([t.detach().float().reshape(-1) for t in leaves])


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| (kiln.testing.relative_error) of outputs of one size."""
    if actual.shape != expected.shape:
        raise ValueError(f"output has {actual.numel()} values, the reference {expected.numel()}")
    return relative_error(actual, expected)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], Any], device: str, runs: int, warmup: int) -> float:
    """Median ms of `runs` calls after `warmup`: CUDA events around each call on a GPU (each call
    synchronized), perf_counter on a CPU."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(runs):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@dataclasses.dataclass
class Prepared:
    """One (batch, precision) of a model on the device: the model in that precision, its inputs
    and the two references."""

    key: tuple[int, str]
    model: torch.nn.Module
    inputs: list[torch.Tensor]
    ref: torch.Tensor    # eager FP32, TF32 off
    same: torch.Tensor   # eager in the row's precision
    weights_mib: float


def prepare(entry: zoo_models.ZooModel, base: torch.nn.Module, batch: int, dtype_name: str, device: str,
            small: bool) -> Prepared:
    """A copy of `base` (the model from ZooModel.create_randomized, float32, on the CPU) on the
    device in the row's precision, its inputs and the references."""
    dtype = DTYPES[dtype_name]
    model = copy.deepcopy(base).to(device)
    inputs = [x.to(device) for x in entry.make_inputs(batch, small)]
    with torch.no_grad():
        with tf32_allowed(False):
            ref = flat_output(model(*inputs))
        model = model.to(dtype)
        cast = [x.to(dtype) if x.is_floating_point() else x for x in inputs]
        same = flat_output(model(*cast))
    weights = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    return Prepared((batch, dtype_name), model, cast, ref, same, weights / 2**20)


def compile_for(backend: str, model: torch.nn.Module, dtype: torch.dtype, inputs: list[torch.Tensor]) -> Any:
    import kiln
    if backend == "eager":
        return model
    if backend == "ro":
        return torch.compile(model, mode="reduce-overhead")
    options = {"enabled_precisions": {dtype}, "min_block_size": 1}
    if backend == "kiln":
        return torch.compile(model, backend="kiln", options=options)
    if backend == "kiln-aot":
        return kiln.compile(model, inputs, **options)
    raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")


def _count_ops(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


def kiln_coverage(row: Row, compiled: Any, dynamo_graphs: Sequence[Any]) -> None:
    """Fills the row's coverage, ops, engines, graphs and kiln_s from Kiln's CompileSummary of
    each compiled graph (kiln.compile's KilnModule.summary; for Dynamo, the graphs that
    kiln.pipeline.LIVE_GRAPHS gained). A Dynamo graph Kiln could not lower counts its FX nodes as
    ops left in PyTorch."""
    summaries = []
    unlowered_ops = 0
    left: collections.Counter[str] = collections.Counter()
    if row.backend == "kiln-aot":
        summaries.append(compiled.summary)
        row.graphs = 1
    else:
        row.graphs = len(dynamo_graphs)
        for graph in dynamo_graphs:
            found = [b.graph_module.meta["kiln_summary"] for b in graph.compiled.values()
                     if b.graph_module is not None and "kiln_summary" in b.graph_module.meta]
            if found:
                summaries.extend(found)
            else:
                unlowered_ops += _count_ops(graph.gm)
                left["(a Dynamo graph Kiln did not lower)"] += _count_ops(graph.gm)
    in_engines = sum(sum(s.ops_in_engines.values()) for s in summaries)
    in_pytorch = sum(sum(s.ops_in_pytorch.values()) for s in summaries) + unlowered_ops
    row.ops = in_engines + in_pytorch
    row.coverage = 100.0 * in_engines / row.ops if row.ops else NAN
    row.engines = sum(s.engines for s in summaries)
    row.kiln_s = sum(s.seconds for s in summaries)
    for s in summaries:
        left.update(s.ops_in_pytorch)
    row.pytorch_ops = ", ".join(f"{op} x{n}" for op, n in left.most_common(8)) + (
        f", ... ({len(left) - 8} more kinds)" if len(left) > 8 else "")


def fallback_note(message: str) -> str:
    """Kiln's warning that a block or graph stays in PyTorch, shortened to what and why (the op
    histogram it also lists is left out)."""
    built = re.match(r"Kiln could not build (.+?) \(.*\); running it in PyTorch: (.*)", message, re.S)
    if built:
        return first_line(f"could not build {built.group(1)}: {built.group(2)}")
    lowered = re.match(r"Kiln could not lower (.+?) \((.*)\); running it in eager PyTorch", message, re.S)
    if lowered:
        return first_line(f"could not lower {lowered.group(1)}: {lowered.group(2)}")
    return first_line(message)


def reset_compilers(device: str) -> None:
    torch._dynamo.reset()
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def run_backend(p: Prepared, row: Row, device: str, runs: int, warmup: int, scratch: str) -> Row:
    from kiln.pipeline import LIVE_GRAPHS
    dtype = DTYPES[row.dtype]
    row.weights_mib = p.weights_mib
    reset_compilers(device)
    # Inductor's and Triton's on-disk caches start empty for every row (Kiln's timing cache file
    # is the worker's own, empty when it starts).
    row_dir = tempfile.mkdtemp(dir=scratch)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(row_dir, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(row_dir, "triton")
    before = set(LIVE_GRAPHS)
    with torch.no_grad():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            fn = compile_for(row.backend, p.model, dtype, p.inputs)
            out = flat_output(fn(*p.inputs))
            synchronize(device)
            if row.backend != "eager":
                row.compile_s = time.perf_counter() - t0
        fallbacks = [str(w.message) for w in caught if "Kiln" in str(w.message)]
        row.fallbacks = len(fallbacks)
        if fallbacks:
            row.note = fallback_note(fallbacks[0])
        row.rel_err = rel_error(out, p.ref)
        row.rel_same = rel_error(out, p.same)
        if row.backend.startswith("kiln"):
            kiln_coverage(row, fn, [g for g in LIVE_GRAPHS if g not in before])
        del out
        row.ms = median_ms(lambda: fn(*p.inputs), device, runs, warmup)
    fn = None
    reset_compilers(device)
    shutil.rmtree(row_dir, ignore_errors=True)
    return row


def worker(spec_path: str) -> int:
    """Measures the spec's tasks in order, writing a JSON line to the events file when each
    starts and when its row is done; ends after the first failed row (the parent starts a fresh
    process for the rest)."""
    spec = json.loads(Path(spec_path).read_text())
    entry = zoo_models.MODELS[spec["model"]]
    device, small = spec["device"], spec["small"]
    scratch = tempfile.mkdtemp(prefix="kiln-zoo-")
    os.environ["KILN_TIMING_CACHE"] = os.path.join(scratch, "timing.cache")
    torch.backends.cuda.matmul.allow_tf32 = True  # FP32 rows allow TF32, as Kiln does
    torch.backends.cudnn.allow_tf32 = True
    import kiln  # noqa: F401  (registers the backend)

    with open(spec["events"], "a", buffering=1) as events:
        def emit(**obj: Any) -> None:
            events.write(json.dumps(obj) + "\n")
            events.flush()

        prepared: Prepared | None = None
        base: torch.nn.Module | None = None
        tasks = spec["tasks"]
        try:
            for i, task in enumerate(tasks):
                if spec.get("deadline") and time.time() > spec["deadline"]:
                    emit(event="deadline")
                    return 0
                emit(event="start", task=i)
                key = (task["batch"], task["dtype"])
                row = Row(entry.name, entry.family, task["batch"], task["dtype"], task["backend"])
                if prepared is None or prepared.key != key:
                    prepared = None
                    reset_compilers(device)
                    try:
                        if base is None:  # weights re-drawn, batch norms calibrated on the device
                            base, _ = entry.create_randomized(1, small=small, device=device)
                            base = base.to("cpu")
                        prepared = prepare(entry, base, key[0], key[1], device, small)
                    except Exception as err:  # every row of this batch and precision fails alike
                        log.exception("%s b%d %s: setup failed", entry.name, *key)
                        for j in range(i, len(tasks)):
                            if (tasks[j]["batch"], tasks[j]["dtype"]) == key:
                                failed = Row(entry.name, entry.family, key[0], key[1], tasks[j]["backend"],
                                             error="setup: " + first_line(err))
                                emit(event="row", task=j, row=dataclasses.asdict(failed))
                        return 0
                try:
                    row = run_backend(prepared, row, device, spec["runs"], spec["warmup"], scratch)
                except Exception as err:
                    log.exception("%s b%d %s %s failed", *row.key)
                    row.error = first_line(err)
                    emit(event="row", task=i, row=dataclasses.asdict(row))
                    return 0
                emit(event="row", task=i, row=dataclasses.asdict(row))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


# ---- the parent: plan, run workers, collect, write -------------------------------------------

@dataclasses.dataclass
class Task:
    model: str
    batch: int
    dtype: str
    backend: str

    @property
    def key(self) -> tuple[str, int, str, str, bool]:
        return self.model, self.batch, self.dtype, self.backend, False


def device_name(device: str) -> str:
    """The device's name; for CUDA, from nvidia-smi where it answers (no CUDA context in this
    process, which only runs workers)."""
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            found = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", str(index)],
                                   capture_output=True, text=True, timeout=30)
            if found.returncode == 0 and found.stdout.strip():
                return found.stdout.strip().splitlines()[0]
        return torch.cuda.get_device_name(index)
    return f"cpu {platform.machine()} {platform.processor() or ''}".strip()


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def versions() -> dict[str, str]:
    import importlib.metadata as md

    import kiln
    found = {"torch": torch.__version__, "kiln": kiln.__version__, "python": platform.python_version()}
    for dist in ("torchvision", "transformers"):
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            found[dist] = "absent"
    return found


class Baseline:
    """The stored reduce-overhead rows of one machine kind: {"device", "rows": {"model|batch|dtype":
    {ms, compile_s, rel_err, rel_same, error, torch, date, runs}}}."""

    def __init__(self, path: Path, device: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {"device": device, "rows": {}}
        if path.exists():
            self.data = json.loads(path.read_text())

    @staticmethod
    def key(model: str, batch: int, dtype: str) -> str:
        return f"{model}|{batch}|{dtype}"

    def get(self, model: str, batch: int, dtype: str) -> dict[str, Any] | None:
        return self.data["rows"].get(self.key(model, batch, dtype))

    def put(self, row: Row, torch_version: str, runs: int) -> None:
        self.data["rows"][self.key(row.model, row.batch, row.dtype)] = {
            "ms": row.ms, "compile_s": row.compile_s, "rel_err": row.rel_err, "rel_same": row.rel_same,
            "error": row.error, "torch": torch_version, "runs": runs,
            "date": datetime.date.today().isoformat()}

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows = dict(sorted(self.data["rows"].items()))
        self.path.write_text(json.dumps({**self.data, "rows": rows}, indent=1) + "\n")

    def stored_row(self, model: zoo_models.ZooModel, batch: int, dtype: str) -> Row | None:
        found = self.get(model.name, batch, dtype)
        if found is None:
            return None
        row = Row(model.name, model.family, batch, dtype, "ro", source="stored",
                  note=f"stored {found.get('date', '?')}, torch {found.get('torch', '?')}")
        for name in ("ms", "compile_s", "rel_err", "rel_same"):
            value = found.get(name)
            setattr(row, name, NAN if value is None else float(value))
        row.error = found.get("error", "")
        return row


def plan_groups(models: list[zoo_models.ZooModel], batches: list[int], dtypes: list[str]) -> list[
        tuple[zoo_models.ZooModel, int, str]]:
    """(model, batch, dtype) in run order: a batch over the model's max_batch becomes its max_batch;
    reduced precisions only where the model lists them, fp32 for every model."""
    groups = []
    for m in models:
        seen: list[int] = []
        for b in batches:
            b = min(b, m.max_batch)
            if b not in seen:
                seen.append(b)
        for b in seen:
            for d in dtypes:
                if d == "fp32" or d in m.dtypes:
                    groups.append((m, b, d))
    return groups


def choose_anchors(groups: list[tuple[zoo_models.ZooModel, int, str]], baseline: Baseline,
                   count: int) -> set[tuple[str, int, str]]:
    usable = [(m.name, b, d) for m, b, d in groups if (found := baseline.get(m.name, b, d)) and not found.get("error")]
    ordered = [k for k in ANCHOR_PREFERENCE if k in usable] + [k for k in usable if k not in ANCHOR_PREFERENCE]
    return set(ordered[:count])


class Runner:
    def __init__(self, args: argparse.Namespace, device: str, header: dict[str, Any], out: Path,
                 rows: list[Row], baseline: Baseline | None, anchors: set[tuple[str, int, str]],
                 deadline: float | None) -> None:
        self.args = args
        self.anchors = anchors
        self.device = device
        self.header = header
        self.out = out
        self.rows = rows
        self.baseline = baseline
        self.deadline = deadline
        self.families = {m.name: m.family for m in zoo_models.MODELS.values()}
        self.workdir = Path(tempfile.mkdtemp(prefix="kiln-zoo-run-"))
        self.stopped = False

    def add(self, row: Row) -> None:
        if row.backend == "ro" and row.source == "measured" and (row.model, row.batch, row.dtype) in self.anchors:
            row.source = "anchor"
        self.rows[:] = [r for r in self.rows if r.key != row.key] + [row]
        if (self.baseline is not None and self.args.baseline == "measure" and row.backend == "ro"
                and row.source == "measured"):
            self.baseline.put(row, self.header["versions"]["torch"], self.args.runs)
            self.baseline.write()
        log.info("%s b%d %s %-8s %s%s", row.model, row.batch, row.dtype, row.backend,
                 "(stored) " if row.source == "stored" else "",
                 f"error: {row.error}" if row.error else
                 f"{row.ms:.3f} ms, rel err {row.rel_err:.1e}"
                 + (f", compile {row.compile_s:.1f} s" if _finite(row.compile_s) else "")
                 + (f", {row.coverage:.1f}% in {row.engines} engine(s)" if row.backend.startswith("kiln") else "")
                 + (f", {row.fallbacks} fallback(s)" if row.fallbacks else ""))
        write_results(self.out, self.rows, self.header)

    def run(self, model: zoo_models.ZooModel, tasks: list[Task]) -> None:
        """Runs `tasks` (all of one model) in worker processes until each has a row, or the time
        budget ends."""
        remaining = list(tasks)
        attempt = 0
        while remaining:
            if self.deadline is not None and time.time() > self.deadline:
                self.stopped = True
                return
            attempt += 1
            stem = self.workdir / f"{model.name}-{attempt}-{os.getpid()}-{len(remaining)}"
            events = stem.with_suffix(".events")
            events.write_text("")
            spec = {"model": model.name, "device": self.device, "small": self.args.small, "runs": self.args.runs,
                    "warmup": self.args.warmup, "deadline": self.deadline, "events": str(events),
                    "tasks": [dataclasses.asdict(t) for t in remaining]}
            spec_path = stem.with_suffix(".json")
            spec_path.write_text(json.dumps(spec))
            log_path = stem.with_suffix(".log")
            done, started, outcome = self._watch(spec_path, events, log_path, remaining)
            finished = set(done)
            if outcome == "deadline":
                self.stopped = True
                return
            index = None
            if outcome != "exit" and started is not None and started not in finished:
                index = started  # the row that was running when the worker was killed or died
            elif not finished:
                index = 0  # no progress at all: the first row takes the blame, so that the run goes on
            if index is not None:
                t = remaining[index]
                tail = _log_tail(log_path)
                why = (f"timeout: no result after {self.args.row_timeout:g} s" if outcome == "timeout"
                       else f"worker ended without a result ({outcome}){': ' + tail if tail else ''}")
                self.add(Row(t.model, self.families[t.model], t.batch, t.dtype, t.backend, error=why))
                finished.add(index)
            remaining = [t for i, t in enumerate(remaining) if i not in finished]

    def _watch(self, spec_path: Path, events: Path, log_path: Path, tasks: list[Task]) -> tuple[
            list[int], int | None, str]:
        """Starts a worker and follows its events: (indices of tasks with a row, index of the task
        that was running at the end, how it ended: "exit", "timeout", "deadline" or "died rc=N")."""
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)]
        done: list[int] = []
        started: int | None = None
        with open(log_path, "w") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
            last = time.time()
            pos = 0
            outcome = ""
            while not outcome:
                ended = proc.poll() is not None
                with open(events) as f:
                    f.seek(pos)
                    chunk = f.read()
                complete = chunk[:chunk.rfind("\n") + 1]
                pos += len(complete)
                for line in complete.splitlines():
                    ev = json.loads(line)
                    last = time.time()
                    if ev["event"] == "start":
                        started = ev["task"]
                    elif ev["event"] == "row":
                        done.append(ev["task"])
                        self.add(Row.from_dict(ev["row"]))
                    elif ev["event"] == "deadline":
                        outcome = "deadline"
                if outcome:
                    break
                if ended:
                    outcome = "exit" if proc.returncode == 0 else f"died rc={proc.returncode}"
                elif time.time() - last > self.args.row_timeout:
                    os.killpg(proc.pid, signal.SIGKILL)  # the worker's own process group
                    proc.wait()
                    outcome = "timeout"
                else:
                    time.sleep(0.2)
            proc.wait()
        return done, started, outcome


def _log_tail(path: Path) -> str:
    """The last line of a worker's log that names an error, else its last line."""
    try:
        lines = [x.strip() for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    errors = [x for x in lines if re.search(r"(Error|error|Exception|Killed|Segmentation)", x)]
    return first_line((errors or lines or [""])[-1])


# ---- results -----------------------------------------------------------------------------------

def set_vs_ro(rows: list[Row]) -> None:
    ro: dict[tuple[str, int, str], float] = {}
    for r in rows:  # a measured ro row (an anchor) wins over a stored one
        if r.backend == "ro" and not r.error and (r.source != "stored" or (r.model, r.batch, r.dtype) not in ro):
            ro[(r.model, r.batch, r.dtype)] = r.ms
    for r in rows:
        base = ro.get((r.model, r.batch, r.dtype), NAN)
        r.vs_ro = base / r.ms if _finite(base) and _finite(r.ms) and r.ms > 0 else NAN


def drift(rows: list[Row]) -> list[tuple[str, float]]:
    """Per anchor (a row with both a measured and a stored ro number): measured ms / stored ms."""
    stored = {(r.model, r.batch, r.dtype): r for r in rows if r.backend == "ro" and r.source == "stored"}
    found = []
    for r in rows:
        s = stored.get((r.model, r.batch, r.dtype))
        if r.backend == "ro" and r.source == "anchor" and s is not None and _finite(r.ms) and _finite(s.ms):
            found.append((f"{r.model} b{r.batch} {r.dtype}", r.ms / s.ms))
    return found


def _f(v: float, fmt: str) -> str:
    return format(v, fmt) if _finite(v) else ""


def markdown(rows: list[Row], header: dict[str, Any]) -> str:
    v = header["versions"]
    lines = [f"Device: {header['device_name']} ({header['device']}); torch {v['torch']}, torchvision "
             f"{v.get('torchvision')}, transformers {v.get('transformers')}, Kiln {v['kiln']}; "
             f"{header['runs']} timed runs per row; {'small models; ' if header['small'] else ''}"
             f"reduce-overhead: {header['baseline_note']}. Written {header['date']}."]
    anchors = drift(rows)
    if anchors:
        lines.append("")
        lines.append("Drift of this machine against the stored reduce-overhead numbers (measured / stored ms): "
                     + ", ".join(f"{k} {x:.2f}" for k, x in anchors)
                     + f"; geometric mean {geomean([x for _, x in anchors]):.2f}.")
    if header.get("missing"):
        lines += ["", f"The time budget ended the run before {len(header['missing'])} row(s) were measured: "
                  + ", ".join(f"{m} b{b} {d} {k}" for m, b, d, k in header["missing"]) + "."]
    elif header.get("stopped"):
        lines += ["", "The time budget ended the run before every row was measured."]
    groups: dict[tuple[str, int, str], dict[str, Row]] = {}
    live_ro = {(r.model, r.batch, r.dtype) for r in rows if r.backend == "ro" and r.source != "stored"}
    for r in rows:
        if r.backend == "ro" and r.source == "stored" and (r.model, r.batch, r.dtype) in live_ro:
            continue  # an anchor: the number measured here is shown, the stored one gives the drift
        groups.setdefault((r.model, r.batch, r.dtype), {})[r.backend] = r
    order = {name: i for i, name in enumerate(zoo_models.MODELS)}
    keys = sorted(groups, key=lambda k: (order.get(k[0], 1 << 30), k[0], k[1], ["fp16", "bf16", "fp32"].index(k[2])))

    lines += ["", "### Summary", "",
              "| dtype | path | rows | failed | with fallbacks | geomean vs ro | slower than ro | "
              "coverage % median (min) | median compile s |", "|---|---|---|---|---|---|---|---|---|"]
    for dtype in ("fp16", "bf16", "fp32"):
        for backend in ("kiln", "kiln-aot"):
            sel = [g[backend] for k, g in groups.items() if k[2] == dtype and backend in g]
            if not sel:
                continue
            ok = [r for r in sel if not r.error]
            ratios = [r.vs_ro for r in ok if _finite(r.vs_ro)]
            cov = [r.coverage for r in ok if _finite(r.coverage)]
            comp = [r.compile_s for r in ok if _finite(r.compile_s)]
            lines.append(f"| {dtype} | {backend} | {len(sel)} | {len(sel) - len(ok)} | "
                         f"{sum(1 for r in ok if r.fallbacks)} | {_f(geomean(ratios), '.2f')} | "
                         f"{sum(1 for x in ratios if x < 1)} of {len(ratios)} | "
                         f"{f'{statistics.median(cov):.1f} ({min(cov):.1f})' if cov else ''} | "
                         f"{_f(statistics.median(comp), '.1f') if comp else ''} |")

    lines += ["", "### Rows", "",
              "| model | family | batch | dtype | eager ms | ro ms | kiln ms | aot ms | kiln vs ro | aot vs ro | "
              "err eager | err ro | err kiln | err aot | compile s ro / kiln / aot | coverage % kiln / aot | "
              "engines kiln / aot | graphs | notes |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    failures: list[str] = []
    fallbacks: list[str] = []
    partial: list[str] = []
    for k in keys:
        g = groups[k]

        def cell(backend: str, field: str, fmt: str) -> str:
            r = g.get(backend)
            if r is None:
                return ""
            if r.error:
                return "fail" if field == "ms" else ""
            return _f(getattr(r, field), fmt)
        notes = []
        for backend in BACKENDS:
            r = g.get(backend)
            if r is None:
                continue
            if r.error:
                failures.append(f"- {k[0]} b{k[1]} {k[2]} {backend}: {r.error}")
            elif r.fallbacks:
                fallbacks.append(f"- {k[0]} b{k[1]} {k[2]} {backend}: {r.fallbacks} warning(s); first: {r.note}")
                notes.append(f"{backend}: {r.fallbacks} fallback(s)")
            if not r.error and r.pytorch_ops:
                partial.append(f"- {k[0]} b{k[1]} {k[2]} {backend} ({_f(r.coverage, '.1f')}%): {r.pytorch_ops}")
        ro = g.get("ro")
        if ro is not None and ro.source != "measured":
            notes.append("ro " + ("anchor" if ro.source == "anchor" else "stored"))
        model = zoo_models.MODELS.get(k[0])
        family = model.family if model else g[next(iter(g))].family
        lines.append(
            f"| {k[0]} | {family} | {k[1]} | {k[2]} | {cell('eager', 'ms', '.3f')} | {cell('ro', 'ms', '.3f')} | "
            f"{cell('kiln', 'ms', '.3f')} | {cell('kiln-aot', 'ms', '.3f')} | {cell('kiln', 'vs_ro', '.2f')} | "
            f"{cell('kiln-aot', 'vs_ro', '.2f')} | {cell('eager', 'rel_err', '.1e')} | "
            f"{cell('ro', 'rel_err', '.1e')} | "
            f"{cell('kiln', 'rel_err', '.1e')} | {cell('kiln-aot', 'rel_err', '.1e')} | "
            f"{' / '.join(cell(b, 'compile_s', '.1f') or '-' for b in ('ro', 'kiln', 'kiln-aot'))} | "
            f"{' / '.join(cell(b, 'coverage', '.1f') or '-' for b in ('kiln', 'kiln-aot'))} | "
            f"{' / '.join(cell(b, 'engines', 'd') or '-' for b in ('kiln', 'kiln-aot'))} | "
            f"{cell('kiln', 'graphs', 'd')} | {'; '.join(notes)} |")
    if failures:
        lines += ["", "### Failures (first line of the error)", ""] + failures
    if fallbacks:
        lines += ["", "### Blocks or graphs Kiln left in PyTorch (its first warning)", ""] + fallbacks
    if partial:
        lines += ["", "### Ops left in PyTorch (Kiln rows under 100% coverage)", ""] + partial
    return "\n".join(lines) + "\n"


def write_results(out: Path, rows: list[Row], header: dict[str, Any]) -> str:
    set_vs_ro(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "zoo.json").write_text(json.dumps({"header": header, "rows": [dataclasses.asdict(r) for r in rows]},
                                             indent=1) + "\n")
    table = markdown(rows, header)
    (out / "zoo.md").write_text(table)
    return table


def write_docs(table: str, path: Path = DOCS) -> None:
    """Replaces the generated section of docs/zoo.md (between its two markers) with `table`."""
    text = path.read_text()
    start, end = text.find(DOCS_START), text.find(DOCS_END)
    if start < 0 or end < start:
        raise SystemExit(f"{path} has no {DOCS_START} ... {DOCS_END} section to replace")
    path.write_text(text[:start + len(DOCS_START)] + "\n" + table + text[end:])


def shard_slice(spec: str) -> slice:
    """`I/N` (0 <= I < N) as the slice that takes every N-th model from the I-th."""
    m = re.fullmatch(r"(\d+)/(\d+)", spec.strip())
    if not m or not int(m.group(1)) < int(m.group(2)):
        raise SystemExit(f"--shard {spec!r}: expected I/N with 0 <= I < N, e.g. 0/4")
    return slice(int(m.group(1)), None, int(m.group(2)))


def join_rows(rows: list[Row], more: list[Row]) -> list[Row]:
    """`rows` with `more` added; a row of `more` replaces one of `rows` with the same key."""
    keys = {r.key for r in more}
    return [r for r in rows if r.key not in keys] + more


def median_rows(runs: list[list[Row]]) -> list[Row]:
    """One row per key over several runs of the same rows (each run a separate process): the
    measured row whose ms is the median of those measured (the lower middle one for an even
    count), noted with the count and range; a key no run measured keeps its last row."""
    by_key: dict[Any, list[Row]] = {}
    for run in runs:
        for r in run:
            by_key.setdefault(r.key, []).append(r)
    out: list[Row] = []
    for same in by_key.values():
        timed = sorted((r for r in same if not r.error and _finite(r.ms)), key=lambda r: r.ms)
        if len(timed) < 2 or same[0].source == "stored":
            out.append(timed[0] if timed else same[-1])
            continue
        row = dataclasses.replace(timed[(len(timed) - 1) // 2])
        spread = f"median of {len(timed)} runs ({timed[0].ms:.3f}-{timed[-1].ms:.3f} ms)"
        row.note = f"{row.note}; {spread}" if row.note else spread
        out.append(row)
    return out


def plan_tasks(mine: list[tuple[zoo_models.ZooModel, int, str]], paths: list[str], baseline: Baseline | None,
               anchors: set[tuple[str, int, str]], args: argparse.Namespace) -> tuple[list[Row], list[Task], list[Task]]:
    """One model's rows (its (model, batch, dtype) groups `mine`): the stored reduce-overhead rows
    it reuses, the tasks of its first worker process and those of a second (kiln.compile apart
    from torch.compile unless --share-process)."""
    stored_rows: list[Row] = []
    first: list[Task] = []
    second: list[Task] = []
    for m, b, d in mine:
        first.append(Task(m.name, b, d, "eager"))
        if baseline is not None:
            stored = baseline.stored_row(m, b, d)
            if args.baseline == "reuse" and stored is not None:
                stored_rows.append(stored)
            if args.baseline == "measure" or stored is None or (m.name, b, d) in anchors:
                first.append(Task(m.name, b, d, "ro"))
        if "dynamo" in paths:
            first.append(Task(m.name, b, d, "kiln"))
        if "aot" in paths:
            (first if args.share_process else second).append(Task(m.name, b, d, "kiln-aot"))
    return stored_rows, first, second


def unmeasured(rows: list[Row], tasks: list[Task]) -> list[list[Any]]:
    """The tasks no row answers (the time budget ended first): [model, batch, dtype, backend]."""
    have = {r.key for r in rows}
    return [[t.model, t.batch, t.dtype, t.backend] for t in tasks if t.key not in have]


def merge(folders: list[Path], out: Path, baseline_dir: Path, docs: bool, median: bool = False) -> int:
    """Joins the results of runs made side by side (--shard) into one table, and the
    reduce-overhead rows they measured into the stored baselines of `baseline_dir`. With
    `median`, the folders are repeated runs of the same rows instead: each row is the median
    one (median_rows)."""
    rows: list[Row] = []
    runs: list[list[Row]] = []
    header: dict[str, Any] | None = None
    missing: set[tuple[Any, ...]] | None = set()
    for folder in folders:
        found = json.loads((folder / "zoo.json").read_text())
        runs.append([Row.from_dict(r) for r in found["rows"]])
        rows = join_rows(rows, runs[-1])
        header = header or found["header"]
        # What a run left unmeasured stays missing unless another run measured it; a stopped run
        # that did not list its missing rows (older files) leaves the whole table incomplete.
        if missing is not None and found["header"].get("stopped") and "missing" not in found["header"]:
            missing = None
        elif missing is not None:
            missing |= {tuple(k) for k in found["header"].get("missing", [])}
        for path in sorted((folder / "baseline").glob("*.json")):
            measured = json.loads(path.read_text())
            stored = Baseline(baseline_dir / path.name, measured["device"])
            stored.data["rows"].update(measured["rows"])
            stored.write()
            log.info("%d reduce-overhead rows of %s joined into %s", len(measured["rows"]), folder, stored.path)
    if header is None:
        raise SystemExit("--merge: no folder given")
    if median:
        rows = median_rows(runs)
    measured = {r.key[:4] for r in rows}
    header["missing"] = [] if missing is None else [list(k) for k in sorted(missing) if k not in measured]
    header["stopped"] = missing is None or bool(header["missing"])
    header["shards"] = len(folders)
    how = "each row the median of the runs that measured it" if median else "a later run's row replaces an earlier's"
    header["baseline_note"] = (f"joined from {len(folders)} runs (zoo.py --merge, {how}); where measured, in those "
                               "runs (ro rows marked stored: benchmarks/zoo_baseline)")
    table = write_results(out, rows, header)
    if docs:
        write_docs(table)
    log.info("\n%s", table)
    return 0


def parse_list(text: str, valid: dict[str, str] | None = None, what: str = "") -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if valid is None:
        return items
    bad = [x for x in items if x.lower() not in valid]
    if bad:
        raise SystemExit(f"unknown {what} {', '.join(bad)}; valid: {', '.join(sorted(set(valid)))}")
    return list(dict.fromkeys(valid[x.lower()] for x in items))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", default="all", help="names, shell-style globs or families, comma-separated")
    parser.add_argument("--batches", default="1,32", help="a batch over a model's max batch becomes that")
    parser.add_argument("--dtypes", default="fp16,bf16",
                        help="fp16, bf16 (models that list it: the transformers), fp32 (every model)")
    parser.add_argument("--paths", default="dynamo,aot", help="Kiln entry points: dynamo (torch.compile), aot "
                        "(kiln.compile); empty for none")
    parser.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    parser.add_argument("--small", action="store_true", help="the models' small variants (smoke runs)")
    parser.add_argument("--runs", type=int, default=None, help="timed runs per row (default 50 on a GPU, 5 on a CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 10 on a GPU, 2 on a CPU)")
    parser.add_argument("--baseline", choices=("reuse", "measure", "skip"), default="reuse")
    parser.add_argument("--baseline-dir", default=str(HERE / "zoo_baseline"))
    parser.add_argument("--anchors", type=int, default=3, help="stored ro rows re-measured to report drift (reuse)")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds after which no row starts")
    parser.add_argument("--row-timeout", type=float, default=600.0, help="seconds a row may take (start-up included)")
    parser.add_argument("--share-process", action="store_true",
                        help="both Kiln paths in one worker per model (fewer start-ups; on a GPU the second "
                        "path's compile then finds the first's timing-cache entries)")
    parser.add_argument("--out", default="zoo-results", help="folder of zoo.json and zoo.md")
    parser.add_argument("--resume", action="store_true", help="keep the rows of OUT/zoo.json, run the rest")
    parser.add_argument("--resume-from", metavar="JSON", help="keep the rows of these zoo.json files "
                        "(comma-separated), run the rest")
    parser.add_argument("--shard", metavar="I/N", help="only models I, I+N, I+2N, ... of the selection (0-based): "
                        "one of N runs side by side, e.g. one per GPU (scripts/zoo_gpus.sh)")
    parser.add_argument("--merge", metavar="DIR", help="run nothing: join the zoo.json of these OUT folders "
                        "(comma-separated) into --out, and their measured reduce-overhead rows into "
                        "--baseline-dir")
    parser.add_argument("--median", action="store_true", help="with --merge: the folders are repeated runs of "
                        "the same rows (one process each); each row is the median run's")
    parser.add_argument("--write-docs", action="store_true", help=f"also write the table into {DOCS}")
    parser.add_argument("--list", action="store_true", help="list the zoo and exit")
    parser.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.worker:
        return worker(args.worker)
    if args.list:
        for m in zoo_models.MODELS.values():
            sys.stdout.write(f"{m.name:20s} {m.family:18s} max batch {m.max_batch:3d}  {','.join(m.dtypes):9s} "
                             f"{m.description}\n")
        return 0

    start = time.time()
    deadline = start + args.time_budget if args.time_budget is not None else None
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: PyTorch sees no CUDA device")
    args.runs = args.runs or (50 if on_gpu else 5)
    args.warmup = args.warmup if args.warmup is not None else (10 if on_gpu else 2)
    models = zoo_models.select(args.models)
    if args.shard:
        models = models[shard_slice(args.shard)]
    batches = [int(b) for b in parse_list(args.batches)]
    dtypes = parse_list(args.dtypes, DTYPE_ALIASES, "dtype")
    paths = parse_list(args.paths, {k: k for k in PATHS}, "path")
    name = device_name(device)
    groups = plan_groups(models, batches, dtypes)

    baseline = None
    anchors: set[tuple[str, int, str]] = set()
    if args.baseline != "skip":
        baseline = Baseline(Path(args.baseline_dir) / f"{slug(name)}{'-small' if args.small else ''}.json", name)
        if args.baseline == "reuse":
            anchors = choose_anchors(groups, baseline, args.anchors)
    note = {"skip": "not run", "measure": f"measured here, written to {baseline.path if baseline else ''}",
            "reuse": f"stored numbers of {baseline.path.name if baseline else ''}, {len(anchors)} anchor row(s) "
                     "re-measured, rows with no stored number measured"}[args.baseline]
    header = {"device": device, "device_name": name, "versions": versions(), "runs": args.runs,
              "small": args.small, "baseline": args.baseline, "baseline_note": note, "paths": paths,
              "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "stopped": False}

    out = Path(args.out)
    if args.merge:
        return merge([Path(d) for d in parse_list(args.merge)], out, Path(args.baseline_dir), args.write_docs,
                     args.median)
    rows: list[Row] = []
    earlier = [Path(p) for p in parse_list(args.resume_from)] if args.resume_from else \
        [out / "zoo.json"] if args.resume and (out / "zoo.json").exists() else []
    for path in earlier:
        rows = join_rows(rows, [Row.from_dict(r) for r in json.loads(path.read_text())["rows"]])
        log.info("resuming: rows kept from %s (%d in all)", path, len(rows))
    have = {r.key for r in rows}

    runner = Runner(args, device, header, out, rows, baseline, anchors, deadline)
    plans = [(model, *plan_tasks([g for g in groups if g[0] is model], paths, baseline, anchors, args))
             for model in models]
    try:
        for model, stored, first, second in plans:
            for row in stored:
                runner.add(row)
            for tasks in (first, second):
                todo = [t for t in tasks if t.key not in have]
                if todo:
                    runner.run(model, todo)
                if runner.stopped:
                    break
            if runner.stopped:
                break
    finally:
        shutil.rmtree(runner.workdir, ignore_errors=True)
    header["missing"] = unmeasured(rows, [t for _, _, first, second in plans for t in first + second])
    header["stopped"] = runner.stopped
    header["seconds"] = round(time.time() - start, 1)
    table = write_results(out, rows, header)
    if args.write_docs:
        write_docs(table)
    log.info("\n%s", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
