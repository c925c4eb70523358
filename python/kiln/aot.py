"""Ahead-of-time entry points and the compile pipeline they share with the Dynamo backend.

    compiled = kiln.compile(model_or_exported_program, arg_inputs=[x], **settings)
    kiln.save(compiled, "model.ep", arg_inputs=[x])     # a torch.export ExportedProgram
    program = kiln.load("model.ep")                      # in any process; program.module()(x)
    kiln.extract_engines("model.ep", "engines/")         # engine_0.kiln ... for kiln-run

kiln.load runs no code from the file unless told the file is trusted, and checks every engine
in it (kiln/archive.py).

:func:`compile_lowered` is the pipeline after lowering: ask the importers, partition, report
(dry run) or describe + build each block, and swap each built block for a KilnEngineModule.
With ``reuse_cached_engines`` / ``cache_built_engines`` a block's engine comes from / goes to
the engine cache (kiln/cached_build.py: a hit is loaded and refitted with the block's weights).
A block whose build fails stays in PyTorch with a warning naming the cause, unless
``pass_through_build_failures`` (or ``require_full_compilation``) asks for the error.
In a saved program each engine is a call of ``kiln::execute_engine`` whose engine bytes are a
uint8 buffer of the program.
"""

from __future__ import annotations

import collections
import dataclasses
import operator
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from kiln import _C
from kiln._logging import debug_logging, get_logger
from kiln.archive import check_archive, engine_blobs
from kiln.archive import check_engines as check_engines_of
from kiln.cached_build import CachedBuild, count
from kiln.dryrun import emit_report, format_report
from kiln.lowering import LoweredGraph, lower_exported_program, lower_module
from kiln.partition import Block, is_op, op_name, partition, replace_block
from kiln.refit import WeightWatch, follow_weights
from kiln.runtime import KilnEngineModule, borrowable_weights, build_engine, warm_up
from kiln.settings import CompilationSettings, settings_from_options
from kiln.translate import Capability, EncodeError, describe_block_parts, kiln_dtype

log = get_logger("compile")

__all__ = ["compile", "save", "load", "extract_engines", "compile_lowered", "KilnModule", "CompileSummary"]


def supported_targets() -> list[str]:
    return list(_C.supported_aten_targets())


@dataclasses.dataclass
class CompileSummary:
    """What one compiled graph ended up with (kept as ``gm.meta["kiln_summary"]``)."""

    graph_name: str
    engines: int
    ops_in_engines: collections.Counter[str]
    ops_in_pytorch: collections.Counter[str]   # excluding getitems of engine results
    seconds: float = 0.0                       # Kiln's part: partition, describe, build or load

    @property
    def coverage(self) -> float:
        total = sum(self.ops_in_engines.values()) + sum(self.ops_in_pytorch.values())
        return 100.0 * sum(self.ops_in_engines.values()) / total if total else 100.0


def _check_engine(engine: Any, block: Block, settings: CompilationSettings) -> None:
    """The engine's I/O must be exactly what PyTorch's metadata says (else it is not used)."""
    for kind, ios, nodes in (("input", engine.inputs, block.inputs), ("output", engine.outputs, block.outputs)):
        if len(ios) != len(nodes):
            raise _C.InternalError(f"engine has {len(ios)} {kind}s, the block {len(nodes)}")
        for io, node in zip(ios, nodes):
            val = node.meta["val"]
            want = (kiln_dtype(val.dtype, settings.truncate_double), list(val.shape))
            if (io.dtype, list(io.shape)) != want:
                raise _C.InternalError(f"engine {kind} '{io.name}' is {io.dtype} {list(io.shape)}, but PyTorch "
                                       f"computes {want[0]} {want[1]} for {node.name}")


def _truncated(constants: Sequence[Any]) -> frozenset[str]:
    """The weights the model holds in float64 and the description in float32 (truncate_double)."""
    return frozenset(c.name for c in constants
                     if c.weight and c.source.dtype == torch.float64 and c.dtype == torch.float32)


