"""The torch.compile backend: ``torch.compile(model, backend="kiln", options={...})``.

Dynamo calls :func:`kiln_backend` once per captured graph (a graph break gives several
graphs; the code between them runs in Python as usual). Dynamo passes the module's
parameters and buffers as graph inputs; Kiln treats them as constants (weights baked into
the engines, named by their module path, e.g. ``layer1.0.conv1.weight``) and the remaining
tensors as runtime inputs. The graph is lowered, partitioned and built by the same pipeline as
kiln.compile (kiln.aot.compile_lowered), engine cache included: with ``reuse_cached_engines``
a new process (or a ``torch._dynamo.reset()``) finds the engines built before and refits the
current weights into them; the weights' names are stable across processes, so they match.

Shapes are static. A new input shape or dtype fails Dynamo's guards and Dynamo calls the
backend again; a shape seen before hits Dynamo's cache. When Dynamo hands over a graph with
symbolic sizes (its automatic dynamic shapes after a recompile; ``dynamic=False`` avoids
that), Kiln specializes it: it builds one engine set per concrete input signature on first
sight and reuses it afterwards.

Kiln compiles for inference. With gradients required (grad mode on and an input or parameter
requiring grad) the graph runs in eager PyTorch with a warning, or raises under
``require_full_compilation``.
"""

from __future__ import annotations

import itertools
import operator
import re
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.fx as fx

from kiln._logging import debug_logging, get_logger
from kiln.aot import _device_of, compile_lowered, graph_runner, supported_targets, unflattener
from kiln.lowering import lower_module
from kiln.settings import CompilationSettings, settings_from_options

log = get_logger("dynamo")

__all__ = ["kiln_backend"]

_graph_ids = itertools.count()
_MAX_SPECIALIZATIONS = 8
# Every KilnDynamoGraph alive: kiln.refit finds the engines Dynamo built for a model here.
_LIVE_GRAPHS: weakref.WeakSet[KilnDynamoGraph] = weakref.WeakSet()
_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _pretty_source(placeholder: fx.Node) -> str:
    """L['self']._modules['layer1']._modules['0']._parameters['weight'] -> layer1.0.weight."""
    grapharg = placeholder.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    text = source.name() if callable(getattr(source, "name", None)) else getattr(source, "name", None)
    if not isinstance(text, str):
        return placeholder.name
    text = re.sub(r"^L\['(self|fn)'\]", "", text)
    text = re.sub(r"\._(modules|parameters|buffers)\['([^']*)'\]", r".\2", text)
    text = re.sub(r"\[(\d+)\]", r".\1", text)
    return text.strip(".") or placeholder.name


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
        args = [next(it) if kind == "input" else getattr(self, value) if kind == "constant" else value
                for kind, value in self.layout]
        return self.gm(*args)


class _Built(NamedTuple):
    """One specialization: the constant tensors its engines were built from (held, so that their
    ids, which key it, stay theirs), the compiled graph module (None when nothing was built) and
    the function that runs it."""

    constants: tuple[torch.Tensor, ...]
    graph_module: fx.GraphModule | None
    run: Callable[..., Any]


