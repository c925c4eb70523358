"""The program cache: a compiled graph kept next to its engines, so that a process whose engines
are cached skips lowering, partitioning and describing as well.

A compilation that uses the engine cache (``reuse_cached_engines`` / ``cache_built_engines``)
also looks up, and stores, its *program*: the graph that :func:`kiln.pipeline.compile_lowered`
makes (engines as calls of modules, the rest as ATen calls), each engine named by its engine
cache key. The program's key is a SHA-256 over what was captured, never over anything cheaper:

* kiln.compile: the ExportedProgram torch.export made (torch.export still runs): every node's op,
  name, target, arguments and value metadata (dtype, shape, strides, device), the graph
  signature, the call specs, every parameter's and buffer's metadata and the bytes of every
  other constant;
* torch.compile: the graph Dynamo captured (Dynamo still traces): every node's op, name,
  target, arguments and example value metadata, the bytes of the graph's own tensor
  constants, which arguments are weights (and their names), the metadata of every argument
  and the values of the non-tensor ones;
* either way: every setting except where the cache lives and whether it is used, PyTorch's
  version, Kiln's code (the bytes of its Python modules and of its extension, so that a rebuilt
  or edited Kiln lowers and partitions again), the device (with its index, and its name), the
  ops Kiln's importers take, and PyTorch's scaled-dot-product backend switches.

kiln.compile of a module also keys the module itself before torch.export traces it (the module
key, :func:`module_key`: the module tree and its plain attributes, its classes' and functions'
source files, the example inputs' metadata and the same settings; docs/engine-cache.md says
what it covers and misses). A small entry under it names the program key and keeps the call
specs (:class:`WarmStart`): a hit loads the program without exporting. A module it cannot
describe exactly (hooks, a class defined in a function, an attribute of unknown kind, ...) is
exported as before; the setting ``module_key=False`` turns the module key off.

A graph whose targets are not PyTorch's own (a function of the user's, an op of a namespace
other than ``aten`` / ``prims``, whose Python decomposition could change without the graph
changing), which calls submodules or has symbolic shapes is not cached (logged; the
compilation lowers as usual). The weights' values are not in the key: a hit takes them from
the model by name (the engines get them through the engine cache: loaded, and refitted unless
the authenticated entry's weights label matches).

A program entry is JSON (nodes, targets as op names resolved in ``torch.ops.aten`` / ``prims``,
arguments as tagged plain values) followed by the bytes of the non-weight constants that the
parts run in PyTorch read; nothing in it is unpickled or evaluated. The default store
(kiln.DiskEngineCache) keeps it as ``<key>.prog``, tagged and verified like an engine entry
(kiln/cache_auth.py). A program that cannot be read, verified or decoded is removed with a
warning and compiled again; one whose engine is missing or unusable, or whose weights no
longer fit, is a miss. Nothing here raises into a compilation.
"""

from __future__ import annotations

import collections
import enum
import functools
import hashlib
import json
import logging
import operator
import os
import re
import struct
import sys
import time
import types
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from kiln import _C
from kiln.cache import EngineCache, UnusableEntry, engine_cache_for, log
from kiln.cached_build import CachedBuild, WeightSpec, count, device_name, recording, settings_text
from kiln.lowering import LoweredGraph
from kiln.pipeline import CompileSummary, compile_lowered, device_of
from kiln.runtime import KilnEngineModule, build_policy, warm_up
from kiln.settings import CompilationSettings
from kiln.translate import scalar_text, torch_dtype

__all__ = ["ProgramCache", "CachedProgram", "Uncacheable", "WarmStart", "exported_program_key", "dynamo_graph_key",
           "module_key"]

_KEY_FORMAT = "kiln-program-cache-1"
_MAGIC = b"KILNPRG1"
_HEADER = struct.Struct("<8sQ")  # magic, bytes of JSON; the constants' bytes follow the JSON
_OP_NAMESPACES = frozenset({"aten", "prims"})
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Settings that change where engines and programs are kept, whether the cache is used or what
# is logged, but never the program compiled.
_NOT_PROGRAM_SETTINGS = frozenset({
    "debug", "dryrun", "cache_built_engines", "reuse_cached_engines", "engine_cache_dir", "engine_cache_size",
    "engine_cache_key_file", "custom_engine_cache", "module_key",
    "specialization_cache_size", "dynamic_max_size", "dynamic_instances",  # dynamic programs only, not kept here
})


class Uncacheable(Exception):
    """A graph the program cache cannot key exactly or store (the message says why)."""


class DamagedProgram(Exception):
    """A program entry that does not decode to a program."""


class _WeightsDiffer(Exception):
    """The model's weights do not fit the cached program (a miss, not a damaged entry)."""


class CachedProgram(NamedTuple):
    """A program cache hit: the compiled graph module and, for a Dynamo graph, its outputs' spec."""

    gm: fx.GraphModule
    out_spec: pytree.TreeSpec | None


# ---- the key --------------------------------------------------------------------------------

def _tensor_meta(t: torch.Tensor) -> str:
    if t.layout != torch.strided:
        raise Uncacheable(f"a {t.layout} tensor")
    shape, strides = tuple(t.shape), t.stride()
    if not all(type(d) is int for d in (*shape, *strides)):
        raise Uncacheable("symbolic shapes")
    return f"tensor({t.dtype},{list(shape)},{list(strides)},{t.device},{t.requires_grad})"


def _tensor_bytes(t: torch.Tensor) -> bytes:
    """The tensor's values (dense, on the host) as bytes."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def _canon(v: Any) -> str:
    """A deterministic text of a graph argument or value; Uncacheable for anything it cannot
    describe exactly."""
    if isinstance(v, fx.Node):
        return f"%{v.name}"
    text = scalar_text(v)
    if text is not None:
        return text
    if isinstance(v, (list, tuple)):
        return ("L[" if isinstance(v, list) else "T[") + ",".join(_canon(x) for x in v) + "]"
    if isinstance(v, dict):
        return "D{" + ",".join(f"{_canon(k)}:{_canon(x)}" for k, x in v.items()) + "}"
    if isinstance(v, slice):
        return f"slice({_canon(v.start)},{_canon(v.stop)},{_canon(v.step)})"
    if v is Ellipsis:
        return "..."
    if isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return f"{type(v).__name__}:{v}"
    if isinstance(v, torch.Tensor):
        return _tensor_meta(v)
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Uncacheable("symbolic shapes")
    raise Uncacheable(f"an argument of type {type(v).__module__}.{type(v).__qualname__}")


def _target_name(target: Any) -> str:
    """A call target as text: an ATen / prims op, or a function of PyTorch or Python's own."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        namespace = target.namespace if isinstance(target, torch._ops.OpOverload) else str(target).split(".")[0]
        if namespace not in _OP_NAMESPACES:
            raise Uncacheable(f"it calls {target} (only ops of {sorted(_OP_NAMESPACES)} are keyed)")
        return f"op:{target}"
    qualname = getattr(target, "__qualname__", None)
    module = getattr(target, "__module__", None)
    if isinstance(qualname, str) and getattr(target, "__objclass__", None) in (torch._C.TensorBase, torch.Tensor):
        return f"tensor:{qualname}"
    python = module in ("_operator", "operator", "math", "builtins")
    if isinstance(module, str) and isinstance(qualname, str) and (
            python or module == "torch" or module.startswith("torch.")):
        return f"fn:{module}.{qualname}"
    raise Uncacheable(f"it calls {target!r}, not a function of PyTorch's own")


