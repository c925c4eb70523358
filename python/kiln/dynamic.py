"""Dynamic shapes: one symbolic program, engines specialized per concrete shape.

A graph exported with dynamic shapes (``kiln.compile(..., dynamic_shapes=...)``, ``kiln.Input``
ranges, or a Dynamo graph with symbolic sizes) is lowered and partitioned once, on its symbolic
form. What runs is the *glue*: the symbolic graph with each block replaced by a
:class:`DynamicBlock`, so the PyTorch parts run any shape. Its first node is a call of
:class:`Specializations`, which binds the symbols from the inputs' sizes, checks each against
its range (:class:`ShapeRangeError` names the input, the dim, the value and the range) and
returns the :class:`Specialization` for those sizes: per block the engine built for them, from
a concrete copy of the block (every symbolic shape and size evaluated, see
:func:`specialize_nodes`) described and built by the existing path (kiln.pipeline, engine cache
included, so cached engines are found per shape). A block that fails to build at some shape runs
that concrete copy in PyTorch for it.

Specializations are kept in a least-recently-used map of ``specialization_cache_size`` entries
with engines of their own (kiln.settings) and up to _MAX_LIGHT served by instances; the one for
the example inputs' sizes (the *opt* shape) is built at compile time, the others on the first
call that needs them (one log line each). A block whose symbols take the same values in two
specializations shares one engine between them.

Which ops go into blocks is decided once, at the opt shape: the importers are asked about a
concrete copy of the whole graph. A block that the importers take at the opt shape but refuse
at another runs in PyTorch at that shape (with the build failure's warning).

kiln.save writes the symbolic ExportedProgram with the live specializations' engines (see "the
saved form" below); kiln.load compiles it again at the saved opt shape and installs those
engines (:meth:`Specializations.install`), so the saved sizes build nothing.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from kiln import _C
from kiln._logging import get_logger
from kiln.dryrun import emit_report, format_report
from kiln.instances import (
    PendingFit,
    RowPadded,
    SizeRange,
    Tuning,
    finish_fit,
    fit_pool,
    make_instance,
    row_symbol,
    start_fit,
)
from kiln.lowering import ASSERT_SCALAR, LoweredGraph, drop_unused
from kiln.partition import Block, PartitionResult, is_op, op_name, partition, replace_block
from kiln.pipeline import CompileSummary, build_block
from kiln.pipeline import _check_engine as check_engine
from kiln.runtime import KilnEngineModule, warm_up
from kiln.settings import CompilationSettings
from kiln.translate import Capability, SharedConstants

log = get_logger("dynamic")

__all__ = ["Input", "ShapeRangeError", "SymbolRange", "ProgramShapes", "Specializations", "DynamicBlock",
           "compile_dynamic", "is_dynamic", "specialize_nodes", "input_dynamic_shapes", "SavedProgram", "read_saved",
           "SAVED_DESCRIPTION", "SAVED_ENGINES"]

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_SIZE = sympy.Symbol("size", integer=True, positive=True)  # an input dim's value, in solved sizes
_SCALAR_REASON = "a symbolic size or scalar: PyTorch computes it from the inputs' sizes"
# Specializations served by instances on a shared arena kept per program (Specializations.add).
_MAX_LIGHT = 1024


class ShapeRangeError(ValueError):
    """An input's size is outside the range a dynamic program was compiled for."""


# ---- kiln.Input ---------------------------------------------------------------------------

def _shape(what: str, value: Any) -> tuple[int, ...]:
    if isinstance(value, torch.Size):
        value = tuple(value)
    if not isinstance(value, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                       for d in value):
        raise ValueError(f"kiln.Input: {what} must be a tuple of ints, got {value!r}")
    if any(d < 0 for d in value):
        raise ValueError(f"kiln.Input: {what} {tuple(value)} has a negative size")
    return tuple(value)


class Input:
    """One input of ``kiln.compile(inputs=[...])`` given by its shapes instead of an example,
    as ``torch_tensorrt.Input``: ``Input(min_shape=..., opt_shape=..., max_shape=..., dtype=...)``
    for a dynamic input (each dim whose min and max differ is dynamic, with that range), or
    ``Input(shape=..., dtype=...)`` for a static one. The example Kiln traces with is a random
    tensor of ``opt_shape``, which is also the shape whose engines are built at compile time."""

    def __init__(self, min_shape: Sequence[int] | None = None, opt_shape: Sequence[int] | None = None,
                 max_shape: Sequence[int] | None = None, *, shape: Sequence[int] | None = None,
                 dtype: torch.dtype = torch.float32, device: str | torch.device | None = None) -> None:
        if shape is not None:
            if min_shape is not None or opt_shape is not None or max_shape is not None:
                raise ValueError("kiln.Input: give shape (a static input) or min_shape, opt_shape and max_shape, "
                                 "not both")
            self.min_shape = self.opt_shape = self.max_shape = _shape("shape", shape)
        else:
            if min_shape is None or opt_shape is None or max_shape is None:
                raise ValueError("kiln.Input: give min_shape, opt_shape and max_shape (or shape for a static input)")
            self.min_shape, self.opt_shape, self.max_shape = (
                _shape("min_shape", min_shape), _shape("opt_shape", opt_shape), _shape("max_shape", max_shape))
            if not len(self.min_shape) == len(self.opt_shape) == len(self.max_shape):
                raise ValueError(f"kiln.Input: min_shape {self.min_shape}, opt_shape {self.opt_shape} and max_shape "
                                 f"{self.max_shape} have different numbers of dims")
            for d, (lo, opt, hi) in enumerate(zip(self.min_shape, self.opt_shape, self.max_shape)):
                if not lo <= opt <= hi:
                    raise ValueError(f"kiln.Input: dim {d} needs min <= opt <= max, got {lo}, {opt}, {hi}")
        dt = getattr(dtype, "to", None)
        if not isinstance(dtype, torch.dtype) and callable(dt):  # a torch_tensorrt.dtype
            dtype = dtype.to(torch.dtype)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"kiln.Input: dtype must be a torch.dtype, got {dtype!r}")
        self.dtype = dtype
        self.device = None if device is None else torch.device(device)

    @property
    def dynamic_dims(self) -> dict[int, tuple[int, int]]:
        """dim -> (min, max) of each dynamic dim."""
        return {d: (lo, hi) for d, (lo, hi) in enumerate(zip(self.min_shape, self.max_shape)) if lo != hi}

    def example(self, device: str | torch.device | None = None) -> torch.Tensor:
        """A random tensor of ``opt_shape`` (values of no consequence for tracing)."""
        dev = self.device or torch.device(device or "cpu")
        if self.dtype.is_floating_point or self.dtype.is_complex:
            return torch.randn(self.opt_shape, dtype=self.dtype, device=dev)
        if self.dtype == torch.bool:
            return torch.ones(self.opt_shape, dtype=torch.bool, device=dev)
        return torch.zeros(self.opt_shape, dtype=self.dtype, device=dev)

    def __repr__(self) -> str:
        if self.min_shape == self.max_shape:
            return f"kiln.Input(shape={self.opt_shape}, dtype={self.dtype})"
        return (f"kiln.Input(min_shape={self.min_shape}, opt_shape={self.opt_shape}, max_shape={self.max_shape}, "
                f"dtype={self.dtype})")


def _input_like(value: Any) -> bool:
    """A kiln.Input, or an object shaped like torch_tensorrt.Input (min/opt/max shapes)."""
    return isinstance(value, Input) or all(hasattr(value, a) for a in ("min_shape", "opt_shape", "max_shape")) \
        and not isinstance(value, torch.Tensor)


def _as_input(value: Any) -> Input:
    if isinstance(value, Input):
        return value
    shapes = [tuple(getattr(value, a)) for a in ("min_shape", "opt_shape", "max_shape")]
    if not all(shapes):  # a static torch_tensorrt.Input keeps its shape in .shape
        static = tuple(getattr(value, "shape", ()) or ())
        return Input(shape=static, dtype=getattr(value, "dtype", torch.float32))
    return Input(*shapes, dtype=getattr(value, "dtype", torch.float32))


def input_dynamic_shapes(arg_inputs: Sequence[Any], device: str | None) -> tuple[list[Any], Any]:
    """Example tensors for ``arg_inputs`` with kiln.Input specs replaced by tensors of their opt
    shape, and the torch.export dynamic_shapes they call for (None when none is dynamic).

    Each dynamic dim gets a Dim of its own; where the program needs two of them equal (a mask
    and the ids it masks), torch.export's suggested fix unifies them (see :func:`export_dynamic`)."""
    examples: list[Any] = []
    shapes: list[Any] = []
    dynamic = False
    for i, value in enumerate(arg_inputs):
        if not _input_like(value):
            examples.append(value)
            shapes.append(None)
            continue
        spec = _as_input(value)
        examples.append(spec.example(device))
        dims = {d: torch.export.Dim(f"input{i}_dim{d}", min=lo, max=hi) for d, (lo, hi) in spec.dynamic_dims.items()}
        dynamic = dynamic or bool(dims)
        shapes.append(dims or None)
    return examples, (tuple(shapes) if dynamic else None)


