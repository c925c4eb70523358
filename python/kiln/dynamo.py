"""The torch.compile backend: ``torch.compile(model, backend="kiln", options={...})``.

Dynamo calls :func:`kiln_backend` once per captured graph (a graph break gives several
graphs; the code between them runs in Python as usual). Dynamo passes the module's
parameters and buffers as graph inputs; Kiln treats them as constants (weights baked into
the engines, named by their module path, e.g. ``layer1.0.conv1.weight``) and the remaining
tensors as runtime inputs. The graph is lowered, partitioned and built by the same pipeline as
kiln.compile (kiln.pipeline.compile_lowered), engine cache included: with ``reuse_cached_engines``
a new process (or a ``torch._dynamo.reset()``) finds the engines built before and refits the
current weights into them; the weights' names are stable across processes, so they match.

With static shapes a new input shape or dtype fails Dynamo's guards and Dynamo calls the
backend again; a shape seen before hits Dynamo's cache. When Dynamo hands over a graph with
symbolic sizes (``dynamic=True``, ``torch._dynamo.mark_dynamic(x, dim, min=, max=)``, or its
automatic dynamic shapes after a recompile; ``dynamic=False`` avoids them), Kiln exports it
once with matching dynamic shapes (each symbol's range from Dynamo's ShapeEnv, an unbounded max
clamped to the ``dynamic_max_size`` setting) and compiles one symbolic program
(kiln/dynamic.py): lowered and partitioned once, with engines built per concrete size on first
sight. A size outside the program's range (above ``dynamic_max_size``), or a graph that cannot
be exported with dynamic shapes, gets one engine set per concrete input signature instead
(logged), as for a static graph.

The compiled graph follows the model's weights: a weight changed in place since the engines
took it (``load_state_dict``, ``copy_``) is refitted into them at the next call
(kiln.refit.WeightWatch), or, with ``immutable_weights=True``, the call raises; with
``share_weights=False`` it is a snapshot and checks nothing.

Options are Kiln's settings under Kiln's or Torch-TensorRT's names (kiln.settings); a
torch.compile ``mode`` maps to settings too (kiln.settings.MODES).

Kiln compiles for inference. With gradients required (grad mode on and an input or parameter
requiring grad) the graph runs in eager PyTorch with a warning, or raises under
``require_full_compilation``.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import re
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from kiln import _C
from kiln._logging import debug_logging, get_logger
from kiln.dynamic import ShapeRangeError, compile_dynamic, range_bounds
from kiln.lowering import LoweredGraph, lower_module
from kiln.pipeline import (
    LIVE_GRAPHS,
    compile_lowered,
    device_of,
    graph_runner,
    runs_again_alike,
    supported_targets,
    unflattener,
)
from kiln.program_cache import ProgramCache
from kiln.refit import WeightWatch, follow_weights
from kiln.settings import CompilationSettings, settings_from_options

log = get_logger("dynamo")

__all__ = ["kiln_backend"]

_graph_ids = itertools.count()
_MAX_SIGNATURES = 8  # input signatures kept per graph; the least recently used one's engines go
# Constant sets (module instances) kept per input signature: a graph shared by the layers of a
# deep model has one per layer, and every one of them runs in each forward.
_MAX_INSTANCES = 1024
# Every KilnDynamoGraph alive: kiln.refit finds the engines Dynamo built for a model here.
_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)


_ROOT = re.compile(r"^[LG]\['([^']*)'\]")


def _source_path(placeholder: fx.Node) -> str | None:
    """L['self']._modules['layer1']._modules['0']._parameters['weight'] -> L['self'].layer1.0.weight."""
    grapharg = placeholder.meta.get("grapharg")
    source: Any = getattr(grapharg, "source", None)
    text = source.name() if callable(getattr(source, "name", None)) else getattr(source, "name", None)
    if not isinstance(text, str):
        return None
    text = re.sub(r"\._(modules|parameters|buffers)\['([^']*)'\]", r".\2", text)
    return re.sub(r"\[(\d+)\]", r".\1", text)


def _weight_names(placeholders: dict[int, fx.Node]) -> dict[int, str]:
    """Per constant argument its name in the engines: the module's own state_dict key. Dynamo
    names a constant after where the frame found it (``L['self']`` for a compiled module,
    ``L['s']`` for a module passed to a compiled function, ``G['m']`` for a global); that root
    is dropped when all constants share it, else kept as a prefix (``s.b.weight``)."""
    paths = {i: _source_path(p) for i, p in placeholders.items()}
    roots = {m.group(1) if m else None for m in (_ROOT.match(p or "") for p in paths.values())}
    names: dict[int, str] = {}
    for i, path in paths.items():
        if path is None:
            names[i] = placeholders[i].name
            continue
        root = _ROOT.match(path)
        drop = root is not None and (len(roots) == 1 or root.group(1) in ("self", "fn"))
        name = (path[root.end():] if drop and root is not None else _ROOT.sub(r"\1", path)).strip(".")
        names[i] = name or placeholders[i].name
    if len(set(names.values())) != len(names):  # two roots with the same paths: keep them apart
        names = {i: (_ROOT.sub(r"\1", p).strip(".") if p else placeholders[i].name) for i, p in paths.items()}
    return names


def _tuple_getter(indices: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """The items at `indices` as a tuple (operator.itemgetter, which returns a bare item for one index)."""
    if len(indices) == 1:
        i = indices[0]
        return lambda seq: (seq[i],)
    return operator.itemgetter(*indices) if indices else (lambda seq: ())


def _is_constant(example: Any) -> bool:
    return isinstance(example, torch.Tensor) and (
        isinstance(example, torch.nn.Parameter) or hasattr(example, "_dynamo_static_input_type"))


class _GraphAsModule(torch.nn.Module):
    """The Dynamo graph with its constant inputs as buffers and its int inputs fixed."""

    def __init__(self, gm: fx.GraphModule, layout: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.gm = gm
        self.layout = layout

    def forward(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        # "size": a size Dynamo passes as an int argument, read from the tensor input it came from.
        args = [next(it) if kind == "input" else getattr(self, value) if kind == "constant"
                else tensors[value[0]].shape[value[1]] if kind == "size" else value
                for kind, value in self.layout]
        return self.gm(*args)


class _Built(NamedTuple):
    """One specialization: the constant tensors its engines were built from (held, so that their
    ids, which key it, stay theirs), the compiled graph module (None when nothing was built),
    the function that runs it, the watch on the weights it follows (None when nothing was
    built), whether a run may be launched before those are checked (pipeline.runs_again_alike),
    whether it serves every shape of a dynamic graph (a symbolic program: it is then the graph's
    last specialization, as a static graph's is) and the float arguments it was made for."""

    constants: tuple[torch.Tensor, ...]
    graph_module: fx.GraphModule | None
    run: Callable[..., Any]
    watch: WeightWatch | None = None
    checks_after_launch: bool = False
    every_shape: bool = False
    floats: tuple[float, ...] = ()


class KilnDynamoGraph:
    """What the backend returns for one Dynamo graph: engines per input signature and per set of
    constant tensors.

    Dynamo reuses one captured graph for every instance of a module class (the parameters are
    graph inputs, and its guards do not pin their identity), so the constants of a call are
    checked by identity against those the engines were built from: another instance's
    parameters get engines of their own (from the engine cache when enabled), never the first
    instance's weights. A graph break inside a repeated block (a branch on a value in every layer)
    makes every layer of the model such an instance, all run in each forward: their engines are
    kept for up to _MAX_INSTANCES constant sets per input signature (the bound on signatures is
    apart), and they are compiled from one lowering of the graph (static or symbolic), copied with
    each instance's weights, not exported and decomposed once per layer.
    """

    def __init__(self, gm: fx.GraphModule, examples: Sequence[Any], settings: CompilationSettings) -> None:
        self.gm = gm
        self.settings = settings
        self.name = f"graph {next(_graph_ids)}"
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.kinds = ["constant" if _is_constant(e) else "input" if isinstance(e, torch.Tensor) else "value"
                      for e in examples]
        # Per constant argument: its name in the engines (from Dynamo's source: stable across
        # instances and processes).
        self.constant_names = _weight_names({i: p for i, (p, k) in enumerate(zip(placeholders, self.kinds))
                                             if k == "constant"})
        self.constant_idx = sorted(self.constant_names)
        self._constants_of = _tuple_getter(self.constant_idx)
        self.input_idx = [i for i, k in enumerate(self.kinds) if k == "input"]
        # Python floats that Dynamo passes as 0-dim tensors (dynamic=True): the symbolic program
        # takes them as the values they have, and is keyed by them.
        self.float_idx = [i for i in self.input_idx
                          if getattr(placeholders[i].meta.get("grapharg"), "pass_arg_as_tensor", False)]
        self.tensor_idx = [i for i in self.input_idx if i not in self.float_idx]
        self.dynamic = any(isinstance(e, _SYM) for e in examples) or any(
            isinstance(s, torch.SymInt) for p in placeholders
            for s in getattr(p.meta.get("example_value"), "shape", ()))
        self.compiled: OrderedDict[Any, _Built] = OrderedDict()
        # Per lowering key (_lowering_key), the lowered graph as it was before its first
        # compilation: another set of constants of the same kinds (another instance of the module)
        # is compiled from a copy of it instead of being exported and decomposed again.
        self._lowerings: OrderedDict[Any, LoweredGraph] = OrderedDict()
        # Dynamic: one symbolic program per set of constants, until one cannot be made.
        self.symbolic = self.dynamic
        self._last: _Built | None = None
        LIVE_GRAPHS.add(self)
        if not self.dynamic:
            self._last = self._lookup(examples)

    def built(self) -> list[tuple[list[tuple[torch.Tensor, str]], fx.GraphModule, WeightWatch | None]]:
        """Per live specialization: its (constant tensor, engine name) pairs, graph module and
        weight watch."""
        return [([(t, self.constant_names[i]) for i, t in zip(self.constant_idx, b.constants)], b.graph_module,
                 b.watch) for b in self.compiled.values() if b.graph_module is not None]

    @property
    def graph_modules(self) -> list[fx.GraphModule]:
        """The compiled graph modules of the live specializations, oldest first."""
        return [gm for _, gm, _ in self.built()]

    def _key(self, args: Sequence[Any], constants: tuple[torch.Tensor, ...], static: bool = False) -> Any:
        if self.dynamic and self.symbolic and not static:
            return "symbolic", tuple(id(c) for c in constants), tuple(args[i].item() for i in self.float_idx)
        shapes = None if not self.dynamic else tuple(
            (tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
            for k, a in zip(self.kinds, args) if k != "constant")
        return shapes, tuple(id(c) for c in constants)

    def _lookup(self, args: Sequence[Any], static: bool = False) -> _Built:
        constants = tuple(args[i] for i in self.constant_idx)
        key = self._key(args, constants, static)
        built = self.compiled.get(key)
        if built is not None:
            self.compiled.move_to_end(key)
            return built
        if self.compiled:
            same_shapes = any(k[0] == key[0] for k in self.compiled)
            log.info("%s: building for %s", self.name,
                     "other constant tensors (another module instance)" if same_shapes
                     else f"a new input signature {key[0]}")
        built = self._specialize(args, constants, symbolic=key[0] == "symbolic")
        if key[0] == "symbolic" and self.float_idx:
            log.info("%s: symbolic program for the float arguments %s", self.name, key[2])
        key = self._key(args, constants, static)  # a symbolic program that failed: per signature
        self.compiled[key] = built
        self._evict(key[0])
        return built

    def _evict(self, signature: Any) -> None:
        """Keeps the specializations of at most _MAX_SIGNATURES input signatures (dropping the
        least recently used signature's) and _MAX_INSTANCES constant sets of ``signature``."""
        signatures = list(dict.fromkeys(k[0] for k in self.compiled))
        if len(signatures) > _MAX_SIGNATURES:
            for k in [k for k in self.compiled if k[0] == signatures[0]]:
                del self.compiled[k]
        same = [k for k in self.compiled if k[0] == signature]
        if len(same) > _MAX_INSTANCES:
            del self.compiled[same[0]]
            log.warning("%s: more than %d sets of constant tensors (module instances) call it with one input "
                        "signature; the least recently used one's engines are dropped and built again when "
                        "it is called", self.name, _MAX_INSTANCES)

    def _dynamic_shapes(self, args: Sequence[Any]) -> tuple[list[tuple[str, Any]], tuple[Any, ...], list[int]]:
        """The "size" layout entries of the int arguments, torch.export's dynamic_shapes of the
        wrapper's tensors (per symbol an automatic dynamic dim with its ShapeEnv range, an
        unbounded max clamped to ``dynamic_max_size``) and the int arguments that need a carrier.

        A symbolic int argument that is no tensor input's size (a length that a graph break
        passed on as a Python int, e.g. BART's position embedding after its encoder layers) is
        carried as the first dim of an empty [n, 0] tensor after the inputs (_carriers), so that
        the program binds it like any size. NotImplementedError for a graph that cannot be
        exported so."""
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        fakes = [placeholders[i].meta.get("example_value") for i in self.tensor_idx]
        where: dict[Any, tuple[int, int]] = {}  # symbol -> (input position, dim)
        dims: dict[Any, Any] = {}
        specs: list[Any] = []

        def dim(size: torch.SymInt, example: int) -> Any:
            expr = size.node.expr
            if expr not in dims:
                lo, hi = range_bounds(size.node.shape_env.var_to_range.get(expr))
                if hi is None:  # unbounded: clamped, sizes beyond are built per signature
                    hi = max(self.settings.dynamic_max_size, example)
                # AUTO: export may narrow the range where the graph needs it (a pooled size that
                # must not reach 1); a size outside it is then built per signature.
                dims[expr] = torch.export.Dim.AUTO(min=lo, max=hi)
            return dims[expr]
        for pos, (fake, i) in enumerate(zip(fakes, self.tensor_idx)):
            if not isinstance(fake, torch.Tensor):
                raise NotImplementedError("an input has no example value")
            spec: dict[int, Any] = {}
            for d, size in enumerate(fake.shape):
                if not isinstance(size, torch.SymInt):
                    continue
                if not size.node.expr.is_symbol:
                    spec[d] = torch.export.Dim.AUTO
                    continue
                where.setdefault(size.node.expr, (pos, d))
                spec[d] = dim(size, int(args[i].shape[d]))
            specs.append(spec or None)
        sizes: list[tuple[str, Any]] = []
        carried: list[int] = []
        for i, (kind, p) in enumerate(zip(self.kinds, placeholders)):
            if kind != "value":
                continue
            value = p.meta.get("example_value")
            if isinstance(value, (torch.SymFloat, torch.SymBool)):
                raise NotImplementedError("a symbolic float or bool argument")
            if isinstance(value, torch.SymInt):
                expr = value.node.expr
                if expr not in where:
                    if not expr.is_symbol:
                        raise NotImplementedError(f"the size argument {expr} is no input's size by itself")
                    where[expr] = (len(specs), 0)
                    specs.append({0: dim(value, int(args[i]))})
                    carried.append(i)
                sizes.append(("size", where[expr]))
        return sizes, (tuple(specs),), carried  # the wrapper takes its tensors as *tensors

    def _specialize(self, args: Sequence[Any], constants: tuple[torch.Tensor, ...], symbolic: bool = False) -> _Built:
        if symbolic:
            try:
                return self._specialize_symbolic(args, constants)
            except Exception as err:  # noqa: BLE001 - any failure: engines per concrete signature instead
                if (self.settings.require_full_compilation and isinstance(err, _C.UnsupportedError)) or \
                        (self.settings.pass_through_build_failures and isinstance(err, _C.KilnError)):
                    raise
                self.symbolic = False
                log.warning("%s: no symbolic program (%s: %s); building per input signature", self.name,
                            type(err).__name__, err)
        return self._specialize_static(args, constants)

    def _specialize_symbolic(self, args: Sequence[Any], constants: tuple[torch.Tensor, ...]) -> _Built:
        """One program for every size in the symbols' ranges (kiln/dynamic.py)."""
        wrapper, names, _ = self._wrapper(args, constants)
        sizes, dynamic_shapes, carried = self._dynamic_shapes(args)
        inputs = [args[i] for i in self.tensor_idx] + _carriers(args, carried)
        size_iter = iter(sizes)
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        layout = []
        for i, (entry, kind, p) in enumerate(zip(wrapper.layout, self.kinds, placeholders)):
            if kind == "value" and isinstance(p.meta.get("example_value"), torch.SymInt):
                entry = next(size_iter)
            elif i in self.float_idx:
                entry = ("value", args[i].detach().clone())  # a constant of the program
            layout.append(entry)
        wrapper.layout = layout
        with debug_logging(self.settings.debug):
            lowering_key = self._lowering_key(args, symbolic=True)
            lowered = self._relower(lowering_key, constants)
            if lowered is None:
                lowered = lower_module(wrapper, _unmarked(inputs), None, supported_targets(), names=names,
                                       fold_weights=self.settings.immutable_weights, dynamic_shapes=dynamic_shapes)
                self._keep_lowering(lowering_key, lowered)
            device = _device(self.settings, [args[i] for i in self.tensor_idx] + list(constants), self.gm)
            compiled = compile_dynamic(lowered, self.settings, device, self.name, lowered.range_constraints)
            shapes = compiled.meta.get("kiln_dynamic")
            if shapes is not None:  # errors name the inputs as the frame does (L['x'] -> x)
                shapes.names = [_ROOT.sub(r"\1", _source_path(placeholders[i]) or placeholders[i].name)
                                for i in self.tensor_idx + carried]
        if self.settings.builds_nothing:
            return _Built(constants, None, self.gm.forward)
        unflatten, graph, pick = unflattener(lowered.out_spec), graph_runner(compiled), self.tensor_idx
        sources = {self.constant_names[i]: t for i, t in zip(self.constant_idx, constants)} \
            if self.settings.share_weights else {}
        for name, t in (compiled.meta.pop("kiln_weight_sources", None) or {}).items():
            sources.setdefault(name, t)

        def run(*args: Any) -> Any:
            try:
                return unflatten(graph(*[args[i] for i in pick], *_carriers(args, carried)))
            except ShapeRangeError as err:  # beyond the clamped range: this signature statically
                log.info("%s: %s; building this input signature statically", self.name, err)
                return self._run_followed(self._lookup(args, static=True), args)
        return _Built(constants, compiled, run, WeightWatch(sources) if sources else None, runs_again_alike(compiled),
                      every_shape=True, floats=tuple(args[i].item() for i in self.float_idx))

    def _wrapper(self, args: Sequence[Any], constants: tuple[torch.Tensor, ...]
                 ) -> tuple[_GraphAsModule, dict[str, str], dict[str, torch.Tensor]]:
        """The graph as a module of its tensor inputs (constants as buffers, other arguments
        fixed), the engine name of each buffer, and the buffers."""
        layout: list[tuple[str, Any]] = []
        wrapper_buffers: dict[str, torch.Tensor] = {}
        names: dict[str, str] = {}
        by_index = dict(zip(self.constant_idx, constants))
        for i, (kind, value) in enumerate(zip(self.kinds, args)):
            if kind == "constant":
                attr = _constant_attr(i)
                wrapper_buffers[attr] = by_index[i].detach()
                names[attr] = self.constant_names[i]
                layout.append(("constant", attr))
            elif kind == "input":
                layout.append(("input", None))
            else:
                layout.append(("value", value))
        wrapper = _GraphAsModule(self.gm, layout)
        for attr, t in wrapper_buffers.items():
            wrapper.register_buffer(attr, t)
        return wrapper, names, wrapper_buffers

    def _specialize_static(self, args: Sequence[Any], constants: tuple[torch.Tensor, ...]) -> _Built:
        wrapper, names, wrapper_buffers = self._wrapper(args, constants)
        by_index = dict(zip(self.constant_idx, constants))
        inputs = [args[i] for i in self.input_idx]
        with debug_logging(self.settings.debug):
            # A program cache hit (kiln/program_cache.py) skips lowering, partitioning and building.
            programs = ProgramCache.for_dynamo_graph(self.gm, args, self.kinds, self.constant_names,
                                                     supported_targets(), self.settings, self.name)
            hit = programs.load({names[a]: t for a, t in wrapper_buffers.items()}) if programs is not None else None
            if hit is not None:
                compiled, out_spec = hit.gm, hit.out_spec
            else:
                lowering_key = self._lowering_key(args, symbolic=False)
                lowered = self._relower(lowering_key, constants)
                if lowered is None:
                    try:
                        lowered = lower_module(wrapper, _unmarked(inputs), None, supported_targets(), names=names,
                                               fold_weights=self.settings.immutable_weights)
                    except Exception as err:  # noqa: BLE001 - any graph export cannot take runs eagerly
                        if self.settings.require_full_compilation:
                            raise
                        warnings.warn(f"Kiln could not lower {self.name} ({type(err).__name__}: {err}); "
                                      "running it in eager PyTorch", RuntimeWarning, stacklevel=3)
                        return _Built(constants, None, self.gm.forward)
                    self._keep_lowering(lowering_key, lowered)
                device = _device(self.settings, inputs + list(constants), self.gm)
                compiled = programs.compile(lowered, device) if programs is not None else \
                    compile_lowered(lowered, self.settings, device, self.name)
                out_spec = lowered.out_spec
        if self.settings.builds_nothing:
            return _Built(constants, None, self.gm.forward)
        unflatten, graph, pick = unflattener(out_spec), graph_runner(compiled), self.input_idx
        # The weights to follow: the model's own tensors as the frame passes them (the wrapper's
        # buffers are detached views: they share the version counter, not a `.data` swap), then
        # any weight the graph held itself.
        sources = {self.constant_names[i]: t for i, t in by_index.items()} if self.settings.share_weights else {}
        for name, t in (compiled.meta.pop("kiln_weight_sources", None) or {}).items():
            sources.setdefault(name, t)  # (none with share_weights=False: a snapshot follows nothing)

        def run(*args: Any) -> Any:
            return unflatten(graph(*[args[i] for i in pick]))
        return _Built(constants, compiled, run, WeightWatch(sources) if sources else None, runs_again_alike(compiled))

    def _lowering_key(self, args: Sequence[Any], symbolic: bool) -> Any:
        """What a lowering (static, or ``symbolic``: with the graph's symbolic sizes) depends on
        besides the constants' values: every argument's shape, strides, dtype and device (the
        constants' too), the values of the others and of the floats passed as tensors; None where
        it is not reused (weights folded into the graph, an argument of another kind)."""
        if self.settings.immutable_weights:
            return None
        key: list[Any] = [symbolic]
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                key.append((tuple(a.shape), a.stride(), a.dtype, a.device, a.item() if i in self.float_idx else None))
            elif a is None or isinstance(a, (bool, int, float, str)):
                key.append((type(a), a))
            else:
                return None
        return tuple(key)

    def _keep_lowering(self, key: Any, lowered: LoweredGraph) -> None:
        """Keeps a copy of ``lowered`` (before compiling changes it) for other constant sets.
        Not for a graph with subgraphs (higher-order ops), which compiling changes in place."""
        if key is None or any(True for _ in lowered.gm.children()):
            return
        self._lowerings[key] = _copy_lowered(lowered)
        if len(self._lowerings) > _MAX_SIGNATURES:
            self._lowerings.popitem(last=False)

    def _relower(self, key: Any, constants: tuple[torch.Tensor, ...]) -> LoweredGraph | None:
        """The kept lowering for ``key`` with ``constants`` in place of the ones it was made
        with (each weight by the argument it came from, renamed as this call's), or None."""
        kept = self._lowerings.get(key) if key is not None else None
        if kept is None:
            return None
        by_attr = {_constant_attr(i): (t.detach(), self.constant_names[i])
                   for i, t in zip(self.constant_idx, constants)}
        lowered = _copy_lowered(kept)
        gm = lowered.gm
        sources: dict[str, torch.Tensor] = {}
        for node in gm.graph.nodes:
            if node.op != "get_attr" or not node.meta.get("kiln_weight"):
                continue
            if node.meta.get("kiln_fqn") not in by_attr:
                return None  # a weight of unknown origin: lowered anew
            tensor, name = by_attr[node.meta["kiln_fqn"]]
            gm.register_buffer(str(node.target), tensor)
            node.meta["kiln_name"] = name
            if node.users:
                sources[name] = tensor
        gm.meta["kiln_weight_sources"] = sources
        log.debug("%s: lowered as another set of constants was", self.name)
        return lowered

    def _run_followed(self, built: _Built, args: Sequence[Any]) -> Any:
        """Runs ``built`` after refitting its engines with any weight changed in place since."""
        if built.watch is not None and built.watch.changed():
            assert built.graph_module is not None
            follow_weights(built.watch, built.graph_module, self.settings.immutable_weights, f"Kiln {self.name}")
        return built.run(*args)

    def _serves(self, args: Sequence[Any], built: _Built) -> bool:
        """Whether ``built`` is this call's specialization: made from the same constant tensors (the
        shapes: fixed by Dynamo's guards in a static graph; any in a symbolic program's ranges,
        which also keeps the float arguments it was made for)."""
        return all(map(operator.is_, self._constants_of(args), built.constants)) and (
            not built.every_shape or tuple(args[i].item() for i in self.float_idx) == built.floats)

    def _current(self, args: Sequence[Any], built: _Built) -> bool:
        """Whether ``built`` serves this call with its constants as they are now (unchanged since
        its engines took them)."""
        return self._serves(args, built) and (built.watch is None or not built.watch.changed())

    def __call__(self, *args: Any) -> Any:
        last = self._last
        if last is not None and last.checks_after_launch and (
                not last.constants or args[self.constant_idx[0]] is last.constants[0]):
            # Launched first, checked while the device works: a run on constants that are not
            # current (another instance's, weights changed in place) is dropped and made again.
            out = last.run(*args)
            if self._current(args, last):
                return out
        if last is not None and self._serves(args, last):
            built = last
        else:
            built = self._lookup(args)
            if not self.dynamic or built.every_shape:
                self._last = built
        return self._run_followed(built, args)


def _device(settings: CompilationSettings, values: Sequence[Any], gm: fx.GraphModule) -> str:
    """The device to build for: that of the tensors among the inputs and constants (device_of);
    for a graph that takes none (sizes alone, say, from which it makes a mask), the device its
    tensors are made on."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if settings.device is None and not tensors:
        made = {v.device: v for n in gm.graph.nodes for v in pytree.tree_leaves(n.meta.get("example_value"))
                if isinstance(v, torch.Tensor)}
        if len(made) > 1:
            raise ValueError(f"a graph without tensor inputs makes tensors on {sorted(str(d) for d in made)}: "
                             "Kiln builds for one device; set Kiln option 'device'")
        tensors = list(made.values())
    return device_of(settings, tensors)


def _carriers(args: Sequence[Any], carried: Sequence[int]) -> list[torch.Tensor]:
    """Per carried int argument (KilnDynamoGraph._dynamic_shapes), an empty tensor of that many rows."""
    return [torch.empty((int(args[i]), 0)) for i in carried]


def _constant_attr(i: int) -> str:
    """The wrapper's buffer for constant argument ``i`` (_GraphAsModule), and its export FQN."""
    return f"c{i}"


def _copy_lowered(lowered: LoweredGraph) -> LoweredGraph:
    """A lowered graph on a new graph (nodes and their metadata copied, constants shared), which
    compiling can change without changing ``lowered``."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(lowered.gm.graph, {}))
    gm = fx.GraphModule(lowered.gm, graph, class_name="KilnLoweredGraph")
    gm.meta.update(lowered.gm.meta)
    return dataclasses.replace(lowered, gm=gm)


def _unmarked(inputs: Sequence[Any]) -> list[Any]:
    """The inputs without the dynamic-dim marks of torch._dynamo.mark_dynamic (kept as attributes
    of the tensor object, which torch.export would also honour): the export's own dynamic shapes
    (or none) decide."""
    return [t.detach() if isinstance(t, torch.Tensor) else t for t in inputs]


def _needs_grad(examples: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(isinstance(e, torch.Tensor) and e.requires_grad for e in examples)


def kiln_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *, options: Any = None,
                 mode: str | None = None) -> Callable[..., Any]:
    """Dynamo backend entry point (registered as "kiln").

    ``torch.compile(m, backend="kiln", mode=...)`` arrives here as ``mode`` (torch passes no
    mode for "default", and refuses mode and options together: ``options={"mode": ...}`` combines
    them). A mode sets the settings in kiln.settings.MODES."""
    settings = settings_from_options(options, mode=mode) if mode is not None else settings_from_options(options)
    if _needs_grad(example_inputs):
        msg = ("Kiln compiles for inference only, but this graph needs gradients (grad mode is on and "
               "inputs or parameters require grad); run it under torch.no_grad() or torch.inference_mode()")
        if settings.require_full_compilation:
            raise RuntimeError(msg)
        warnings.warn(msg + ". Running the graph in eager PyTorch.", RuntimeWarning, stacklevel=2)
        return gm.forward
    return KilnDynamoGraph(gm, example_inputs, settings)
