"""Choosing what to tune: ``inspect`` times every submodule of a model on sample data, ``wrap``
puts chosen submodules in ``kiln.tune.Module`` wrappers in place.

``inspect`` runs the model eagerly under ``torch.no_grad()`` (one untimed warm-up call on the
first sample, then every sample) with hooks around every submodule: a submodule's time includes
its children's, and on a GPU the device is synchronized around every submodule call so that the
time is its own (the total is then larger than an unhooked run's).
"""

from __future__ import annotations

import dataclasses
import difflib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kiln.tune.backends import Backend
from kiln.tune.config import TuneConfig
from kiln.tune.inputs import Inputs, as_samples, describe, input_device
from kiln.tune.measure import synchronize
from kiln.tune.module import Module
from kiln.tune.strategies import Strategy

__all__ = ["ModuleStats", "Inspection", "inspect", "wrap"]


@dataclasses.dataclass
class ModuleStats:
    """One submodule: its path, class, calls, total time over all calls (ms), share of the model's
    time, parameter count and the input signatures it was called with."""

    name: str
    type: str
    calls: int = 0
    total_ms: float = 0.0
    share: float = 0.0
    params: int = 0
    shapes: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Inspection(list[ModuleStats]):
    """The submodules worth tuning, the largest share of time first."""

    total_ms: float = 0.0

    def names(self) -> list[str]:
        return [s.name for s in self]

    def table(self) -> str:
        rows = [["module", "type", "share", "total ms", "calls", "params", "inputs"]]
        for s in self:
            rows.append([s.name, s.type, f"{100 * s.share:.1f}%", f"{s.total_ms:.3f}", str(s.calls), str(s.params),
                         "; ".join(s.shapes)])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        lines = [f"kiln.tune.inspect: model {self.total_ms:.3f} ms in all"]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
        return "\n".join(line.rstrip() for line in lines)

    def __str__(self) -> str:
        return self.table()


def inspect(model: torch.nn.Module, data: Any, *, min_share: float = 0.05, max_depth: int | None = None) -> Inspection:
    """The submodules of ``model`` that take at least ``min_share`` of its time on ``data``
    (at most ``max_depth`` levels deep when given), the largest share first."""
    samples = as_samples(data)
    device = input_device(samples, model)
    stats = {name: ModuleStats(name, type(m).__name__, params=sum(p.numel() for p in m.parameters()))
             for name, m in model.named_modules()}
    starts: list[float] = []
    handles = []

    def pre(name: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            shape = describe(Inputs(args, kwargs))
            if shape not in stats[name].shapes:
                stats[name].shapes.append(shape)
            synchronize(device)
            starts.append(time.perf_counter())
        return hook

    def post(name: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            synchronize(device)
            stats[name].total_ms += (time.perf_counter() - starts.pop()) * 1e3
            stats[name].calls += 1
        return hook

    with torch.no_grad():
        samples[0].call(model)
        try:
            for name, m in model.named_modules():
                handles.append(m.register_forward_pre_hook(pre(name), with_kwargs=True))
                handles.append(m.register_forward_hook(post(name), with_kwargs=True, always_call=True))
            for sample in samples:
                sample.call(model)
        finally:
            for h in handles:
                h.remove()
    total = stats[""].total_ms
    found = Inspection()
    found.total_ms = total
    for name, s in stats.items():
        if not name or s.calls == 0 or (max_depth is not None and name.count(".") >= max_depth):
            continue
        s.share = s.total_ms / total if total > 0 else 0.0
        if s.share >= min_share:
            found.append(s)
    found.sort(key=lambda s: -s.share)
    return found


def wrap(model: torch.nn.Module, names_or_types: str | type | Sequence[str | type], *,
         strategy: Strategy | str | Mapping[str, Any] | None = None,
         backends: Sequence[Backend | str | Mapping[str, Any]] | None = None,
         config: TuneConfig | None = None) -> list[Module]:
    """Replaces the named submodules (paths such as ``"encoder.layer.0"``) and every outermost
    submodule of the given classes with ``kiln.tune.Module`` wrappers, in place; returns the
    wrappers (those already wrapped included). The root cannot be wrapped in place: use
    ``kiln.tune.Module(model)``."""
    targets = [names_or_types] if isinstance(names_or_types, (str, type)) else list(names_or_types)
    modules = dict(model.named_modules())
    explicit: list[str] = []
    by_type: list[str] = []
    for t in targets:
        if isinstance(t, str):
            if t == "":
                raise ValueError("kiln.tune.wrap: the root cannot be wrapped in place; use kiln.tune.Module(model)")
            if t not in modules:
                close = difflib.get_close_matches(t, list(modules), n=3)
                hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
                raise ValueError(f"kiln.tune.wrap: the model has no submodule {t!r}{hint}")
            explicit.append(t)
        elif isinstance(t, type) and issubclass(t, torch.nn.Module):
            matched = [n for n, m in modules.items() if n and isinstance(m, t)]
            if not matched:
                raise ValueError(f"kiln.tune.wrap: the model has no submodule of type {t.__name__}")
            by_type += matched
        else:
            raise TypeError(f"kiln.tune.wrap: expected submodule paths or nn.Module classes, got {t!r}")
    for a in explicit:
        for b in explicit:
            if b.startswith(a + "."):
                raise ValueError(f"kiln.tune.wrap: {b!r} is inside {a!r}; wrap one or the other")

    def wrapped_ancestor(path: str) -> str | None:
        parts = path.split(".")
        prefixes = (".".join(parts[:i]) for i in range(len(parts)))
        return next((p for p in prefixes if isinstance(modules.get(p), Module)), None)

    for path in explicit:
        outer = wrapped_ancestor(path)
        if outer is not None:
            raise ValueError(f"kiln.tune.wrap: {path!r} is inside the wrapped module {outer or '<root>'!r}")
    by_type = [p for p in by_type if wrapped_ancestor(p) is None]  # a class's matches inside wrappers stay as they are
    chosen: list[str] = []
    for path in sorted(dict.fromkeys(explicit + by_type), key=lambda p: p.count(".")):
        if any(path.startswith(c + ".") for c in chosen):
            continue  # inside a module wrapped here: the outermost match is tuned
        chosen.append(path)
    wrappers = []
    for path in chosen:
        target = model.get_submodule(path)
        if isinstance(target, Module):
            wrappers.append(target)
            continue
        parent_path, _, child = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        wrapper = Module(target, name=path, strategy=strategy, backends=backends, config=config)
        setattr(parent, child, wrapper)
        wrappers.append(wrapper)
    return wrappers
