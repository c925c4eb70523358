"""Tuning configuration: one validated object, from code or from a JSON (or TOML) file.

Fields (defaults in brackets):
    backends                 candidates [eager, kiln-jit, kiln-aot, inductor, inductor-reduce-overhead]
    strategy                 how the winner is chosen [min_latency]
    warmup, runs             untimed and timed calls per sample and candidate [3, 20]
    max_samples              inputs recorded per module for tuning [4]
    tolerances               largest relative error accepted, per compute precision
                             [float64 1e-6, float32 3e-3, float16 1e-2, bfloat16 5e-2]
    reject_slower_than_eager reject a candidate slower than eager [true]
    slower_margin            ... by more than this fraction of eager's time [0.0]
    compare_whole            also time every candidate on the whole model and lift the best to the root
                             when it beats the wrappers' choices together [true]
    progress, report         progress bar / result table on stderr [true, true]
    report_path              where the JIT hook writes the JSON report at exit [none]
    cache, cache_dir         reuse and store choices in the tuning cache [false; true under the JIT hook],
                             [$XDG_CACHE_HOME/kiln/tune, else ~/.cache/kiln/tune]
    calls_before_tuning      JIT hook: calls recorded before a module is tuned [1]
    min_params               JIT hook: tune only modules with at least this many parameters [1]
    include, exclude         JIT hook: class-name patterns (fnmatch) to tune / to leave alone [all, none]

Environment (read by :func:`load_config`): ``KILN_TUNE_CONFIG`` (the file), ``KILN_TUNE_CACHE_DIR``,
``KILN_TUNE_REPORT`` (report_path) and ``KILN_TUNE_QUIET=1`` (no progress bar, no table).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from kiln.tune.backends import Backend, Eager, Inductor, KilnAot, KilnJit, backend_from_spec
from kiln.tune.strategies import MinLatency, Strategy, strategy_from_spec

__all__ = ["TuneConfig", "load_config", "default_backends", "default_cache_dir", "DEFAULT_TOLERANCES"]

DEFAULT_TOLERANCES: dict[str, float] = {"float64": 1e-6, "float32": 3e-3, "float16": 1e-2, "bfloat16": 5e-2}
_TRUE = {"1", "true", "yes", "on"}


def default_backends() -> tuple[Backend, ...]:
    return (Eager(), KilnJit(), KilnAot(), Inductor(), Inductor("reduce-overhead"))


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kiln", "tune")


def _int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"kiln.tune config: {name!r} must be an int >= {lo}, got {value!r}")
    return value


def _patterns(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"kiln.tune config: {name!r} must be a list of class-name patterns, got {value!r}")
    return tuple(value)


@dataclasses.dataclass(frozen=True)
class TuneConfig:
    backends: Sequence[Backend | str | Mapping[str, Any]] = dataclasses.field(default_factory=default_backends)
    strategy: Strategy | str | Mapping[str, Any] = dataclasses.field(default_factory=MinLatency)
    warmup: int = 3
    runs: int = 20
    max_samples: int = 4
    tolerances: Mapping[str, float] = dataclasses.field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    reject_slower_than_eager: bool = True
    slower_margin: float = 0.0
    compare_whole: bool = True
    progress: bool = True
    report: bool = True
    report_path: str | None = None
    cache: bool = False
    cache_dir: str = dataclasses.field(default_factory=default_cache_dir)
    calls_before_tuning: int = 1
    min_params: int = 1
    include: Sequence[str] = ()
    exclude: Sequence[str] = ()

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if isinstance(self.backends, (str, Mapping, Backend)) or not isinstance(self.backends, Sequence):
            raise ValueError(f"kiln.tune config: 'backends' must be a list, got {self.backends!r}")
        backends = tuple(backend_from_spec(b) for b in self.backends)
        names = [b.name for b in backends]
        if len(set(names)) != len(names):
            raise ValueError(f"kiln.tune config: backend names must differ (give each a name=): {names}")
        set_(self, "backends", backends)
        set_(self, "strategy", strategy_from_spec(self.strategy))
        set_(self, "warmup", _int("warmup", self.warmup, 0))
        set_(self, "runs", _int("runs", self.runs, 1))
        set_(self, "max_samples", _int("max_samples", self.max_samples, 1))
        set_(self, "calls_before_tuning", _int("calls_before_tuning", self.calls_before_tuning, 1))
        set_(self, "min_params", _int("min_params", self.min_params, 0))
        tolerances = dict(DEFAULT_TOLERANCES)
        for key, value in dict(self.tolerances).items():
            if key not in DEFAULT_TOLERANCES:
                raise ValueError(f"kiln.tune config: tolerance for {key!r}: not a precision "
                                 f"({', '.join(DEFAULT_TOLERANCES)})")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"kiln.tune config: tolerance for {key!r} must be a number >= 0, got {value!r}")
            tolerances[key] = float(value)
        set_(self, "tolerances", tolerances)
        for key in ("reject_slower_than_eager", "compare_whole", "progress", "report", "cache"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"kiln.tune config: {key!r} must be a bool, got {getattr(self, key)!r}")
        margin = self.slower_margin
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not (0 <= margin < math.inf):
            raise ValueError(f"kiln.tune config: 'slower_margin' must be a fraction >= 0, got {margin!r}")
        set_(self, "slower_margin", float(margin))
        for key in ("report_path", "cache_dir"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ValueError(f"kiln.tune config: {key!r} must be a path, got {value!r}")
            set_(self, key, None if value is None else os.fspath(value))
        set_(self, "include", _patterns("include", self.include))
        set_(self, "exclude", _patterns("exclude", self.exclude))

    @property
    def backend_list(self) -> list[Backend]:
        return list(self.backends)  # type: ignore[arg-type]  # normalized in __post_init__

    @property
    def strategy_obj(self) -> Strategy:
        assert isinstance(self.strategy, Strategy)
        return self.strategy

    def replace(self, **changes: Any) -> TuneConfig:
        _check_keys(changes)
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["backends"] = [b.to_json() for b in self.backend_list]
        out["strategy"] = self.strategy_obj.to_json()
        out["include"], out["exclude"] = list(self.include), list(self.exclude)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TuneConfig:
        if not isinstance(data, Mapping):
            raise ValueError(f"kiln.tune config: expected an object of settings, got {type(data).__name__}")
        _check_keys(data)
        return cls(**dict(data))


def _check_keys(data: Mapping[str, Any]) -> None:
    valid = [f.name for f in dataclasses.fields(TuneConfig)]
    for key in data:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"kiln.tune config: unknown setting {key!r}{hint}; valid: {', '.join(valid)}")


def _read_file(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        raw = f.read()
    if path.endswith(".toml"):
        try:
            import tomllib  # type: ignore[import-not-found,unused-ignore]
        except ImportError:  # Python 3.10
            raise ValueError(f"kiln.tune config: {path}: TOML needs Python 3.11 or later; use JSON") from None
        return dict(tomllib.loads(raw.decode()))
    try:
        data = json.loads(raw)
    except ValueError as err:
        raise ValueError(f"kiln.tune config: {path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"kiln.tune config: {path} must hold a JSON object")
    return data


def load_config(path: str | os.PathLike[str] | None = None, *, jit: bool = False,
                env: Mapping[str, str] | None = None) -> TuneConfig:
    """The config of a file (default: ``$KILN_TUNE_CONFIG``; none: the defaults) with the
    environment's overrides. ``jit=True`` turns the tuning cache on unless the file sets it."""
    env = os.environ if env is None else env
    path = path if path is not None else env.get("KILN_TUNE_CONFIG") or None
    data = _read_file(os.fspath(path)) if path is not None else {}
    if jit:
        data.setdefault("cache", True)
    if env.get("KILN_TUNE_CACHE_DIR"):
        data["cache_dir"] = env["KILN_TUNE_CACHE_DIR"]
    if env.get("KILN_TUNE_REPORT"):
        data["report_path"] = env["KILN_TUNE_REPORT"]
    if env.get("KILN_TUNE_QUIET", "").lower() in _TRUE:
        data["progress"] = data["report"] = False
    return TuneConfig.from_json(data)
