"""MutableModule: a compiled model that follows changes to the module it wraps.

    mm = kiln.MutableModule(model, enabled_precisions={torch.float32})
    mm(x)                              # first call: compiles for x's shapes (kiln.compile)
    mm.load_state_dict(other_weights)  # or model.load_state_dict, or in-place updates
    mm(x)                              # the weights changed: refits the engines, no rebuild
    mm(x_of_another_shape)             # the input signature changed: compiles again
    mm.save("mm.pt"); mm2 = kiln.MutableModule.load("mm.pt")

State machine (checked at the start of every call, cheapest test first)::

    uncompiled --call--> compiled                                 (builds += 1)
    compiled --call, same signature, same structure, same weights--> run
    compiled --call, weights changed--> refit --> run             (refits += 1)
    compiled --call, signature or structure changed--> compile --> run   (builds += 1)

* signature: the call's pytree structure, every tensor's shape, dtype and device, every other
  argument's value (export specializes on them);
* structure: every submodule's path, class and training flag, every parameter's and buffer's
  name, shape, dtype and device;
* weights: per parameter and buffer, the tensor object, its data pointer and its version
  counter. ``load_state_dict`` and in-place updates under ``torch.no_grad()`` bump the version
  counter; assigning a new tensor changes the object, ``p.data = t`` the data pointer. In-place
  writes through ``.data`` (``p.data.mul_(2)``) bypass the counter: call :meth:`refit` after those.

The per-call check is cheap: PyTorch's global registration hooks bump a counter whenever any
module registers a parameter, buffer or submodule (attribute assignment included); only then is
the model walked again. Otherwise the check reads the recorded tensors' data pointers and
version counters and the recorded modules' training flags (well under a millisecond for resnet50).

A refit that fails (an engine built with immutable weights, a weight the engines cannot take)
falls back to a fresh compile with a warning. Attribute reads the wrapper does not have go to the
wrapped model; ``state_dict`` / ``load_state_dict`` use the wrapped model's keys.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from kiln._logging import get_logger
from kiln.settings import settings_from_options
from kiln.trt_compat import ALIASES

log = get_logger("mutable")

__all__ = ["MutableModule"]


def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    leaves, spec = pytree.tree_flatten((args, kwargs))
    described = tuple((tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) else
                      (type(x).__name__, repr(x)) for x in leaves)
    return str(spec), described


# Bumped whenever any module anywhere registers a parameter, buffer or submodule (attribute
# assignment included): until it moves, a model's structure and tensor objects are unchanged.
_generation = [0]
_hooks_installed = False


def _bump(*_: Any) -> None:
    _generation[0] += 1


def _install_hooks() -> None:
    global _hooks_installed
    if not _hooks_installed:
        from torch.nn.modules import module as nn_module
        nn_module.register_module_parameter_registration_hook(_bump)
        nn_module.register_module_buffer_registration_hook(_bump)
        nn_module.register_module_module_registration_hook(_bump)
        _hooks_installed = True


class _Snapshot:
    """What the engines were built or refitted from: the structure (every submodule's path, class
    and training flag, every parameter's and buffer's name, shape, dtype and device) and, per
    tensor, the object, its data pointer and its version counter."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.generation = _generation[0]
        named_modules = list(model.named_modules())
        named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
        self.modules = [m for _, m in named_modules]
        self.training = [m.training for m in self.modules]
        self.tensors = [t for _, t in named]
        self.state = [(t.data_ptr(), t._version) for t in self.tensors]
        self.structure = (tuple((n, type(m).__qualname__, m.training) for n, m in named_modules),
                          tuple((n, tuple(t.shape), t.dtype, t.device) for n, t in named))

    def same_objects(self) -> bool:
        """No registration anywhere since, and no training flag changed (cheap)."""
        return self.generation == _generation[0] and all(
            m.training == t for m, t in zip(self.modules, self.training))

    def same_values(self) -> bool:
        return all((t.data_ptr(), t._version) == s for t, s in zip(self.tensors, self.state))

    def same_tensors_as(self, other: _Snapshot) -> bool:
        return len(self.tensors) == len(other.tensors) and all(
            a is b for a, b in zip(self.tensors, other.tensors)) and self.state == other.state


