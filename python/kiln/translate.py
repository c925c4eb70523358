"""Translation: FX nodes of a lowered graph -> kiln._C.ImportGraph, the C++ import description.

One :class:`Encoder` turns FX values into tensor ids (dtype, static shape and strides from the
FakeTensor in ``meta["val"]``) and FX nodes into import nodes (see include/kiln/import.h):

* target is ``str(overload)``, e.g. "aten.convolution.default";
* arguments follow the overload's schema: every positional argument in order (absent trailing
  ones take the schema default), keyword-only arguments as kwargs (defaults included);
* a tensor is ``ImportArg.of_tensor(id)``; int, float, bool, str and None pass as they are;
  a torch.dtype becomes a DType (a dtype Kiln lacks makes the node unsupported); a device,
  layout or memory format becomes its string; lists nest;
* ``outputs`` has one tensor id per tensor output of the overload, -1 for an output nobody
  reads; a getitem on a tuple output is the id of that tuple element.

:class:`Capability` describes a whole graph once and asks a ``kiln._C.BuildTrial`` about each
node in order (the partitioner's capability function: the importers, then the target backend).
:func:`describe_block` describes one block with its constants' bytes for the build;
:func:`describe_block_parts` can leave the weights' bytes out (the engine cache's key needs only
their metadata, and a cache hit takes the weights from the model, so copying them is only worth
it when the block is built). No operator knowledge lives here: which node is supported, and
how, is decided by the C++ importers and backends.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

from kiln import _C
from kiln.partition import Block
from kiln.settings import CompilationSettings

__all__ = ["Encoder", "Capability", "describe_block", "describe_block_parts", "BlockDescription", "ConstantInfo",
           "kiln_dtype", "torch_dtype", "EncodeError", "scalar_text"]

_TORCH_TO_KILN: dict[torch.dtype, Any] = {
    torch.float32: _C.DType.f32, torch.float16: _C.DType.f16, torch.bfloat16: _C.DType.bf16,
    torch.float64: _C.DType.f64, torch.int64: _C.DType.i64, torch.int32: _C.DType.i32,
    torch.int8: _C.DType.i8, torch.uint8: _C.DType.u8, torch.bool: _C.DType.bool,
}
_KILN_TO_TORCH = {v: k for k, v in _TORCH_TO_KILN.items()}


class EncodeError(Exception):
    """A node or value that cannot be described to the importers (the reason is the message)."""


def kiln_dtype(dt: torch.dtype, truncate_double: bool = False) -> Any:
    if truncate_double and dt == torch.float64:
        dt = torch.float32
    try:
        return _TORCH_TO_KILN[dt]
    except KeyError:
        raise EncodeError(f"dtype {dt} has no Kiln equivalent") from None


def torch_dtype(dt: Any) -> torch.dtype:
    return _KILN_TO_TORCH[dt]


def _static_shape(t: torch.Tensor, what: str) -> tuple[list[int], list[int] | None]:
    if t.layout != torch.strided:
        raise EncodeError(f"{what} has layout {t.layout}")
    try:
        shape = [int(s) for s in t.shape]
        strides = [int(s) for s in t.stride()]
    except (TypeError, RuntimeError):
        raise EncodeError(f"{what} has a symbolic shape {tuple(t.shape)} (Kiln builds static shapes)") from None
    return shape, (None if t.is_contiguous() else strides)


@dataclasses.dataclass(frozen=True)
class ConstantInfo:
    """One constant of a block as the description names it, with the tensor it comes from."""

    tensor: int              # the ImportGraph tensor id
    name: str                # the state_dict key of a weight
    weight: bool             # a model weight (refittable) rather than a lifted or folded constant
    nbytes: int              # dense bytes, in the described dtype
    dtype: torch.dtype       # the described dtype (float32 for float64 with truncate_double)
    shape: tuple[int, ...]
    source: torch.Tensor     # the graph module's tensor (not converted, not copied)


@dataclasses.dataclass
class BlockDescription:
    """A block's ImportGraph and its constants; without weight bytes, ``graph`` holds only the
    constants that are not weights (the build needs :func:`describe_block_parts` again)."""

    graph: _C.ImportGraph
    constants: list[ConstantInfo]
    weight_bytes: bool


class SharedConstants:
    """Host copies of constants that several descriptions share (a dynamic program's opt build and
    the samples of its range fit describe the same weights): each tensor is copied once."""

    def __init__(self) -> None:
        # Keyed by what makes the copied bytes equal; the tensor is kept so its address stays its own.
        self._copies: dict[tuple[Any, ...], tuple[torch.Tensor, _C.ConstantBytes]] = {}

    @staticmethod
    def _key(tensor: torch.Tensor, dtype: torch.dtype) -> tuple[Any, ...]:
        return (tensor.data_ptr(), tensor.device, tensor.dtype, dtype, tuple(tensor.shape), tuple(tensor.stride()),
                tensor._version)

    def get(self, tensor: torch.Tensor, dtype: torch.dtype) -> _C.ConstantBytes | None:
        found = self._copies.get(self._key(tensor, dtype))
        return found[1] if found is not None else None

    def put(self, tensor: torch.Tensor, dtype: torch.dtype, data: _C.ConstantBytes) -> None:
        self._copies[self._key(tensor, dtype)] = (tensor, data)


class Encoder:
    """Builds one ImportGraph; remembers the tensor id of every FX value it has described."""

    def __init__(self, settings: CompilationSettings, weight_bytes: bool = True,
                 shared: SharedConstants | None = None) -> None:
        self.graph = _C.ImportGraph()
        self.truncate_double = settings.truncate_double
        self.weight_bytes = weight_bytes
        self.shared = shared
        self.ids: dict[fx.Node, int] = {}
        self.constants: list[ConstantInfo] = []

    # -- values --
    def add_value(self, node: fx.Node, dense: bool = False) -> int:
        """The id of a tensor-valued node (described on first use)."""
        if node in self.ids:
            return self.ids[node]
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise EncodeError(f"value {node.name} is not a tensor with metadata ({type(val).__name__})")
        shape, strides = _static_shape(val, f"value {node.name}")
        dtype = kiln_dtype(val.dtype, self.truncate_double)
        # A dynamic program's concrete copy marks the values whose size depends on its symbols.
        tid = self.graph.add_tensor(dtype, shape, None if dense else strides, sized=bool(node.meta.get("kiln_sized")))
        self.ids[node] = tid
        return tid

    def add_input(self, node: fx.Node) -> int:
        # Dense: the engine module hands the engine contiguous buffers whatever their strides.
        tid = self.add_value(node, dense=True)
        self.graph.add_input(tid, node.name)
        return tid

    def add_constant(self, node: fx.Node, tensor: torch.Tensor | None) -> int:
        """A get_attr node; with ``tensor`` it is recorded in ``constants`` and its bytes are
        copied (dense, on the host), except a weight's when the encoder leaves weight bytes out."""
        tid = self.add_value(node, dense=True)
        if tensor is not None:
            name = node.meta.get("kiln_name", str(node.target))
            weight = bool(node.meta.get("kiln_weight", False))
            dtype = torch.float32 if self.truncate_double and tensor.dtype == torch.float64 else tensor.dtype
            nbytes = tensor.numel() * dtype.itemsize
            self.constants.append(ConstantInfo(tid, name, weight, nbytes, dtype, tuple(tensor.shape), tensor))
            if self.weight_bytes or not weight:
                copy = self.shared.get(tensor, dtype) if self.shared is not None else None
                if copy is not None:
                    self.graph.add_shared_constant(tid, name, copy, weight)
                    return tid
                data = tensor.detach().to(dtype).to("cpu").contiguous()
                copy = self.graph.add_constant_from_ptr(tid, name, data.data_ptr(), nbytes, weight)
                if self.shared is not None:
                    self.shared.put(tensor, dtype, copy)
        return tid

    # -- nodes --
    def _arg(self, value: Any, where: str) -> Any:
        if isinstance(value, fx.Node):
            if value not in self.ids:
                raise EncodeError(f"{where}: {value.name} is not a described tensor")
            return _C.ImportArg.of_tensor(self.ids[value])
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, torch.dtype):
            return kiln_dtype(value, self.truncate_double)
        if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
            return str(value)
        if isinstance(value, (list, tuple)):
            return [self._arg(v, where) for v in value]
        raise EncodeError(f"{where}: cannot describe an argument of type {type(value).__name__}")

    def node_arguments(self, node: fx.Node) -> tuple[list[Any], dict[str, Any]]:
        target = node.target
        if not isinstance(target, torch._ops.OpOverload):
            raise EncodeError(f"{node.name} calls {target}, not an ATen overload")
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        extra = set(node.kwargs) - {a.name for a in target._schema.arguments}
        if extra:
            raise EncodeError(f"{node.name}: unknown keyword arguments {sorted(extra)}")
        positional = [a for a in target._schema.arguments if not a.kwarg_only]
        if len(node.args) > len(positional):
            raise EncodeError(f"{node.name}: {len(node.args)} positional arguments for {len(positional)}")
        for i, a in enumerate(target._schema.arguments):
            where = f"{target} argument '{a.name}'"
            if not a.kwarg_only and i < len(node.args):
                value = node.args[i]
            elif a.name in node.kwargs:
                value = node.kwargs[a.name]
            elif a.has_default_value():
                value = a.default_value
            else:
                raise EncodeError(f"{node.name}: missing argument '{a.name}'")
            (kwargs.__setitem__(a.name, self._arg(value, where)) if a.kwarg_only
             else args.append(self._arg(value, where)))
        return args, kwargs

    def node_outputs(self, node: fx.Node) -> list[int]:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return [self.add_value(node)]
        if val is None and isinstance(node.target, torch._ops.OpOverload) and not node.target._schema.returns:
            return []
        if not isinstance(val, (tuple, list)):
            raise EncodeError(f"{node.name} produces {type(val).__name__}, not tensors")
        outs = [-1] * len(val)
        for user in node.users:
            if user.target is not operator.getitem or not isinstance(user.args[1], int):
                raise EncodeError(f"{node.name}: a tuple output used other than by indexing")
            i = user.args[1]
            if outs[i] == -1:
                outs[i] = self.add_value(user)
            else:  # two getitems of one element name one tensor
                self.ids[user] = outs[i]
        return outs

    def describe_node(self, node: fx.Node) -> _C.ImportNode:
        for value in node.all_input_nodes:
            if value not in self.ids:
                self.add_value(value)
        args, kwargs = self.node_arguments(node)
        return _C.ImportNode(str(node.target), args, kwargs, self.node_outputs(node), node.name)


