"""Tuning: measure every candidate backend of a wrapped module on its sample inputs, reject the
ones that are wrong, fail or are slower than eager, and let the strategy choose among the rest.

Per module, in order: eager runs every sample (the reference outputs) and is timed; then each
candidate is compiled and run on every sample (compile time and first calls), its outputs are
compared with eager's (the tolerance is that of the least precise dtype it or the module computes
in), and only a correct candidate is timed. Everything runs under ``torch.no_grad()``.
With ``config.cache`` a choice found in the tuning cache is used instead, after one check of its
outputs against eager's.

Then the whole model (``tune_whole``, with ``config.compare_whole``): the same rows for every
candidate on the whole model while the wrappers pass their calls through, one for the wrappers'
choices run together, and the faster of the best whole-model backend and those choices is kept.
The whole-model comparison is not cached.
"""

from __future__ import annotations

import gc
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kiln.tune.backends import Backend, Eager, backend_from_json
from kiln.tune.cache import TuningCache, tuning_key
from kiln.tune.config import TuneConfig
from kiln.tune.fingerprint import device_name, versions
from kiln.tune.inputs import Inputs, as_samples, describe, detached_copy, input_device
from kiln.tune.measure import (
    compare_outputs,
    float_dtypes,
    memory_in_use,
    synchronize,
    time_calls,
    tolerance_for,
)
from kiln.tune.module import Choice, Module, _Recorder
from kiln.tune.results import COMPOSED, WHOLE, CandidateResult, ModuleReport, Progress, TuneReport
from kiln.tune.root import RootChoice, Runner, clear_root, install_root, passing_through, root_choice
from kiln.tune.strategies import Strategy

log = logging.getLogger("kiln.tune")

__all__ = ["tune", "tune_module", "tune_whole", "tune_at_call", "wrapped_modules", "training_sensitive", "JIT_REPORTS"]

# Reports of the modules tuned at their first call in this process (the JIT hook writes them at exit).
JIT_REPORTS: list[ModuleReport] = []


def wrapped_modules(model: torch.nn.Module) -> list[tuple[str, Module]]:
    """The ``kiln.tune.Module`` wrappers in ``model`` (the model itself included) with their paths."""
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, Module)]
    for outer, _ in found:
        for inner, _ in found:
            if inner != outer and (outer == "" or inner.startswith(outer + ".")):
                raise ValueError(f"kiln.tune: wrapped module {inner!r} is inside wrapped module {outer or '<root>'!r}; "
                                 "wrap one or the other")
    return found


def training_sensitive(module: torch.nn.Module) -> bool:
    """True when a call changes the module's state or output at random: batch norm updating its
    running statistics, or dropout, in training mode."""
    for m in module.modules():
        if not m.training:
            continue
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            return True
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:
            return True
    return False


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(err).__name__}: {first[:200]}"


def _config_json(backend: Backend) -> dict[str, Any]:
    try:
        return backend.config()
    except TypeError as err:
        return {"unstorable": str(err)}


def _eager_row(name: str, module: torch.nn.Module, samples: Sequence[Inputs], config: TuneConfig,
               device: torch.device) -> tuple[CandidateResult, list[Any]]:
    row = CandidateResult(name, Eager.kind, {}, status="ok", reference=True, error=0.0)
    try:
        refs = [s.call(module) for s in samples]
        timing = time_calls(module, samples, warmup=config.warmup, runs=config.runs, device=device)
    except Exception as err:
        raise RuntimeError(f"kiln.tune: the module raised on its own sample inputs ({_short(err)})") from err
    row.latency_ms, row.latency_p90_ms, row.throughput = timing.median_ms, timing.p90_ms, timing.throughput
    return row, refs


