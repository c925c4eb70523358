"""Lowering: a Dynamo FX graph, an nn.Module or an ExportedProgram -> a Core ATen FX graph.

Every entry point ends in the same form, a :class:`LoweredGraph`:

* placeholders are the runtime tensor inputs, in call order;
* ``get_attr`` nodes are the constants (parameters, buffers, lifted tensor constants, folded
  values); each carries ``meta["kiln_name"]`` (its module path, e.g. ``layer1.0.conv1.weight``,
  the model's state_dict key, which is the name the engines give the weight and the name
  ``kiln.refit`` finds new values by) and ``meta["kiln_weight"]`` (True for an untransformed
  model weight);
* ``gm.meta["kiln_weight_sources"]`` maps each used weight's name to the tensor the program
  holds (for a module, the module's own parameter or buffer): what a compiled model watches
  to follow weights changed in place (kiln.refit.WeightWatch);
* every other node calls an ATen overload (or ``operator.getitem``) and carries
  ``meta["val"]``, a FakeTensor (or a tuple of them) with the exact dtype and static shape.

The graph comes from torch.export (non-strict tracing with functionalization and FakeTensor
propagation, i.e. AOTAutograd's inference export) followed by ``run_decompositions`` with
Kiln's table: PyTorch's Core ATen decompositions, minus the overloads the C++ importers take
whole (so ``aten.linear`` or attention stay one node when Kiln has an importer for them),
plus PyTorch's decomposition of any op left that the importers do not take, where that
decomposition only uses ops they do take. Clean-ups then
remove asserts, detach/alias copies, fold computations on constants and drop dead code.
Computations on model weights are folded here only with ``fold_weights=True`` (immutable
weights): otherwise they are left to the engine builder, whose folding is recorded so that a
refit derives them again from new weights (a value folded here would keep the old weights).
Lowering is inference-only: it traces under ``torch.no_grad()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from kiln import training_ops
from kiln._logging import get_logger
from kiln.outputs import OutputTemplate, export_flat, output_hint, unregistered_output

log = get_logger("lowering")

__all__ = ["LoweredGraph", "export_module", "lower_module", "lower_exported_program", "resolve_op",
           "decomposition_table", "cleanup", "attr_name", "fetch_attr", "ASSERT_SCALAR"]

_IDENTITY_OPS = ("aten.detach.default", "aten.alias.default", "aten.lift_fresh.default",
                 "aten.lift_fresh_copy.default", "aten.clone.default")


@dataclasses.dataclass
class LoweredGraph:
    """A Core ATen graph ready for partitioning (see the module docstring for its form)."""

    gm: fx.GraphModule
    in_spec: pytree.TreeSpec | None   # how (args, kwargs) flatten to the placeholders
    out_spec: pytree.TreeSpec | None  # how the flat outputs nest
    # Rebuilds the module's output from the outputs nested by out_spec, when it holds objects
    # torch.export cannot trace (kiln.outputs); None when out_spec says it all.
    out_template: OutputTemplate | None = None
    # torch.export's range of each symbolic size (symbol -> ValueRanges); empty for static shapes.
    range_constraints: dict[Any, Any] = dataclasses.field(default_factory=dict)


def resolve_op(name: str) -> torch._ops.OpOverload | torch._ops.OpOverloadPacket | None:
    """"aten.add.Tensor" -> torch.ops.aten.add.Tensor (None when PyTorch has no such op)."""
    parts = name.split(".")
    try:
        obj: Any = getattr(torch.ops, parts[0])
        for part in parts[1:]:
            obj = getattr(obj, part)
    except (AttributeError, RuntimeError):
        return None
    return obj if isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) else None


def _core_table() -> dict[Any, Callable[..., Any]]:
    try:
        from torch.export import default_decompositions  # torch >= 2.6
        return default_decompositions()  # type: ignore[return-value]
    except ImportError:  # pragma: no cover - older torch
        from torch._decomp import core_aten_decompositions
        return dict(core_aten_decompositions())


def decomposition_table(keep: Iterable[str]) -> dict[Any, Callable[..., Any]]:
    """Core ATen decompositions minus the overloads in ``keep`` (those stay whole); where the
    importers take matmul whole, einsum becomes matmul (:func:`einsum_as_matmul`)."""
    keep = set(keep)
    table = _core_table()
    for name in keep:
        op = resolve_op(name)
        if isinstance(op, torch._ops.OpOverload) and op in table:
            del table[op]
    if "aten.matmul.default" in keep:
        table[torch.ops.aten.einsum.default] = einsum_as_matmul
    return table


def einsum_as_matmul(equation: str, operands: Sequence[torch.Tensor], path: Any = None) -> torch.Tensor:
    """A two-operand einsum that is a batched matrix product, as permutes, reshapes and one
    matmul that keeps the batch dims apart: ``"bhid,bhjd->bhij"`` is ``q @ k.transpose(-1, -2)``
    on the 4-D tensors. PyTorch's own decomposition flattens the batch dims into a bmm between
    permutes of 5-D or 6-D views, which hides attention from form_attention. Any other equation
    (one or three operands, ``...``, a repeated letter, a letter summed within one operand)
    takes PyTorch's decomposition."""
    def fallback() -> Any:
        return NotImplemented  # PyTorch's decomposition
    eq = equation.replace(" ", "")
    if len(operands) != 2 or "..." in eq or "->" not in eq:
        return fallback()
    ins, out = eq.split("->")
    parts = ins.split(",")
    if len(parts) != 2:
        return fallback()
    sa, sb = parts
    a, b = operands
    if (len(set(sa)) != len(sa) or len(set(sb)) != len(sb) or len(set(out)) != len(out)
            or len(sa) != a.dim() or len(sb) != b.dim() or set(out) - set(sa) - set(sb)):
        return fallback()
    batch = [c for c in out if c in sa and c in sb]
    m = [c for c in sa if c in out and c not in sb]
    n = [c for c in sb if c in out and c not in sa]
    k = [c for c in sa if c in sb and c not in out]
    if len(batch) + len(m) + len(k) != len(sa) or len(batch) + len(n) + len(k) != len(sb):
        return fallback()  # a letter summed within one operand
    size = {**{c: a.shape[i] for i, c in enumerate(sa)}, **{c: b.shape[i] for i, c in enumerate(sb)}}

    def arrange(x: torch.Tensor, have: str, order: list[str], rows: list[str], cols: list[str]) -> torch.Tensor:
        perm = [have.index(c) for c in order + rows + cols]
        if perm != list(range(len(perm))):
            x = torch.ops.aten.permute.default(x, perm)
        if len(rows) != 1 or len(cols) != 1:  # several letters (or none) per matrix dim: one dim each
            lead = [x.shape[i] for i in range(len(order))]
            x = torch.ops.aten.reshape.default(x, lead + [_product(x.shape[len(order):len(order) + len(rows)]),
                                                          _product(x.shape[len(order) + len(rows):])])
        return x
    y = torch.ops.aten.matmul.default(arrange(a, sa, batch, m, k), arrange(b, sb, batch, k, n))
    if len(m) != 1 or len(n) != 1:
        y = torch.ops.aten.reshape.default(y, list(y.shape[:len(batch)]) + [size[c] for c in m + n])
    have = batch + m + n
    perm = [have.index(c) for c in out]
    return torch.ops.aten.permute.default(y, perm) if perm != list(range(len(perm))) else y


