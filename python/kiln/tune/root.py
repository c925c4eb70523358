"""The whole-model choice: a backend run on the whole model instead of its wrappers' own choices.

After tuning a model's wrapped submodules, ``kiln.tune.tune`` also times every candidate backend
on the whole model with the wrappers passing their calls through (``compare_whole``). When one
beats the wrappers' choices together, it is "lifted" to the root: the wrappers pass through (their
reports say they were superseded) and the model's calls go to that backend's compiled form.

The root must stay the same object (``model(x)`` after ``kt.tune(model, data)``), so the choice
is installed on the instance: ``model.__dict__["forward"]`` is a :class:`RootChoice`, which
``nn.Module.__call__`` calls instead of the class's ``forward`` (hooks still run around it). The
backend compiles a :class:`Runner`, a small module whose forward calls ``type(model).forward``,
so compiling and tracing it never meet the instance's override. The decision, lifted or not, is
kept in ``model.__dict__["_kiln_tune_root"]`` for ``kiln.tune.report`` and ``kiln.tune.save``.
"""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from kiln.tune.backends import Backend
from kiln.tune.inputs import Inputs, detached_copy
from kiln.tune.module import Module
from kiln.tune.results import ModuleReport

if TYPE_CHECKING:
    from kiln.tune.config import TuneConfig

log = logging.getLogger("kiln.tune")

__all__ = ["Runner", "RootChoice", "root_choice", "install_root", "clear_root", "passing_through"]

ROOT_KEY = "_kiln_tune_root"


def _runner_forward(self: Runner, *args: Any, **kwargs: Any) -> Any:
    return self.model_forward(self.model, *args, **kwargs)


class Runner(torch.nn.Module):
    """Runs ``model`` through its class's ``forward``; what whole-model backends compile.

    Each runner's forward is a fresh copy of one function's code: Dynamo keeps its compiled
    frames and its recompile limit per code object, so runners of different models (or several
    candidates of one) do not use up one shared limit."""

    model_forward: Callable[..., Any]

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model  # a registered child: torch.export sees the model's parameters as the runner's
        code = _runner_forward.__code__.replace()
        forward = types.FunctionType(code, _runner_forward.__globals__, "forward")
        object.__setattr__(self, "model_forward", type(model).forward)
        object.__setattr__(self, "forward", types.MethodType(forward, self))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Runner, (self.model,))


class RootChoice:
    """The whole-model decision. ``backend`` None: the wrappers' own choices were kept (nothing
    lifted); else the backend lifted to the root, with ``fn`` its compiled form of the model's
    :class:`Runner` (None: compiled at the next call). ``source``: tuned or file. ``retune``: the
    saved choice could not be restored; the model is tuned again at its first call."""

    def __init__(self, model: torch.nn.Module, backend: Backend | None, fn: Callable[..., Any] | None,
                 report: ModuleReport | None, source: str, config: TuneConfig | None, *, retune: bool = False,
                 runner: Runner | None = None) -> None:
        self.runner = runner if runner is not None else Runner(model)
        self.backend, self.fn, self.report, self.source, self.config = backend, fn, report, source, config
        self.retune = retune

    @property
    def model(self) -> torch.nn.Module:
        return self.runner.model

    @property
    def lifted(self) -> bool:
        return self.backend is not None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.retune:
            return self._tune_at_call(args, kwargs)
        fn = self.fn
        if fn is None:
            assert self.backend is not None
            fn = self.fn = self.backend.compile(self.runner, [Inputs(args, dict(kwargs))])
        return fn(*args, **kwargs)

    def _tune_at_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from kiln.tune.tuner import tune

        model = self.model
        log.info("kiln.tune: tuning the model on its first call")
        try:
            tune(model, [detached_copy(args, kwargs)], config=self.config)
        except Exception as err:  # noqa: BLE001 - a tuning that breaks leaves the model eager, not the program
            log.warning("kiln.tune: tuning the model failed (%s: %s); it runs eagerly", type(err).__name__,
                        str(err).splitlines()[0][:200] if str(err) else "", exc_info=log.isEnabledFor(logging.DEBUG))
            clear_root(model)
            for wrapper in _wrappers(model):
                wrapper.set_choice(None)
        return model(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        # Compiled forms do not pickle or copy; the copy compiles the lifted backend at its next call.
        return (_rebuild, (self.model, self.backend, self.report, self.source, self.config, self.retune))

    def __repr__(self) -> str:
        what = f"lifted {self.backend.name!r}" if self.backend is not None else "per-module choices kept"
        return f"RootChoice({what}, source={self.source!r}{', retune' if self.retune else ''})"


def _rebuild(model: torch.nn.Module, backend: Backend | None, report: ModuleReport | None, source: str,
             config: TuneConfig | None, retune: bool) -> RootChoice:
    return RootChoice(model, backend, None, report, source, config, retune=retune)


def _wrappers(model: torch.nn.Module) -> list[Module]:
    return [m for m in model.modules() if isinstance(m, Module)]


def root_choice(model: torch.nn.Module) -> RootChoice | None:
    """The whole-model decision of the last ``kiln.tune.tune`` (or ``load``) of ``model``, or None."""
    choice = model.__dict__.get(ROOT_KEY)
    return choice if isinstance(choice, RootChoice) else None


def install_root(model: torch.nn.Module, choice: RootChoice) -> None:
    """Keeps ``choice`` on ``model``; a lifted backend (other than eager, which needs no override)
    or a pending re-tune also takes over the model's calls."""
    clear_root(model)
    model.__dict__[ROOT_KEY] = choice
    if choice.retune or (choice.backend is not None and choice.backend.kind != "eager"):
        model.__dict__["forward"] = choice


def clear_root(model: torch.nn.Module) -> None:
    """Removes the whole-model decision: the model's calls go to its class's forward again."""
    model.__dict__.pop(ROOT_KEY, None)
    if isinstance(model.__dict__.get("forward"), RootChoice):
        del model.__dict__["forward"]


@contextlib.contextmanager
def passing_through(wrappers: Iterable[Module]) -> Iterator[None]:
    """The wrappers call their modules as they are (no choice, no recording) inside the block."""
    saved = [(w, w._passthrough) for w in wrappers]
    for w, _ in saved:
        w._passthrough = True
    try:
        yield
    finally:
        for w, before in saved:
            w._passthrough = before