def _candidate_row(backend: Backend, module: torch.nn.Module, samples: Sequence[Inputs], refs: Sequence[Any],
                   eager_dtypes: set[torch.dtype], config: TuneConfig,
                   device: torch.device) -> tuple[CandidateResult, Callable[..., Any] | None]:
    row = CandidateResult(backend.name, backend.kind, _config_json(backend))
    why = backend.unavailable(device)
    if why:
        row.status, row.reason = "unavailable", why
        return row, None
    row.tolerance = tolerance_for(eager_dtypes | backend.precisions(), config.tolerances)
    gc.collect()
    before = memory_in_use(device)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn = backend.compile(module, samples)
            outs = [s.call(fn) for s in samples]
            synchronize(device)
        except Exception as err:  # noqa: BLE001 - any failure rejects the candidate, with its reason
            log.info("kiln.tune: %s failed", backend.name, exc_info=log.isEnabledFor(logging.DEBUG))
            row.status, row.reason = "failed", _short(err)
            return row, None
    row.compile_s = time.perf_counter() - t0
    notes = list(dict.fromkeys(str(w.message).splitlines()[0][:160] for w in caught))
    for note in notes:
        log.info("kiln.tune: %s warned: %s", backend.name, note)
    compared = [compare_outputs(o, r) for o, r in zip(outs, refs)]
    row.error = max(e for e, _ in compared)
    problem = next((p for _, p in compared if p), "")
    if problem or not row.error <= row.tolerance:
        row.status = "wrong"
        row.reason = problem or f"error {row.error:.1e} above the tolerance {row.tolerance:.0e}"
        return row, None
    try:
        timing = time_calls(fn, samples, warmup=config.warmup, runs=config.runs, device=device)
    except Exception as err:  # noqa: BLE001
        row.status, row.reason = "failed", f"while timing: {_short(err)}"
        return row, None
    row.latency_ms, row.latency_p90_ms, row.throughput = timing.median_ms, timing.p90_ms, timing.throughput
    row.memory_mib = max(0, memory_in_use(device) - before) / 2**20
    row.status, row.reason = "ok", "; ".join(notes)
    return row, fn


def _slower(row: CandidateResult, eager: CandidateResult, strategy: Strategy, margin: float) -> str:
    if strategy.metric == "throughput":
        if row.throughput < eager.throughput / (1 + margin):
            return f"slower than eager: {row.throughput:.4g} vs {eager.throughput:.4g} items/s"
    elif row.latency_ms > eager.latency_ms * (1 + margin):
        return f"slower than eager: {row.latency_ms:.3f} vs {eager.latency_ms:.3f} ms"
    return ""


def _from_cache(mod: Module, samples: Sequence[Inputs], entry: dict[str, Any], config: TuneConfig,
                device: torch.device) -> Choice | None:
    """The cached choice, compiled and checked against eager on ``samples``; None if it fails."""
    try:
        backend = backend_from_json(entry["choice"])
        report = ModuleReport.from_json(entry["report"])
        refs = [s.call(mod.module) for s in samples]
        fn = backend.compile(mod.module, samples)
        tol = tolerance_for(float_dtypes(mod.module, samples) | backend.precisions(), config.tolerances)
        for sample, ref in zip(samples, refs):
            error, problem = compare_outputs(sample.call(fn), ref)
            if problem or not error <= tol:
                raise ValueError(problem or f"error {error:.1e} above the tolerance {tol:.0e}")
    except Exception as err:  # noqa: BLE001 - a cache entry that does not work is a miss
        log.warning("kiln.tune: %s: the cached choice does not work here (%s); tuning again", mod.name, _short(err))
        return None
    report.name, report.source = mod.name, "cache"
    return Choice(backend, fn, report, "cache", config)