def _product(sizes: Iterable[Any]) -> Any:
    total: Any = 1
    for s in sizes:
        total = total * s
    return total


def _extra_decompositions(gm: fx.GraphModule, keep: set[str]) -> dict[Any, Callable[..., Any]]:
    """PyTorch decompositions of ops left in the graph that the importers do not take, where
    the decomposition only produces ops they do take (else the op is better left whole)."""
    from torch._decomp import decomposition_table as registry
    extra: dict[Any, Callable[..., Any]] = {}
    rejected: set[Any] = set()
    for node in gm.graph.nodes:
        op = node.target
        if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
            continue
        if str(op) in keep or op not in registry or op in extra or op in rejected:
            continue
        if _decomposes_into(node, registry[op], keep):
            extra[op] = registry[op]
        else:
            rejected.add(op)
    return extra


def _decomposes_into(node: fx.Node, decomp: Callable[..., Any], keep: set[str]) -> bool:
    """Traces ``decomp`` on meta tensors shaped like the node's inputs; True when every op it
    calls is in ``keep``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def meta(n: fx.Node) -> Any:
        v = n.meta.get("val")
        if not isinstance(v, torch.Tensor):
            raise TypeError("non-tensor input")
        # A symbolic size is traced at its example value: a decomposition whose ops depend on the
        # sizes (a branch on numel == 0, say) is judged at the example's sizes.
        return torch.empty_strided([_hint(s) for s in v.shape], [_hint(s) for s in v.stride()], dtype=v.dtype,
                                   device="meta")

    try:
        args, kwargs = pytree.tree_map_only(fx.Node, meta, (node.args, node.kwargs))
        flat, spec = pytree.tree_flatten((args, kwargs))
        positions = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]

        def call(*tensors: torch.Tensor) -> Any:
            values = list(flat)
            for i, t in zip(positions, tensors):
                values[i] = t
            a, k = pytree.tree_unflatten(values, spec)
            return decomp(*a, **k)
        traced = make_fx(call, decomposition_table=decomposition_table(keep))(*[flat[i] for i in positions])
    except Exception:  # noqa: BLE001 - any failure means: leave the op whole
        return False
    return all(str(n.target) in keep for n in traced.graph.nodes if n.op == "call_function" and not is_getitem(n))


def _hint(size: Any) -> int:
    """The example value of a size (a SymInt's hint)."""
    if isinstance(size, torch.SymInt):
        hint = size.node.hint
        if hint is None:
            raise ValueError(f"the size {size} has no example value")
        return int(hint)
    return int(size)


def _decompose(ep: torch.export.ExportedProgram, keep: set[str]) -> torch.export.ExportedProgram:
    ep = ep.run_decompositions(decomposition_table(keep))
    if keep:  # only worth a second pass when the importers' coverage is known
        extra = _extra_decompositions(ep.graph_module, keep)
        if extra:
            log.debug("decomposing further: %s", sorted(str(k) for k in extra))
            ep = ep.run_decompositions(extra)
    return ep


def lower_exported_program(ep: torch.export.ExportedProgram, keep: Iterable[str] = (),
                           names: dict[str, str] | None = None, fold_weights: bool = False) -> LoweredGraph:
    """Decomposes an ExportedProgram and turns its lifted parameters into constants.

    ``names`` renames constants (export's FQN -> the name weights should carry in engines).
    ``fold_weights`` lets the clean-up fold computations on weights (see the module docstring).
    """
    keep = set(keep)
    # Where every op is one the importers take or a known composite, the graph is rewritten
    # without tracing it again (kiln/training_ops.py).
    why = training_ops.rewritable(ep.graph, keep) if keep else "no importer coverage given"
    direct = why is None
    if not direct:
        log.debug("decomposing the exported program (%s)", why)
        with torch.no_grad():
            ep = _decompose(ep, keep)
    sig = ep.graph_signature
    if sig.buffers_to_mutate or getattr(sig, "user_inputs_to_mutate", None):
        raise NotImplementedError("the program mutates its inputs or buffers in place "
                                  "(Kiln compiles pure inference graphs)")
    gm = _constants_to_attrs(ep, names or {})
    if direct:
        with torch.no_grad():
            training_ops.lower_in_place(gm)
    from kiln.control_flow import prepare_subgraphs  # it builds on this module
    prepare_subgraphs(gm, fold_weights)
    cleanup(gm, fold_weights)
    return LoweredGraph(gm, ep.call_spec.in_spec, ep.call_spec.out_spec,
                        range_constraints=dict(ep.range_constraints))


def lower_module(module: torch.nn.Module, args: Sequence[Any], kwargs: dict[str, Any] | None = None,
                 keep: Iterable[str] = (), names: dict[str, str] | None = None,
                 fold_weights: bool = False, dynamic_shapes: Any = None) -> LoweredGraph:
    """torch.export (non-strict) the module on example inputs (with torch.export's
    ``dynamic_shapes``, if given), then lower the program."""
    ep, template = export_module(module, args, kwargs, dynamic_shapes)
    lowered = lower_exported_program(ep, keep, names, fold_weights)
    lowered.out_template = template
    return lowered


def export_module(module: torch.nn.Module, args: Sequence[Any], kwargs: dict[str, Any] | None = None,
                  dynamic_shapes: Any = None) -> tuple[torch.export.ExportedProgram, OutputTemplate | None]:
    """torch.export (non-strict) of the module on example inputs, for inference; with
    ``dynamic_shapes`` (torch.export's), the sizes they name stay symbolic (kiln.dynamic).

    An output that torch.export cannot flatten (an object of a type that is not a registered
    pytree) is flattened by Kiln instead (kiln.outputs); the template returned then rebuilds it.
    A branch on tensor values that torch.export cannot trace is specialized to the branch the
    example inputs take (export_specialized)."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    with torch.no_grad(), _inference_mode_off(), _no_stack_traces():
        try:
            if dynamic_shapes is not None:
                from kiln.dynamic import export_dynamic  # it builds on this module
                return export_dynamic(module, tuple(args), kwargs or {}, dynamic_shapes), None
            return torch.export.export(module, tuple(args), kwargs or {}, strict=False), None
        except GuardOnDataDependentSymNode as err:
            if dynamic_shapes is not None:
                raise
            return export_specialized(module, tuple(args), kwargs or {}, err), None
        except RuntimeError as err:
            kind = unregistered_output(err)
            if kind is None or dynamic_shapes is not None:
                if kind is not None:
                    raise TypeError(f"kiln.compile: the module returns a {kind}, which torch.export cannot trace as "
                                    f"an output; with dynamic shapes Kiln does not flatten it itself: "
                                    f"{output_hint(kind)}") from None
                raise
            log.info("the module's output holds a %s, which is not a registered pytree: tracing again with "
                     "Kiln flattening the output", kind)
            try:
                return export_flat(module, tuple(args), kwargs or {})
            except TypeError as why:
                raise TypeError(f"kiln.compile: the module returns a {kind}, which torch.export cannot trace as an "
                                f"output and Kiln cannot take apart: {why}; {output_hint(kind)}") from None


def export_specialized(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                       err: Exception) -> torch.export.ExportedProgram:
    """torch.export of a module whose Python branches on a tensor's value (BART's
    ``if not torch.isfinite(h).all(): h = h.clamp(...)`` in FP16), which plain export refuses:
    torch.export's draft mode runs the example inputs for real, takes the branch they take, and
    records the condition as an assert (which lowering drops: an engine cannot raise). The
    program then computes that branch for every input; each specialized condition is logged as
    a warning naming its source line. Any other problem draft mode reports re-raises ``err``."""
    try:
        from torch.export._draft_export import FailureType
    except ImportError:  # a torch without draft mode
        raise err from None
    quiet = [logging.getLogger(n) for n in ("torch.export._draft_export", "torch.fx.experimental.symbolic_shapes")]
    levels = [q.level for q in quiet]
    try:
        for q in quiet:  # draft mode logs each real-tensor decision and a report of its own
            q.setLevel(logging.ERROR)
        ep = torch.export.draft_export(module, args, kwargs)
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
    report = getattr(ep, "_report", None)
    failures = [f for f in getattr(report, "failures", []) if not f.xfail]
    if not failures or any(f.failure_type != FailureType.DATA_DEPENDENT_ERROR for f in failures):
        raise err
    # The report names a frame's file by an id of torch's process-wide intern table, whose files
    # interned before this export the report's own table lacks.
    from torch._logging import structured
    files = {i: name for name, i in getattr(structured, "INTERN_TABLE", {}).items()}
    files.update(getattr(report, "str_to_filename", {}))
    for f in failures:
        frame = (f.data.get("user_stack") or [{}])[-1]
        where = f"{files.get(frame.get('filename'), '?')}:{frame.get('line', '?')}"
        log.warning("kiln.compile: the module branches on tensor values at %s (`%s`), which torch.export cannot "
                    "trace; the program takes the branch the example inputs took (%s was %s) for every input",
                    where, frame.get("loc", "?"), f.data.get("expr", "?"), f.data.get("result", "?"))
    return ep


@contextlib.contextmanager
def _no_stack_traces() -> Iterator[None]:
    """FX records no stack trace per traced node meanwhile (torch.fx.config, where this torch has
    the setting): nothing in Kiln reads them, and capturing them is a good part of a symbolic
    export's time. The setting is global while it lasts."""
    config = torch.fx.config
    before = getattr(config, "do_not_emit_stack_traces", None)
    if before is None:
        yield
        return
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = before