@functools.lru_cache(maxsize=1)
def kiln_code_digest() -> str:
    """A SHA-256 over Kiln's own code: its package's Python modules and its extension (once per
    process): the version string does not change when either is edited or rebuilt."""
    h = hashlib.sha256()
    package = Path(__file__).resolve().parent
    for path in sorted([*package.glob("*.py"), Path(_C.__file__).resolve()]):
        h.update(f"{path.name}\0".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _key_prefix(kind: str, settings: CompilationSettings, device: str, keep: Sequence[str]) -> Any:
    h = hashlib.sha256()
    sdpa = [f() for f in (torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.mem_efficient_sdp_enabled,
                          torch.backends.cuda.math_sdp_enabled, torch.backends.cuda.cudnn_sdp_enabled)]
    for text in (_KEY_FORMAT, kind, torch.__version__, _C.__version__, kiln_code_digest(), device,
                 device_name(device), settings_text(settings, _NOT_PROGRAM_SETTINGS), "\n".join(sorted(keep)),
                 f"sdpa={sdpa}"):
        h.update(text.encode())
        h.update(b"\0")
    return h


def _line(h: Any, text: str) -> None:
    h.update(text.encode())
    h.update(b"\n")


def exported_program_key(ep: torch.export.ExportedProgram, keep: Sequence[str], settings: CompilationSettings,
                         device: str) -> str:
    """The program key of an ExportedProgram (see the module docstring); Uncacheable when it
    cannot be made exactly."""
    if ep.range_constraints:
        raise Uncacheable("symbolic shapes")
    h = _key_prefix("export", settings, device, keep)
    for spec in (*ep.graph_signature.input_specs, *ep.graph_signature.output_specs):
        _line(h, repr(spec))
    _line(h, f"in {ep.call_spec.in_spec}")
    _line(h, f"out {ep.call_spec.out_spec}")
    for node in ep.graph.nodes:
        if node.op == "call_function":
            target = _target_name(node.target)
        elif node.op in ("placeholder", "output"):
            target = str(node.target)
        else:
            raise Uncacheable(f"a {node.op} node ({node.name})")
        _line(h, f"{node.op} {node.name} {target} {_canon(node.args)} {_canon(node.kwargs)} "
                 f"{_canon(node.meta.get('val'))}")
    for name, t in ep.state_dict.items():  # the weights' values are the model's, taken at a hit
        _line(h, f"state {name} {_tensor_meta(t)} {isinstance(t, torch.nn.Parameter)}")
    for name, c in ep.constants.items():
        if not isinstance(c, torch.Tensor):
            raise Uncacheable(f"constant {name} is a {type(c).__name__}")
        _line(h, f"constant {name} {_tensor_meta(c)} {hashlib.sha256(_tensor_bytes(c)).hexdigest()}")
    return h.hexdigest()


def _attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def dynamo_graph_key(gm: fx.GraphModule, args: Sequence[Any], kinds: Sequence[str], constant_names: Mapping[int, str],
                     keep: Sequence[str], settings: CompilationSettings, device: str) -> str:
    """The program key of a graph Dynamo captured, called with ``args`` (``kinds``: "constant",
    "input" or "value" per argument; ``constant_names``: the weights' names by argument index)."""
    h = _key_prefix("dynamo", settings, device, keep)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            target = _target_name(node.target)
        elif node.op in ("placeholder", "output", "call_method"):
            target = str(node.target)
        elif node.op == "get_attr":
            value = _attr(gm, str(node.target))
            if not isinstance(value, torch.Tensor):
                raise Uncacheable(f"it holds a {type(value).__name__} ({node.target})")
            target = f"{node.target} {_tensor_meta(value)} {hashlib.sha256(_tensor_bytes(value)).hexdigest()}"
        else:
            raise Uncacheable(f"a {node.op} node ({node.name})")
        _line(h, f"{node.op} {node.name} {target} {_canon(node.args)} {_canon(node.kwargs)} "
                 f"{_canon(node.meta.get('example_value'))}")
    for i, (kind, arg) in enumerate(zip(kinds, args, strict=True)):
        _line(h, f"arg {i} {kind} {constant_names.get(i, '')!r} {_canon(arg)}")
    return h.hexdigest()


def dynamo_out_spec(gm: fx.GraphModule) -> pytree.TreeSpec:
    """How the flat outputs of the lowered Dynamo graph nest: the structure of its output node."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return pytree.tree_flatten(output.args[0])[1]


# ---- the entry: encoding and decoding --------------------------------------------------------

def _encode(v: Any) -> Any:
    if isinstance(v, fx.Node):
        return {"n": v.name}
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return {"f": float(v).hex()}
    if isinstance(v, list):
        return {"l": [_encode(x) for x in v]}
    if isinstance(v, tuple):
        return {"t": [_encode(x) for x in v]}
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {"d": {k: _encode(x) for k, x in v.items()}}
    for tag, kind in (("dtype", torch.dtype), ("layout", torch.layout), ("memory_format", torch.memory_format)):
        if isinstance(v, kind):
            return {tag: str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    raise Uncacheable(f"an argument of type {type(v).__module__}.{type(v).__qualname__} in the compiled graph")


def _torch_attr(name: Any, kind: type) -> Any:
    if not isinstance(name, str) or not _NAME.match(name):
        raise DamagedProgram(f"{name!r} is not a {kind.__name__} name")
    value = getattr(torch, name, None)
    if not isinstance(value, kind):
        raise DamagedProgram(f"torch.{name} is not a {kind.__name__}")
    return value


def _decode(v: Any, nodes: Mapping[str, fx.Node]) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if not isinstance(v, dict) or len(v) != 1:
        raise DamagedProgram(f"an argument {str(v)[:60]} of no known form")
    ((tag, x),) = v.items()
    if tag == "n":
        if x not in nodes:
            raise DamagedProgram(f"an argument names {str(x)[:60]}, which no node before it is")
        return nodes[x]
    if tag == "f" and isinstance(x, str):
        return float.fromhex(x)
    if tag in ("l", "t") and isinstance(x, list):
        items = [_decode(i, nodes) for i in x]
        return items if tag == "l" else tuple(items)
    if tag == "d" and isinstance(x, dict):
        return {k: _decode(i, nodes) for k, i in x.items()}
    if tag == "dtype":
        return _torch_attr(x, torch.dtype)
    if tag == "layout":
        return _torch_attr(x, torch.layout)
    if tag == "memory_format":
        return _torch_attr(x, torch.memory_format)
    if tag == "device" and isinstance(x, str):
        return torch.device(x)
    raise DamagedProgram(f"an argument {str(v)[:60]} of no known form")


def _op_target(name: Any) -> Any:
    """"aten.add.Tensor" -> torch.ops.aten.add.Tensor; "getitem" -> operator.getitem."""
    if name == "getitem":
        return operator.getitem
    parts = name.split(".") if isinstance(name, str) else []
    if len(parts) != 3 or parts[0] not in _OP_NAMESPACES or not all(_NAME.match(p) for p in parts):
        raise DamagedProgram(f"the target {str(name)[:60]} is not an op of {sorted(_OP_NAMESPACES)}")
    try:
        op = getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except (AttributeError, RuntimeError):
        raise DamagedProgram(f"PyTorch has no op {name}") from None
    if not isinstance(op, torch._ops.OpOverload):
        raise DamagedProgram(f"{name} is not an op overload")
    return op


_DTYPE_NAMES = {str(dt).removeprefix("torch."): dt for dt in
                (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
                 torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}


def _dtype(name: Any) -> torch.dtype:
    if not isinstance(name, str) or name not in _DTYPE_NAMES:
        raise DamagedProgram(f"{str(name)[:40]} is not a dtype")
    return _DTYPE_NAMES[name]


def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPE_NAMES:
        raise Uncacheable(f"a constant of dtype {dtype}")
    return name


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(d) is int and d >= 0 for d in value):
        raise DamagedProgram(f"{str(value)[:60]} is not a shape")
    return tuple(value)


def _engine_entry(attr: str, module: KilnEngineModule, key: str, weights: list[WeightSpec],
                  graph_name: str) -> dict[str, Any]:
    suffix = f" of {graph_name}"
    return {
        "attr": attr, "key": key,
        "label": module.name[: -len(suffix)] if module.name.endswith(suffix) else module.name,
        "inputs": [_dtype_name(dt) for dt in module._in_cast], "outputs": [_dtype_name(dt) for dt in module._out_cast],
        "io": {"inputs": [[_dtype_name(dt), list(s)] for s, dt in module._in],
               "outputs": [[_dtype_name(dt), list(s)] for s, dt in module._out]},
        "weights": [[w.name, _dtype_name(w.dtype), _dtype_name(w.source_dtype), list(w.shape)] for w in weights],
        "truncated": sorted(module.truncated_weights),
    }


def encode_program(gm: fx.GraphModule, engines: Mapping[str, tuple[str, list[WeightSpec]]], key: str,
                   graph_name: str) -> bytes:
    """The entry of a graph compile_lowered made. ``engines``: per engine attribute its cache key
    and weights. Raises Uncacheable for a graph it cannot describe."""
    blob = bytearray()
    nodes: list[list[Any]] = []
    buffers: dict[str, dict[str, Any]] = {}
    modules: list[dict[str, Any]] = []
    for node in gm.graph.nodes:
        if node.op == "call_function":
            if node.target is operator.getitem:
                target = "getitem"
            elif isinstance(node.target, torch._ops.OpOverload) and node.target.namespace in _OP_NAMESPACES:
                target = str(node.target)
            else:
                raise Uncacheable(f"the compiled graph calls {node.target}")
        elif node.op == "call_module":
            target = str(node.target)
            module = gm.get_submodule(target)
            if not isinstance(module, KilnEngineModule) or target not in engines:
                raise Uncacheable(f"the compiled graph calls the module {target}, not an engine of the cache")
            modules.append(_engine_entry(target, module, *engines[target], graph_name))
        elif node.op == "get_attr":
            target = str(node.target)
            if target not in buffers:
                buffers[target] = _buffer_entry(node, getattr(gm, target), blob)
        elif node.op in ("placeholder", "output"):
            target = str(node.target)
        else:
            raise Uncacheable(f"a {node.op} node in the compiled graph")
        nodes.append([node.op, node.name, target, _encode(node.args), _encode(node.kwargs)])
    summary: CompileSummary = gm.meta["kiln_summary"]
    sources = gm.meta.get("kiln_weight_sources")
    doc = {
        "format": _KEY_FORMAT, "key": key, "nodes": nodes, "buffers": buffers, "engines": modules,
        "summary": {"in_engines": dict(summary.ops_in_engines), "in_pytorch": dict(summary.ops_in_pytorch)},
        "weight_sources": None if sources is None else sorted(sources),
    }
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    return _HEADER.pack(_MAGIC, len(text)) + text + bytes(blob)


def _buffer_entry(node: fx.Node, value: torch.Tensor, blob: bytearray) -> dict[str, Any]:
    name = node.meta.get("kiln_name")
    if not isinstance(name, str) or not isinstance(value, torch.Tensor):
        raise Uncacheable(f"constant {node.target} has no name")
    entry: dict[str, Any] = {"name": name, "dtype": _dtype_name(value.dtype), "shape": list(value.shape)}
    if node.meta.get("kiln_weight", False):
        entry["weight"] = True  # the model's, taken by name at a hit
        return entry
    data = _tensor_bytes(value)
    entry.update(weight=False, offset=len(blob), nbytes=len(data), device=str(value.device))
    blob += data
    return entry


class _Decoded(NamedTuple):
    doc: dict[str, Any]
    blob: memoryview


def _parse(data: bytes | bytearray | memoryview, key: str) -> _Decoded:
    view = memoryview(data).cast("B")
    if len(view) < _HEADER.size:
        raise DamagedProgram(f"{len(view)} bytes, less than a header")
    magic, length = _HEADER.unpack_from(view, 0)
    if magic != _MAGIC or length > len(view) - _HEADER.size:
        raise DamagedProgram("no program header")
    try:
        doc = json.loads(bytes(view[_HEADER.size:_HEADER.size + length]))
    except (ValueError, RecursionError) as err:
        raise DamagedProgram(f"its JSON does not parse ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != _KEY_FORMAT or doc.get("key") != key:
        raise DamagedProgram("another format or another key's program")
    for field, kind in (("nodes", list), ("buffers", dict), ("engines", list), ("summary", dict)):
        if not isinstance(doc.get(field), kind):
            raise DamagedProgram(f"no {field}")
    return _Decoded(doc, view[_HEADER.size + length:])


# ---- the cache ----------------------------------------------------------------------------------

def _uses_cache(settings: CompilationSettings) -> bool:
    return (settings.reuse_cached_engines or settings.cache_built_engines) and not settings.builds_nothing


class ProgramCache:
    """One graph's dealings with the program cache: ``load`` before lowering, ``compile`` (which
    compiles the lowered graph and stores the program) after."""

    def __init__(self, key: str, settings: CompilationSettings, device: str, graph_name: str,
                 out_spec: pytree.TreeSpec | None = None) -> None:
        self.key = key
        self.settings = settings
        self.device = device
        self.graph_name = graph_name
        self.out_spec = out_spec
        self.store: EngineCache = engine_cache_for(settings)
        self._unusable: set[str] = set()  # engine keys a hit found missing or unusable
        self.in_store = False  # the program is in the cache: found there, or stored
        self.looked_up = False  # load already answered a miss (WarmStart): it is not read again

    @classmethod
    def for_exported_program(cls, ep: torch.export.ExportedProgram, keep: Sequence[str],
                             settings: CompilationSettings, graph_name: str) -> ProgramCache | None:
        """The program cache of kiln.compile's ExportedProgram, or None (not used, or no key)."""
        if not _uses_cache(settings):
            return None
        try:
            user = set(ep.graph_signature.user_inputs)
            examples = [n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder" and n.name in user]
            device = device_of(settings, examples)
            return cls(exported_program_key(ep, keep, settings, device), settings, device, graph_name)
        except Exception as err:  # noqa: BLE001 - the cache never fails a compilation
            _not_keyed(graph_name, err)
            return None

    @classmethod
    def for_dynamo_graph(cls, gm: fx.GraphModule, args: Sequence[Any], kinds: Sequence[str],
                         constant_names: Mapping[int, str], keep: Sequence[str], settings: CompilationSettings,
                         graph_name: str) -> ProgramCache | None:
        """The program cache of a Dynamo graph called with ``args``, or None."""
        if not _uses_cache(settings):
            return None
        try:
            device = device_of(settings, [a for a in args if isinstance(a, torch.Tensor)])
            return cls(dynamo_graph_key(gm, args, kinds, constant_names, keep, settings, device), settings, device,
                       graph_name, dynamo_out_spec(gm))
        except Exception as err:  # noqa: BLE001
            _not_keyed(graph_name, err)
            return None

    # -- the hit --
    def load(self, weights: Mapping[str, torch.Tensor]) -> CachedProgram | None:
        """The compiled graph from the cache, its engines loaded (and refitted where the weights
        differ) and its weights taken from ``weights`` (the model's tensors by name); None on a miss."""
        if not self.settings.reuse_cached_engines or self.looked_up:
            return None
        start = time.perf_counter()
        warm_up(self.device)  # the device's libraries set themselves up while the entries are read
        entry = _read_entry(self.store, self.key, self._reject)
        if entry is None:
            self._miss("no entry")
            return None
        try:
            program = _parse(entry.data, self.key)
            specs = self._engine_specs(program.doc)
            buffers = self._buffers(program, weights)
            sources = self._sources(program.doc, weights)
            graph = self._graph(program.doc, buffers, {s["attr"] for s in specs})
            summary = program.doc["summary"]
            in_engines, in_pytorch = (collections.Counter({str(k): int(v) for k, v in summary[f].items()})
                                      for f in ("in_engines", "in_pytorch"))
            for spec in specs:
                for w in spec["weights"]:
                    _weight(weights, w.name, w.source_dtype, w.shape)
        except _WeightsDiffer as err:
            self._miss(str(err))
            return None
        except Exception as err:  # noqa: BLE001 - whatever a damaged entry makes the decoding raise
            self._reject(f"{entry.source} is damaged ({type(err).__name__}: {err})")
            self._miss("a damaged entry")
            return None
        engines = self._load_engines(specs, weights)
        if engines is None:
            self._miss("an engine is not in the cache")
            return None
        try:
            gm = self._module(graph, buffers, engines, sources)
        except Exception as err:  # noqa: BLE001
            self._reject(f"{entry.source} cannot be used ({type(err).__name__}: {err})")
            self._miss("an unusable entry")
            return None
        gm.meta["kiln_summary"] = CompileSummary(self.graph_name, len(engines), in_engines, in_pytorch,
                                                 time.perf_counter() - start)
        count("program_hits")
        self.in_store = True
        log.info("program cache hit for %s (key %s): %d engine(s), %.3f s", self.graph_name, self.key[:16],
                 len(engines), time.perf_counter() - start)
        return CachedProgram(gm, self.out_spec)

    def _engine_specs(self, doc: Mapping[str, Any]) -> list[dict[str, Any]]:
        specs = []
        for e in doc["engines"]:
            if not isinstance(e, dict) or not isinstance(e.get("key"), str) or not isinstance(e.get("attr"), str) \
                    or not _NAME.match(e["attr"]) or not isinstance(e.get("label"), str):
                raise DamagedProgram("an engine without key, attribute or label")
            weights = [WeightSpec(str(w[0]), _dtype(w[1]), _dtype(w[2]), _shape(w[3])) for w in e["weights"]]
            io = {kind: [(_dtype(d), _shape(s)) for d, s in e["io"][kind]] for kind in ("inputs", "outputs")}
            truncated = e["truncated"]
            if not isinstance(truncated, list) or not all(isinstance(t, str) for t in truncated):
                raise DamagedProgram("a malformed list of truncated weights")
            specs.append(dict(attr=e["attr"], key=e["key"], label=e["label"], weights=weights, io=io,
                              inputs=[_dtype(d) for d in e["inputs"]], outputs=[_dtype(d) for d in e["outputs"]],
                              truncated=frozenset(truncated)))
        return specs

    def _buffers(self, program: _Decoded,
                 weights: Mapping[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, str, bool]]:
        """Per attribute of the graph: its tensor, name and whether it is a model weight."""
        out: dict[str, tuple[torch.Tensor, str, bool]] = {}
        for attr, b in program.doc["buffers"].items():
            if not isinstance(b, dict) or not isinstance(b.get("name"), str) or not _NAME.match(str(attr)):
                raise DamagedProgram(f"a malformed constant {str(attr)[:60]}")
            dtype, shape = _dtype(b["dtype"]), _shape(b["shape"])
            if b["weight"] is True:
                t = _weight(weights, b["name"], dtype, shape).detach()
            else:
                offset, nbytes = b["offset"], b["nbytes"]
                if type(offset) is not int or type(nbytes) is not int or offset < 0 or nbytes < 0 \
                        or offset + nbytes > len(program.blob):
                    raise DamagedProgram(f"constant {b['name']} lies outside the entry")
                numel = 1
                for d in shape:
                    numel *= d
                if numel * dtype.itemsize != nbytes:
                    raise DamagedProgram(f"constant {b['name']} has {nbytes} bytes for {dtype} {list(shape)}")
                raw = bytearray(program.blob[offset:offset + nbytes])
                flat = torch.frombuffer(raw, dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
                t = flat.view(dtype).reshape(shape).to(torch.device(b["device"]))
            if not self.settings.share_weights:
                t = t.clone()
            out[attr] = (t, b["name"], b["weight"] is True)
        return out

    def _sources(self, doc: Mapping[str, Any], weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """The weights the compiled graph follows (None: it follows none)."""
        names = doc.get("weight_sources")
        if names is None or not self.settings.share_weights:
            return None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise DamagedProgram("a malformed list of weights")
        missing = [n for n in names if n not in weights]
        if missing:
            raise _WeightsDiffer(f"the model has no weight {missing[0]}")
        return {n: weights[n] for n in names}

    def _load_engines(self, specs: list[dict[str, Any]],
                      weights: Mapping[str, torch.Tensor]) -> dict[str, KilnEngineModule] | None:
        """Every engine of the program from the engine cache (several at once), or None when one
        is missing or unusable (the engine cache logs why and removes a bad entry)."""

        def load(spec: dict[str, Any]) -> KilnEngineModule | None:
            name = f"{spec['label']} of {self.graph_name}"
            cached = CachedBuild.for_key(self.store, spec["key"], self.device, name, spec["weights"], weights)

            def make_module(engine: Any) -> KilnEngineModule:
                module = KilnEngineModule(engine, self.device, spec["inputs"], spec["outputs"], name=name,
                                          use_cuda_graphs=self.settings.use_cuda_graphs)
                module.truncated_weights = spec["truncated"]
                return module

            def check(engine: Any) -> None:
                if engine.policy != build_policy(self.settings):
                    raise _C.InternalError(f"engine was built with {engine.policy!r}, the settings ask for "
                                           f"{build_policy(self.settings)!r}")
                for kind, ios in (("inputs", engine.inputs), ("outputs", engine.outputs)):
                    got = [(torch_dtype(io.dtype), tuple(io.shape)) for io in ios]
                    if got != spec["io"][kind]:
                        raise _C.InternalError(f"engine {kind} are {got}, the program's {spec['io'][kind]}")
            return cached.load(make_module, check)

        if len(specs) > 1:
            with ThreadPoolExecutor(min(len(specs), 4), thread_name_prefix="kiln-program-load") as pool:
                modules = list(pool.map(load, specs))
        else:
            modules = [load(s) for s in specs]
        if any(m is None for m in modules):
            self._unusable.update(s["key"] for s, m in zip(specs, modules) if m is None)
            return None
        return {s["attr"]: m for s, m in zip(specs, modules) if m is not None}

    def _graph(self, doc: Mapping[str, Any], buffers: Mapping[str, tuple[torch.Tensor, str, bool]],
               engines: set[str]) -> fx.Graph:
        """The program's graph, every node checked: ATen / prims ops, getitem, the program's own
        engines and constants, placeholders and one output, each argument naming nodes before it."""
        graph = fx.Graph()
        nodes: dict[str, fx.Node] = {}
        for item in doc["nodes"]:
            if not isinstance(item, list) or len(item) != 5 or not isinstance(item[1], str) or item[1] in nodes:
                raise DamagedProgram("a malformed node")
            op, name, target, args, kwargs = item
            args, kwargs = _decode(args, nodes), _decode(kwargs, nodes)
            if not isinstance(args, tuple) or not isinstance(kwargs, dict):
                raise DamagedProgram(f"node {name}: malformed arguments")
            if op == "call_function":
                node = graph.create_node(op, _op_target(target), args, kwargs, name)
            elif op == "call_module" and target in engines or op == "get_attr" and target in buffers:
                node = graph.create_node(op, target, args, kwargs, name)
                if op == "get_attr":
                    _, kiln_name, weight = buffers[target]
                    node.meta.update(kiln_name=kiln_name, kiln_weight=weight)
            elif op == "placeholder" and isinstance(target, str) and _NAME.match(target) and not args and not kwargs:
                node = graph.create_node(op, target, (), {}, name)
            elif op == "output" and len(args) == 1 and not kwargs:
                node = graph.create_node(op, "output", args, {}, name)
            else:
                raise DamagedProgram(f"node {name}: {str(op)[:20]} {str(target)[:60]} is not a node of a program")
            nodes[name] = node
        graph.lint()
        return graph

    @staticmethod
    def _module(graph: fx.Graph, buffers: Mapping[str, tuple[torch.Tensor, str, bool]],
                engines: Mapping[str, KilnEngineModule], sources: dict[str, torch.Tensor] | None) -> fx.GraphModule:
        root = torch.nn.Module()
        for attr, (t, _, _) in buffers.items():
            root.register_buffer(attr, t)
        for attr, module in engines.items():
            root.add_module(attr, module)
        gm = fx.GraphModule(root, graph, class_name="KilnLoweredGraph")
        if sources is not None:
            gm.meta["kiln_weight_sources"] = sources
        return gm

    # -- the miss --
    def compile(self, lowered: LoweredGraph, device: str) -> fx.GraphModule:
        """compile_lowered, noting the engines the cache holds, then stores the program (with
        ``cache_built_engines``) unless a block failed to build, an engine is not in the cache
        or the graph cannot be described."""
        count("lowerings")
        with recording(frozenset(self._unusable)) as rec:
            gm = compile_lowered(lowered, self.settings, device, self.graph_name)
        if not self.settings.cache_built_engines:
            return gm
        why = ""
        if device != self.device:
            why = f"it was keyed for {self.device}, compiled for {device}"
        elif rec.counts.get("build_failures"):
            why = "a block failed to build"
        elif self.out_spec is not None and lowered.out_spec != self.out_spec:
            why = "its outputs nest otherwise than the captured graph's"
        if why:
            log.info("program cache: %s not stored: %s", self.graph_name, why)
            return gm
        by_engine = {id(r.engine): (r.key, r.weights) for r in rec.engines}
        engines = {}
        for attr, module in gm.named_children():
            if isinstance(module, KilnEngineModule):
                if id(module.engine) not in by_engine:
                    log.info("program cache: %s not stored: %s's engine is not in the cache", self.graph_name, attr)
                    return gm
                engines[attr] = by_engine[id(module.engine)]
        try:
            data = encode_program(gm, engines, self.key, self.graph_name)
            self.store.put_program(self.key, data)
        except Uncacheable as err:
            log.info("program cache: %s not stored: %s", self.graph_name, err)
            return gm
        except Exception as err:  # noqa: BLE001 - a full disk must not fail the compilation
            log.warning("program cache: could not store the program of %s: %s: %s", self.graph_name,
                        type(err).__name__, err)
            return gm
        count("programs_stored")
        self.in_store = True
        log.info("program cache: stored %s (key %s, %d bytes, %d engine(s))", self.graph_name, self.key[:16],
                 len(data), len(engines))
        return gm

    def _miss(self, why: str) -> None:
        count("program_misses")
        log.info("program cache miss for %s (key %s): %s", self.graph_name, self.key[:16], why)

    def _reject(self, why: str) -> None:
        _remove_entry(self.store, self.key, f"entry {self.key[:16]} for {self.graph_name}: {why}; removing it and "
                      "compiling the graph again")


def _read_entry(store: EngineCache, key: str, reject: Callable[[str], None]) -> Any:
    """The store's program entry under `key`, or None: absent, unusable (`reject` gets why) or a
    store that failed (logged: a user store must not break compilation)."""
    try:
        return store.read_program(key)
    except UnusableEntry as err:
        reject(str(err))
    except Exception as err:  # noqa: BLE001 - a user store must not break compilation
        log.warning("program cache: %r failed to read %s: %s: %s", store, key, type(err).__name__, err)
    return None


def _remove_entry(store: EngineCache, key: str, message: str) -> None:
    """Counts and logs a rejected program entry (`message`) and removes it from the store."""
    count("programs_rejected")
    log.warning("program cache: %s", message)
    try:
        store.remove_program(key)
    except Exception as err:  # noqa: BLE001
        log.warning("program cache: %r failed to remove %s: %s", store, key, err)


def _weight(weights: Mapping[str, torch.Tensor], name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    t = weights.get(name)
    if not isinstance(t, torch.Tensor):
        raise _WeightsDiffer(f"the model has no weight {name}")
    if t.dtype != dtype or tuple(t.shape) != shape:
        raise _WeightsDiffer(f"weight {name} is {t.dtype} {list(t.shape)}, the program's {dtype} {list(shape)}")
    return t


def _not_keyed(graph_name: str, err: Exception) -> None:
    if isinstance(err, Uncacheable):
        log.info("program cache: %s is compiled without it: %s", graph_name, err)
    else:
        log.warning("program cache: no key for %s (%s: %s); compiling without it", graph_name, type(err).__name__, err)


# ---- warm start without torch.export: the module key -----------------------------------------

_MODULE_KEY_FORMAT = "kiln-module-key-1"
_POINTER_MAGIC = b"KILNMOD1"
_MODULE_STATE = frozenset(vars(torch.nn.Module()))  # every module's own: tensors, children, hooks, training
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")
# Class attributes keyed by value (plain data: a class-level flag or table a forward reads).
_CLASS_DATA = (bool, int, float, complex, str, bytes, type(None), tuple, list, dict, set, frozenset, enum.Enum,
               torch.dtype)
_MAX_VALUES = 200_000  # plain values described per key; a module with more is not keyed
_VERSIONED = frozenset({"torch", "builtins", *sys.stdlib_module_names})  # keyed by their version


@functools.lru_cache(maxsize=4096)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """The SHA-256 of a file's contents (size and mtime only key this process's memo of it)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class _Describer:
    """Deterministic text of a module tree's plain state. Notes the source files of the code it
    meets (classes, functions, modules: see ``note_code``); raises Uncacheable for a value it
    cannot describe exactly."""

    def __init__(self, modules: Mapping[int, str]) -> None:
        self.modules = modules  # id of every module of the tree -> its name
        self.files: dict[str, str] = {}  # source file -> the Python module it is
        self.noted: set[str] = set()
        self.classes: dict[type, str] = {}
        self.seen: dict[int, int] = {}  # objects described (by id) -> order of first sight
        self.alive: list[Any] = []  # the objects seen, held so that their ids stay theirs
        self.values = 0

    # -- code --
    def _module_file(self, name: str) -> None:
        if name in self.noted or name.partition(".")[0] in _VERSIONED:
            return
        self.noted.add(name)
        mod = sys.modules.get(name)
        path = getattr(mod, "__file__", None)
        if not isinstance(path, str) or not Path(path).is_file():
            raise Uncacheable(f"Python module {name} has no source file")
        self.files[path] = name

    def note_code(self, module_name: str) -> None:
        """Notes the file of a Python module and of every module its globals come from (one level:
        what the module imports and calls)."""
        if module_name in self.noted or module_name.partition(".")[0] in _VERSIONED:
            return
        self._module_file(module_name)
        for value in list(getattr(sys.modules[module_name], "__dict__", {}).values()):
            if isinstance(value, types.ModuleType):
                name = value.__name__
            elif isinstance(value, (type, types.FunctionType)):
                name = value.__module__
            else:
                continue
            if isinstance(name, str) and name in sys.modules:
                self._module_file(name)

    def code_ref(self, obj: Any) -> str:
        """A class or a module-level function by module and qualified name (its module's files
        noted)."""
        module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if not isinstance(module, str) or not isinstance(qualname, str):
            raise Uncacheable(f"{obj!r} has no module or qualified name")
        if "<locals>" in qualname or "<lambda>" in qualname:
            raise Uncacheable(f"{module}.{qualname} is defined inside a function")
        if module in sys.modules:
            self.note_code(module)
        elif module.partition(".")[0] not in _VERSIONED:
            raise Uncacheable(f"{module}.{qualname}'s module is not imported")
        return f"{module}.{qualname}"

    def function(self, fn: types.FunctionType, strict: bool = True) -> str:
        """A Python function: where its code is (module, qualified name, file and line; the
        module's files noted), its defaults and the values it closes over. ``strict=False`` (a
        decorator's wrapper): a closed-over value it cannot describe is keyed by its type."""
        code, module = fn.__code__, fn.__module__
        if not isinstance(module, str):
            raise Uncacheable(f"function {fn.__qualname__} has no module")
        if module.partition(".")[0] not in _VERSIONED:
            if not Path(code.co_filename).is_file():
                raise Uncacheable(f"{module}.{fn.__qualname__} has no source file")
            if module not in sys.modules:
                raise Uncacheable(f"{module}.{fn.__qualname__}'s module is not imported")
            self.note_code(module)
            self.files.setdefault(code.co_filename, module)
        if id(fn) in self.seen:
            return f"@{self.seen[id(fn)]}"
        self.seen[id(fn)] = len(self.seen)
        self.alive.append(fn)
        cells = []
        for cell in fn.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # a cell not filled yet
                cells.append("empty")
                continue
            if isinstance(value, types.FunctionType):
                cells.append(self.function(value, strict))
            elif isinstance(value, types.MethodType) and isinstance(value.__func__, types.FunctionType):
                cells.append(f"{type(value.__self__).__qualname__}.{self.function(value.__func__, strict)}")
            elif strict:
                cells.append(self.describe(value))
            else:
                try:
                    cells.append(self.describe(value))
                except Uncacheable:
                    cells.append(f"a {type(value).__module__}.{type(value).__qualname__}")
        return (f"fn #{self.seen[id(fn)]} {module}.{fn.__qualname__}@{code.co_filename}:{code.co_firstlineno} "
                f"[{','.join(cells)}] {self.describe(fn.__defaults__)} {self.describe(fn.__kwdefaults__)}")

    def class_ref(self, cls: type) -> str:
        """A class with its bases; a function in a class that another file defines (a method set
        on the class from elsewhere) is described with what it closes over."""
        known = self.classes.get(cls)
        if known is not None:
            return known
        parts = []
        for base in cls.__mro__[:-1]:
            parts.append(self.code_ref(base))
            home = getattr(sys.modules.get(base.__module__), "__file__", None)
            for name, value in vars(base).items():
                if isinstance(value, (staticmethod, classmethod)):
                    value = value.__func__
                if isinstance(value, types.FunctionType) and value.__code__.co_filename != home:
                    parts.append(f"{name}={self.function(value, strict=False)}")
                elif not name.startswith("__") and isinstance(value, _CLASS_DATA):
                    parts.append(f"{name}:{self.describe(value)}")  # class-level settings, set at run time too
        self.classes[cls] = text = "(" + ",".join(parts) + ")"
        return text

    # -- values --
    def describe(self, v: Any) -> str:
        self.values += 1
        if self.values > _MAX_VALUES:
            raise Uncacheable(f"more than {_MAX_VALUES} attribute values")
        t = type(v)
        if v is None or t is bool:
            return repr(v)
        if t is int:
            return f"i{v}"
        if t is float:
            return f"f{v.hex()}"
        if t is complex:
            return f"c{v.real.hex()},{v.imag.hex()}"
        if t in (str, bytes):
            return repr(v)
        if isinstance(v, (int, float, str, bytes)) and not isinstance(v, enum.Enum):  # a subclass: type and value
            base: Callable[[Any], Any] = next(b for b in (bool, int, float, str, bytes) if isinstance(v, b))
            return f"{self.code_ref(t)}({self.describe(base(v))})"
        if v is Ellipsis:
            return "..."
        if isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return f"{t.__name__}:{v}"
        if isinstance(v, enum.Enum):
            return f"enum {self.code_ref(t)}.{v.name}"
        if isinstance(v, torch.nn.Module):
            if id(v) not in self.modules:
                raise Uncacheable(f"an attribute holds a {t.__qualname__} that is not a submodule")
            return f"module {self.modules[id(v)]!r}"
        if isinstance(v, torch.Tensor):
            if t not in (torch.Tensor, torch.nn.Parameter):
                raise Uncacheable(f"an attribute holds a {t.__qualname__}")
            return f"tensor {_tensor_meta(v)} {hashlib.sha256(_tensor_bytes(v)).hexdigest()}"
        if isinstance(v, type):
            return f"class {self.code_ref(v)}"
        if isinstance(v, types.FunctionType):
            return self.function(v)
        if isinstance(v, types.BuiltinFunctionType):
            owner = v.__self__
            if owner is None or isinstance(owner, types.ModuleType):
                return f"builtin {v.__module__ or getattr(owner, '__name__', '')}.{v.__qualname__}"
            return f"builtin {self.describe(owner)}.{v.__name__}"
        if isinstance(v, types.MethodType):
            return f"method {self.describe(v.__self__)}.{self.describe(v.__func__)}"
        if isinstance(v, types.ModuleType):
            if v.__name__ in sys.modules:
                self.note_code(v.__name__)
            return f"pymodule {v.__name__}"
        if isinstance(v, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            return f"op {v}"
        if isinstance(v, logging.Logger):
            return f"logger {v.name}"
        if id(v) in self.seen:
            return f"@{self.seen[id(v)]}"
        self.seen[id(v)] = len(self.seen)
        self.alive.append(v)
        prefix = f"#{self.seen[id(v)]} " + ("" if t in (list, tuple, dict, set, frozenset) else self.code_ref(t))
        if isinstance(v, functools.partial):
            return f"{prefix} partial({self.describe(v.func)},{self.describe(v.args)},{self.describe(v.keywords)})"
        if isinstance(v, (list, tuple)):
            return f"{prefix}[" + ",".join(self.describe(x) for x in v) + "]"
        if isinstance(v, dict):
            return f"{prefix}{{" + ",".join(f"{self.describe(k)}:{self.describe(x)}" for k, x in v.items()) + "}"
        if isinstance(v, (set, frozenset)):
            return f"{prefix}{{" + ",".join(sorted(self.describe(x) for x in v)) + "}"
        state = getattr(v, "__dict__", None)
        slots = [s for c in t.__mro__ for s in _slot_names(c)]
        if isinstance(state, dict) or slots:
            fields = dict(state) if isinstance(state, dict) else {}
            for s in slots:
                if s not in ("__dict__", "__weakref__") and hasattr(v, s):
                    fields[f"slot {s}"] = getattr(v, s)
            return f"{prefix} obj{{" + ",".join(f"{k!r}:{self.describe(x)}" for k, x in sorted(fields.items())) + "}"
        to_dict = getattr(v, "to_dict", None)
        if callable(to_dict):
            try:
                as_dict = to_dict()
            except Exception as err:  # noqa: BLE001 - any object's method
                raise Uncacheable(f"{t.__qualname__}.to_dict() failed ({type(err).__name__})") from None
            return f"{prefix} dict {self.describe(as_dict)}"
        raise Uncacheable(f"an attribute holds a {t.__module__}.{t.__qualname__}, which it cannot describe")


def _slot_names(cls: type) -> list[str]:
    slots = vars(cls).get("__slots__", ())
    return [slots] if isinstance(slots, str) else [s for s in slots if isinstance(s, str)]


def _input_meta(v: Any, describer: _Describer) -> str:
    if isinstance(v, torch.Tensor):
        if type(v) is not torch.Tensor:
            raise Uncacheable(f"an input is a {type(v).__qualname__}")
        return _tensor_meta(v)
    return describer.describe(v)


def module_key(module: torch.nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any] | None, keep: Sequence[str],
               settings: CompilationSettings, device: str) -> str:
    """The key of a module before torch.export traces it: everything the module key covers
    (docs/engine-cache.md, "Warm start without torch.export"); Uncacheable when it cannot be
    made exactly."""
    import torch.nn.modules.module as module_module
    for hooks in _GLOBAL_HOOKS:
        if getattr(module_module, hooks, None):
            raise Uncacheable(f"a global module hook ({hooks.strip('_')}) is registered")
    if any(torch.is_autocast_enabled(kind) for kind in ("cpu", "cuda")):
        raise Uncacheable("autocast is on")
    h = _key_prefix("module", settings, device, keep)
    _line(h, f"{_MODULE_KEY_FORMAT} python {sys.version} default dtype {torch.get_default_dtype()} "
             f"device {torch.get_default_device()}")
    tree = list(module.named_modules(remove_duplicate=False))
    names: dict[int, str] = {}
    for name, m in tree:
        names.setdefault(id(m), name)
    d = _Describer(names)
    for name, m in tree:
        for hooks in _HOOKS:
            if getattr(m, hooks, None):
                raise Uncacheable(f"module {name or type(m).__name__} has {hooks.strip('_').replace('_', ' ')}")
        state = vars(m)
        _line(h, f"module {name!r} {d.class_ref(type(m))} training={m.training} "
                 f"non-persistent={sorted(m._non_persistent_buffers_set)}")
        for attr in sorted(k for k in state if k not in _MODULE_STATE):
            _line(h, f" {attr}={d.describe(state[attr])}")
    first: dict[int, str] = {}
    for name, t in (*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)):
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise Uncacheable(f"{name} is a {type(t).__qualname__}")
        _line(h, f"tensor {name} {type(t).__name__} {_tensor_meta(t)} same-as {first.setdefault(id(t), name)}")
    flat, spec = pytree.tree_flatten((tuple(args), dict(kwargs or {})))
    _line(h, f"inputs {spec}")
    for leaf in flat:
        _line(h, f"input {_input_meta(leaf, d)}")
    packages = set()
    for path, name in sorted(d.files.items()):
        st = os.stat(path)
        _line(h, f"file {name} {path} {_file_digest(path, st.st_size, st.st_mtime_ns)}")
        packages.add(name.partition(".")[0])
    for package in sorted(packages):
        _line(h, f"package {package} {getattr(sys.modules.get(package), '__version__', None)}")
    return h.hexdigest()


class WarmHit(NamedTuple):
    """A program found by the module key: the compiled graph and the exported program's call specs."""

    gm: fx.GraphModule
    in_spec: pytree.TreeSpec
    out_spec: pytree.TreeSpec


class WarmStart:
    """kiln.compile's lookup before torch.export: a small entry under the module key (module_key)
    names the program key its ExportedProgram had and keeps the call specs, so that a hit loads
    the program without exporting. ``load`` before torch.export; ``program_cache`` instead of
    ProgramCache.for_exported_program after it; ``remember`` once the program is in the cache."""

    def __init__(self, key: str, module: torch.nn.Module, settings: CompilationSettings, device: str,
                 graph_name: str) -> None:
        self.key = key
        self.module = module
        self.settings = settings
        self.device = device
        self.graph_name = graph_name
        self.store: EngineCache = engine_cache_for(settings)
        self._missed: ProgramCache | None = None  # the program the entry named, which missed

    @classmethod
    def for_module(cls, module: torch.nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any] | None,
                   keep: Sequence[str], settings: CompilationSettings, graph_name: str) -> WarmStart | None:
        """The module's warm start, or None (the cache is not used, the switch is off, or the
        module cannot be keyed: logged, and torch.export runs as usual)."""
        if not _uses_cache(settings) or not settings.module_key:
            return None
        start = time.perf_counter()
        try:
            leaves = pytree.tree_leaves((tuple(args), dict(kwargs or {})))
            device = device_of(settings, [a for a in leaves if isinstance(a, torch.Tensor)])
            key = module_key(module, args, kwargs, keep, settings, device)
        except Exception as err:  # noqa: BLE001 - the cache never fails a compilation
            if isinstance(err, Uncacheable):
                log.info("program cache: no module key for %s, torch.export runs: %s", graph_name, err)
            else:
                log.warning("program cache: no module key for %s (%s: %s); torch.export runs", graph_name,
                            type(err).__name__, err)
            return None
        log.debug("program cache: module key of %s %s (%.3f s)", graph_name, key[:16], time.perf_counter() - start)
        return cls(key, module, settings, device, graph_name)

    def weights(self) -> dict[str, torch.Tensor]:
        """The module's parameters and buffers by name, as torch.export's program names them."""
        return {**dict(self.module.named_buffers(remove_duplicate=False)),
                **dict(self.module.named_parameters(remove_duplicate=False))}

    def load(self) -> WarmHit | None:
        """The program the module key names, loaded as ProgramCache.load does; None on a miss."""
        if not self.settings.reuse_cached_engines:
            return None
        entry = _read_entry(self.store, self.key, self._reject)
        if entry is None:
            log.info("program cache: no entry for %s's module key %s; torch.export runs", self.graph_name,
                     self.key[:16])
            return None
        try:
            program_key, in_spec, out_spec = _parse_pointer(entry.data, self.key)
        except Exception as err:  # noqa: BLE001 - whatever a damaged entry makes the decoding raise
            self._reject(f"{entry.source} is damaged ({type(err).__name__}: {err})")
            return None
        programs = ProgramCache(program_key, self.settings, self.device, self.graph_name)
        hit = programs.load(self.weights())
        if hit is None:
            self._missed = programs
            return None
        log.info("program cache: %s found by its module key %s, without torch.export", self.graph_name, self.key[:16])
        return WarmHit(hit.gm, in_spec, out_spec)

    def program_cache(self, ep: torch.export.ExportedProgram, keep: Sequence[str]) -> ProgramCache | None:
        """ProgramCache.for_exported_program; when the module key led to this very program a
        moment ago and it missed, its lookup is not repeated (the engines found unusable stay so)."""
        programs = ProgramCache.for_exported_program(ep, keep, self.settings, self.graph_name)
        missed = self._missed
        if programs is not None and missed is not None and missed.key == programs.key:
            missed.out_spec = programs.out_spec
            missed.looked_up = True
            return missed
        return programs

    def remember(self, programs: ProgramCache | None, ep: torch.export.ExportedProgram) -> None:
        """Stores the module key's entry once ``programs`` (the ExportedProgram's) is in the cache."""
        if programs is None or not programs.in_store or not self.settings.cache_built_engines:
            return
        try:
            data = _encode_pointer(self.key, programs.key, ep.call_spec.in_spec, ep.call_spec.out_spec)
            self.store.put_program(self.key, data)
        except Exception as err:  # noqa: BLE001 - a spec that does not serialize, a full disk
            log.info("program cache: %s's module key not stored (%s: %s); torch.export will run", self.graph_name,
                     type(err).__name__, err)
            return
        log.info("program cache: stored %s's module key %s -> program %s", self.graph_name, self.key[:16],
                 programs.key[:16])

    def _reject(self, why: str) -> None:
        _remove_entry(self.store, self.key, f"module entry {self.key[:16]} for {self.graph_name}: {why}; removing it")


def _encode_pointer(key: str, program_key: str, in_spec: pytree.TreeSpec, out_spec: pytree.TreeSpec) -> bytes:
    doc = {"format": _MODULE_KEY_FORMAT, "key": key, "program": program_key,
           "in_spec": pytree.treespec_dumps(in_spec), "out_spec": pytree.treespec_dumps(out_spec)}
    return _POINTER_MAGIC + json.dumps(doc, separators=(",", ":")).encode()


def _parse_pointer(data: bytes | bytearray | memoryview, key: str) -> tuple[str, pytree.TreeSpec, pytree.TreeSpec]:
    """A module key entry: the program key it names and the call specs (loaded by pytree, which
    only rebuilds types registered with it)."""
    view = memoryview(data).cast("B")
    if bytes(view[:len(_POINTER_MAGIC)]) != _POINTER_MAGIC:
        raise DamagedProgram("no module entry header")
    doc = json.loads(bytes(view[len(_POINTER_MAGIC):]))
    if not isinstance(doc, dict) or doc.get("format") != _MODULE_KEY_FORMAT or doc.get("key") != key:
        raise DamagedProgram("another format or another key's entry")
    program, in_spec, out_spec = doc.get("program"), doc.get("in_spec"), doc.get("out_spec")
    if not isinstance(program, str) or not re.fullmatch(r"[0-9a-f]{64}", program) \
            or not isinstance(in_spec, str) or not isinstance(out_spec, str):
        raise DamagedProgram("a malformed module entry")
    return program, pytree.treespec_loads(in_spec), pytree.treespec_loads(out_spec)