def _measure(label: str, module: torch.nn.Module, samples: Sequence[Inputs], strategy: Strategy,
             candidates: Sequence[Backend], config: TuneConfig, device: torch.device, progress: Progress,
             fresh: Callable[[], torch.nn.Module] | None = None) -> \
        tuple[list[CandidateResult], dict[str, Callable[..., Any]], Backend | None, list[Any]]:
    """Eager's row and reference outputs, then every candidate's row (the strategy's order and
    skipping rule, the slower-than-eager rule); the compiled forms of the accepted ones by name.
    ``fresh``: each candidate compiles its own equivalent of ``module`` made by it."""
    eager_candidate = next((b for b in candidates if isinstance(b, Eager)), None)
    if eager_candidate is None and "eager" in [b.name for b in candidates]:
        raise ValueError(f"kiln.tune: {label}: the name 'eager' is the reference's; give the candidate "
                         "another name")
    progress.step(f"{label}: eager")
    eager, refs = _eager_row(eager_candidate.name if eager_candidate else "eager", module, samples, config, device)
    eager_dtypes = float_dtypes(module, samples)
    results = [eager]
    fns: dict[str, Callable[..., Any]] = {eager.backend: module}
    order = [b.name for b in candidates]
    done = strategy.stops_at_first_ok and order[:1] == [eager.backend]
    for backend in candidates:
        if backend is eager_candidate:
            done = done or strategy.stops_at_first_ok
            continue
        if done:
            results.append(CandidateResult(backend.name, backend.kind, _config_json(backend), status="skipped",
                                           reason="an earlier backend in the order works"))
            progress.step(f"{label}: {backend.name} (skipped)")
            continue
        progress.step(f"{label}: {backend.name}")
        target = fresh() if fresh is not None else module
        row, fn = _candidate_row(backend, target, samples, refs, eager_dtypes, config, device)
        if row.ok and config.reject_slower_than_eager:
            slower = _slower(row, eager, strategy, config.slower_margin)
            if slower:
                row.status, row.reason, fn = "slower", slower, None
        results.append(row)
        if fn is not None:
            fns[row.backend] = fn
        done = strategy.stops_at_first_ok and row.ok
    return results, fns, eager_candidate, refs


def tune_module(mod: Module, samples: Sequence[Inputs], config: TuneConfig, progress: Progress | None = None) -> \
        ModuleReport:
    """Tunes one wrapped module on ``samples`` and installs the winner in it."""
    module = mod.module
    strategy, candidates = mod.strategy_and_candidates(config)
    device = input_device(samples, module)
    started = time.perf_counter()
    cache, key = None, ""
    with torch.no_grad():
        if config.cache:
            try:
                key = tuning_key(module, samples, candidates, strategy, config, device)
                cache = TuningCache(config.cache_dir)
            except TypeError as err:
                log.warning("kiln.tune: %s is not cached: %s", mod.name, err)
            entry = cache.get(key) if cache is not None else None
            if entry is not None:
                (progress or Progress(1, config.progress)).step(f"{mod.name}: cached choice")
                choice = _from_cache(mod, samples, entry, config, device)
                if choice is not None:
                    mod.set_choice(choice)
                    assert choice.report is not None
                    return choice.report
        progress = progress if progress is not None else Progress(1 + len(candidates), config.progress)
        results, fns, eager_candidate, _ = _measure(mod.name, module, samples, strategy, candidates, config, device,
                                                    progress)
        order = [b.name for b in candidates]
        winner, reason = strategy.select(results, order)
    by_name = {b.name: b for b in candidates}
    backend = by_name.get(winner) or eager_candidate or Eager(winner)
    report = ModuleReport(mod.name, strategy.to_json(), winner, reason, "tuned", len(samples),
                          list(dict.fromkeys(describe(s) for s in samples)), results, time.perf_counter() - started)
    mod.set_choice(Choice(backend, fns[winner], report, "tuned", config))
    fns.clear()
    gc.collect()
    if cache is not None:
        cache.put(key, backend.to_json(), report.to_json())
    log.info("kiln.tune: %s -> %s (%s)", mod.name, winner, reason)
    return report


class _Composed(Backend):
    """The wrappers' own choices run together: the model as tuning left it (compiled already)."""

    def __init__(self, precisions: frozenset[torch.dtype]) -> None:
        super().__init__(COMPOSED)
        self._precisions = precisions

    def compile(self, module: torch.nn.Module, samples: Sequence[Inputs]) -> Callable[..., Any]:
        return module

    def precisions(self) -> frozenset[torch.dtype]:
        return self._precisions