class MutableModule(torch.nn.Module):
    """Compiles ``model`` lazily with Kiln and refits or recompiles as it changes (see above).

    ``builds`` counts compilations, ``refits`` refits; ``settings`` is the validated
    CompilationSettings (``immutable_weights`` defaults to False here, so engines can be refitted).
    """

    def __init__(self, model: torch.nn.Module, **options: Any) -> None:
        super().__init__()
        if not any(k == "immutable_weights" or (k in ALIASES and ALIASES[k].field == "immutable_weights")
                   for k in options):
            options["immutable_weights"] = False
        self.model = model
        self.settings = settings_from_options(options)
        self.builds = 0
        self.refits = 0
        object.__setattr__(self, "_compiled", None)  # not a submodule: no state_dict entries
        self._signature: tuple[Any, ...] | None = None
        self._snapshot: _Snapshot | None = None  # None while compiled: refit before the next run
        _install_hooks()

    @property
    def compiled(self) -> torch.nn.Module | None:
        """The current compiled program (a kiln KilnModule), None before the first call."""
        return self._compiled

    # -- the call --
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        signature = _signature(args, kwargs)
        snap = self._snapshot
        if self._compiled is None:
            self._compile(args, kwargs, signature, "first call")
        elif signature != self._signature:
            self._compile(args, kwargs, signature, "the input signature changed")
        elif snap is None or not snap.same_objects():
            now = _Snapshot(self.model)
            if snap is not None and now.structure != snap.structure:
                self._compile(args, kwargs, signature, "the module's structure changed")
            elif snap is None or not now.same_tensors_as(snap):
                self._refit_or_compile(args, kwargs, signature)
            else:
                self._snapshot = now  # something elsewhere registered a tensor; nothing here changed
        elif not snap.same_values():
            self._refit_or_compile(args, kwargs, signature)
        with torch.no_grad():
            return self._compiled(*args, **kwargs)

    def refit(self) -> None:
        """Refits the engines with the model's current weights now (e.g. after writes to
        ``.data``, which the version counters do not see). Does nothing before the first call."""
        if self._compiled is None:
            return
        from kiln.refit import refit as refit_fn
        with torch.no_grad():
            refit_fn(self._compiled, self.model)
        self.refits += 1
        self._snapshot = _Snapshot(self.model)
        log.info("MutableModule: refitted the engines with the model's current weights")

    def _refit_or_compile(self, args: tuple[Any, ...], kwargs: dict[str, Any], signature: tuple[Any, ...]) -> None:
        try:
            self.refit()
        except Exception as err:  # noqa: BLE001 - any refit failure falls back to a rebuild
            msg = f"Kiln MutableModule could not refit ({type(err).__name__}: {err}); recompiling"
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
            log.warning("%s", msg)
            self._compile(args, kwargs, signature, "refit failed")

    def _compile(self, args: tuple[Any, ...], kwargs: dict[str, Any], signature: tuple[Any, ...], why: str) -> None:
        from kiln.aot import compile as kiln_compile
        log.info("MutableModule: compiling (%s)", why)
        object.__setattr__(self, "_compiled", None)  # free the old engines first
        compiled = kiln_compile(self.model, arg_inputs=list(args), kwarg_inputs=dict(kwargs) or None,
                                settings=self.settings)
        # The snapshot checks the weights before every call (data pointers too) and refits; the
        # program's own watch would repeat half of that check.
        compiled.weight_watch = None
        object.__setattr__(self, "_compiled", compiled)
        self.builds += 1
        self._signature = signature
        self._snapshot = _Snapshot(self.model)

    # -- the wrapped model's view --
    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            model = self.__dict__.get("_modules", {}).get("model")
            if model is None or name.startswith("__"):
                raise
            return getattr(model, name)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:  # the wrapped model's keys
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)

    # -- saving --
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        # Whether the saved engines hold the saved weights (else the loaded module refits first).
        snap = self._snapshot
        state["_in_sync"] = snap is not None and snap.same_objects() and snap.same_values()
        state["_snapshot"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        in_sync = state.pop("_in_sync", False)
        super().__setstate__(state)
        _install_hooks()
        self._snapshot = _Snapshot(self.model) if in_sync and self._compiled is not None else None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Saves the model, the settings and the compiled engines (torch.save)."""
        torch.save(self, os.fspath(path))

    @staticmethod
    def load(path: str | os.PathLike[str], map_location: Any = None) -> MutableModule:
        """Loads what :meth:`save` wrote (a pickle: load only files you trust)."""
        obj = torch.load(os.fspath(path), map_location=map_location, weights_only=False)
        if not isinstance(obj, MutableModule):
            raise TypeError(f"{os.fspath(path)} holds a {type(obj).__name__}, not a kiln.MutableModule")
        return obj

    def extra_repr(self) -> str:
        return f"builds={self.builds}, refits={self.refits}, compiled={self._compiled is not None}"