class Capability:
    """The partitioner's capability function: every node of ``gm`` asked of the importers and of
    the backend for ``device``, in order (``_C.BuildTrial``; the device need not be present)."""

    def __init__(self, gm: fx.GraphModule, settings: CompilationSettings, device: str) -> None:
        self.encoder = Encoder(settings)
        self.trial = _C.BuildTrial(device)
        self.answers: dict[fx.Node, tuple[bool, str]] = {}
        for node in gm.graph.nodes:
            if node.op == "placeholder" and isinstance(node.meta.get("val"), torch.Tensor):
                self._try(lambda: self.encoder.add_input(node))
            elif node.op == "get_attr":
                self._try(lambda: self.encoder.add_constant(node, None))
            elif node.op == "call_function" and node.target is not operator.getitem:
                self.answers[node] = self._ask(node)

    @staticmethod
    def _try(fn: Any) -> None:
        try:
            fn()
        except EncodeError:
            pass  # nodes that read this value become unsupported, with the reason

    def _ask(self, node: fx.Node) -> tuple[bool, str]:
        try:
            inode = self.encoder.describe_node(node)
        except EncodeError as e:
            return False, str(e)
        answer = self.trial.add(inode, self.encoder.graph)
        return bool(answer.supported), answer.reason

    def __call__(self, node: fx.Node) -> tuple[bool, str]:
        return self.answers.get(node, (False, "not an ATen call"))


