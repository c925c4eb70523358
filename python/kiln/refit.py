"""Refit: new weights for compiled modules without rebuilding their engines.

    compiled = torch.compile(model, backend="kiln")     # or kiln.compile(model, [x])
    compiled(x)
    kiln.refit(compiled, new_model)                     # or new_model.state_dict()
    compiled(x)                                         # the new weights' outputs, no rebuild

Each engine names its weights by the model's state_dict keys (lowering gives every constant
its module path, ``meta["kiln_name"]``; the Dynamo backend drops the frame's root, ``L['self']``
or ``L['s']`` for a module passed to a compiled function). :func:`refit` also maps engine names
to the compiled model's keys through the parameter objects themselves, and names weights by
those keys in its errors. ``kiln.refit(model, ...)`` on the plain model refits the engines
Dynamo built from its weights (the way to refit what a compiled function runs). A weight the
engines folded (a batch norm into a conv, a cast) is derived again by the engine's refit program,
exactly as the build derived it (include/kiln/refit.h). Parameters used by the parts of a graph
that run in PyTorch (outside any engine) are replaced too.

The lower-level pieces are for other front-end parts (the engine cache, MutableModule):
:func:`refit_engine_module` refits one :class:`KilnEngineModule` from engine weight names,
:func:`engine_weights_from` picks those weights out of a module or state dict.

All weights are checked (names, shapes, dtypes, weights needed together) before any engine
changes; no dtype is converted, except float64 weights of engines built with truncate_double.
An engine built with ``immutable_weights=True`` raises ``kiln.UnsupportedError``.

Compiled models follow their weights by themselves: :class:`WeightWatch` and
:func:`follow_weights` (used by kiln.compile's KilnModule and the Dynamo backend) refit at the
next call the weights changed in place since the engines took them. A refit from other weights
than the model's (a state dict, another model) lasts until the model's weights next change.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

import torch
import torch.fx as fx

from kiln import _C
from kiln._logging import get_logger
from kiln.pipeline import LIVE_GRAPHS
from kiln.runtime import KilnEngineModule
from kiln.translate import EncodeError, kiln_dtype

log = get_logger("refit")

__all__ = ["refit", "refit_engine_module", "engine_weights_from", "WeightWatch", "follow_weights"]

Source: TypeAlias = torch.nn.Module | Mapping[str, torch.Tensor]


# ---- the low-level API ----------------------------------------------------------------------

def _weight_names(engine: Any) -> list[str]:
    return list(_C.Refitter(engine).weight_names) if engine.refittable else list(engine.weight_names)


def _prepare(module: KilnEngineModule, weights: Mapping[str, torch.Tensor],
             labels: Mapping[str, str] | None = None) -> tuple[Any, list[torch.Tensor]]:
    """A Refitter holding the new values (checked by the engine); the host tensors it reads.
    The Refitter refers to them without copying: keep them alive until ``_apply``. Errors name a
    weight by ``labels`` (engine name -> the model's key) where given."""
    refitter = _C.Refitter(module.engine)
    held: list[torch.Tensor] = []
    truncated: frozenset[str] = getattr(module, "truncated_weights", frozenset())
    for name, tensor in weights.items():
        want = refitter.weight_type(name)  # InvalidArgumentError naming an unknown weight
        label = labels.get(name, name) if labels else name
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"weight '{label}' must be a torch.Tensor ({want}), got a {type(tensor).__name__}")
        if list(tensor.shape) != list(want.shape):
            raise _C.InvalidArgumentError(f"weight '{label}' must have shape {want}, got {list(tensor.shape)}")
        t = tensor.detach()
        if t.dtype == torch.float64 and want.dtype == _C.DType.f32 and name in truncated:
            t = t.float()  # the model keeps it in float64, the engine in float32 (truncate_double)
        try:
            dtype = kiln_dtype(t.dtype)
        except EncodeError:
            dtype = None
        if dtype != want.dtype:
            raise _C.InvalidArgumentError(
                f"weight '{label}' must be {want}, got a {t.dtype} tensor (a refit converts no weight's "
                "dtype; convert it, e.g. with .to(), before the refit)")
        t = t.to("cpu").contiguous()
        refitter.set_weight_view(name, dtype, list(t.shape), t.data_ptr())
        held.append(t)
    return refitter, held