def export_dynamic(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                   dynamic_shapes: Any) -> torch.export.ExportedProgram:
    """torch.export (non-strict) with dynamic shapes. A constraint violation whose fix torch.export
    suggests (two dims that must be equal, a dim that is really static) is fixed and exported
    again; one with no fix, a guard on the symbols that torch cannot prove over their range (a
    torch whose symbolic reasoning is weaker than the model needs), is exported again with the guard
    as a run-time check in the program (``_assert_scalar``): a size that fails it raises."""
    from torch.export.dynamic_shapes import refine_dynamic_shapes_from_suggested_fixes
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

    def export(shapes: Any, deferred: bool = False) -> torch.export.ExportedProgram:
        with _sdpa_math(), _attention_as_one_op():
            return _attention_back(torch.export.export(module, args, kwargs, dynamic_shapes=shapes, strict=False,
                                                       prefer_deferred_runtime_asserts_over_guards=deferred))
    try:
        return export(dynamic_shapes)
    except (torch._dynamo.exc.UserError, ConstraintViolationError) as err:
        if "Constraints violated" not in str(err):
            raise
        if "Suggested fixes" not in str(err):
            guard = next((line.strip() for line in str(err).splitlines() if "guard" in line), str(err))
            log.info("torch.export could not prove a guard over the dynamic range; it becomes a run-time check: %s",
                     guard)
            return export(dynamic_shapes, deferred=True)
        head, tail = str(err).split("Suggested fixes:", 1)
        fixes = []
        for line in tail.strip("\n").splitlines():  # the fixes end at the first line that is not one
            if " = " not in line:
                break
            fixes.append(line.strip())
        refined = refine_dynamic_shapes_from_suggested_fixes(head + "Suggested fixes:\n" + "\n".join(fixes),
                                                             dynamic_shapes)
        log.info("torch.export refined the dynamic shapes: %s", "; ".join(fixes))
        return export(refined)


# Export with symbolic sizes evaluates each F.scaled_dot_product_attention call through the math
# backend's ops (_sdpa_math), symbolic size arithmetic that cost BERT-base 40% of its export;
# the graph keeps one scaled_dot_product_attention node anyway. During the export such calls run
# as kiln::export_sdpa, whose fake kernel only states the output's shape, and _attention_back
# turns its nodes into aten.scaled_dot_product_attention with the same arguments.
_F_SDPA = torch.nn.functional.scaled_dot_product_attention
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_SCHEMA = ("(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, float dropout_p, bool is_causal, "
                "float? scale, bool enable_gqa) -> Tensor")
_SDPA_OP: list[Any] = []  # the op once defined; None where this torch cannot define it