@contextlib.contextmanager
def _inference_mode_off() -> Any:
    # Export refuses to trace under inference mode; the example tensors may still be
    # inference tensors, which tracing only reads.
    if torch.is_inference_mode_enabled():
        with torch.inference_mode(False):
            yield
    else:
        yield


def fetch_attr(module: torch.nn.Module, target: str) -> Any:
    """The attribute a get_attr or call_module node names ("a.b.c")."""
    obj: Any = module
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def attr_name(fqn: str, taken: set[str]) -> str:
    """A fresh attribute name for the constant or subgraph ``fqn`` (recorded in ``taken``)."""
    base = "_k_" + re.sub(r"[^0-9a-zA-Z_]", "_", fqn)
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def _constants_to_attrs(ep: torch.export.ExportedProgram, names: dict[str, str]) -> fx.GraphModule:
    """Placeholders of parameters/buffers/constants -> get_attr nodes on a fresh root (which
    takes the program's own attributes: the subgraphs of higher-order ops such as torch.cond)."""
    from torch.export.graph_signature import InputKind
    graph = fx.Graph()
    graph.output(graph.graph_copy(ep.graph, {}))
    specs = ep.graph_signature.input_specs
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    assert len(specs) == len(placeholders), "export signature and graph disagree"
    attrs = {n.target: fetch_attr(ep.graph_module, str(n.target)) for n in graph.nodes
             if n.op in ("get_attr", "call_module")}
    gm = fx.GraphModule(attrs, graph, class_name="KilnLoweredGraph")
    taken: set[str] = set()
    sources: dict[str, torch.Tensor] = {}
    for spec, node in zip(specs, placeholders):
        if spec.kind == InputKind.USER_INPUT:
            continue
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            raise NotImplementedError(f"input {node.name} of kind {spec.kind.name} is not supported")
        target = spec.target
        tensor = ep.state_dict[target] if target in ep.state_dict else ep.constants[target]
        attr = attr_name(target, taken)
        gm.register_buffer(attr, tensor.detach())
        with graph.inserting_before(node):
            new = graph.get_attr(attr)
        new.meta.update(node.meta)
        new.meta["kiln_name"] = names.get(target, target)
        new.meta["kiln_fqn"] = target  # the exported module's attribute it came from
        new.meta["kiln_weight"] = spec.kind != InputKind.CONSTANT_TENSOR
        if new.meta["kiln_weight"] and node.users:
            sources[new.meta["kiln_name"]] = tensor
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    gm.meta["kiln_weight_sources"] = sources
    gm.recompile()
    return gm


