"""What tuning found: per module every candidate's status and measurements, the winner and why;
as JSON and as a terminal table, and the progress bar shown while tuning.

Candidate statuses: ``ok`` (accepted; eager is always ok: it is the reference), ``wrong`` (its
outputs differ from eager's beyond the tolerance), ``failed`` (compiling or running raised),
``slower`` (slower than eager), ``unavailable`` (cannot run on this device) and ``skipped``
(not measured: an earlier backend already works under the first-that-works strategy).

A model whose wrapped submodules were tuned together also gets a whole-model section
(``TuneReport.whole``, a ModuleReport named "whole model"): every candidate backend on the whole
model (the wrappers passing through), one row ``per-module`` for the wrappers' own choices run
together, and the decision: ``per-module`` kept, or a backend lifted to the root.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

__all__ = ["CandidateResult", "ModuleReport", "TuneReport", "Progress", "STATUSES", "COMPOSED", "WHOLE"]

STATUSES = ("ok", "wrong", "failed", "slower", "unavailable", "skipped")
COMPOSED = "per-module"  # the whole-model report's row (and winner) for the wrappers' own choices together
WHOLE = "whole model"  # the whole-model report's name
FORMAT = "kiln.tune.report/1"


def _nan_to_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _none_to_nan(value: Any) -> float:
    return float("nan") if value is None else float(value)


@dataclasses.dataclass
class CandidateResult:
    """One backend's outcome on one module. Times in milliseconds; ``throughput`` in items
    (the first dimension of the first input) per second; ``error`` is the largest relative error
    ``||out - eager|| / ||eager||`` over the outputs and samples; ``memory_mib`` the memory that
    compiling and running it added (device memory in use on CUDA, resident memory on the CPU)."""

    backend: str
    kind: str
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    status: str = "skipped"
    reason: str = ""
    latency_ms: float = float("nan")
    latency_p90_ms: float = float("nan")
    throughput: float = float("nan")
    error: float = float("nan")
    tolerance: float = float("nan")
    compile_s: float = float("nan")
    memory_mib: float = float("nan")
    reference: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return {k: _nan_to_none(v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CandidateResult:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {k: (_none_to_nan(v) if fields[k].type == "float" else v)
                                  for k, v in data.items() if k in fields}
        return cls(**values)


@dataclasses.dataclass
class ModuleReport:
    """One module's tuning. ``source``: ``tuned`` (measured now), ``cache`` (the tuning cache's
    choice, checked against eager) or ``file`` (restored by kiln.tune.load). ``superseded``: why
    a backend on the whole model replaced this choice ("" while it stands)."""

    name: str
    strategy: dict[str, Any]
    winner: str
    reason: str
    source: str = "tuned"
    samples: int = 0
    signatures: list[str] = dataclasses.field(default_factory=list)
    candidates: list[CandidateResult] = dataclasses.field(default_factory=list)
    tune_s: float = float("nan")
    superseded: str = ""

    def candidate(self, backend: str) -> CandidateResult:
        for c in self.candidates:
            if c.backend == backend:
                return c
        raise KeyError(f"no candidate {backend!r} in the report of {self.name!r}")

    def to_json(self) -> dict[str, Any]:
        out = {k: _nan_to_none(v) for k, v in dataclasses.asdict(self).items() if k != "candidates"}
        out["candidates"] = [c.to_json() for c in self.candidates]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModuleReport:
        values = dict(data)
        values["candidates"] = [CandidateResult.from_json(c) for c in values.get("candidates", [])]
        values["tune_s"] = _none_to_nan(values.get("tune_s"))
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    def table(self) -> str:
        return _module_table(self)


@dataclasses.dataclass
class TuneReport:
    """Every tuned module's report, with the device and versions they were measured on, and the
    whole-model comparison (None when it was not made)."""

    modules: list[ModuleReport] = dataclasses.field(default_factory=list)
    device: str = ""
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    whole: ModuleReport | None = None

    @property
    def lifted(self) -> bool:
        """True when a backend on the whole model replaced the wrappers' choices."""
        return self.whole is not None and self.whole.winner != COMPOSED

    def __getitem__(self, name: str) -> ModuleReport:
        for m in self.modules:
            if m.name == name:
                return m
        raise KeyError(f"no module {name!r} in the tuning report (modules: {[m.name for m in self.modules]})")

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "device": self.device, "versions": self.versions,
                "modules": [m.to_json() for m in self.modules],
                "whole": self.whole.to_json() if self.whole is not None else None}

    def save_json(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TuneReport:
        if data.get("format") != FORMAT:
            raise ValueError(f"kiln.tune: not a tuning report (format {data.get('format')!r}, expected {FORMAT!r})")
        whole = data.get("whole")
        return cls([ModuleReport.from_json(m) for m in data.get("modules", [])], str(data.get("device", "")),
                   dict(data.get("versions", {})), ModuleReport.from_json(whole) if whole else None)

    def table(self) -> str:
        return "\n\n".join(m.table() for m in self.modules + ([self.whole] if self.whole is not None else []))

    def __str__(self) -> str:
        return self.table()


def _fmt(value: float, spec: str) -> str:
    return "-" if not math.isfinite(value) else format(value, spec)


def _module_table(report: ModuleReport) -> str:
    head = (f"kiln.tune: {report.name} ({report.source}; {report.samples} sample(s): "
            f"{'; '.join(report.signatures) or '-'}; strategy {report.strategy.get('kind', '?')})")
    columns = ["backend", "status", "median ms", "p90 ms", "items/s", "error", "compile s", "mem MiB", "note"]
    rows = [columns]
    for c in report.candidates:
        note = "reference" if c.reference and not c.reason else c.reason
        rows.append([c.backend + (" *" if c.backend == report.winner else ""), c.status, _fmt(c.latency_ms, ".3f"),
                     _fmt(c.latency_p90_ms, ".3f"), _fmt(c.throughput, ".4g"), _fmt(c.error, ".1e"),
                     _fmt(c.compile_s, ".2f"), _fmt(c.memory_mib, ".1f"), note])
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns) - 1)]
    lines = [head]
    for r in rows:
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1])
    lines.append(f"  {'decision' if report.name == WHOLE else 'winner'}: "
                 f"{report.winner}: {report.reason}")
    if report.superseded:
        lines.append(f"  superseded: {report.superseded}")
    return "\n".join(line.rstrip() for line in lines)


class Progress:
    """A progress bar on a stream (stderr by default): redrawn in place on a terminal, one line
    per step otherwise; nothing at all when disabled."""

    def __init__(self, total: int, enabled: bool = True, stream: TextIO | None = None, width: int = 24) -> None:
        self.total, self.done, self.enabled, self.width = max(total, 1), 0, enabled, width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def step(self, label: str) -> None:
        """Shows ``label`` as the step now running (after the steps done so far)."""
        if not self.enabled:
            return
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        text = f"kiln.tune [{bar}] {self.done}/{self.total} {label}"
        if self.tty:
            self.stream.write("\r\033[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.done = min(self.done + 1, self.total)

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def write(self, text: str) -> None:
        """Prints a block of text (the report table) on its own lines, whether the bar is shown or not."""
        self.close()
        self.stream.write(text + "\n")
        self.stream.flush()