def describe_block(gm: fx.GraphModule, block: Block, settings: CompilationSettings) -> _C.ImportGraph:
    """The import description of one block, with its constants' bytes."""
    return describe_block_parts(gm, block, settings).graph


def describe_block_parts(gm: fx.GraphModule, block: Block, settings: CompilationSettings,
                         weight_bytes: bool = True, shared: SharedConstants | None = None) -> BlockDescription:
    """The import description of one block and its constants; ``weight_bytes=False`` leaves the
    weights out of the graph (their metadata stays in ``constants``); ``shared`` lends and keeps
    the constants' host copies."""
    enc = Encoder(settings, weight_bytes, shared)
    for node in block.inputs:
        enc.add_input(node)
    for node in block.constants:
        enc.add_constant(node, getattr(gm, str(node.target)))
    for node in block.nodes:
        if node.target is operator.getitem:
            if node not in enc.ids:
                raise EncodeError(f"{node.name} indexes a value the block does not produce")
            continue
        enc.graph.add_node(enc.describe_node(node))
    for i, node in enumerate(block.outputs):
        enc.graph.add_output(enc.ids[node], f"output_{i}")
    return BlockDescription(enc.graph, enc.constants, weight_bytes)


def scalar_text(v: Any) -> str | None:
    """The exact text of None, a bool, int, float or string in a cache key (floats in hex, so
    that the text is the value); None for any other value."""
    if v is None or isinstance(v, bool):
        return repr(v)
    if isinstance(v, int):
        return f"i{int(v)}"
    if isinstance(v, float):
        return f"f{float(v).hex()}"
    if isinstance(v, str):
        return "s" + repr(v)
    return None