def _build_block(gm: fx.GraphModule, block: Block, settings: CompilationSettings, device: str,
                 name: str) -> KilnEngineModule | None:
    """The engine module of one block: from the engine cache (refitted) or freshly built."""
    truncated: frozenset[str] = frozenset()

    def make_module(engine: Any) -> KilnEngineModule:
        module = KilnEngineModule(engine, device, [n.meta["val"].dtype for n in block.inputs],
                                  [n.meta["val"].dtype for n in block.outputs], name=name,
                                  use_cuda_graphs=settings.use_cuda_graphs)
        module.truncated_weights = truncated
        return module
    try:
        cached = None
        if settings.reuse_cached_engines or settings.cache_built_engines:
            # The key needs no weight bytes, and a hit takes the weights from the model: copy them
            # into the description only when the block is built.
            lite = describe_block_parts(gm, block, settings, weight_bytes=not settings.reuse_cached_engines)
            truncated = _truncated(lite.constants)
            cached = CachedBuild.create(lite, settings, device, name)
            if cached is not None and settings.reuse_cached_engines:
                module = cached.load(make_module, lambda e: _check_engine(e, block, settings))
                if module is not None:
                    return module
            parts = lite if lite.weight_bytes else describe_block_parts(gm, block, settings)
        else:
            parts = describe_block_parts(gm, block, settings)
        truncated = _truncated(parts.constants)
        shared = borrowable_weights(parts.constants, device) if settings.share_weights else None
        engine = build_engine(parts.graph, settings, device, shared)
        count("builds")
        _check_engine(engine, block, settings)
    except (_C.KilnError, EncodeError) as err:
        if settings.pass_through_build_failures or settings.require_full_compilation:
            raise
        ops = ", ".join(f"{k} x{v}" for k, v in block.histogram().most_common())
        msg = f"Kiln could not build {name} ({ops}); running it in PyTorch: {err}"
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        log.warning("%s", msg)
        return None
    log.debug("built %s: %d ops\n%s", name, block.num_ops, engine.build_log)
    if cached is not None and settings.cache_built_engines:
        cached.store(engine)
    return make_module(engine)


def compile_lowered(lowered: LoweredGraph, settings: CompilationSettings, device: str,
                    graph_name: str = "graph") -> fx.GraphModule:
    """Partitions the lowered graph and replaces each buildable block by an engine module."""
    start = time.perf_counter()
    if not settings.builds_nothing:
        warm_up(device)  # overlaps the partitioning (a no-op when kiln.compile started it already)
    gm = lowered.gm
    result = partition(gm, Capability(gm, settings), settings)
    if settings.builds_nothing or settings.debug:
        emit_report(format_report(result, settings, graph_name), settings)
    if settings.builds_nothing:
        gm.meta["kiln_summary"] = CompileSummary(graph_name, 0, collections.Counter(), result.pytorch_ops())
        return gm
    built: list[tuple[Block, KilnEngineModule]] = []
    for i, block in enumerate(result.blocks):
        module = _build_block(gm, block, settings, device, f"engine {i} of {graph_name}")
        if module is not None:
            built.append((block, module))
    remap: dict[fx.Node, fx.Node] = {}
    for i, (block, module) in enumerate(built):
        block.inputs = [remap.get(n, n) for n in block.inputs]
        replace_block(gm, block, f"_kiln_engine_{i}", module, remap)
    gm.graph.eliminate_dead_code()
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for attr, buffer in list(gm.named_buffers(recurse=False)):
        if attr not in used:
            delattr(gm, attr)
        elif not settings.share_weights:
            gm.register_buffer(attr, buffer.clone())  # a snapshot: the PyTorch parts too
    if not settings.share_weights:
        gm.meta.pop("kiln_weight_sources", None)  # nothing to follow
    gm.recompile()
    in_engines: collections.Counter[str] = collections.Counter()
    for block, _ in built:
        in_engines.update(block.histogram())
    in_pytorch = collections.Counter(op_name(n) for n in gm.graph.nodes if is_op(n))
    seconds = time.perf_counter() - start
    gm.meta["kiln_summary"] = CompileSummary(graph_name, len(built), in_engines, in_pytorch, seconds)
    log.info("%s: %d engine(s), %d of %d ops in engines, %.3f s", graph_name, len(built),
             sum(in_engines.values()), result.total_ops, seconds)
    return gm