# ---- clean-ups ----------------------------------------------------------------------------

ASSERT_SCALAR = torch.ops.aten._assert_scalar.default


def _checks_input_sizes(node: fx.Node) -> bool:
    """An ``_assert_scalar`` on the inputs' symbolic sizes (a guard torch.export could not prove, a
    ``torch._check`` on a size): it stays and runs with the program's size arithmetic, so that a
    size failing it raises. Asserts on values read from tensors (``.item()``) go, as other asserts."""
    from torch.fx.experimental.symbolic_shapes import free_symbols, free_unbacked_symbols
    cond = node.args[0] if node.target is ASSERT_SCALAR and node.args else None
    val = cond.meta.get("val") if isinstance(cond, fx.Node) else None
    return isinstance(val, torch.SymBool) and bool(free_symbols(val)) and not free_unbacked_symbols(val)


def cleanup(gm: fx.GraphModule, fold_weights: bool = False) -> None:
    """Removes asserts (but those on input sizes) and identity copies, folds constant computations
    (on model weights only with ``fold_weights``), drops dead code."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        schema = node.target._schema
        writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        if not schema.returns and not writes and not node.users and not _checks_input_sizes(node):
            graph.erase_node(node)  # _assert_tensor_metadata, _assert_async, ...
        elif str(node.target) in _IDENTITY_OPS and _removable_copy(node):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    _fold_constants(gm, fold_weights)
    drop_unused(gm)
    graph.lint()
    gm.recompile()


def drop_unused(gm: fx.GraphModule) -> None:
    """Removes dead nodes, then the buffers that no get_attr reads any more."""
    gm.graph.eliminate_dead_code()
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for name, _ in list(gm.named_buffers(recurse=False)):
        if name not in used:
            delattr(gm, name)


def _removable_copy(node: fx.Node) -> bool:
    src = node.args[0]
    if not isinstance(src, fx.Node) or any(k != "memory_format" for k in node.kwargs):
        return False
    # A clone that makes a strided value dense stays: a view after it needs that layout where it
    # runs in PyTorch (engines read every value dense, so it costs nothing inside one).
    val = src.meta.get("val")
    if node.target is torch.ops.aten.clone.default and isinstance(val, torch.Tensor) and not val.is_contiguous():
        return False
    # A copy of an input or constant that reaches the output keeps outputs from aliasing inputs.
    if src.op in ("placeholder", "get_attr"):
        return not any(u.op == "output" for u in node.users)
    return True


def _is_foldable(node: fx.Node, fold_weights: bool) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in node.target.tags:
        return False
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return False
    inputs = node.all_input_nodes
    if not inputs or any(n.op != "get_attr" for n in inputs):
        return False
    if not fold_weights and any(n.meta.get("kiln_weight", False) for n in inputs):
        return False  # the engine builder folds it, recorded for refit
    # Never materialize a broadcast: folding must not grow the constants.
    in_numel = sum(n.meta["val"].numel() for n in inputs if isinstance(n.meta.get("val"), torch.Tensor))
    return val.numel() <= in_numel


def _fold_constants(gm: fx.GraphModule, fold_weights: bool) -> None:
    graph = gm.graph
    taken = {name for name, _ in gm.named_buffers()}
    for node in list(graph.nodes):
        if not _is_foldable(node, fold_weights):
            continue
        args, kwargs = pytree.tree_map_only(fx.Node, lambda n: getattr(gm, n.target), (node.args, node.kwargs))
        with torch.no_grad():
            value = node.target(*args, **kwargs)
        srcs = node.all_input_nodes
        label = "+".join(s.meta.get("kiln_name", str(s.target)) for s in srcs)
        fqn = f"{label}:{node.target._opname}"
        attr = attr_name(fqn, taken)
        gm.register_buffer(attr, value.detach())
        with graph.inserting_before(node):
            new = graph.get_attr(attr)
        new.meta.update(node.meta)
        new.meta["kiln_name"] = fqn
        new.meta["kiln_weight"] = False
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        for src in srcs:
            if not src.users:
                graph.erase_node(src)


def is_getitem(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem
