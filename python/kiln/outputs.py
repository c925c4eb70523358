"""Model outputs that torch.export cannot trace: objects that are not registered pytrees.

torch.export flattens a model's output with ``torch.utils._pytree`` and refuses any object of a
type that is not registered (``Found <class ...> in output, which is not a known type``): for
example the ``DynamicCache`` that a transformers decoder returns in ``past_key_values`` with
``use_cache=True`` (its ``ModelOutput`` classes are registered, its caches are not unless
``transformers.integrations.executorch.register_dynamic_cache_export_support()`` ran).

Kiln does not register anything (that would change the whole process): :func:`export_flat`
traces the model's forward followed by Kiln's own flattening, so that the program returns a flat
tuple of tensors, and keeps an :class:`OutputTemplate` that rebuilds the model's output from it.
Registered pytree nodes (tuples, dicts, ``ModelOutput``, ...) are taken apart as pytree does;
an unregistered object is rebuilt as an object of its class with the same attributes (``__dict__``
and slots), each taken apart the same way (so a cache's layers get their new key and value tensors). Values that hold no
tensor (ints, dtypes, configs) are kept as they were when traced. An object that cannot be taken
apart (a reference cycle, a class that cannot be created without arguments) is a ``TypeError``
naming its type and where it is in the output.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["OutputTemplate", "export_flat", "unregistered_output", "output_hint"]

_UNKNOWN_OUTPUT = re.compile(r"Found <class '([^']+)'> in output, which is not a known type")
_MAX_DEPTH = 32


def unregistered_output(err: BaseException) -> str | None:
    """The qualified name of the type in torch's "not a known type" output error (None for any
    other error)."""
    m = _UNKNOWN_OUTPUT.search(str(err))
    return m.group(1) if m else None


def output_hint(type_name: str) -> str:
    """How a user makes an output of ``type_name`` exportable."""
    hint = ("register it as a pytree node (torch.utils._pytree.register_pytree_node) or return tensors "
            "(tuples, lists and dicts of them)")
    if type_name.startswith("transformers."):
        hint += ("; for a transformers cache, call transformers.integrations.executorch."
                 "register_dynamic_cache_export_support() first, or run the model with use_cache=False")
    return hint


@dataclasses.dataclass(frozen=True)
class _Constant:
    value: Any


@dataclasses.dataclass(frozen=True)
class _Object:
    cls: type
    attributes: tuple[tuple[str, OutputTemplate], ...]


@dataclasses.dataclass(frozen=True)
class OutputTemplate:
    """How to rebuild a value from the flat tensors a program returns: a pytree spec whose
    leaves are tensor positions, constants or objects rebuilt attribute by attribute."""

    spec: pytree.TreeSpec
    leaves: tuple[int | _Constant | _Object, ...]

    def rebuild(self, flat: Sequence[Any]) -> Any:
        values = [flat[leaf] if isinstance(leaf, int) else leaf.value if isinstance(leaf, _Constant)
                  else _new_object(leaf, flat) for leaf in self.leaves]
        return pytree.tree_unflatten(values, self.spec)

    def has_objects(self) -> bool:
        return any(isinstance(leaf, _Object) for leaf in self.leaves)


def _slots(cls: type) -> set[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.update((slots,) if isinstance(slots, str) else slots)
    return names - {"__dict__", "__weakref__"}


def _state(value: Any) -> dict[str, Any] | None:
    """An object's attributes (its ``__dict__`` and the slots that are set); None for a value
    that has neither."""
    state = getattr(value, "__dict__", None)
    slots = _slots(type(value))
    if not isinstance(state, dict) and not slots:
        return None
    found = dict(state) if isinstance(state, dict) else {}
    for name in slots:
        try:
            found[name] = object.__getattribute__(value, name)
        except AttributeError:
            pass  # an empty slot
    return found


def _new_object(template: _Object, flat: Sequence[Any]) -> Any:
    cls: Any = template.cls
    obj = cls.__new__(cls)
    slots = _slots(cls)
    for name, part in template.attributes:
        if name in slots:
            object.__setattr__(obj, name, part.rebuild(flat))
        else:
            obj.__dict__[name] = part.rebuild(flat)
    return obj


def _holds_tensor(value: Any, seen: set[int], depth: int) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if id(value) in seen or depth > _MAX_DEPTH:
        return False
    seen.add(id(value))
    leaves = pytree.tree_leaves(value)
    if len(leaves) != 1 or leaves[0] is not value:
        return any(_holds_tensor(v, seen, depth + 1) for v in leaves)
    state = _state(value)
    return state is not None and any(_holds_tensor(v, seen, depth + 1) for v in state.values())


class _Flattener:
    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []
        self.active: set[int] = set()  # the objects being taken apart (a cycle would recurse forever)

    def flatten(self, value: Any, path: str) -> OutputTemplate:
        leaves, spec = pytree.tree_flatten(value)
        try:
            paths = [path + pytree.keystr(p) for p, _ in pytree.tree_flatten_with_path(value)[0]]
        except Exception:  # noqa: BLE001 - a node registered without keys: positions will do
            paths = [f"{path}[{i}]" if len(leaves) > 1 else path for i in range(len(leaves))]
        return OutputTemplate(spec, tuple(self.leaf(v, p) for v, p in zip(leaves, paths)))

    def leaf(self, value: Any, path: str) -> int | _Constant | _Object:
        if isinstance(value, torch.Tensor):
            self.tensors.append(value)
            return len(self.tensors) - 1
        if not _holds_tensor(value, set(), 0):
            return _Constant(value)
        name = f"{type(value).__module__}.{type(value).__qualname__}"
        state = _state(value)
        assert state is not None  # it holds a tensor
        if id(value) in self.active or len(self.active) > _MAX_DEPTH:
            raise TypeError(f"{path} is a {name} that refers back to itself")
        self.active.add(id(value))
        try:
            parts = tuple((k, self.flatten(v, f"{path}.{k}")) for k, v in state.items())
        finally:
            self.active.discard(id(value))
        template = _Object(type(value), parts)
        try:  # the rebuild must work before the program is built around it
            _new_object(template, self.tensors)
        except Exception as err:  # noqa: BLE001 - any failure means: this type cannot be rebuilt
            raise TypeError(f"{path} is a {name}, which Kiln cannot rebuild "
                            f"({type(err).__name__}: {err})") from None
        return template


def export_flat(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) \
        -> tuple[torch.export.ExportedProgram, OutputTemplate]:
    """torch.export (non-strict) of ``module`` returning its output's tensors as a flat tuple,
    with the template that rebuilds the output. The module traced is a shallow copy of
    ``module`` (same parameters, buffers and submodules, so the same names) whose forward
    flattens the output."""
    found: list[OutputTemplate] = []
    forward = module.forward

    def flat_forward(*a: Any, **k: Any) -> tuple[torch.Tensor, ...]:
        flattener = _Flattener()
        found.append(flattener.flatten(forward(*a, **k), "output"))
        return tuple(flattener.tensors)

    wrapper = copy.copy(module)
    wrapper.forward = flat_forward  # type: ignore[method-assign]
    ep = torch.export.export(wrapper, args, kwargs, strict=False)
    return ep, found[-1]