def _check_complete(refitter: Any) -> None:
    if list(refitter.missing_weights()):
        refitter.refit()  # raises InvalidArgumentError naming them, changing nothing


def _apply(module: KilnEngineModule, refitter: Any) -> None:
    with module._lock:  # no call of this module runs during the refit
        refitter.refit()
        module.own_kernels()  # an instance's kernels (run_kernels_of) refuse the new weights
    for hook in module.refit_hooks:  # e.g. dropping the instances made on the old weights
        hook()
    log.debug("%s: %s", module.name, refitter.report)
    if "engine_blob" in module._buffers:  # the engine bytes torch.export would save
        module._buffers["engine_blob"] = torch.frombuffer(bytearray(module.engine_bytes()), dtype=torch.uint8)


def refit_engine_module(module: KilnEngineModule, weights: Mapping[str, torch.Tensor]) -> None:
    """Refits ``module``'s engine in place from ``weights`` (engine weight name -> tensor).

    Weights not given keep their values, except that a constant derived from several weights
    needs all of them (``kiln.InvalidArgumentError`` names the missing ones). A wrong name,
    shape or dtype raises ``kiln.InvalidArgumentError`` naming the weight; an immutable engine
    ``kiln.UnsupportedError``. Nothing changes when anything is wrong.
    """
    refitter, held = _prepare(module, weights)
    _check_complete(refitter)
    _apply(module, refitter)
    del held
    log.debug("refitted %s: %d weights (weights version %d)", module.name, len(weights),
              module.engine.weights_version)


def _tensors_of(source: Source) -> dict[str, torch.Tensor]:
    if isinstance(source, torch.nn.Module):
        found = dict(source.named_parameters(remove_duplicate=False))
        found.update(source.named_buffers(remove_duplicate=False))
        return found
    if isinstance(source, Mapping):
        return dict(source)
    raise TypeError(f"new weights must be an nn.Module or a state dict, got {type(source).__name__}")


def engine_weights_from(source: Source, engine_module: KilnEngineModule,
                        names: Mapping[str, str] | None = None) -> dict[str, torch.Tensor]:
    """The weights of ``engine_module``'s engine found in ``source`` (a module or state dict),
    keyed by engine weight name. ``names`` maps engine names to source keys where they differ.
    Weights ``source`` lacks are left out."""
    tensors = _tensors_of(source)
    names = names or {}
    out: dict[str, torch.Tensor] = {}
    for name in _weight_names(engine_module.engine):
        key = names.get(name, name)
        if key in tensors:
            out[name] = tensors[key]
    return out


# ---- finding what a compiled module runs ------------------------------------------------

class _Targets:
    """The engines of a compiled module, and the constants its PyTorch parts read."""

    def __init__(self) -> None:
        self.engines: list[tuple[KilnEngineModule, dict[str, str]]] = []  # (module, engine name -> key)
        self.constants: list[tuple[fx.GraphModule, str, str]] = []          # (graph module, attr, key)
        self.watches: list[tuple[WeightWatch, dict[str, str]]] = []         # (watch, engine name -> key)
        self._seen: set[int] = set()

    def add_graph(self, root: torch.nn.Module, rename: dict[str, str]) -> None:
        for m in root.modules():
            # An instance (kiln/instances.py) runs on its parent's weights: refitting the parent is enough.
            if isinstance(m, KilnEngineModule) and id(m) not in self._seen and not m.engine.is_instance:
                self._seen.add(id(m))
                self.engines.append((m, rename))
            if isinstance(m, fx.GraphModule):
                for node in m.graph.nodes:
                    if node.op == "get_attr" and node.meta.get("kiln_weight") and "kiln_name" in node.meta:
                        name = node.meta["kiln_name"]
                        self.constants.append((m, str(node.target), rename.get(name, name)))


def _dynamo_graphs() -> Iterable[Any]:
    return list(LIVE_GRAPHS)