def _sdpa_eager(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
                dropout_p: float, is_causal: bool, scale: float | None, enable_gqa: bool) -> torch.Tensor:
    return _F_SDPA(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def _sdpa_shape(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
                dropout_p: float, is_causal: bool, scale: float | None, enable_gqa: bool) -> torch.Tensor:
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


def _attention_op() -> Any:
    """kiln::export_sdpa, defined on first use (None, and export as before, where this torch
    refuses the definition)."""
    if not _SDPA_OP:
        try:
            op = torch.library.custom_op("kiln::export_sdpa", _sdpa_eager, mutates_args=(), schema=_SDPA_SCHEMA)
            op.register_fake(_sdpa_shape)
            _SDPA_OP.append(torch.ops.kiln.export_sdpa.default)
        except Exception as err:  # noqa: BLE001 - any refusal leaves the math backend's export
            log.info("attention stays on the math backend in dynamic exports: %s", err)
            _SDPA_OP.append(None)
    return _SDPA_OP[0]


class _AttentionAsOneOp(torch.overrides.TorchFunctionMode):
    """Runs F.scaled_dot_product_attention calls as ``op`` (kiln::export_sdpa, see above)."""

    def __init__(self, op: Any) -> None:
        super().__init__()
        self.op = op

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func is not _F_SDPA or len(args) + len(kwargs) > len(_SDPA_ARGS):
            return func(*args, **kwargs)
        bound = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
        bound.update(zip(_SDPA_ARGS, args))
        bound.update(kwargs)
        if set(bound) != set(_SDPA_ARGS):  # an argument this version of torch added
            return func(*args, **kwargs)
        return self.op(*(bound[name] for name in _SDPA_ARGS))


def _attention_as_one_op() -> Any:
    op = _attention_op()
    return contextlib.nullcontext() if op is None else _AttentionAsOneOp(op)


def _attention_back(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """kiln::export_sdpa nodes become aten.scaled_dot_product_attention (their values stay)."""
    op = _attention_op()
    if op is None:
        return ep
    for node in ep.graph_module.graph.nodes:
        if node.op == "call_function" and node.target == op:
            values = dict(zip(_SDPA_ARGS, node.args))
            values.update(node.kwargs)
            node.target = torch.ops.aten.scaled_dot_product_attention.default
            node.args = tuple(values[name] for name in _SDPA_ARGS[:6])
            node.kwargs = {"scale": values["scale"], "enable_gqa": values["enable_gqa"]}
    ep.graph_module.recompile()
    return ep


def _sdpa_math() -> Any:
    """Export evaluates scaled_dot_product_attention with PyTorch's math backend. The exported
    graph keeps one scaled_dot_product_attention node whatever the backend, but a fused CUDA
    backend's checks would become constraints on the symbols (the memory-efficient kernel pads a
    mask whose row stride is not a multiple of 8, which narrowed a sequence range to multiples
    of 8); the math backend has none."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.MATH])


# ---- symbols ------------------------------------------------------------------------------

def _expr(size: Any) -> sympy.Expr:
    return size.node.expr if isinstance(size, _SYM_TYPES) else sympy.Integer(int(size))


def symbolic_tensor(val: Any) -> bool:
    return isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride()))


def is_dynamic(gm: fx.GraphModule) -> bool:
    """Whether any input of the graph has a symbolic size."""
    return any(symbolic_tensor(n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder")


def _scalar_node(node: fx.Node) -> bool:
    """A call producing a (symbolic) Python scalar (a size, a product of sizes, a comparison) or
    asserting one."""
    val = node.meta.get("val")
    return node.op == "call_function" and (isinstance(val, (*_SYM_TYPES, int, float, bool))
                                           or node.target is ASSERT_SCALAR)


def _scalar_value(node: fx.Node, binding: Binding) -> Any:
    """A scalar node's value under ``binding`` (None for an assert: the program's glue runs it)."""
    return None if node.target is ASSERT_SCALAR else evaluate(node.meta["val"], binding)


def _shape_env(gm: fx.GraphModule) -> Any:
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        for s in (*val.shape, *val.stride()) if isinstance(val, torch.Tensor) else ():
            if isinstance(s, torch.SymInt):
                return s.node.shape_env
    return None


@dataclasses.dataclass(frozen=True)
class SymbolRange:
    """One symbol of a dynamic program: its range and its opt value (built at compile time)."""

    symbol: sympy.Symbol
    min: int
    max: int
    opt: int

    @property
    def name(self) -> str:
        return str(self.symbol)

    def text(self) -> str:
        return f"{self.name} in {self.min}..{self.max} (opt {self.opt})"


Binding = dict[sympy.Symbol, int]


def _sympy_binding(binding: Binding) -> dict[sympy.Symbol, sympy.Integer]:
    return {s: sympy.Integer(v) for s, v in binding.items()}


def evaluate(value: Any, binding: Binding) -> Any:
    """A symbolic scalar (or a plain one) under the binding, as a Python int, float or bool."""
    if isinstance(value, (bool, int, float)) and not isinstance(value, _SYM_TYPES):
        return value
    expr = value.node.expr if isinstance(value, _SYM_TYPES) else value
    out = sympy.sympify(expr).xreplace(_sympy_binding(binding))
    if not out.is_number:
        raise _C.UnsupportedError(f"kiln: the size {expr} depends on {sorted(map(str, out.free_symbols))}, which no "
                                  "input size determines (a data-dependent size)")
    if isinstance(value, torch.SymBool) or out in (sympy.true, sympy.false):
        return bool(out)
    if isinstance(value, torch.SymFloat):
        return float(out)
    return int(out)


class ProgramShapes:
    """The symbols of a dynamic program and where the inputs carry them: binds them from a call's
    inputs and checks every input dim against what the program was compiled for."""

    def __init__(self, placeholders: Sequence[fx.Node], ranges: dict[sympy.Symbol, SymbolRange]) -> None:
        self.names = [p.name for p in placeholders]
        self.dims: list[list[sympy.Expr] | None] = [
            [_expr(s) for s in p.meta["val"].shape] if isinstance(p.meta.get("val"), torch.Tensor) else None
            for p in placeholders]
        self.ranges = ranges
        # Per symbol, where its value is read: the first (input, dim) that is that symbol alone, else
        # one whose size is an expression of that symbol alone, solved for it (`inverse`, in _SIZE).
        self.sources: dict[sympy.Symbol, tuple[int, int]] = {}
        self.inverse: dict[sympy.Symbol, sympy.Expr] = {}
        for i, dims in enumerate(self.dims):
            for d, e in enumerate(dims or ()):
                if isinstance(e, sympy.Symbol) and e not in self.sources:
                    self.sources[e] = (i, d)
        for i, dims in enumerate(self.dims):
            for d, e in enumerate(dims or ()):
                (s,) = e.free_symbols if len(e.free_symbols) == 1 else (None,)
                if s is not None and s in ranges and s not in self.sources:
                    solved = sympy.solve(sympy.Eq(e, _SIZE), s)
                    if len(solved) == 1:
                        self.sources[s], self.inverse[s] = (i, d), solved[0]
        unbound = sorted(map(str, (s for s in ranges if s not in self.sources)))
        if unbound:
            # Sizes of intermediate values only: a block whose shapes need one cannot be specialized
            # (evaluate() names it); the others build as usual.
            log.info("symbolic sizes %s are no input's size: not bound by calls", unbound)
        self.ranges = {s: r for s, r in ranges.items() if s in self.sources}
        self.symbols = sorted(self.ranges, key=lambda s: self.sources[s])

    def describe_inputs(self) -> list[str]:
        """Per dynamic input: its name, sizes and the ranges of its symbols (the dry-run report)."""
        lines = []
        for name, dims in zip(self.names, self.dims):
            if dims is None or all(e.is_number for e in dims):
                continue
            syms = sorted({s for e in dims for s in e.free_symbols}, key=str)
            ranges = ", ".join(self.ranges[s].text() for s in syms if s in self.ranges)
            lines.append(f"{name}: [{', '.join(str(e) for e in dims)}] with {ranges}")
        return lines

    def opt_binding(self) -> Binding:
        return {s: self.ranges[s].opt for s in self.symbols}

    def bind(self, args: Sequence[Any]) -> Binding:
        """The symbols' values for these inputs; ShapeRangeError for a size out of its range or not
        what the program needs."""
        binding: Binding = {}
        for s in self.symbols:
            i, d = self.sources[s]
            a = args[i]
            if not isinstance(a, torch.Tensor) or a.dim() != len(self.dims[i] or ()):
                self._check_rank(args, i)
            size = int(a.shape[d])
            value = size if s not in self.inverse else evaluate(self.inverse[s], {_SIZE: size})
            r = self.ranges[s]
            if not r.min <= value <= r.max:
                what, of = (f"{size}", "") if s not in self.inverse else (f"{size} ({s} = {value})", f" of {s}")
                raise ShapeRangeError(f"kiln: input '{self.names[i]}' dim {d} is {what}, outside the range "
                                      f"{r.min}..{r.max}{of} this program was compiled for")
            binding[s] = value
        for i, dims in enumerate(self.dims):
            if dims is None:
                continue
            self._check_rank(args, i)
            shape = args[i].shape
            for d, e in enumerate(dims):
                if self.sources.get(e) == (i, d):
                    continue
                want = int(e) if e.is_number else evaluate(e, binding)
                if int(shape[d]) == want:
                    continue
                if e.is_number:
                    raise ShapeRangeError(f"kiln: input '{self.names[i]}' dim {d} is {shape[d]}, this program was "
                                          f"compiled for {want}")
                if isinstance(e, sympy.Symbol):
                    j, k = self.sources[e]
                    raise ShapeRangeError(f"kiln: input '{self.names[i]}' dim {d} is {shape[d]}, but this program "
                                          f"needs it equal to input '{self.names[j]}' dim {k} ({want})")
                raise ShapeRangeError(f"kiln: input '{self.names[i]}' dim {d} is {shape[d]}, but this program needs "
                                      f"{e} = {want} there")
        return binding

    def _check_rank(self, args: Sequence[Any], i: int) -> None:
        dims = self.dims[i] or []
        a = args[i]
        if not isinstance(a, torch.Tensor):
            raise ShapeRangeError(f"kiln: input '{self.names[i]}' is a {type(a).__name__}, this program was compiled "
                                  "for a tensor")
        if a.dim() != len(dims):
            raise ShapeRangeError(f"kiln: input '{self.names[i]}' has {a.dim()} dims, this program was compiled for "
                                  f"{len(dims)}")


def symbol_ranges(gm: fx.GraphModule, constraints: dict[Any, Any] | None,
                  max_size: int) -> dict[sympy.Symbol, SymbolRange]:
    """Each symbol of the graph's inputs with its range (torch.export's range constraints, else the
    ShapeEnv's) and opt value (its example size). An unbounded max becomes ``max_size`` (logged)."""
    env = _shape_env(gm)
    symbols = sorted({s for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
                      for d in n.meta["val"].shape for s in _expr(d).free_symbols}, key=str)
    out: dict[sympy.Symbol, SymbolRange] = {}
    for s in symbols:
        vr = (constraints or {}).get(s)
        if vr is None and env is not None:
            vr = env.var_to_range.get(s)
        lo, hi_value = range_bounds(vr)
        hints = getattr(env, "backed_var_to_val", None) if env is not None else None
        if hints is None and env is not None:
            hints = env.var_to_val
        opt = int(hints[s]) if hints is not None and s in hints else lo
        if hi_value is None:
            hi = max(max_size, opt)
            log.info("symbol %s has no upper bound; serving sizes up to %d (setting dynamic_max_size)", s, hi)
        else:
            hi = hi_value
        out[s] = SymbolRange(s, lo, hi, min(max(opt, lo), hi))
    return out


def range_bounds(vr: Any) -> tuple[int, int | None]:
    """A ShapeEnv value range (or None) as (min, max): min 0 where unknown, max None where unbounded."""
    if vr is None:
        return 0, None
    return finite_bound(vr.lower) or 0, finite_bound(vr.upper)


def finite_bound(v: Any) -> int | None:
    """A range bound as an int; None for an infinite one (torch's int_oo, sympy's oo)."""
    if v is None or getattr(v, "is_finite", True) is False or getattr(v, "is_infinite", False):
        return None
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None


# ---- concrete copies ----------------------------------------------------------------------

_FAKE: list[Any] = []


def _fake_mode() -> Any:
    if not _FAKE:
        from torch._subclasses.fake_tensor import FakeTensorMode
        _FAKE.append(FakeTensorMode())
    return _FAKE[0]


def concrete_value(val: Any, binding: Binding, made: dict[tuple[Any, ...], torch.Tensor] | None = None) -> Any:
    """A node's ``meta["val"]`` with every symbolic size evaluated: a FakeTensor of concrete shape
    and strides, a tuple of them, or a Python scalar. ``made`` keeps the FakeTensors made so far
    by shape, strides, dtype and device, for values that agree in all four to share one (only
    their metadata is read)."""
    if isinstance(val, torch.Tensor):
        if not symbolic_tensor(val):
            return val
        shape = tuple(evaluate(s, binding) for s in val.shape)
        stride = tuple(evaluate(s, binding) for s in val.stride())
        key = (shape, stride, val.dtype, val.device)
        if made is not None and key in made:
            return made[key]
        with _fake_mode():
            fake = torch.empty_strided(shape, stride, dtype=val.dtype, device=val.device)
        if made is not None:
            made[key] = fake
        return fake
    if isinstance(val, (tuple, list)):
        return type(val)(concrete_value(v, binding, made) for v in val)
    if isinstance(val, _SYM_TYPES):
        return evaluate(val, binding)
    return val


def _evaluate_sizes(value: Any, binding: Binding) -> Any:
    """A node argument with every symbolic scalar in it evaluated (the same object where none is)."""
    if isinstance(value, _SYM_TYPES):
        return evaluate(value, binding)
    if isinstance(value, (tuple, list)):
        items = [_evaluate_sizes(v, binding) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    if isinstance(value, dict):
        mapped = {k: _evaluate_sizes(v, binding) for k, v in value.items()}
        return value if all(mapped[k] is v for k, v in value.items()) else mapped
    return value


def specialize_nodes(src: fx.GraphModule, inputs: Sequence[fx.Node], nodes: Iterable[fx.Node], outputs: Any,
                     binding: Binding, name: str = "KilnSpecialized", lenient: bool = False
                     ) -> tuple[fx.GraphModule, dict[fx.Node, fx.Node]]:
    """A concrete copy of part of ``src``: ``inputs`` become placeholders, ``nodes`` are copied with
    every symbolic scalar they read (a node outside or inside, e.g. ``sym_size``) replaced by its
    value under ``binding`` and every ``meta["val"]`` made concrete; the output is ``outputs``
    (nodes, nested in tuples and lists). Constants are shared with ``src``. ``lenient`` leaves out
    the nodes that cannot be made concrete (data-dependent sizes) and those reading them."""
    graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    made: dict[tuple[Any, ...], torch.Tensor] = {}
    for node in inputs:
        new = graph.placeholder(node.name)
        new.meta.update(node.meta)
        new.meta["val"] = concrete_value(node.meta.get("val"), binding, made)
        new.meta["kiln_sized"] = symbolic_tensor(node.meta.get("val"))  # what importers build from it
        env[node] = new

    def lookup(n: fx.Node) -> Any:
        if n in env:
            return env[n]
        if _scalar_node(n):  # a size computed outside the copied part
            env[n] = _scalar_value(n, binding)
            return env[n]
        raise KeyError(f"{n.name} is read by the copied nodes but not copied")

    for node in nodes:
        if node in env:
            continue
        try:
            if _scalar_node(node):
                env[node] = _scalar_value(node, binding)
                continue
            val = concrete_value(node.meta.get("val"), binding, made)
            new = graph.node_copy(node, lookup)
        except (KeyError, _C.UnsupportedError):
            if not lenient:
                raise
            continue
        new.args, new.kwargs = _evaluate_sizes(new.args, binding), _evaluate_sizes(new.kwargs, binding)
        new.meta["kiln_sized"] = symbolic_tensor(node.meta.get("val"))  # kept a node (kiln/instances.py)
        new.meta["val"] = val
        env[node] = new
    graph.output(pytree.tree_map_only(fx.Node, lookup, outputs))
    gm = fx.GraphModule(src, graph, class_name=name)
    return gm, {k: v for k, v in env.items() if isinstance(v, fx.Node)}


# ---- specializations ----------------------------------------------------------------------

@dataclasses.dataclass
class _BlockSource:
    """One block of the symbolic program, as the nodes of the untouched symbolic graph."""

    index: int
    block: Block
    tensor_inputs: list[fx.Node]
    symbols: tuple[sympy.Symbol, ...]  # the symbols its concrete copy depends on
    histogram: collections.Counter[str]


class Specialization:
    """The engines (or concrete PyTorch copies) of every block for one binding of the symbols."""

    def __init__(self, binding: Binding, runners: list[torch.nn.Module], block_keys: list[tuple[int, ...]],
                 jobs: list[Callable[[], None]] | None = None) -> None:
        self.binding = binding
        self.runners = runners
        self.block_keys = block_keys
        # Background work on its runners (instances to make), started once it is live.
        self.jobs = jobs or []

    def text(self) -> str:
        return ", ".join(f"{s}={v}" for s, v in self.binding.items())

    def light(self) -> bool:
        """Whether every block runs an instance on its range's shared arena, or padded rows of
        another size's engine: it holds no weights or arena of its own, only plans, kernels and
        CUDA graphs."""
        return all(isinstance(r, RowPadded) or (isinstance(r, KilnEngineModule) and r.engine.is_instance
                                                 and r.shares_arena) for r in self.runners)

    def holds_instances(self) -> bool:
        """Whether a block runs an instance (kiln/instances.py) here, or another size's engine on
        padded rows until its instance is made."""
        return any(isinstance(r, RowPadded) or (isinstance(r, KilnEngineModule) and r.engine.is_instance)
                   for r in self.runners)


class DynamicBlock(torch.nn.Module):
    """A block of the glue graph: runs the current specialization's engine for it."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def forward(self, spec: Specialization, *inputs: torch.Tensor) -> Any:
        return spec.runners[self.index](*inputs)


class Specializations(torch.nn.Module):
    """The first call of the glue graph: binds the symbols from the inputs and returns the
    specialization for them, building it on first sight (least recently used evicted beyond
    ``specialization_cache_size``). The live specializations' engines are submodules, so that
    refit, weight following and ``engines()`` find them."""

    _is_impure = True  # FX keeps the call when no block reads its result: it checks the ranges

    def __init__(self, source: fx.GraphModule, shapes: ProgramShapes, blocks: list[_BlockSource],
                 settings: CompilationSettings, device: str, graph_name: str) -> None:
        super().__init__()
        self.__dict__["source"] = source  # not a submodule: its constants are the glue's own
        self.__dict__["blocks"] = blocks
        self.shapes = shapes
        self.settings = settings
        self.device = device
        self.graph_name = graph_name
        self.capacity = settings.specialization_cache_size
        self.live: collections.OrderedDict[tuple[int, ...], Specialization] = collections.OrderedDict()
        self.by_shapes: dict[tuple[Any, ...], Specialization] = {}  # the inputs' shapes -> their specialization
        self._newest: Specialization | None = None
        self.built = torch.nn.ModuleDict()  # spec name -> its runners
        self._names: dict[int, str] = {}
        self._count = 0
        self._lock = threading.RLock()
        self._build_lock = threading.Lock()
        self._building: dict[tuple[int, ...], threading.Event] = {}  # new bindings being built
        # Blocks served by instances of one engine (kiln/instances.py), and those engines, kept as
        # submodules (for refit) when their own specialization is dropped.
        self.ranges: dict[int, SizeRange] = {}
        self.range_parents = torch.nn.ModuleDict()
        self.tuning = Tuning()  # timed instances, made after the untimed ones serve
        self.shared_constants: SharedConstants | None = None  # see sharing_constants

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        # A copy fits no ranges (their fitted programs and arenas are the process's): it builds per size.
        for transient in ("_lock", "_build_lock", "_building", "tuning", "ranges"):
            state.pop(transient, None)
        state.pop("source_program", None)  # kiln.save's input, not part of a pickled copy
        state.pop("source_versions", None)
        return state

    @contextlib.contextmanager
    def sharing_constants(self) -> Iterator[None]:
        """Within: the blocks' descriptions share their constants' host copies (an engine build and
        its range fit describe the same weights); after, the copies are let go."""
        self.shared_constants = SharedConstants()
        try:
            yield
        finally:
            self.shared_constants = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._build_lock = threading.Lock()
        self._building = {}
        self.tuning = Tuning()
        self.ranges = {}
        self.shared_constants = None

    @staticmethod
    def _key(args: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args)

    def forward(self, *args: Any) -> Specialization:
        key = self._key(args)
        spec = self.by_shapes.get(key)
        if spec is not None:
            if self._newest is not spec:
                with self._lock:
                    bkey = self._binding_key(spec.binding)
                    if bkey in self.live:
                        self.live.move_to_end(bkey)
                    self._newest = spec
            return spec
        binding = self.shapes.bind(args)
        bkey = self._binding_key(binding)
        # A new binding builds outside the lock, so calls at sizes already built go on meanwhile;
        # a second call for the same new binding waits for the first one's build. Builds run one at
        # a time (the symbolic graph's fake tensors are not for concurrent use).
        while True:
            with self._lock:
                spec = self.live.get(bkey)
                if spec is not None:
                    self.live.move_to_end(bkey)
                    self.by_shapes[key] = spec
                    self._newest = spec
                    return spec
                building = self._building.get(bkey)
                if building is None:
                    building = self._building[bkey] = threading.Event()
                    break
            building.wait()
        try:
            with self._build_lock:
                with self._lock:
                    shared = self._shared_runners()
                spec = self.specialize(binding, shared)
            with self._lock:
                self.add(spec)
                self.by_shapes[key] = spec
                self._newest = spec
            return spec
        finally:
            with self._lock:
                del self._building[bkey]
            building.set()

    def _binding_key(self, binding: Binding) -> tuple[int, ...]:
        return tuple(binding[s] for s in self.shapes.symbols)

    def add(self, spec: Specialization) -> None:
        """Keeps ``spec`` as the most recently used, dropping the least recently used beyond the
        capacity (specialization_cache_size; _MAX_LIGHT for light specializations)."""
        self.live[self._binding_key(spec.binding)] = spec
        name = f"s{self._count}"
        self._count += 1
        self._names[id(spec)] = name
        self.built[name] = torch.nn.ModuleList(spec.runners)
        for job in spec.jobs:  # they replace runners of live specializations only
            self.tuning.submit(job)
        spec.jobs = []
        # Specializations with engines of their own count against the capacity; light ones (served
        # by instances, Specialization.light) against _MAX_LIGHT: a program over a range of sizes
        # serves many of them, each cheap to keep and tens of milliseconds to make again.
        # The specialization whose engines the instances run on stays, beyond the capacity if need be
        # (they hold its engines anyway, and kiln.save writes it), as does the one just added: the
        # least recently used of the others goes.
        for light, bound in ((False, self.capacity), (True, _MAX_LIGHT)):
            while sum(s.light() == light for s in self.live.values()) > bound:
                older = list(self.live.items())[:-1]
                victim = next((k for k, s in older if s.light() == light and not self._holds_range_engine(s)), None)
                if victim is None:
                    break
                old = self.live.pop(victim)
                del self.built[self._names.pop(id(old))]
                for k in [k for k, v in self.by_shapes.items() if v is old]:
                    del self.by_shapes[k]
                log.info("%s: dropped the specialization for %s (least recently used; %s)", self.graph_name,
                         old.text(), f"{_MAX_LIGHT} kept served by instances" if light
                         else f"specialization_cache_size={self.capacity}")

    def _holds_range_engine(self, spec: Specialization) -> bool:
        """Whether a block of ``spec`` runs an engine that instances run on (kiln/instances.py)."""
        parents = {id(m) for m in self.range_parents.values()}
        return any(id(r) in parents for r in spec.runners)

    def _shared_runners(self) -> dict[tuple[int, tuple[int, ...]], torch.nn.Module]:
        """Per (block, its symbols' values), the runner a live specialization has for it."""
        return {(b.index, k): spec.runners[b.index] for spec in self.live.values()
                for b, k in zip(self.blocks, spec.block_keys)}

    def specialize(self, binding: Binding,
                   shared: dict[tuple[int, tuple[int, ...]], torch.nn.Module] | None = None,
                   meanwhile: Callable[[], None] | None = None, untimed: bool = False) -> Specialization:
        """Builds every block's engine for this binding of the symbols, or shares one of `shared`
        (default: the live specializations') built for the same sizes of that block. ``meanwhile``
        runs once: during the first engine build, or at the end if nothing was built. ``untimed``:
        the blocks with symbols build at optimization level 0 (see :meth:`retime`)."""
        start = time.perf_counter()
        runners: list[torch.nn.Module] = []
        keys: list[tuple[int, ...]] = []
        built = instances = 0
        jobs: list[Callable[[], None]] = []
        todo = [meanwhile] if meanwhile is not None else []

        def run_todo() -> None:
            while todo:
                todo.pop()()
        if shared is None:
            shared = self._shared_runners()
        for b in self.blocks:
            key = tuple(binding[s] for s in b.symbols)
            keys.append(key)
            runner = shared.get((b.index, key))
            if runner is None and b.index in self.ranges:
                runner = self._instance(b, binding, jobs)
                instances += runner is not None
            if runner is None:
                runner, ok = self._build(b, binding, run_todo if todo else None, untimed and bool(b.symbols))
                built += ok
            runners.append(runner)
        run_todo()
        seconds = time.perf_counter() - start
        spec = Specialization(dict(binding), runners, keys, jobs)
        log.info("%s: new specialization %s: %d engine(s) built, %d instance(s) made in %.3f s (%d of %d kept)",
                 self.graph_name, spec.text(), built, instances, seconds, min(len(self.live) + 1, self.capacity),
                 self.capacity)
        return spec

    def _engine_name(self, b: _BlockSource, binding: Binding) -> str:
        text = ", ".join(f"{s}={binding[s]}" for s in b.symbols)
        return f"engine {b.index} of {self.graph_name}" + (f" [{text}]" if text else "")

    def _instance(self, b: _BlockSource, binding: Binding, jobs: list[Callable[[], None]]) -> torch.nn.Module | None:
        """An instance of the block's range engine at ``binding``, untimed; None (logged) where the
        fitted plan does not hold, for the caller to build an engine instead. On a GPU, an instance
        with timed tactics is then made in the background and takes its place (:meth:`_tune`).
        A block whose varying symbol only counts rows is served at once by an engine of another
        row count on padded rows (:meth:`_row_padded`), and its instance made in the background.
        The background work goes into ``jobs``, for the specialization to start once live."""
        name = self._engine_name(b, binding)
        cuda = torch.device(self.device).type == "cuda"
        padded = self._row_padded(b, binding)
        if padded is not None:
            level = self.settings.optimization_level if cuda else 0
            jobs.append(lambda: self._tune(b, dict(binding), padded, level))
            log.info("%s: runs on padded rows of the engine for %d until its instance is made", name,
                     padded.built_rows)
            return padded
        try:
            module = make_instance(self.ranges[b.index], binding, name)
        except _C.KilnError as err:
            log.info("%s: no instance, building an engine: %s", name, err)
            return None
        if self.settings.optimization_level > 0 and cuda:
            jobs.append(lambda: self._tune(b, dict(binding), module))
        return module

    def _row_padded(self, b: _BlockSource, binding: Binding) -> RowPadded | None:
        """For a block whose range has a row symbol (kiln/instances.py row_symbol): the engine of a
        live specialization that agrees with ``binding`` on the other symbols, run on padded rows
        (the smallest that holds the row count, else the largest, in chunks). None otherwise."""
        r = self.ranges[b.index]
        if r.rows is None:
            return None
        s, rows_in, rows_out = r.rows
        want = binding[s]
        with self._lock:
            candidates = {spec.binding[s]: spec.runners[b.index] for spec in self.live.values()
                          if isinstance(spec.runners[b.index], KilnEngineModule)
                          and all(spec.binding[t] == binding[t] for t in b.symbols if t != s)}
        if not candidates:
            return None
        rows = min((n for n in candidates if n >= want), default=max(candidates))
        return RowPadded(candidates[rows], rows, rows_in, rows_out)

    def _tune(self, b: _BlockSource, binding: Binding, current: torch.nn.Module, level: int | None = None) -> None:
        """Replaces ``current`` (an untimed instance, padded rows, or an engine built untimed) by
        an instance whose tactics are timed at ``level`` (default: the program's optimization
        level), or by an engine built so where no instance serves, in every live specialization
        that still runs it. An untimed engine that instances run on stays, running the kernels of
        a timed instance at its own sizes (KilnEngineModule.run_kernels_of)."""
        name = self._engine_name(b, binding)
        with self._lock:
            if not any(spec.runners[b.index] is current for spec in self.live.values()):
                return  # dropped meanwhile (LRU, a refit)
        start = time.perf_counter()
        level = self.settings.optimization_level if level is None else level
        r = self.ranges.get(b.index)
        range_engine = r is not None and r.parent is current
        untimed_instance = isinstance(current, KilnEngineModule) and current.engine.is_instance
        made: torch.nn.Module | None = None
        try:
            if range_engine:
                current.run_kernels_of(current.engine.instance(current.engine.graph(), level, False, True))
                current.prime()
                log.info("%s: timed in the background in %.3f s (optimization level %d)", name,
                         time.perf_counter() - start, level)
                return
            if r is not None:
                made = make_instance(r, binding, name, level, background=True)
        except _C.KilnError as err:
            if untimed_instance or range_engine:
                log.info("%s: keeps its untimed kernels (timing failed: %s)", name, err)
                return
            log.info("%s: no instance (%s); building an engine in the background", name, err)
        if made is None:
            with self._build_lock:
                made, _ = self._build(b, binding)
        with self._lock:
            swapped = 0
            for spec in self.live.values():
                if spec.runners[b.index] is current:
                    spec.runners[b.index] = made
                    self.built[self._names[id(spec)]][b.index] = made
                    swapped += 1
        if swapped:
            log.info("%s: instance made in the background in %.3f s (optimization level %d)", name,
                     time.perf_counter() - start, level)

    def retime(self, specs: Iterable[Specialization]) -> None:
        """Times in the background the tactics of the engines of ``specs`` that were built at a
        lower optimization level than the program's (the opt shape's blocks with symbols, on a
        GPU: the compile returns, and calls are served, without waiting for tactic timing; see
        :meth:`_tune`), and again after each refit of one that instances run on."""
        if not times_tactics(self.settings, self.device):
            return
        level = self.settings.optimization_level
        seen: set[int] = set()
        for spec in specs:
            for b, runner in zip(self.blocks, spec.runners):
                if not _built(runner) or runner.engine.optimization_level >= level or id(runner) in seen:
                    continue
                seen.add(id(runner))
                job = functools.partial(self._tune, b, dict(spec.binding), runner)
                self.tuning.submit(job)
                r = self.ranges.get(b.index)
                if r is not None and r.parent is runner:
                    runner.refit_hooks.append(functools.partial(self.tuning.submit, job))

    def wait_tuned(self) -> None:
        """Returns once the instances made so far run with timed tactics (or kept untimed ones)."""
        self.tuning.wait()

    def start_fits(self, binding: Binding, pool: concurrent.futures.Executor,
                   runners: Sequence[torch.nn.Module] | None = None) -> dict[int, PendingFit]:
        """Starts the range fits at ``binding`` of the blocks that have no range engine yet (of
        those whose runner in ``runners``, when given, is a built engine): their samples are
        described now and optimized on ``pool``, while the engines build. See finish_fits."""
        pending: dict[int, PendingFit] = {}
        if not self.settings.dynamic_instances:
            return pending
        for b in self.blocks:
            if not b.symbols or b.index in self.ranges or (runners is not None and not _built(runners[b.index])):
                continue
            base = {s: binding[s] for s in b.symbols}

            def concrete(at: Binding, b: _BlockSource = b) -> tuple[fx.GraphModule, Block]:
                gm, block, _ = self._concrete(b, {**binding, **at})
                return gm, block
            fit = start_fit(base, self.shapes.ranges, b.block.nodes, concrete, self.settings, self.device,
                            self._engine_name(b, base), pool, self.shared_constants)
            if fit is not None:
                pending[b.index] = fit
        return pending

    def finish_fits(self, spec: Specialization, pending: dict[int, PendingFit]) -> None:
        """Makes the engines ``spec`` built (not instances) at the binding ``pending`` started at
        the range engines of their blocks, where their plans fit a SizeProgram (kiln/instances.py)."""
        for b, runner in zip(self.blocks, spec.runners):
            fit = pending.get(b.index)
            if fit is None or b.index in self.ranges or not _built(runner):
                continue
            r = finish_fit(fit, runner)
            if r is not None:
                # (Tied symbols count the rows of other inputs too: no padded rows for those.)
                r.rows = None if r.tied else row_symbol(b.tensor_inputs, b.block.nodes, b.block.outputs, r.symbols)
                self.ranges[b.index] = r
                self.range_parents[str(b.index)] = runner
                runner.refit_hooks.append(self._drop_instances)

    def fit_ranges(self, spec: Specialization) -> None:
        """Fits ranges to the engines ``spec`` holds already (start_fits, then finish_fits)."""
        with fit_pool() as pool:
            self.finish_fits(spec, self.start_fits(spec.binding, pool, spec.runners))

    def _drop_instances(self) -> None:
        """Drops the specializations that hold instances (after a refit of their range engine,
        whose new weights their kernels may not have read); they are made again on first use."""
        with self._lock:
            for bkey, spec in list(self.live.items()):
                if spec.holds_instances():
                    del self.live[bkey]
                    del self.built[self._names.pop(id(spec))]
                    for k in [k for k, v in self.by_shapes.items() if v is spec]:
                        del self.by_shapes[k]
                    if self._newest is spec:
                        self._newest = None

    def _concrete(self, b: _BlockSource, binding: Binding) -> tuple[fx.GraphModule, Block, str]:
        """The block copied with every size evaluated under ``binding``, and its engine's name."""
        block = b.block
        gm, env = specialize_nodes(self.source, b.tensor_inputs, [*block.constants, *block.nodes],
                                   tuple(block.outputs), binding,
                                   "KilnBlock")
        concrete = Block([env[n] for n in block.nodes if n in env], [env[n] for n in b.tensor_inputs],
                         [env[n] for n in block.constants], [env[n] for n in block.outputs])
        return gm, concrete, self._engine_name(b, binding)

    def _build(self, b: _BlockSource, binding: Binding, meanwhile: Callable[[], None] | None = None,
               untimed: bool = False) -> tuple[torch.nn.Module, bool]:
        gm, concrete, name = self._concrete(b, binding)
        settings = self.settings.replace(optimization_level=0) if untimed else self.settings
        module = build_block(gm, concrete, settings, self.device, name, constants=self.shared_constants,
                             meanwhile=meanwhile)
        if module is None:
            return gm, False  # the concrete copy runs in PyTorch at this shape
        return module, True

    # -- kiln.save / kiln.load --
    def keep_source(self, program: torch.export.ExportedProgram) -> None:
        """Keeps the symbolic ExportedProgram this table was compiled from, for kiln.save (the
        model's tensors, not copies; with ``share_weights=False`` their versions are noted, since
        the program is then a snapshot that a saved copy of changed weights would not match)."""
        self.__dict__["source_program"] = program
        self.__dict__["source_versions"] = None if self.settings.share_weights else _versions(program)

    def saved_form(self) -> tuple[torch.export.ExportedProgram, torch.export.ExportedProgram, str]:
        """What kiln.save writes for this program: the symbolic ExportedProgram it was compiled
        from, a program whose buffers are the live specializations' engines (``engine_<i>``,
        uint8) and the description tying them together (JSON; see :func:`read_saved`)."""
        program = self.__dict__.get("source_program")
        if program is None:
            raise _C.UnsupportedError(
                "kiln.save: this dynamic-shape program keeps no symbolic ExportedProgram to save (it comes from "
                "torch.compile, or from a pickled copy); save the module kiln.compile or kiln.load returned")
        derived = [(self.shapes.names[i], d, e) for i, dims in enumerate(self.shapes.dims)
                   for d, e in enumerate(dims or ()) if not e.is_number and not isinstance(e, sympy.Symbol)]
        if derived:
            name, d, e = derived[0]
            raise _C.UnsupportedError(
                f"kiln.save: input '{name}' dim {d} is the derived size {e} in this dynamic-shape program; "
                "torch.export cannot lower such a program again after loading it, so it is not saved (give that dim "
                "a Dim of its own)")
        versions = self.__dict__.get("source_versions")
        if versions is not None and versions != _versions(program):
            raise _C.UnsupportedError(
                "kiln.save: the model's weights changed in place since this dynamic-shape program was compiled with "
                "share_weights=False (a snapshot of the weights as they were); the saved program would not match its "
                "engines. Save before changing them, or compile again")
        with self._lock:
            blobs: list[torch.Tensor] = []
            engines: list[dict[str, Any]] = []
            index: dict[int, int] = {}
            specs = []
            # Instances are made again after loading, on the saved range engines; the range engines'
            # specialization may be live beyond the capacity, which a saved program may not exceed.
            saved = [spec for spec in self.live.values() if not spec.holds_instances()]
            while len(saved) > self.capacity:
                victim = next((s for s in saved if not self._holds_range_engine(s)), None)
                if victim is None:
                    break
                saved.remove(victim)
            for spec in saved:  # least recently used first, as load re-adds them
                entries: list[int | None] = []
                for runner in spec.runners:
                    if not isinstance(runner, KilnEngineModule):
                        entries.append(None)  # the block runs in PyTorch at this size
                        continue
                    if id(runner) not in index:  # an engine shared between specializations is saved once
                        index[id(runner)] = len(blobs)
                        blobs.append(torch.frombuffer(bytearray(runner.engine_bytes()), dtype=torch.uint8))
                        engines.append({"truncated_weights": sorted(runner.truncated_weights)})
                    entries.append(index[id(runner)])
                shapes = [None if dims is None else [evaluate(e, spec.binding) for e in dims]
                          for dims in self.shapes.dims]
                specs.append({"inputs": shapes, "blocks": entries})
        description = {
            "format": SAVED_FORMAT,
            "graph_name": self.graph_name,
            "settings": settings_record(self.settings),
            "symbols": [{"input": self.shapes.sources[s][0], "dim": self.shapes.sources[s][1], "min": r.min,
                         "max": r.max, "opt": r.opt} for s in self.shapes.symbols for r in (self.shapes.ranges[s],)],
            "blocks": [block_signature(b) for b in self.blocks],
            "engines": engines,
            "specializations": specs,
        }
        holder = _EngineHolder(blobs)
        with torch.no_grad():
            engines_program = torch.export.export(holder, (), strict=False)
        return program, engines_program, json.dumps(description, separators=(",", ":"))

    def install(self, saved: SavedProgram, path: str) -> int:
        """Adds the saved specializations with their saved engines (nothing is built: each engine is
        deserialized, checked and compared with its block's inputs and outputs at its sizes).
        Returns the number of engines."""
        where = f"kiln.load: {path}"
        if len(saved.blocks) != len(self.blocks) or any(
                want != block_signature(b) for want, b in zip(saved.blocks, self.blocks)):
            raise _C.VersionMismatchError(
                f"{where}: the saved dynamic-shape program partitions into {len(self.blocks)} block(s) here "
                f"({', '.join(_signature_text(block_signature(b)) for b in self.blocks) or 'none'}), into "
                f"{len(saved.blocks)} when it was saved ({', '.join(map(_signature_text, saved.blocks)) or 'none'}); "
                "it was saved by another version of Kiln or PyTorch: compile the model again")
        made: dict[int, tuple[int, tuple[int, ...], KilnEngineModule]] = {}
        for n, entry in enumerate(saved.specializations):
            if len(entry.inputs) != len(self.shapes.dims):
                raise _saved_error(path, f"specialization {n} gives {len(entry.inputs)} input shapes, the program "
                                         f"takes {len(self.shapes.dims)} inputs")
            if len(entry.blocks) != len(self.blocks):
                raise _saved_error(path, f"specialization {n} names {len(entry.blocks)} blocks, the program has "
                                         f"{len(self.blocks)}")
            args = [None if shape is None else torch.empty(shape, device="meta") for shape in entry.inputs]
            try:
                binding = self.shapes.bind(args)
            except ShapeRangeError as err:
                raise _saved_error(path, f"specialization {n} does not fit the program: {err}") from None
            runners: list[torch.nn.Module] = []
            keys: list[tuple[int, ...]] = []
            for b, e in zip(self.blocks, entry.blocks):
                key = tuple(binding[s] for s in b.symbols)
                keys.append(key)
                if e is None:
                    runners.append(self._concrete(b, binding)[0])  # runs in PyTorch at this size, as when saved
                    continue
                if e in made:
                    index, made_key, module = made[e]
                    if (index, made_key) != (b.index, key):
                        raise _saved_error(path, f"engine {e} serves block {index} at {made_key} and block {b.index} "
                                                 f"at {key}")
                else:
                    module = self._adopt(b, binding, saved.engines[e], e, where)
                    made[e] = (b.index, key, module)
                runners.append(module)
            self.add(Specialization(dict(binding), runners, keys))
        return len(made)

    def _adopt(self, b: _BlockSource, binding: Binding, engine: SavedEngine, i: int, where: str) -> KilnEngineModule:
        gm, concrete, name = self._concrete(b, binding)
        what = f"{where}: engine {i} ({name})"
        try:
            built = _C.Engine.deserialize(engine.blob.detach().cpu().contiguous().numpy(), self.device)
        except _C.KilnError as err:
            raise type(err)(f"{what}: {err}") from None
        try:
            check_engine(built, concrete, self.settings)
        except _C.InternalError as err:
            raise _C.CorruptedError(f"{what} does not fit its block: {err}") from None
        module = KilnEngineModule(built, self.device, [n.meta["val"].dtype for n in concrete.inputs],
                                  [n.meta["val"].dtype for n in concrete.outputs], name=name,
                                  use_cuda_graphs=self.settings.use_cuda_graphs)
        module.truncated_weights = engine.truncated_weights
        return module


def _built(runner: torch.nn.Module) -> bool:
    """Whether a block's runner is an engine built for its binding (not an instance, not PyTorch)."""
    return isinstance(runner, KilnEngineModule) and not runner.engine.is_instance


def _symbols_of(nodes: Iterable[fx.Node]) -> set[sympy.Symbol]:
    out: set[sympy.Symbol] = set()
    for n in nodes:
        for v in pytree.tree_leaves(n.meta.get("val")):
            if isinstance(v, torch.Tensor):
                for s in (*v.shape, *v.stride()):
                    out |= _expr(s).free_symbols
            elif isinstance(v, _SYM_TYPES):
                out |= v.node.expr.free_symbols
    return out


# ---- the saved form (kiln.save / kiln.load) ------------------------------------------------
#
# A saved dynamic program is a torch.export archive (kiln.save's format) holding two programs and
# one extra file: "model", the symbolic ExportedProgram the program was compiled from;
# SAVED_ENGINES, a program whose buffers are the engines of the live specializations (raw uint8
# tensor records, as a static program's engines); and SAVED_DESCRIPTION, JSON: the settings, each
# symbol's range and opt value (by the input dim it is read from), each block's signature, and
# per specialization its input shapes and, per block, the index of its engine (null: the block
# ran in PyTorch at those sizes). kiln.load lowers and partitions "model" as kiln.compile did
# (at the same opt sizes), checks that the blocks are the saved ones, and installs the engines.

SAVED_FORMAT = 1
SAVED_DESCRIPTION = "kiln_dynamic.json"
SAVED_ENGINES = "kiln_engines"

# Settings of the process, not of the program: not saved (the loaded program takes the defaults).
_LOCAL_SETTINGS = frozenset({"debug", "dryrun", "cache_built_engines", "reuse_cached_engines", "engine_cache_dir",
                             "engine_cache_size", "engine_cache_key_file", "custom_engine_cache", "mode",
                             "timing_cache_path", "autocast_calibration_dataloader", "module_key"})


class _EngineHolder(torch.nn.Module):
    """The engines of a saved dynamic program as buffers (``engine_<i>``) of a program of their own."""

    def __init__(self, blobs: Sequence[torch.Tensor]) -> None:
        super().__init__()
        for i, blob in enumerate(blobs):
            self.register_buffer(f"engine_{i}", blob)

    def forward(self) -> torch.Tensor:
        return torch.zeros(1)  # torch.export saves no program without an output


def _versions(program: torch.export.ExportedProgram) -> tuple[int, ...]:
    return tuple(t._version for t in program.state_dict.values())


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, (set, frozenset)):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return value


def settings_record(settings: CompilationSettings) -> dict[str, Any]:
    """The settings a saved dynamic program is built with, as JSON values."""
    if settings.autocast_calibration_dataloader is not None:
        raise _C.UnsupportedError("kiln.save: a dynamic-shape program compiled with autocast_calibration_dataloader "
                                  "cannot be saved (the calibration data is not part of the program)")
    return {f.name: _jsonable(getattr(settings, f.name)) for f in dataclasses.fields(settings)
            if f.name not in _LOCAL_SETTINGS}


def _settings_from_record(record: Any, path: str) -> CompilationSettings:
    if not isinstance(record, dict):
        raise _saved_error(path, "has no settings table")
    values = dict(record)
    unknown = sorted((set(values) - {f.name for f in dataclasses.fields(CompilationSettings)})
                     | (set(values) & _LOCAL_SETTINGS))
    if unknown:
        raise _saved_error(path, f"names settings that are not saved: {', '.join(map(str, unknown))}")
    if values.get("min_block_size") == "inf":
        values["min_block_size"] = math.inf
    if isinstance(values.get("autocast_excluded_nodes"), list):
        values["autocast_excluded_nodes"] = tuple(values["autocast_excluded_nodes"])
    try:
        settings = CompilationSettings(**values)
    except (TypeError, ValueError) as err:
        raise _saved_error(path, f"has settings Kiln refuses: {err}") from None
    if settings.builds_nothing:
        raise _saved_error(path, "has settings that build nothing (min_block_size=inf)")
    return settings


def block_signature(b: _BlockSource) -> dict[str, Any]:
    """What identifies a block of the symbolic program across processes: its ops and I/O counts."""
    return {"ops": sorted([name, count] for name, count in b.histogram.items()), "inputs": len(b.tensor_inputs),
            "outputs": len(b.block.outputs)}


def _signature_text(sig: dict[str, Any]) -> str:
    ops = sum(count for _, count in sig["ops"])
    return f"{ops} ops, {sig['inputs']} in, {sig['outputs']} out"


def _saved_error(path: str, what: str) -> _C.CorruptedError:
    return _C.CorruptedError(f"kiln.load: {path} is damaged or not a program saved by kiln.save: the dynamic-shape "
                             f"program's description ({SAVED_DESCRIPTION}) {what}")


@dataclasses.dataclass(frozen=True)
class SavedEngine:
    blob: torch.Tensor  # the engine file's bytes (uint8)
    truncated_weights: frozenset[str]


@dataclasses.dataclass(frozen=True)
class SavedSpecialization:
    inputs: list[list[int] | None]  # per input of the program, its shape (None: not a tensor)
    blocks: list[int | None]  # per block, its engine's index (None: it runs in PyTorch)


@dataclasses.dataclass(frozen=True)
class SavedProgram:
    """The description of a saved dynamic program, checked (see :func:`read_saved`)."""

    path: str
    graph_name: str
    settings: CompilationSettings
    symbols: list[tuple[int, int, int, int, int]]  # input, dim, min, max, opt
    blocks: list[dict[str, Any]]
    engines: list[SavedEngine]
    specializations: list[SavedSpecialization]


def _is_int(v: Any, lo: int = 0) -> bool:
    return type(v) is int and v >= lo


def read_saved(text: Any, engines: torch.export.ExportedProgram | None, path: str) -> SavedProgram:
    """The saved description and engines of a dynamic program; kiln.CorruptedError naming what is
    malformed (kiln.VersionMismatchError for another format version)."""
    try:
        doc = json.loads(text) if isinstance(text, str) else None
    except ValueError as err:
        raise _saved_error(path, f"is not JSON ({err})") from None
    if not isinstance(doc, dict):
        raise _saved_error(path, "is not a JSON table")
    if doc.get("format") != SAVED_FORMAT:
        raise _C.VersionMismatchError(f"kiln.load: {path}: the dynamic-shape program is saved in format "
                                      f"{doc.get('format')!r}; this Kiln reads format {SAVED_FORMAT}")
    graph_name = doc.get("graph_name")
    if not isinstance(graph_name, str):
        raise _saved_error(path, "has no graph name")
    settings = _settings_from_record(doc.get("settings"), path)
    symbols: list[tuple[int, int, int, int, int]] = []
    raw_symbols = doc.get("symbols")
    for item in raw_symbols if isinstance(raw_symbols, list) else [None]:
        fields: list[Any] = [item.get(k) for k in ("input", "dim", "min", "max", "opt")] \
            if isinstance(item, dict) else []
        if len(fields) != 5 or not all(_is_int(v) for v in fields) or not fields[2] <= fields[4] <= fields[3]:
            raise _saved_error(path, f"has a malformed symbol range {str(item)[:80]}")
        symbols.append((fields[0], fields[1], fields[2], fields[3], fields[4]))
    blocks = doc.get("blocks")
    if not isinstance(blocks, list) or not all(
            isinstance(b, dict) and set(b) == {"ops", "inputs", "outputs"} and _is_int(b["inputs"])
            and _is_int(b["outputs"]) and isinstance(b["ops"], list)
            and all(isinstance(o, list) and len(o) == 2 and isinstance(o[0], str) and _is_int(o[1], 1)
                    for o in b["ops"]) for b in blocks):
        raise _saved_error(path, "has a malformed block list")
    records = doc.get("engines")
    if not isinstance(records, list):
        raise _saved_error(path, "has no engine list")
    state = engines.state_dict if engines is not None else {}
    saved_engines = []
    for i, record in enumerate(records):
        names = record.get("truncated_weights") if isinstance(record, dict) else None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise _saved_error(path, f"has a malformed entry for engine {i}")
        blob = state.get(f"engine_{i}")
        if not isinstance(blob, torch.Tensor) or blob.dtype != torch.uint8 or blob.dim() != 1:
            raise _saved_error(path, f"names engine {i}, whose bytes ({SAVED_ENGINES}: engine_{i}) are missing")
        saved_engines.append(SavedEngine(blob, frozenset(names)))
    specs = []
    raw_specs = doc.get("specializations")
    for item in raw_specs if isinstance(raw_specs, list) else [None]:
        inputs = item.get("inputs") if isinstance(item, dict) else None
        entries = item.get("blocks") if isinstance(item, dict) else None
        if not isinstance(inputs, list) or not all(
                shape is None or isinstance(shape, list) and all(_is_int(d) for d in shape) for shape in inputs) \
                or not isinstance(entries, list) or not all(
                e is None or _is_int(e) and e < len(saved_engines) for e in entries):
            raise _saved_error(path, f"has a malformed specialization {str(item)[:80]}")
        specs.append(SavedSpecialization(inputs, entries))
    if len(specs) > settings.specialization_cache_size:
        raise _saved_error(path, f"has {len(specs)} specializations, more than its specialization_cache_size "
                                 f"({settings.specialization_cache_size})")
    return SavedProgram(path, graph_name, settings, symbols, blocks, saved_engines, specs)


def _use_saved_ranges(shapes: ProgramShapes, saved: SavedProgram) -> None:
    """The saved symbols' ranges must be the program's (the same range errors); their opt values
    are taken from the file (the partition is decided at the opt sizes)."""
    here = {shapes.sources[s]: (r.min, r.max) for s, r in shapes.ranges.items()}
    there = {(i, d): (lo, hi) for i, d, lo, hi, _ in saved.symbols}
    if here != there:
        def text(ranges: dict[tuple[int, int], tuple[int, int]]) -> str:
            return ", ".join(f"input {i} dim {d} in {lo}..{hi}" for (i, d), (lo, hi) in sorted(ranges.items()))
        raise _C.VersionMismatchError(
            f"kiln.load: {saved.path}: the saved dynamic-shape program has the ranges {text(here) or 'none'} here, "
            f"{text(there) or 'none'} when it was saved; it was saved by another version of Kiln or PyTorch")
    by_source = {shapes.sources[s]: s for s in shapes.ranges}
    for i, d, _, _, opt in saved.symbols:
        s = by_source[(i, d)]
        shapes.ranges[s] = dataclasses.replace(shapes.ranges[s], opt=opt)


# ---- compile ------------------------------------------------------------------------------

def _check_full(result: PartitionResult) -> None:
    inside = {n for b in result.blocks for n in b.nodes}
    left = collections.Counter(op_name(n) for n in result.gm.graph.nodes
                               if is_op(n) and n not in inside and not _scalar_node(n))
    if left:
        raise _C.UnsupportedError("require_full_compilation=True, but these ops would run in PyTorch: "
                                  + ", ".join(f"{k} x{v}" for k, v in sorted(left.items())))


def compile_dynamic(lowered: LoweredGraph, settings: CompilationSettings, device: str, graph_name: str = "graph",
                    constraints: dict[Any, Any] | None = None, saved: SavedProgram | None = None) -> fx.GraphModule:
    """The glue graph of a lowered symbolic graph (see the module docstring): partitioned once,
    with the opt shape's engines built now (none in a dry run, which returns the graph to run
    in PyTorch), or, for a program ``saved`` by kiln.save, its saved specializations installed
    (nothing built). Its meta has ``kiln_summary`` (blocks counted as engines) and
    ``kiln_weight_sources``."""
    start = time.perf_counter()
    gm = lowered.gm
    if not settings.builds_nothing:
        warm_up(device)
    if settings.enable_autocast:
        from kiln.autocast import apply_autocast
        apply_autocast(gm, settings)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ranges = symbol_ranges(gm, constraints, settings.dynamic_max_size)
    shapes = ProgramShapes(placeholders, ranges)
    if saved is not None:
        _use_saved_ranges(shapes, saved)
    opt = shapes.opt_binding()
    # The importers are asked once, about the whole graph at the opt shape.
    body = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    whole, node_map = specialize_nodes(gm, placeholders, body, (), opt, lenient=True)
    capability = Capability(whole, settings, device)

    def supports(node: fx.Node) -> tuple[bool, str]:
        if _scalar_node(node):
            return False, _SCALAR_REASON
        copy = node_map.get(node)
        if copy is None:
            return False, "a data-dependent size (or an input of one): runs in PyTorch"
        return capability(copy)

    part_settings = settings.replace(require_full_compilation=False, min_block_size=1) \
        if settings.require_full_compilation else settings
    result = partition(gm, supports, part_settings)
    if settings.require_full_compilation:
        _check_full(result)
    if settings.builds_nothing or settings.debug:
        emit_report(format_report(result, settings, graph_name, dynamic_inputs=shapes.describe_inputs()), settings)
    sources = gm.meta.pop("kiln_weight_sources", None) or {}
    if settings.builds_nothing:
        gm.meta["kiln_summary"] = CompileSummary(graph_name, 0, collections.Counter(), result.pytorch_ops())
        return gm
    if not settings.share_weights:
        for attr, buffer in list(gm.named_buffers(recurse=False)):
            gm.register_buffer(attr, buffer.clone())  # a snapshot: engines and PyTorch parts
        sources = {}
    blocks = []
    for i, block in enumerate(result.blocks):
        tensors = [n for n in block.inputs if not _scalar_node(n)]
        syms = _symbols_of([*block.inputs, *block.nodes])
        blocks.append(_BlockSource(i, block, tensors, tuple(s for s in shapes.symbols if s in syms), block.histogram()))
    # The glue: a copy of the symbolic graph with each block a DynamicBlock call.
    graph = fx.Graph()
    val_map: dict[fx.Node, fx.Node] = {}
    graph.output(graph.graph_copy(gm.graph, val_map))
    glue = fx.GraphModule(gm, graph, class_name="KilnDynamicGraph")
    table = Specializations(gm, shapes, blocks, settings, device, graph_name)
    glue.add_submodule("_kiln_specializations", table)
    inputs = [val_map[p] for p in placeholders]
    with graph.inserting_after(inputs[-1] if inputs else next(iter(graph.nodes))):
        spec_node = graph.call_module("_kiln_specializations", tuple(inputs))
    remap: dict[fx.Node, fx.Node] = {}
    for b in blocks:
        mapped = Block([val_map[n] for n in b.block.nodes], [spec_node] + [remap.get(val_map[n], val_map[n])
                                                                           for n in b.tensor_inputs],
                       [val_map[n] for n in b.block.constants], [val_map[n] for n in b.block.outputs])
        replace_block(glue, mapped, f"_kiln_block_{b.index}", DynamicBlock(b.index), remap)
    drop_unused(glue)
    glue.recompile()
    if saved is not None:  # the saved sizes' engines, checked; other sizes are built on first use
        installed = table.install(saved, saved.path)
        log.info("%s: %d saved specialization(s) with %d engine(s) installed", graph_name,
                 len(saved.specializations), installed)
        with table.sharing_constants():
            for spec in list(table.live.values()):
                table.fit_ranges(spec)
        table.retime(list(table.live.values()))
    else:  # the opt shape's engines are built now, the samples of their range fits described and optimized meanwhile
        # The blocks that may serve a range build untimed; their tactics are timed in the background.
        untimed = settings.dynamic_instances and times_tactics(settings, device)
        with table.sharing_constants(), fit_pool() as pool:
            pending: dict[int, PendingFit] = {}
            spec = table.specialize(opt, meanwhile=lambda: pending.update(table.start_fits(opt, pool)),
                                    untimed=untimed)
            table.add(spec)
            table.finish_fits(spec, pending)
        for runner in spec.runners:  # a new size's first call runs on these (padded rows), untimed
            if _built(runner):
                runner.prime()
        table.retime([spec])
    in_engines: collections.Counter[str] = collections.Counter()
    for b in blocks:
        in_engines.update(b.histogram)
    in_pytorch = collections.Counter(op_name(n) for n in graph.nodes if is_op(n))
    seconds = time.perf_counter() - start
    glue.meta["kiln_summary"] = CompileSummary(graph_name, len(blocks), in_engines, in_pytorch, seconds)
    glue.meta["kiln_weight_sources"] = sources
    glue.meta["kiln_dynamic"] = shapes
    log.info("%s: dynamic program, %d block(s), %d of %d ops in engines, symbols %s; %s in %.3f s",
             graph_name, len(blocks), sum(in_engines.values()), result.total_ops,
             ", ".join(shapes.ranges[s].text() for s in shapes.symbols),
             "saved engines installed" if saved is not None else "opt shape built", seconds)
    return glue


def times_tactics(settings: CompilationSettings, device: str) -> bool:
    """Whether builds for ``device`` time tactics at the settings' optimization level (on a GPU,
    above level 0), so that a dynamic program defers that timing to the background."""
    return settings.optimization_level > 0 and torch.device(device).type == "cuda"


def dynamic_program_of(module: torch.nn.Module) -> Specializations | None:
    """The Specializations table of a compiled dynamic program inside ``module`` (None if none)."""
    for m in module.modules():
        if isinstance(m, Specializations):
            return m
    return None