def canonical_description(graph: _C.ImportGraph, constants: Sequence[ConstantInfo] | None = None) -> str:
    """A deterministic text of an import description without any constant's bytes.

    It holds every tensor's dtype, shape, strides and symbolic ranges, the inputs and outputs
    with their names, each constant's tensor, name, weight flag and size, and every node's
    target, arguments (tensor references, values and their kinds, lists nested) and outputs.
    Node names are left out: they label the FX graph and do not change the engine. Two blocks
    with the same text build the same engine up to the constants' values (the engine cache's
    key, see kiln/cached_build.py). ``constants`` (a :class:`BlockDescription`'s) stand for
    the graph's own list, which lacks the weights of a description without weight bytes; the
    text is the same either way.
    """
    def arg(a: Any) -> str:
        if isinstance(a, _C.ImportArg):
            kind = a.kind
            if kind == _C.ImportArgKind.tensor:
                return f"t{a.tensor}"
            if kind == _C.ImportArgKind.list:
                return "[" + ",".join(arg(x) for x in a.list) + "]"
            return arg(a.to_value())
        text = scalar_text(a)
        if text is not None:
            return text
        if isinstance(a, _C.DType):
            return f"d{a.name}"
        if isinstance(a, (list, tuple)):
            return "[" + ",".join(arg(x) for x in a) + "]"
        raise EncodeError(f"cannot describe an argument of type {type(a).__name__} canonically")

    lines = []
    for i, t in enumerate(graph.tensors):
        sym = f" sym={list(t.symbols)}{list(t.sym_min)}{list(t.sym_max)}" if list(t.symbols) else ""
        sized = " sized" if t.sized else ""
        lines.append(f"tensor {i} {t.dtype.name} {list(t.shape)} {list(t.strides)}{sym}{sized}")
    lines += [f"input {tid} {name!r}" for tid, name in graph.inputs]
    lines += [f"constant {c.tensor} {c.name!r} weight={c.weight} nbytes={c.nbytes}"
              for c in (graph.constants if constants is None else constants)]
    for node in graph.nodes:
        kwargs = ",".join(f"{k}={arg(v)}" for k, v in sorted(node.kwargs.items()))
        lines.append(f"node {node.target}({','.join(arg(a) for a in node.args)};{kwargs}) -> {list(node.outputs)}")
    lines += [f"output {tid} {name!r}" for tid, name in graph.outputs]
    return "\n".join(lines) + "\n"