def unflattener(out_spec: pytree.TreeSpec | None) -> Callable[[Sequence[Any]], Any]:
    """flat outputs -> the program's output structure; plain tuples and single values skip pytree."""
    if out_spec is None:
        return lambda flat: flat
    n = out_spec.num_leaves
    if out_spec == pytree.tree_flatten(tuple(range(n)))[1]:
        return tuple
    if out_spec == pytree.tree_flatten(0)[1]:
        return operator.itemgetter(0)
    return lambda flat: pytree.tree_unflatten(list(flat), out_spec)


def graph_runner(gm: fx.GraphModule) -> Callable[..., Sequence[Any]]:
    """How to run a compiled graph: the graph itself, or, when the whole graph is one engine
    call on its inputs in order, that engine's forward directly (saves the GraphModule's few
    microseconds per call; hooks on the engine module do not run on this path)."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    calls = [n for n in nodes if n.op == "call_module"]
    output = nodes[-1]
    if len(calls) != 1 or tuple(calls[0].args) != tuple(placeholders) or calls[0].kwargs:
        return gm
    engine = gm.get_submodule(str(calls[0].target))
    rest = [n for n in nodes if n.op not in ("placeholder", "call_module", "output")]
    results = output.args[0]
    if not isinstance(engine, KilnEngineModule) or not isinstance(results, (tuple, list)) or any(
            n.target is not operator.getitem or n.args[0] is not calls[0] for n in rest) \
            or any(r not in rest for r in results):
        return gm
    order = [r.args[1] for r in results]
    if order == list(range(len(engine.output_names))):
        return engine.forward
    forward = engine.forward

    def reordered(*inputs: Any) -> tuple[Any, ...]:
        outs = forward(*inputs)
        return tuple(outs[i] for i in order)
    return reordered


class KilnModule(torch.nn.Module):
    """A compiled program: flattens (args, kwargs) like the exported program, runs the graph.

    It follows the model's weights: a weight changed in place since the engines took it (see
    kiln.refit.WeightWatch) is refitted into them at the next call, or, for engines built with
    ``immutable_weights=True``, the call raises ``kiln.UnsupportedError``. Compiled with
    ``share_weights=False`` it is a snapshot of the model and checks nothing.
    """

    def __init__(self, gm: fx.GraphModule, in_spec: pytree.TreeSpec | None, out_spec: pytree.TreeSpec | None,
                 immutable_weights: bool = False) -> None:
        super().__init__()
        self.gm = gm
        self._in_spec = in_spec
        self._out_spec = out_spec
        self.immutable_weights = immutable_weights
        sources = gm.meta.pop("kiln_weight_sources", None) or {}  # not kept in meta, which pickles
        self.weight_watch: WeightWatch | None = WeightWatch(sources) if sources else None
        # Called with positional leaves only (the common case), flattening is the identity.
        self._positional = in_spec is not None and in_spec == pytree.tree_flatten(
            (tuple(range(in_spec.num_leaves)), {}))[1]
        self._unflatten = unflattener(out_spec)
        self._run = graph_runner(gm)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        watch = self.weight_watch
        if watch is not None and watch.changed():
            self.follow_weights()
        if self._positional and self._in_spec is not None and not kwargs and len(args) == self._in_spec.num_leaves \
                and all(isinstance(a, torch.Tensor) for a in args):
            flat: Sequence[Any] = args
        else:
            flat, spec = pytree.tree_flatten((args, kwargs))
            if self._in_spec is not None and spec != self._in_spec:
                raise ValueError(f"Kiln module called with inputs structured as {spec}, "
                                 f"compiled for {self._in_spec}")
        return self._unflatten(self._run(*flat))

    def follow_weights(self) -> None:
        """Refits the engines now with the model's weights that changed in place (nothing when
        none did). Calls do this by themselves; see the class docstring."""
        if self.weight_watch is not None and self.weight_watch.changed():
            follow_weights(self.weight_watch, self.gm, self.immutable_weights, f"Kiln {self.summary.graph_name}")

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("immutable_weights", False)
        state.setdefault("weight_watch", None)
        super().__setstate__(state)
        self._unflatten = unflattener(self._out_spec)
        self._run = graph_runner(self.gm)

    def __getstate__(self) -> dict[str, Any]:
        # A copy is a snapshot: it holds the engines with the weights they have now (the model's
        # current ones, followed first) and follows no model.
        self.follow_weights()
        state = dict(self.__dict__)
        state.pop("_unflatten", None)
        state.pop("_run", None)
        state["weight_watch"] = None
        return state

    def engines(self) -> list[KilnEngineModule]:
        return [m for m in self.modules() if isinstance(m, KilnEngineModule)]

    @property
    def summary(self) -> CompileSummary:
        return self.gm.meta["kiln_summary"]


def _device_of(settings: CompilationSettings, tensors: Sequence[Any]) -> str:
    devices = {t.device for t in tensors if isinstance(t, torch.Tensor)}
    if settings.device is not None:
        if devices and any(str(d if d.index is not None or d.type == "cpu" else torch.device(d.type, 0))
                           != settings.device for d in devices):
            raise ValueError(f"Kiln option 'device' is {settings.device!r}, but the inputs are on "
                             f"{sorted(str(d) for d in devices)}")
        return settings.device
    if len(devices) > 1:
        raise ValueError(f"inputs on several devices ({sorted(str(d) for d in devices)}); set 'device'")
    dev = devices.pop() if devices else torch.device("cpu")
    return "cpu" if dev.type == "cpu" else f"cuda:{dev.index or 0}"


def _check_examples(arg_inputs: Any, kwarg_inputs: Any) -> None:
    """Example inputs are a list or tuple (and a dict) of tensors, Python scalars, None, or pytree
    containers of them: a lone tensor or a numpy array is a clear error here, not a puzzle later."""
    if arg_inputs is not None and not isinstance(arg_inputs, (list, tuple)):
        hint = " (pass [x])" if isinstance(arg_inputs, torch.Tensor) else ""
        raise TypeError(f"kiln.compile: arg_inputs must be a list or tuple of example inputs, got a "
                        f"{type(arg_inputs).__name__}" + hint)
    if kwarg_inputs is not None and not isinstance(kwarg_inputs, dict):
        raise TypeError(f"kiln.compile: kwarg_inputs must be a dict, got a {type(kwarg_inputs).__name__}")
    leaves, _ = pytree.tree_flatten((list(arg_inputs or ()), dict(kwarg_inputs or {})))
    for leaf in leaves:
        if not isinstance(leaf, (torch.Tensor, int, float, bool, str, type(None), torch.dtype, torch.device)):
            module = type(leaf).__module__
            hint = " (convert it with torch.from_numpy)" if module == "numpy" else ""
            raise TypeError(f"kiln.compile: an example input is a {module}.{type(leaf).__qualname__}, not a "
                            f"torch.Tensor{hint}")


def compile(module: torch.nn.Module | torch.export.ExportedProgram, arg_inputs: Sequence[Any] | None = None,
            kwarg_inputs: dict[str, Any] | None = None, *, settings: CompilationSettings | None = None,
            **options: Any) -> KilnModule:
    """Compiles a module (exported with torch.export on ``arg_inputs``) or an ExportedProgram."""
    settings = settings_from_options(settings, **options)
    if not isinstance(module, (torch.nn.Module, torch.export.ExportedProgram)):
        raise TypeError(f"kiln.compile compiles a torch.nn.Module or a torch.export.ExportedProgram, "
                        f"got a {type(module).__name__}")
    _check_examples(arg_inputs, kwarg_inputs)
    with debug_logging(settings.debug), torch.no_grad():
        keep = supported_targets()
        if not settings.builds_nothing and arg_inputs is not None:
            try:  # the device's libraries set themselves up while torch.export traces
                warm_up(_device_of(settings, list(arg_inputs)))
            except ValueError:
                pass  # inputs on several devices: reported below, after lowering
        if isinstance(module, torch.export.ExportedProgram):
            lowered = lower_exported_program(module, keep, fold_weights=settings.immutable_weights)
        else:
            if arg_inputs is None:
                raise ValueError("kiln.compile needs arg_inputs (example inputs) to trace a module")
            lowered = lower_module(module, list(arg_inputs), kwarg_inputs, keep,
                                     fold_weights=settings.immutable_weights)
        examples = [n.meta.get("val") for n in lowered.gm.graph.nodes if n.op == "placeholder"]
        device = _device_of(settings, examples)
        gm = compile_lowered(lowered, settings, device, graph_name=type(module).__name__)
    return KilnModule(gm, lowered.in_spec, lowered.out_spec, settings.immutable_weights)


def _engine_modules(module: torch.nn.Module) -> list[KilnEngineModule]:
    return [m for m in module.modules() if isinstance(m, KilnEngineModule)]


def save(module: torch.nn.Module, path: str | os.PathLike[str], arg_inputs: Sequence[Any],
         kwarg_inputs: dict[str, Any] | None = None) -> torch.export.ExportedProgram:
    """Exports a compiled module (engines as kiln::execute_engine calls) and saves it."""
    for m in module.modules():
        if isinstance(m, KilnModule):
            m.follow_weights()  # the engines saved hold the model's current weights
    engines = _engine_modules(module)
    if not engines:
        log.warning("kiln.save: the module contains no Kiln engine; saving a plain exported program")
    try:
        for e in engines:
            e.set_exporting(True)
        with torch.no_grad():
            ep = torch.export.export(module, tuple(arg_inputs), kwarg_inputs or {}, strict=False)
    finally:
        for e in engines:
            e.set_exporting(False)
    with open(os.fspath(path), "wb") as f:  # a file object: torch warns about a path not ending in .pt2
        torch.export.save(ep, f)
    return ep


def load(path: str | os.PathLike[str], *, trusted: bool = False) -> torch.export.ExportedProgram:
    """Loads a program saved by kiln.save (call ``.module()`` on it to run it).

    Nothing in the file runs: parts that torch.export would unpickle unsafely or evaluate raise
    ``UnsafeFileError`` naming them (kiln/archive.py), unless ``trusted=True`` (files you made
    or trust: their pickles are loaded as torch.export does). Every embedded engine is
    deserialized and checked here, so a damaged one raises its ``kiln.EngineFileError`` (one that
    cannot be read at all, ``kiln.CorruptedError``) from this call, not from the first run."""
    return _load(os.fspath(path), trusted, check_engines=True)


def _load(path: str, trusted: bool, check_engines: bool) -> torch.export.ExportedProgram:
    if not isinstance(trusted, bool):
        raise TypeError(f"kiln.load: trusted must be a bool, got {trusted!r}")
    try:
        with open(path, "rb") as f:  # one open file for the check and the load: the bytes checked are those read
            if not trusted:
                check_archive(f, path)
                f.seek(0)
            try:
                ep = torch.export.load(f)
            except Exception as err:  # noqa: BLE001 - any failure of torch's reader is a file it cannot read
                raise _C.CorruptedError(f"kiln.load: {path} is damaged or not a program saved by kiln.save: "
                                        f"torch.export could not read it ({type(err).__name__}: {err})") from err
    except IsADirectoryError:
        raise _C.IoError(f"kiln.load: {path} is a directory, not a saved program") from None
    engines = check_engines_of(ep, path) if check_engines else 0
    log.info("kiln.load: %s: %d engine(s)%s", path, engines, " (trusted)" if trusted else "")
    return ep


def extract_engines(program: str | os.PathLike[str] | torch.export.ExportedProgram,
                    out_dir: str | os.PathLike[str], *, trusted: bool = False) -> list[Path]:
    """Writes every engine of a saved program as ``engine_<i>.kiln`` (runnable by kiln-run)."""
    ep = program if isinstance(program, torch.export.ExportedProgram) else \
        _load(os.fspath(program), trusted, check_engines=False)  # kiln-run checks the engines it loads
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for _, blob in engine_blobs(ep):
        path = out / f"engine_{len(paths)}.kiln"
        path.write_bytes(blob.detach().cpu().contiguous().numpy().tobytes())
        paths.append(path)
    return paths
