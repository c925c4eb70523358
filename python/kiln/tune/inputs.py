"""Sample inputs of a module call: what tuning runs, and the signature that keys its results.

A sample is one call's arguments. ``as_inputs`` reads the short forms: a tensor is one positional
argument, a tuple or list is the positional arguments, a dict is keyword arguments, and
:class:`Inputs` says both explicitly. The signature of a call is its argument structure plus, per
leaf, a tensor's dtype, shape and device or a plain value's repr: two calls with the same
signature are served by the same compiled artifact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["Inputs", "as_inputs", "as_samples", "signature", "describe", "batch_items", "input_device",
           "detached_copy", "fast_key"]


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The arguments of one call: ``Inputs(args=(x,), kwargs={"mask": m})``."""

    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def call(self, fn: Callable[..., Any]) -> Any:
        return fn(*self.args, **self.kwargs)

    def leaves(self) -> list[Any]:
        return pytree.tree_leaves((list(self.args), dict(self.kwargs)))


def as_inputs(sample: Any) -> Inputs:
    """One sample in any of the accepted forms, as :class:`Inputs`."""
    if isinstance(sample, Inputs):
        return sample
    if isinstance(sample, (tuple, list)):
        return Inputs(tuple(sample), {})
    if isinstance(sample, Mapping):
        return Inputs((), dict(sample))
    return Inputs((sample,), {})


def as_samples(data: Any) -> list[Inputs]:
    """The tuning data as a list of samples: an iterable of samples, or one tensor / Inputs."""
    if isinstance(data, (torch.Tensor, Inputs)):
        return [as_inputs(data)]
    if data is None or isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Iterable):
        raise TypeError("kiln.tune: data must be a list of samples (each a tensor, a tuple of positional "
                        f"arguments, a dict of keyword arguments or kiln.tune.Inputs), got {type(data).__name__}")
    samples = [as_inputs(s) for s in data]
    if not samples:
        raise ValueError("kiln.tune: data holds no sample")
    return samples


def _leaf_text(leaf: Any) -> str:
    if isinstance(leaf, torch.Tensor):
        return f"{str(leaf.dtype).removeprefix('torch.')}{list(leaf.shape)}@{leaf.device}"
    if leaf is None or isinstance(leaf, (bool, int, float, str, torch.dtype, torch.device)):
        return repr(leaf)
    return type(leaf).__qualname__


def signature(inputs: Inputs) -> str:
    """Structure and per-leaf dtype/shape/device (or value) of a call, as text."""
    leaves, spec = pytree.tree_flatten((list(inputs.args), dict(inputs.kwargs)))
    return f"{spec}|" + ",".join(_leaf_text(leaf) for leaf in leaves)


def describe(inputs: Inputs) -> str:
    """A short human form of a signature: ``float32[4, 16], mask=bool[4, 16]``."""
    def one(value: Any) -> str:
        leaves = pytree.tree_leaves(value)
        if len(leaves) == 1 and leaves[0] is value:
            text = _leaf_text(value)
            return text.rsplit("@", 1)[0] if isinstance(value, torch.Tensor) else text
        return "(" + ", ".join(one(v) for v in leaves) + ")"
    parts = [one(a) for a in inputs.args] + [f"{k}={one(v)}" for k, v in inputs.kwargs.items()]
    return ", ".join(parts)


def fast_key(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    """A cheap dictionary key that tells apart calls of different signatures. Calls with
    positional tensors only (the common case) get a tuple of (shape, dtype, device); others their
    full signature text."""
    if not kwargs and all(type(a) is torch.Tensor for a in args):
        return tuple((a.shape, a.dtype, a.device) for a in args)
    return signature(Inputs(tuple(args), dict(kwargs)))


def batch_items(inputs: Inputs) -> int:
    """Items one call processes, for throughput: the first dimension of the first tensor (1 for a scalar)."""
    for leaf in inputs.leaves():
        if isinstance(leaf, torch.Tensor):
            return int(leaf.shape[0]) if leaf.dim() > 0 else 1
    return 1


def input_device(samples: Iterable[Inputs], module: torch.nn.Module | None = None) -> torch.device:
    """The device of the first tensor input, else of the module's first parameter or buffer, else the CPU."""
    for sample in samples:
        for leaf in sample.leaves():
            if isinstance(leaf, torch.Tensor):
                return leaf.device
    if module is not None:
        for t in list(module.parameters()) + list(module.buffers()):
            return t.device
    return torch.device("cpu")


def detached_copy(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Inputs:
    """A copy of a call's arguments that later in-place changes by the caller do not reach."""
    def copy(x: Any) -> Any:
        return x.detach().clone() if isinstance(x, torch.Tensor) else x
    new_args, new_kwargs = pytree.tree_map(copy, (list(args), dict(kwargs)))
    return Inputs(tuple(new_args), new_kwargs)