def _speed(row: CandidateResult, metric: str) -> str:
    return f"{row.throughput:.4g} items/s" if metric == "throughput" else f"{row.latency_ms:.3f} ms"


def _faster(row: CandidateResult, than: CandidateResult, metric: str) -> bool:
    return row.throughput > than.throughput if metric == "throughput" else row.latency_ms < than.latency_ms


def tune_whole(model: torch.nn.Module, wrappers: Sequence[Module], samples: Sequence[Inputs], config: TuneConfig,
               progress: Progress) -> ModuleReport:
    """Times every candidate of the config's strategy on the whole model, the wrappers passing
    their calls through, and the wrappers' tuned choices run together (the same measurement and
    check against eager); when a whole-model backend beats those by the strategy's metric, lifts
    it to the root (see kiln.tune.root). Returns the whole-model report."""
    strategy = config.strategy_obj
    candidates = strategy.candidates(config.backend_list)
    recorder = _Recorder(config.max_samples)
    for sample in samples:
        recorder.add(sample.args, sample.kwargs)
    samples = recorder.samples
    runner = Runner(model)
    device = input_device(samples, model)
    started = time.perf_counter()
    with torch.no_grad():
        with passing_through(wrappers):
            results, fns, eager_candidate, refs = _measure(WHOLE, runner, samples, strategy, candidates, config,
                                                           device, progress, fresh=lambda: Runner(model))
        progress.step(f"{WHOLE}: {COMPOSED}")
        precisions = frozenset(p for w in wrappers if w.choice is not None for p in w.choice.precisions())
        composed, _ = _candidate_row(_Composed(precisions), runner, samples, refs, float_dtypes(runner, samples),
                                     config, device)
    composed.kind, composed.reason = COMPOSED, composed.reason or "the wrappers' own choices"
    metric = strategy.metric
    best = min((r for r in results if r.ok), key=lambda r: (-r.throughput, r.latency_ms) if metric == "throughput"
               else (r.latency_ms, r.latency_p90_ms))
    versus = f"{_speed(composed, metric)} per module" if composed.ok else \
        f"the wrappers' choices together, {composed.status} ({composed.reason})"
    if composed.ok and not _faster(best, composed, metric):
        winner = COMPOSED
        reason = (f"kept: {_speed(composed, metric)} per module; the best on the whole model, {best.backend}: "
                  f"{_speed(best, metric)}")
    else:
        winner = best.backend
        reason = f"lifted to the root: {_speed(best, metric)} on the whole model vs {versus}"
    report = ModuleReport(WHOLE, strategy.to_json(), winner, reason, "tuned", len(samples),
                          list(dict.fromkeys(describe(s) for s in samples)), results + [composed],
                          time.perf_counter() - started)
    if winner == COMPOSED:
        install_root(model, RootChoice(model, None, None, report, "tuned", config))
    else:
        backend = next((b for b in candidates if b.name == winner), None) or eager_candidate or Eager(winner)
        for wrapper in wrappers:
            wrapper.supersede(f"by {winner} on the whole model: {_speed(best, metric)} vs {versus}")
        install_root(model, RootChoice(model, backend, fns[winner], report, "tuned", config))
    fns.clear()
    gc.collect()
    log.info("kiln.tune: %s -> %s (%s)", WHOLE, winner, reason)
    return report


