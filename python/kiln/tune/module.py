"""``kiln.tune.Module``: a drop-in wrapper that runs its module with the backend tuning chose.

Lifecycle of a wrapper::

    untuned --kiln.tune.tune / first calls (tune_on_call) / tuning cache--> tuned (source tuned|cache)
    untuned --kiln.tune.load, artifacts sound--> tuned (source file)
    untuned --kiln.tune.load, artifact missing or damaged--> untuned, tune_on_call (re-tuned at its first call)
    tuned --a whole-model backend lifted to the root (kiln.tune.tune, compare_whole)--> superseded

An untuned wrapper runs its module eagerly; while ``kiln.tune.tune`` runs the model it records
the inputs it sees (the tuning samples). A tuned one calls the compiled form of the chosen
backend, compiled at the first call when the choice was restored without it (a JIT backend
from a file). The wrapper keeps the wrapped module's state-dict keys (no ``module.`` in them) and
forwards attribute reads it does not have to the wrapped module, so code that reads
``model.block.weight`` or loads a checkpoint of the unwrapped model still works.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from kiln.tune.backends import Backend, backend_from_spec
from kiln.tune.inputs import Inputs, detached_copy, signature
from kiln.tune.results import ModuleReport
from kiln.tune.strategies import Strategy, strategy_from_spec

if TYPE_CHECKING:
    from kiln.tune.config import TuneConfig

__all__ = ["Module", "Choice"]

_MAX_SIGNATURES = 8


@dataclasses.dataclass
class Choice:
    """The chosen backend, its compiled form (None: compiled at the next call), the report of
    the tuning that chose it, where the choice came from (tuned, cache or file) and the config it
    was tuned with (kept by kiln.tune.save, so that a re-tune after loading uses it again)."""

    backend: Backend
    fn: Callable[..., Any] | None
    report: ModuleReport | None
    source: str
    config: TuneConfig | None = None


class _Recorder:
    """The first ``limit`` calls' inputs, plus one call of each further signature (up to 8)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.samples: list[Inputs] = []
        self.signatures: set[str] = set()

    def add(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        sig = signature(Inputs(args, dict(kwargs)))
        if len(self.samples) >= self.limit and (sig in self.signatures or len(self.signatures) >= _MAX_SIGNATURES):
            return
        self.samples.append(detached_copy(args, kwargs))
        self.signatures.add(sig)


def _strip_prefix(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    inner = prefix + "module."
    if not any(k.startswith(inner) for k in state_dict):
        return
    items = list(state_dict.items())
    state_dict.clear()
    for key, value in items:
        state_dict[prefix + key[len(inner):] if key.startswith(inner) else key] = value


def _add_prefix(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    inner = prefix + "module."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)


class Module(torch.nn.Module):
    """Wraps ``module``; called like it, returns what it returns.

    name: the label in reports (default: the class name; ``kiln.tune.wrap`` uses the path).
    strategy, backends: how to choose and among what (None: the tuning config's).
    config: a ``TuneConfig`` for this module (None: the one given to ``kiln.tune.tune``).
    tune_on_call: tune at the first call(s) (``calls_before_tuning`` of the config) on their
        inputs instead of waiting for ``kiln.tune.tune``.
    """

    def __init__(self, module: torch.nn.Module, name: str | None = None,
                 strategy: Strategy | str | Mapping[str, Any] | None = None,
                 backends: Sequence[Backend | str | Mapping[str, Any]] | None = None, *,
                 config: TuneConfig | None = None, tune_on_call: bool = False) -> None:
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"kiln.tune.Module wraps a torch.nn.Module, got a {type(module).__name__}")
        if isinstance(module, Module):
            raise TypeError(f"kiln.tune.Module: {module.__dict__.get('name')!r} is already wrapped")
        super().__init__()
        self.module = module
        self.name = name if name is not None else type(module).__name__
        self.strategy = strategy_from_spec(strategy) if strategy is not None else None
        self.backends = tuple(backend_from_spec(b) for b in backends) if backends is not None else None
        if self.backends is not None:
            names = [b.name for b in self.backends]
            if len(set(names)) != len(names):
                raise ValueError(f"kiln.tune.Module {self.name!r}: backend names must differ (give each a name=): "
                                 f"{names}")
        self.config = config
        self.tune_on_call = tune_on_call
        self._choice: Choice | None = None
        self._recorder: _Recorder | None = None
        self._pending: list[Inputs] = []
        self._passthrough = False
        self.register_state_dict_post_hook(_strip_prefix)
        self.register_load_state_dict_pre_hook(_add_prefix)

    # ---- what was chosen ----
    @property
    def choice(self) -> Backend | None:
        """The chosen backend (None while untuned)."""
        return self._choice.backend if self._choice is not None else None

    @property
    def report(self) -> ModuleReport | None:
        return self._choice.report if self._choice is not None else None

    @property
    def source(self) -> str | None:
        """Where the choice came from: "tuned", "cache", "file" (None while untuned)."""
        return self._choice.source if self._choice is not None else None

    @property
    def superseded(self) -> bool:
        """True when a backend on the whole model replaced this wrapper's choice: calls pass through."""
        return self._passthrough

    def set_choice(self, choice: Choice | None) -> None:
        self._choice = choice
        self._pending = []
        self._passthrough = False

    def supersede(self, why: str) -> None:
        """Passes calls through from now on (until tuned again); the report keeps ``why``. The
        compiled form is released: nothing calls it."""
        if self._choice is not None:
            self._choice.fn = None
            if self._choice.report is not None:
                self._choice.report.superseded = why
        self._pending = []
        self._passthrough = True

    def strategy_and_candidates(self, config: TuneConfig) -> tuple[Strategy, list[Backend]]:
        strategy = self.strategy if self.strategy is not None else config.strategy_obj
        default = self.backends if self.backends is not None else config.backend_list
        return strategy, strategy.candidates(default)

    # ---- calls ----
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._passthrough:  # first: whole-model backends trace this while the wrapper passes through
            return self.module(*args, **kwargs)
        if self._recorder is not None:
            self._recorder.add(args, kwargs)
            return self.module(*args, **kwargs)
        choice = self._choice
        if choice is None:
            if not self.tune_on_call:
                return self.module(*args, **kwargs)
            from kiln.tune.tuner import tune_at_call

            return tune_at_call(self, args, kwargs)
        fn = choice.fn
        if fn is None:
            fn = choice.fn = choice.backend.compile(self.module, [Inputs(args, dict(kwargs))])
        return fn(*args, **kwargs)

    def start_recording(self, limit: int) -> None:
        self._recorder = _Recorder(limit)

    def stop_recording(self) -> list[Inputs]:
        samples = self._recorder.samples if self._recorder is not None else []
        self._recorder = None
        return samples

    # ---- drop-in behaviour ----
    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("module")
            if inner is None or name.startswith("__"):
                raise
            return getattr(inner, name)

    def __getstate__(self) -> dict[str, Any]:
        # Compiled forms do not pickle or copy; the copy compiles the chosen backend at its first call.
        state = dict(self.__dict__)
        choice = state.get("_choice")
        if choice is not None:
            state["_choice"] = dataclasses.replace(choice, fn=None)
        state["_recorder"], state["_pending"] = None, []
        return state

    def extra_repr(self) -> str:
        chosen = f", choice={self.choice.name!r} ({self.source})" if self.choice is not None else ""
        return f"name={self.name!r}{chosen}{', superseded' if self.superseded else ''}"