def _targets_of(compiled: torch.nn.Module) -> _Targets:
    targets = _Targets()
    if isinstance(compiled, KilnEngineModule):
        targets.engines.append((compiled, {}))
        return targets
    model = getattr(compiled, "_orig_mod", None)  # torch.compile's OptimizedModule
    if model is None:
        targets.add_graph(compiled, {})  # kiln.compile's KilnModule, or a module holding engines
        watch = getattr(compiled, "weight_watch", None)
        if isinstance(watch, WeightWatch):
            targets.watches.append((watch, {}))
    if targets.engines:
        return targets
    # Dynamo graphs built from this model: their constants are the model's own tensors.
    model = model if model is not None else compiled
    owned: dict[int, str] = {}
    for key, t in _tensors_of(model).items():
        owned.setdefault(id(t), key)
    for graph in _dynamo_graphs():
        for constants, gm, watch in graph.built():
            # Only specializations built from this model's own tensors (another instance of the
            # same class has engines of its own).
            rename = {name: owned[id(t)] for t, name in constants if id(t) in owned}
            if rename:
                targets.add_graph(gm, rename)
                if watch is not None:
                    targets.watches.append((watch, rename))
    return targets


# ---- kiln.refit ----------------------------------------------------------------------------

def refit(compiled: torch.nn.Module, new_weights: Source, *, strict: bool = True) -> None:
    """Gives every Kiln engine of ``compiled`` the weights of ``new_weights`` without rebuilding.

    ``compiled`` comes from ``torch.compile(model, backend="kiln")``, ``kiln.compile`` or is a
    KilnEngineModule; ``new_weights`` is a module of the same architecture or a state dict. With
    ``strict`` every weight the engines take must be in ``new_weights`` (a module always has
    all of them; a state dict lacks non-persistent buffers: pass ``strict=False`` to keep those).
    """
    if not isinstance(compiled, torch.nn.Module):
        raise TypeError(f"kiln.refit: compiled must be a module (from kiln.compile or torch.compile(model, ...)), got "
                        f"a {type(compiled).__name__}; for a compiled function, pass the module it runs: "
                        "kiln.refit(model, new_weights) refits the engines built from that model's weights")
    targets = _targets_of(compiled)
    if not targets.engines:
        raise ValueError(f"kiln.refit: {type(compiled).__name__} holds no Kiln engine (compile it with "
                         "kiln.compile or torch.compile(backend='kiln') and run it once first)")
    tensors = _tensors_of(new_weights)
    prepared = []
    for module, rename in targets.engines:
        names = _weight_names(module.engine)
        missing = [rename.get(n, n) for n in names if rename.get(n, n) not in tensors]
        if missing and strict:
            raise KeyError(f"kiln.refit: the new weights lack {len(missing)} weight(s) of {module.name}: "
                           f"{sorted(missing)[:8]} (strict=False keeps their current values)")
        weights = {n: tensors[rename.get(n, n)] for n in names if rename.get(n, n) in tensors}
        refitter, held = _prepare(module, weights, rename)
        _check_complete(refitter)
        prepared.append((module, refitter, held))
    constants = []
    for gm, attr, key in targets.constants:
        if key in tensors:
            old, new = getattr(gm, attr), tensors[key].detach()
            if new.shape != old.shape:
                raise _C.InvalidArgumentError(f"weight '{key}' must have shape {list(old.shape)}, "
                                              f"got {list(new.shape)}")
            constants.append((gm, attr, new.to(device=old.device, dtype=old.dtype).clone()))
    # Everything checked: now change the engines and the PyTorch-side constants.
    for module, refitter, _held in prepared:
        _apply(module, refitter)
    for gm, attr, value in constants:
        setattr(gm, attr, value)
    for watch, rename in targets.watches:
        watch.mark(in_sync=watch.holds({n: tensors.get(rename.get(n, n)) for n in watch.names}))
    log.info("kiln.refit: %d engine(s) refitted, %d PyTorch-side constant(s) replaced",
             len(prepared), len(constants))


# ---- following the model's weights ----------------------------------------------------------

_VERSION = operator.attrgetter("_version")


