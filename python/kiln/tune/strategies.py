"""How the winner is chosen among the accepted candidates.

Every strategy chooses among candidates whose status is ``ok``: they compile, run, match eager
within the tolerance and (unless disabled in the config) are not slower than eager. Eager is
always measured and always ok, so every choice has a fallback.

    OneBackend(b)          b if it is accepted, else eager
    FirstThatWorks([..])   the first accepted backend in the order (later ones are not measured)
    MinLatency()           the lowest median latency
    MaxThroughput()        the highest throughput (items per second, calls issued back to back)
    LatencyBudget(ms)      the most accurate candidate whose latency (p90 by default) is within
                           ``ms``; none within it: the fastest

A strategy is one class with a ``kind``; defining it registers it for config files.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from kiln.tune.backends import Backend, backend_from_spec
from kiln.tune.results import CandidateResult

__all__ = ["Strategy", "OneBackend", "FirstThatWorks", "MinLatency", "MaxThroughput", "LatencyBudget",
           "strategy_from_spec"]

_REGISTRY: dict[str, type[Strategy]] = {}


class Strategy(abc.ABC):
    kind: ClassVar[str] = ""
    metric: ClassVar[str] = "latency"  # what "slower than eager" compares: "latency" or "throughput"
    stops_at_first_ok: ClassVar[bool] = False  # measure candidates in order and stop at the first accepted

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if kind:
            _REGISTRY[kind] = cls

    def candidates(self, default: Sequence[Backend]) -> list[Backend]:
        """The backends to try, given those configured."""
        return list(default)

    @abc.abstractmethod
    def select(self, results: Sequence[CandidateResult], order: Sequence[str]) -> tuple[str, str]:
        """(winner's backend name, why) among ``results`` (eager's included); ``order`` is the
        candidates' names in the order they were given."""

    def config(self) -> dict[str, Any]:
        return {}

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.config()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.config().items())})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Strategy) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.kind)


def _eager(results: Sequence[CandidateResult]) -> CandidateResult:
    return next(r for r in results if r.reference)


def _ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.2f}x" if denominator > 0 else "-"


class OneBackend(Strategy):
    kind = "one"

    def __init__(self, backend: Backend | str | Mapping[str, Any]) -> None:
        self.backend = backend_from_spec(backend)

    def candidates(self, default: Sequence[Backend]) -> list[Backend]:
        return [self.backend]

    def select(self, results: Sequence[CandidateResult], order: Sequence[str]) -> tuple[str, str]:
        mine = next((r for r in results if r.backend == self.backend.name), None)
        if mine is not None and mine.ok:
            return mine.backend, "the one backend asked for; it works"
        why = f"{mine.status}: {mine.reason}" if mine is not None else "not measured"
        return _eager(results).backend, f"{self.backend.name} was rejected ({why}); eager"

    def config(self) -> dict[str, Any]:
        return {"backend": self.backend.to_json()}


class FirstThatWorks(Strategy):
    kind = "first_that_works"
    stops_at_first_ok = True

    def __init__(self, backends: Sequence[Backend | str | Mapping[str, Any]] | None = None) -> None:
        self.backends = None if backends is None else [backend_from_spec(b) for b in backends]

    def candidates(self, default: Sequence[Backend]) -> list[Backend]:
        return list(self.backends if self.backends is not None else default)

    def select(self, results: Sequence[CandidateResult], order: Sequence[str]) -> tuple[str, str]:
        by_name = {r.backend: r for r in results}
        for i, name in enumerate(order):
            r = by_name.get(name)
            if r is not None and r.ok:
                return name, "the first backend in the order that works" + (
                    f" ({', '.join(order[:i])} did not)" if i else "")
        return _eager(results).backend, "no backend in the order works; eager"

    def config(self) -> dict[str, Any]:
        return {"backends": None if self.backends is None else [b.to_json() for b in self.backends]}


class MinLatency(Strategy):
    kind = "min_latency"

    def select(self, results: Sequence[CandidateResult], order: Sequence[str]) -> tuple[str, str]:
        best = min((r for r in results if r.ok), key=lambda r: (r.latency_ms, r.latency_p90_ms))
        eager = _eager(results)
        return best.backend, (f"lowest median latency: {best.latency_ms:.3f} ms "
                              f"({_ratio(eager.latency_ms, best.latency_ms)} eager's speed)")


class MaxThroughput(Strategy):
    kind = "max_throughput"
    metric = "throughput"

    def select(self, results: Sequence[CandidateResult], order: Sequence[str]) -> tuple[str, str]:
        best = max((r for r in results if r.ok), key=lambda r: (r.throughput, -r.latency_ms))
        eager = _eager(results)
        return best.backend, (f"highest throughput: {best.throughput:.4g} items/s "
                              f"({_ratio(best.throughput, eager.throughput)} eager's)")


class LatencyBudget(Strategy):
    kind = "latency_budget"

    def __init__(self, ms: float, statistic: str = "p90") -> None:
        if not isinstance(ms, (int, float)) or isinstance(ms, bool) or not ms > 0:
            raise ValueError(f"kiln.tune: a latency budget is a positive number of milliseconds, got {ms!r}")
        if statistic not in ("median", "p90"):
            raise ValueError(f"kiln.tune: the latency budget's statistic is 'median' or 'p90', got {statistic!r}")
        self.ms, self.statistic = float(ms), statistic

    def _latency(self, r: CandidateResult) -> float:
        return r.latency_ms if self.statistic == "median" else r.latency_p90_ms

    def select(self, results: Sequence[CandidateResult], order: Sequence[str]) -> tuple[str, str]:
        ok = [r for r in results if r.ok]
        within = [r for r in ok if self._latency(r) <= self.ms]
        if within:
            best = min(within, key=lambda r: (r.error, self._latency(r)))
            return best.backend, (f"the most accurate within {self.ms:g} ms: {self.statistic} "
                                  f"{self._latency(best):.3f} ms, error {best.error:.1e}")
        best = min(ok, key=self._latency)
        return best.backend, (f"no candidate within {self.ms:g} ms ({self.statistic}); the fastest: "
                              f"{self._latency(best):.3f} ms")

    def config(self) -> dict[str, Any]:
        return {"ms": self.ms, "statistic": self.statistic}


_ALIASES = {"one_backend": "one", "first": "first_that_works", "latency": "min_latency",
            "throughput": "max_throughput", "budget": "latency_budget"}


def strategy_from_spec(spec: Strategy | str | Mapping[str, Any]) -> Strategy:
    """A strategy from an instance, a name (min_latency, max_throughput, first_that_works; dashes
    allowed) or a mapping ``{"kind": "latency_budget", "ms": 5}``."""
    if isinstance(spec, Strategy):
        return spec
    if isinstance(spec, str):
        spec = {"kind": spec}
    if not isinstance(spec, Mapping):
        raise TypeError(f"kiln.tune: a strategy is a kiln.tune.Strategy, a name or a dict, got {type(spec).__name__}")
    data = dict(spec)
    kind = str(data.pop("kind", "")).replace("-", "_")
    kind = _ALIASES.get(kind, kind)
    cls = _REGISTRY.get(kind)
    if cls is None:
        raise ValueError(f"kiln.tune: unknown strategy {spec.get('kind')!r}; valid: {', '.join(sorted(_REGISTRY))}")
    try:
        return cls(**data)
    except TypeError as err:
        raise ValueError(f"kiln.tune: strategy {kind!r}: {err}") from None
