"""Core ATen from torch.export's training IR without tracing the program again.

``ExportedProgram.run_decompositions`` traces every op once more (functionalization, fake
tensors, symbolic size arithmetic for dynamic programs), although most of a typical export is
already made of ops the importers take. When every op of the graph is one the importers take or
one of the few below (convolution, batch, layer and group norm in their composite forms, the
in-place activations and additions of torchvision models, ``to`` and ``type_as``, constant
``pad``, ``&``, ``min`` / ``max`` of two tensors, first-order ``diff``, eval dropout), :func:`lower_in_place`
rewrites those nodes in the copied graph, each into what the decomposition gives, and the trace
is skipped. Anything else (another op, a higher-order op, an in-place op on a value something
else reads afterwards or through a view) makes :func:`rewritable` name the node, and the caller
decomposes the program as before.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

aten = torch.ops.aten

# In-place op -> its functional form (same arguments).
_IN_PLACE = {
    aten.relu_.default: aten.relu.default,
    aten.silu_.default: aten.silu.default,
    aten.hardswish_.default: aten.hardswish.default,
    aten.hardsigmoid_.default: aten.hardsigmoid.default,
    aten.hardtanh_.default: aten.hardtanh.default,
    aten.sigmoid_.default: aten.sigmoid.default,
    aten.add_.Tensor: aten.add.Tensor,
    aten.mul_.Tensor: aten.mul.Tensor,
    aten.zero_.default: aten.zeros_like.default,
}
# Composite op -> the op it always becomes (same arguments).
_RENAMED = {
    aten.__and__.Tensor: aten.bitwise_and.Tensor,
    aten.__or__.Tensor: aten.bitwise_or.Tensor,
    aten.min.other: aten.minimum.default,
    aten.max.other: aten.maximum.default,
}
# Ops that leave their input's values as they are (eval dropout, in place or not; detach_).
_IDENTITY = (aten.dropout_.default, aten.detach_.default)
_CONVS = {aten.conv1d.default: 1, aten.conv2d.default: 2, aten.conv3d.default: 3}
_TO = (aten.to.dtype, aten.to.dtype_layout, aten.to.device)
_SCALARS = {"int", "SymInt", "bool", "SymBool", "float", "SymFloat"}


def _arguments(node: fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in."""
    schema = node.target._schema  # type: ignore[union-attr]
    out: dict[str, Any] = {}
    for i, a in enumerate(schema.arguments):
        if not a.kwarg_only and i < len(node.args):
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def _returns_alias(target: Any) -> bool:
    return any(r.alias_info is not None for r in target._schema.returns)