class KilnDynamoGraph:
    """What the backend returns for one Dynamo graph: engines per input signature and per set of
    constant tensors.

    Dynamo reuses one captured graph for every instance of a module class (the parameters are
    graph inputs, and its guards do not pin their identity), so the constants of a call are
    checked by identity against those the engines were built from: another instance's
    parameters get engines of their own (from the engine cache when enabled), never the first
    instance's weights.
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
        self.constant_names = {i: _pretty_source(p) for i, (p, k) in enumerate(zip(placeholders, self.kinds))
                               if k == "constant"}
        self.constant_idx = sorted(self.constant_names)
        self._constants_of = _tuple_getter(self.constant_idx)
        self.input_idx = [i for i, k in enumerate(self.kinds) if k == "input"]
        self.dynamic = any(isinstance(e, _SYM) for e in examples) or any(
            isinstance(s, torch.SymInt) for p in placeholders
            for s in getattr(p.meta.get("example_value"), "shape", ()))
        self.compiled: OrderedDict[Any, _Built] = OrderedDict()
        self._last: _Built | None = None
        _LIVE_GRAPHS.add(self)
        if not self.dynamic:
            self._last = self._lookup(examples)

    def built(self) -> list[tuple[list[tuple[torch.Tensor, str]], fx.GraphModule]]:
        """Per live specialization: its (constant tensor, engine name) pairs and graph module."""
        return [([(t, self.constant_names[i]) for i, t in zip(self.constant_idx, b.constants)], b.graph_module)
                for b in self.compiled.values() if b.graph_module is not None]

    @property
    def graph_modules(self) -> list[fx.GraphModule]:
        """The compiled graph modules of the live specializations, oldest first."""
        return [gm for _, gm in self.built()]

    def _key(self, args: Sequence[Any], constants: tuple[torch.Tensor, ...]) -> Any:
        shapes = None if not self.dynamic else tuple(
            (tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
            for k, a in zip(self.kinds, args) if k != "constant")
        return shapes, tuple(id(c) for c in constants)

    def _lookup(self, args: Sequence[Any]) -> _Built:
        constants = tuple(args[i] for i in self.constant_idx)
        key = self._key(args, constants)
        built = self.compiled.get(key)
        if built is not None:
            self.compiled.move_to_end(key)
            return built
        if self.compiled:
            same_shapes = any(k[0] == key[0] for k in self.compiled)
            log.info("%s: building for %s", self.name,
                     "other constant tensors (another module instance)" if same_shapes
                     else f"a new input signature {key[0]}")
        built = self._specialize(args, constants)
        self.compiled[key] = built
        if len(self.compiled) > _MAX_SPECIALIZATIONS:
            self.compiled.popitem(last=False)
        return built

    def _specialize(self, args: Sequence[Any], constants: tuple[torch.Tensor, ...]) -> _Built:
        layout: list[tuple[str, Any]] = []
        wrapper_buffers: dict[str, torch.Tensor] = {}
        names: dict[str, str] = {}
        by_index = dict(zip(self.constant_idx, constants))
        for i, (kind, value) in enumerate(zip(self.kinds, args)):
            if kind == "constant":
                attr = f"c{i}"
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
        inputs = [args[i] for i in self.input_idx]
        with debug_logging(self.settings.debug):
            try:
                lowered = lower_module(wrapper, inputs, None, supported_targets(), names=names,
                                       fold_weights=self.settings.immutable_weights)
            except Exception as err:  # noqa: BLE001 - any graph export cannot take runs eagerly
                if self.settings.require_full_compilation:
                    raise
                warnings.warn(f"Kiln could not lower {self.name} ({type(err).__name__}: {err}); "
                              "running it in eager PyTorch", RuntimeWarning, stacklevel=3)
                return _Built(constants, None, self.gm.forward)
            device = _device_of(self.settings, inputs + list(constants))
            compiled = compile_lowered(lowered, self.settings, device, self.name)
        if self.settings.builds_nothing:
            return _Built(constants, None, self.gm.forward)
        unflatten, graph, pick = unflattener(lowered.out_spec), graph_runner(compiled), self.input_idx

        def run(*args: Any) -> Any:
            return unflatten(graph(*[args[i] for i in pick]))
        return _Built(constants, compiled, run)

    def __call__(self, *args: Any) -> Any:
        last = self._last
        # Static shapes: Dynamo's guards fixed them, so the constants' identity decides.
        if last is not None and all(map(operator.is_, self._constants_of(args), last.constants)):
            return last.run(*args)
        built = self._lookup(args)
        if not self.dynamic:
            self._last = built
        return built.run(*args)


def _needs_grad(examples: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(isinstance(e, torch.Tensor) and e.requires_grad for e in examples)


def kiln_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *, options: Any = None,
                 mode: str | None = None) -> Callable[..., Any]:
    """Dynamo backend entry point (registered as "kiln")."""
    if mode not in (None, "default"):
        raise ValueError(f"torch.compile mode {mode!r} is not a Kiln mode; use options={{...}} "
                         f"(mode may only be 'default')")
    settings = settings_from_options(options)
    if _needs_grad(example_inputs):
        msg = ("Kiln compiles for inference only, but this graph needs gradients (grad mode is on and "
               "inputs or parameters require grad); run it under torch.no_grad() or torch.inference_mode()")
        if settings.require_full_compilation:
            raise RuntimeError(msg)
        warnings.warn(msg + ". Running the graph in eager PyTorch.", RuntimeWarning, stacklevel=2)
        return gm.forward
    return KilnDynamoGraph(gm, example_inputs, settings)