class WeightWatch:
    """The model tensors a compiled graph takes its weights from (engine weight name -> tensor),
    and their version counters when the engines last took them. Every in-place write through a
    tensor bumps its counter (``copy_``, ``load_state_dict``, optimizer steps), so :meth:`changed`,
    the per-call check, is one pass summing the counters (they only grow: any write moves the sum).

    Not seen: a new tensor under a parameter (``p.data = t``), writes through ``p.data``
    (``p.data.mul_(2)`` bumps another counter than ``p``'s) and writes to inference tensors (they
    have no counter). The engines then keep the weights they had, whole; ``kiln.refit(compiled,
    model)`` brings them up to date. Watching data pointers too would see the first kind, at
    about the cost of the counters again on every call.
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.names = list(tensors)
        self.tensors = list(tensors.values())
        self._versioned = [t for t in self.tensors if not t.is_inference()]
        self.lock = threading.Lock()
        self.mark()

    def mark(self, in_sync: bool = True) -> None:
        """Records the tensors' state as the one the engines hold. ``in_sync=False`` says the
        engines hold other values (a refit from other weights): the next change refits every
        weight from the model, not only the changed ones, so that no mix remains."""
        self._versions = [0 if t.is_inference() else t._version for t in self.tensors]
        self._sum = sum(map(_VERSION, self._versioned))
        self.in_sync = in_sync

    def changed(self) -> bool:
        return sum(map(_VERSION, self._versioned)) != self._sum

    def changed_names(self) -> list[str]:
        """The names whose tensors changed since :meth:`mark` (every name when not in sync)."""
        if not self.in_sync:
            return list(self.names)
        return [n for n, t, v in zip(self.names, self.tensors, self._versions)
                if not t.is_inference() and t._version != v]

    def holds(self, values: Mapping[str, Any]) -> bool:
        """Whether ``values`` are the watched tensors' own bytes (the same memory, shape and dtype)."""
        return all(isinstance(v, torch.Tensor) and v.data_ptr() == t.data_ptr() and v.shape == t.shape
                   and v.dtype == t.dtype and v.stride() == t.stride()
                   for t, v in zip(self.tensors, (values.get(n) for n in self.names)))


def follow_weights(watch: WeightWatch, root: torch.nn.Module, immutable: bool, what: str) -> None:
    """Brings the engines and PyTorch-side constants of ``root`` (a compiled graph) up to date
    with the watched tensors after they changed in place: refits each engine with the weights
    that changed (and those its refit program needs with them). With immutable engines raises
    ``kiln.UnsupportedError`` instead: they cannot follow, and a mix would be silently wrong."""
    with watch.lock:
        if not watch.changed():
            return  # another thread followed first
        changed = watch.changed_names()
        if immutable:
            raise _C.UnsupportedError(
                f"{what}: the model's weights changed in place after compiling ({_listed(changed)}), but its "
                "engines were built with immutable_weights=True and cannot take new weights; compile the model "
                "again, or compile it with immutable_weights=False so that it follows its weights")
        tensors = dict(zip(watch.names, watch.tensors))
        targets = _Targets()
        targets.add_graph(root, {})
        _refit_changed(targets, tensors, set(changed))
        watch.mark()
    log.info("%s: the model's weights changed in place (%s); engines refitted", what, _listed(changed))


def _listed(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _refit_changed(targets: _Targets, tensors: Mapping[str, torch.Tensor], changed: set[str]) -> None:
    prepared = []
    for module, _ in targets.engines:
        take = {n: tensors[n] for n in _weight_names(module.engine) if n in changed and n in tensors}
        if not take:
            continue
        refitter, held = _prepare(module, take)
        # The weights a derived constant needs with those taken, until none is missing.
        while needed := [n for n in refitter.missing_weights() if n in tensors and n not in take]:
            take.update((n, tensors[n]) for n in needed)
            refitter, held = _prepare(module, take)
        _check_complete(refitter)
        prepared.append((module, refitter, held))
    constants = []
    for gm, attr, key in targets.constants:
        if key in changed and key in tensors:
            old, new = getattr(gm, attr), tensors[key].detach()
            if new.shape != old.shape:
                raise _C.InvalidArgumentError(f"weight '{key}' must have shape {list(old.shape)}, "
                                              f"got {list(new.shape)}")
            constants.append((gm, attr, new.to(device=old.device, dtype=old.dtype)))  # no copy when they match
    for module, refitter, _held in prepared:
        _apply(module, refitter)
    for gm, attr, value in constants:
        setattr(gm, attr, value)