def _fresh(node: Any, accepted: set[fx.Node]) -> bool:
    """Whether ``node`` is a value of its own (no view of another): an op result that aliases
    nothing, an item of one, or an in-place op already accepted (it becomes functional)."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return False
    if node in accepted:
        return True
    if node.target is operator.getitem:
        return _fresh(node.args[0], accepted)
    return isinstance(node.target, torch._ops.OpOverload) and not _returns_alias(node.target)


def _in_place_ok(node: fx.Node, order: dict[fx.Node, int], accepted: set[fx.Node]) -> bool:
    """An in-place op may become functional when what it writes is a value of its own that
    nothing reads after it or through a view."""
    x = node.args[0] if node.args else None
    if not isinstance(x, fx.Node) or not _fresh(x, accepted):
        return False
    for user in x.users:
        if user is node:
            continue
        if order[user] > order[node]:
            return False
        if isinstance(user.target, torch._ops.OpOverload) and _returns_alias(user.target):
            return False
    return True


def _conv_ok(node: fx.Node) -> bool:
    return not isinstance(_arguments(node).get("padding"), str)


def _batch_norm_ok(node: fx.Node) -> bool:
    a = _arguments(node)
    return a.get("training") is False and a.get("running_mean") is not None and a.get("running_var") is not None


def _to_ok(node: fx.Node) -> bool:
    a = _arguments(node)
    return (a.get("memory_format") in (None, torch.preserve_format) and a.get("layout") in (None, torch.strided)
            and isinstance(node.args[0], fx.Node) and isinstance(node.args[0].meta.get("val"), torch.Tensor))


def _identity_ok(node: fx.Node) -> bool:
    return node.target == aten.detach_.default or _arguments(node).get("train") is False


def _pad_ok(node: fx.Node) -> bool:
    return _arguments(node).get("mode") == "constant"


def _group_norm_ok(node: fx.Node) -> bool:
    val = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dim() >= 2 and all(isinstance(d, int) for d in val.shape)


def _diff_ok(node: fx.Node) -> bool:
    a = _arguments(node)
    val = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    joined = [a.get(k) for k in ("prepend", "append") if a.get(k) is not None]
    return (a.get("n") == 1 and isinstance(val, torch.Tensor) and val.dtype != torch.bool
            and all(isinstance(j, fx.Node) and isinstance(j.meta.get("val"), torch.Tensor) for j in joined))


def _type_as_ok(node: fx.Node) -> bool:
    return all(isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.Tensor) for a in node.args[:2])


def _same_device(named: Any, device: torch.device) -> bool:
    d = torch.device(named)
    return d.type == device.type and (d.index is None or device.index is None or d.index == device.index)


def _list(value: Any, n: int) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value] * n


def _call(graph: fx.Graph, node: fx.Node, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
          val: bool = True) -> fx.Node:
    """A new ``target(*args, **kwargs)`` node in front of ``node``, with its metadata and, with
    ``val``, its own value (from the op's meta kernel)."""
    kwargs = kwargs or {}
    with graph.inserting_before(node):
        new = graph.call_function(target, args, kwargs)
    new.meta.update(node.meta)
    if val:
        vals = fx.map_arg((args, kwargs), lambda a: a.meta["val"])
        new.meta["val"] = target(*vals[0], **vals[1])
    return new


def _replace(graph: fx.Graph, node: fx.Node, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
             item: bool = False) -> None:
    """Replaces ``node`` by ``target(*args, **kwargs)`` (its first result with ``item``, the op
    returning several values), keeping the node's metadata."""
    new = _call(graph, node, target, args, kwargs, val=item)
    if item:
        new = _call(graph, node, operator.getitem, (new, 0), val=False)
    node.replace_all_uses_with(new)
    graph.erase_node(node)


def _drop(graph: fx.Graph, node: fx.Node) -> None:
    """Removes a node whose result is its first argument's value."""
    node.replace_all_uses_with(node.args[0])
    graph.erase_node(node)


def _same_args(graph: fx.Graph, node: fx.Node, target: Any) -> None:
    _replace(graph, node, target, node.args, dict(node.kwargs))


def _conv(graph: fx.Graph, node: fx.Node) -> None:
    a, k = _arguments(node), _CONVS[node.target]
    _replace(graph, node, aten.convolution.default,
             (a["input"], a["weight"], a["bias"], _list(a["stride"], k), _list(a["padding"], k),
              _list(a["dilation"], k), False, [0] * k, a["groups"]))


def _batch_norm(graph: fx.Graph, node: fx.Node) -> None:
    a = _arguments(node)
    _replace(graph, node, aten._native_batch_norm_legit_no_training.default,
             (a["input"], a["weight"], a["bias"], a["running_mean"], a["running_var"], a["momentum"], a["eps"]),
             item=True)


def _layer_norm(graph: fx.Graph, node: fx.Node) -> None:
    a = _arguments(node)
    _replace(graph, node, aten.native_layer_norm.default,
             (a["input"], a["normalized_shape"], a["weight"], a["bias"], a["eps"]), item=True)


def _group_norm(graph: fx.Graph, node: fx.Node) -> None:
    a = _arguments(node)
    shape = node.args[0].meta["val"].shape
    _replace(graph, node, aten.native_group_norm.default,
             (a["input"], a["weight"], a["bias"], shape[0], shape[1], math.prod(shape[2:]), a["num_groups"],
              a["eps"]), item=True)


def _cast(graph: fx.Graph, node: fx.Node) -> None:
    """As the decomposition: a cast names only what changes; a .to() that changes nothing is its input."""
    x = node.args[0]
    a = {"dtype": node.args[1].meta["val"].dtype} if node.target == aten.type_as.default else _arguments(node)
    val = x.meta["val"]
    kwargs = {}
    if a.get("dtype") is not None and a["dtype"] != val.dtype:
        kwargs["dtype"] = a["dtype"]
    if a.get("device") is not None and not _same_device(a["device"], val.device):
        kwargs["device"] = a["device"]
    if kwargs:
        _replace(graph, node, aten._to_copy.default, (x,), kwargs)
    else:
        _drop(graph, node)


def _pad(graph: fx.Graph, node: fx.Node) -> None:
    a = _arguments(node)
    _replace(graph, node, aten.constant_pad_nd.default,
             (node.args[0], a["pad"], 0.0 if a.get("value") is None else a["value"]))


def _diff(graph: fx.Graph, node: fx.Node) -> None:
    """x[1:] - x[:-1] along dim, x with prepend and append joined."""
    a = _arguments(node)
    x, dim = node.args[0], a["dim"]
    parts = [p for p in (a.get("prepend"), x, a.get("append")) if p is not None]
    if len(parts) > 1:
        x = _call(graph, node, aten.cat.default, (parts, dim))
    ends = tuple(_call(graph, node, aten.slice.Tensor, (x, dim, start, end))
                 for start, end in ((1, sys.maxsize), (0, -1)))
    _replace(graph, node, aten.sub.Tensor, ends)


def _any(node: fx.Node) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class _Rewrite:
    becomes: Any  # the op the importers must take (an identity: alias stands in)
    ok: Callable[[fx.Node], bool]  # whether these arguments have the rewrite (in-place ops: see _in_place_ok)
    apply: Callable[[fx.Graph, fx.Node], None]


_REWRITES: dict[Any, _Rewrite] = {
    **{op: _Rewrite(aten.convolution.default, _conv_ok, _conv) for op in _CONVS},
    aten.batch_norm.default: _Rewrite(aten._native_batch_norm_legit_no_training.default, _batch_norm_ok, _batch_norm),
    aten.layer_norm.default: _Rewrite(aten.native_layer_norm.default, _any, _layer_norm),
    aten.group_norm.default: _Rewrite(aten.native_group_norm.default, _group_norm_ok, _group_norm),
    **{op: _Rewrite(aten._to_copy.default, _to_ok, _cast) for op in _TO},
    aten.type_as.default: _Rewrite(aten._to_copy.default, _type_as_ok, _cast),
    aten.pad.default: _Rewrite(aten.constant_pad_nd.default, _pad_ok, _pad),
    aten.diff.default: _Rewrite(aten.slice.Tensor, _diff_ok, _diff),
    **{op: _Rewrite(aten.alias.default, _identity_ok, _drop) for op in _IDENTITY},
    **{op: _Rewrite(new, _any, functools.partial(_same_args, target=new))
       for op, new in {**_RENAMED, **_IN_PLACE}.items()},
}


def rewritable(graph: fx.Graph, keep: set[str]) -> str | None:
    """None when :func:`lower_in_place` gives the graph in ops of ``keep``, else the node it
    cannot rewrite and why (see the module docstring)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    accepted: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if not isinstance(target, torch._ops.OpOverload):
            if isinstance(target, torch._ops.HigherOrderOperator):
                return f"{node.name}: a higher-order op ({target})"
            continue  # getitem, arithmetic on sizes
        if str(target) in keep:
            continue
        if all(str(r.type) in _SCALARS for r in target._schema.returns):
            continue  # sizes and asserts (sym_size, _assert_scalar), which the decomposition keeps too
        rewrite = _REWRITES.get(target)
        if rewrite is None or str(rewrite.becomes) not in keep:
            return f"{node.name}: {target} has no rewrite"
        if target in _IN_PLACE:
            if not _in_place_ok(node, order, accepted):
                return f"{node.name}: {target} writes a value that is read afterwards or is a view"
            accepted.add(node)
        elif not rewrite.ok(node):
            return f"{node.name}: {target} with these arguments has no rewrite"
    return None


def lower_in_place(gm: fx.GraphModule) -> None:
    """Rewrites the training-IR ops of a graph that :func:`rewritable` accepted (returned None for)."""
    graph = gm.graph
    for node in list(graph.nodes):
        rewrite = _REWRITES.get(node.target) if node.op == "call_function" else None
        if rewrite is not None:
            rewrite.apply(graph, node)
    gm.recompile()
