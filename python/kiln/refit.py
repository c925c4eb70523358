"""Refit: new weights for compiled modules without rebuilding their engines.

    compiled = torch.compile(model, backend="kiln")     # or kiln.compile(model, [x])
    compiled(x)
    kiln.refit(compiled, new_model)                     # or new_model.state_dict()
    compiled(x)                                         # the new weights' outputs, no rebuild

Each engine names its weights by the model's state_dict keys (lowering gives every constant
its module path, ``meta["kiln_name"]``). For a module from ``torch.compile``, Dynamo may name a
graph's parameters after their source (``L['self'].conv.weight``); :func:`refit` maps those back
to the compiled model's names through the parameter objects themselves, so renaming never
matters. A weight the engines folded (a batch norm into a conv, a cast) is derived again by the
engine's refit program, exactly as the build derived it (include/kiln/refit.h). Parameters used
by the parts of a graph that run in PyTorch (outside any engine) are replaced too.

The lower-level pieces are for other front-end parts (the engine cache, MutableModule):
:func:`refit_engine_module` refits one :class:`KilnEngineModule` from engine weight names,
:func:`engine_weights_from` picks those weights out of a module or state dict.

All weights are checked (names, shapes, dtypes, weights needed together) before any engine
changes. An engine built with ``immutable_weights=True`` raises ``kiln.UnsupportedError``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.fx as fx

from kiln import _C
from kiln._logging import get_logger
from kiln.runtime import KilnEngineModule
from kiln.translate import EncodeError, kiln_dtype

log = get_logger("refit")

__all__ = ["refit", "refit_engine_module", "engine_weights_from"]

Source = torch.nn.Module | Mapping[str, torch.Tensor]


# ---- the low-level API ----------------------------------------------------------------------

def _weight_names(engine: Any) -> list[str]:
    return list(_C.Refitter(engine).weight_names) if engine.refittable else list(engine.weight_names)


def _prepare(module: KilnEngineModule, weights: Mapping[str, torch.Tensor]) -> tuple[Any, list[torch.Tensor]]:
    """A Refitter holding the new values (checked by the engine); the host tensors it reads.
    The Refitter refers to them without copying: keep them alive until ``_apply``."""
    refitter = _C.Refitter(module.engine)
    held: list[torch.Tensor] = []
    for name, tensor in weights.items():
        want = refitter.weight_type(name)  # InvalidArgumentError naming an unknown weight
        t = tensor.detach()
        if t.dtype == torch.float64 and want.dtype == _C.DType.f32:
            t = t.float()  # built with truncate_double
        try:
            dtype = kiln_dtype(t.dtype)
        except EncodeError:
            raise _C.InvalidArgumentError(f"weight '{name}' must be {want}, got a {t.dtype} tensor") from None
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
        self._seen: set[int] = set()

    def add_graph(self, root: torch.nn.Module, rename: dict[str, str]) -> None:
        for m in root.modules():
            if isinstance(m, KilnEngineModule) and id(m) not in self._seen:
                self._seen.add(id(m))
                self.engines.append((m, rename))
            if isinstance(m, fx.GraphModule):
                for node in m.graph.nodes:
                    if node.op == "get_attr" and node.meta.get("kiln_weight") and "kiln_name" in node.meta:
                        name = node.meta["kiln_name"]
                        self.constants.append((m, str(node.target), rename.get(name, name)))


def _dynamo_graphs() -> Iterable[Any]:
    from kiln import dynamo
    return list(dynamo._LIVE_GRAPHS)


def _targets_of(compiled: torch.nn.Module) -> _Targets:
    targets = _Targets()
    if isinstance(compiled, KilnEngineModule):
        targets.engines.append((compiled, {}))
        return targets
    model = getattr(compiled, "_orig_mod", None)  # torch.compile's OptimizedModule
    if model is None:
        targets.add_graph(compiled, {})  # kiln.compile's KilnModule, or a module holding engines
    if targets.engines:
        return targets
    # Dynamo graphs built from this model: their constants are the model's own tensors.
    model = model if model is not None else compiled
    owned: dict[int, str] = {}
    for key, t in _tensors_of(model).items():
        owned.setdefault(id(t), key)
    for graph in _dynamo_graphs():
        for constants, gm in graph.built():
            # Only specializations built from this model's own tensors (another instance of the
            # same class has engines of its own).
            rename = {name: owned[id(t)] for t, name in constants if id(t) in owned}
            if rename:
                targets.add_graph(gm, rename)
    return targets


# ---- kiln.refit ----------------------------------------------------------------------------

def refit(compiled: torch.nn.Module, new_weights: Source, *, strict: bool = True) -> None:
    """Gives every Kiln engine of ``compiled`` the weights of ``new_weights`` without rebuilding.

    ``compiled`` comes from ``torch.compile(model, backend="kiln")``, ``kiln.compile`` or is a
    KilnEngineModule; ``new_weights`` is a module of the same architecture or a state dict. With
    ``strict`` every weight the engines take must be in ``new_weights`` (a module always has
    all of them; a state dict lacks non-persistent buffers: pass ``strict=False`` to keep those).
    """
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
        refitter, held = _prepare(module, weights)
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
    log.info("kiln.refit: %d engine(s) refitted, %d PyTorch-side constant(s) replaced",
             len(prepared), len(constants))