def tune(model: torch.nn.Module, data: Any, *, config: TuneConfig | None = None,
         modules: Sequence[str] | None = None) -> TuneReport:
    """Tunes every wrapped module of ``model`` (or those at the paths in ``modules``) on the inputs
    each receives while ``model`` runs on ``data``; then, with ``config.compare_whole``, compares
    every candidate on the whole model with the wrappers' choices together (``tune_whole``).
    Returns the report. Tuning the whole model again undoes an earlier whole-model choice first."""
    config = config if config is not None else TuneConfig()
    samples = as_samples(data)
    wrapped = wrapped_modules(model)
    if not wrapped:
        raise ValueError("kiln.tune.tune: the model has no wrapped module; use kiln.tune.wrap or kiln.tune.Module")
    if modules is not None:
        unknown = set(modules) - {p for p, _ in wrapped}
        if unknown:
            raise ValueError(f"kiln.tune.tune: no wrapped module at {sorted(unknown)}; "
                             f"wrapped: {[p for p, _ in wrapped]}")
        lifted = root_choice(model)
        if lifted is not None and (lifted.lifted or lifted.retune):
            raise ValueError("kiln.tune.tune: a backend on the whole model supersedes the wrappers; tune the whole "
                             "model (modules=None) to compare again")
        wrapped = [(p, m) for p, m in wrapped if p in set(modules)]
    for path, mod in wrapped:
        if training_sensitive(mod.module):
            raise ValueError(f"kiln.tune.tune: {path or '<root>'} is in training mode with batch norm or dropout, "
                             "which tuning's repeated calls would change; call model.eval() first")
    if modules is None:
        clear_root(model)  # undoes an earlier whole-model choice: the model is tuned from scratch
    whole = config.compare_whole and modules is None and all(path for path, _ in wrapped)
    if whole and "forward" in model.__dict__:
        log.warning("kiln.tune.tune: the model's forward is replaced on the instance; not comparing backends on "
                    "the whole model")
        whole = False
    if whole and training_sensitive(model):
        log.warning("kiln.tune.tune: the model is in training mode with batch norm or dropout; not comparing "
                    "backends on the whole model (call model.eval() first)")
        whole = False
    for _, mod in wrapped:
        mod.set_choice(None)
        mod.start_recording((mod.config or config).max_samples)
    try:
        with torch.no_grad():
            for sample in samples:
                sample.call(model)
    finally:
        recorded = {path: mod.stop_recording() for path, mod in wrapped}
    def steps_of(candidates: Sequence[Backend]) -> int:  # eager's, then every other candidate's
        return 1 + sum(1 for b in candidates if not isinstance(b, Eager))

    steps = sum(steps_of(mod.strategy_and_candidates(mod.config or config)[1]) for _, mod in wrapped)
    steps += 1 + steps_of(config.strategy_obj.candidates(config.backend_list)) if whole else 0
    progress = Progress(steps, config.progress)
    report = TuneReport(device=device_name(input_device(samples, model)), versions=versions())
    try:
        for path, mod in wrapped:
            if not recorded[path]:
                log.warning("kiln.tune.tune: %s was not called on the data; it stays untuned (eager)", path or "<root>")
                continue
            report.modules.append(tune_module(mod, recorded[path], mod.config or config, progress))
        if whole:
            report.whole = tune_whole(model, [mod for _, mod in wrapped], samples, config, progress)
    finally:
        progress.close()
    if config.report and report.modules:
        progress.write(report.table())
    return report


def tune_at_call(mod: Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A call of an untuned ``tune_on_call`` wrapper: records it, and once enough calls are
    recorded tunes the module on them; runs the call with the winner (eagerly before)."""
    config = mod.config if mod.config is not None else TuneConfig()
    mod._pending.append(detached_copy(args, kwargs))
    if len(mod._pending) < config.calls_before_tuning:
        return mod.module(*args, **kwargs)
    samples, mod._pending = mod._pending, []
    log.info("kiln.tune: tuning %s on its first %d call(s)", mod.name, len(samples))
    try:
        report = tune_module(mod, samples, config)
    except Exception as err:  # noqa: BLE001 - a tuning that breaks leaves the module eager, not the program
        log.warning("kiln.tune: tuning %s failed (%s); it runs eagerly", mod.name, _short(err),
                    exc_info=log.isEnabledFor(logging.DEBUG))
        mod.set_choice(Choice(Eager(), mod.module, None, "tuned", config))
        return mod.module(*args, **kwargs)
    JIT_REPORTS.append(report)
    if config.report:
        Progress(1, config.progress).write(report.table())
    choice = mod._choice
    assert choice is not None and choice.fn is not None
    return choice.fn(*args, **kwargs)
