"""Control flow: ``torch.cond`` branches compiled as graphs of their own, subgraph calls inlined.

A lowered graph (kiln.lowering) may call higher-order ops (HOPs) whose arguments name subgraphs,
GraphModules held as attributes of the graph module:

* ``higher_order.invoke_subgraph`` (``torch.compiler.nested_compile_region``) is a plain call of
  its subgraph; :func:`prepare_subgraphs` inlines it, so that its ops join the engines of the
  graph around it (the region exists to save compile time, which an engine build does not
  share between call sites with different weights anyway).
* ``higher_order.cond`` stays in the graph (as a call of :func:`call_cond`, so that the graph
  pickles): PyTorch evaluates the predicate and runs the branch it picks.
  :func:`prepare_subgraphs` gives each cond its own copies of its branches, with the
  operands that are constants (weights) moved into the branches as their own constants, so
  that the engines built from a branch hold its weights like any block; then
  :func:`compile_subgraphs`, called by the pipeline on every graph it compiles, compiles each
  branch through that same pipeline (recursively: a cond inside a branch is handled the same
  way). A branch whose blocks cannot be built runs in PyTorch, block by block, with the
  pipeline's usual warning.

Any other HOP (``while_loop``, ``scan``, ``map``, ...) runs in PyTorch whole, its subgraphs
as lowered; the partition report names it.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from kiln._logging import get_logger
from kiln.lowering import LoweredGraph, attr_name, cleanup, fetch_attr

log = get_logger("control_flow")

__all__ = ["is_higher_order", "is_cond", "call_cond", "CondTracer", "prepare_subgraphs", "compile_subgraphs",
           "add_subgraph_summaries", "higher_order_reason", "export_form"]


def is_higher_order(node: fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator)


def call_cond(pred: Any, true_fn: Any, false_fn: Any, operands: Any) -> Any:
    """``torch.ops.higher_order.cond``, as a lowered graph calls it: a function that FX's symbolic
    tracing keeps whole (:class:`CondTracer`). Unpickling a GraphModule traces its code again,
    and cond itself refuses that tracer's proxies, so a graph calling it would not pickle."""
    return torch.ops.higher_order.cond(pred, true_fn, false_fn, operands)


class CondTracer(fx.Tracer):
    """The tracer a graph that calls :func:`call_cond` is unpickled with (its ``_tracer_cls``)."""

    def __init__(self, autowrap_modules: tuple[Any, ...] = (math,),
                 autowrap_functions: tuple[Callable[..., Any], ...] = ()) -> None:
        super().__init__(autowrap_modules, (*autowrap_functions, call_cond))


def is_cond(node: fx.Node) -> bool:
    return node.op == "call_function" and (node.target is call_cond or node.target is torch.ops.higher_order.cond) \
        and len(node.args) == 4 and not node.kwargs \
        and all(isinstance(a, fx.Node) and a.op == "get_attr" for a in node.args[1:3]) \
        and isinstance(node.args[3], (tuple, list))


def _is_invoke_subgraph(node: fx.Node) -> bool:
    hop = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    return is_higher_order(node) and hop is not None and node.target is hop and not node.kwargs \
        and len(node.args) >= 2 and isinstance(node.args[0], fx.Node) and node.args[0].op == "get_attr"


def higher_order_reason(node: fx.Node) -> str:
    """Why a HOP node runs in PyTorch (the partition report's text)."""
    if is_cond(node):
        return "control flow: PyTorch picks the branch; each branch is compiled as a graph of its own"
    return f"higher-order op {node.target.name()} runs in PyTorch with its subgraphs"  # type: ignore[union-attr]


def _copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A new GraphModule over a copy of ``gm``'s graph (nodes and meta), sharing its attributes."""
    graph = fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    attrs = {n.target: fetch_attr(gm, str(n.target)) for n in graph.nodes if n.op in ("get_attr", "call_module")}
    return fx.GraphModule(attrs, graph, class_name="KilnSubgraph")


def _set_attr(gm: fx.GraphModule, base: str, value: Any) -> str:
    """Registers ``value`` on ``gm`` under a fresh name derived from ``base``."""
    taken = set(gm._modules) | set(gm._buffers) | set(gm._parameters) | set(dir(gm))
    name = attr_name(base, taken)
    if isinstance(value, torch.nn.Module):
        gm.add_submodule(name, value)
    elif isinstance(value, torch.Tensor):
        gm.register_buffer(name, value)
    else:
        setattr(gm, name, value)
    return name


# ---- lowering: inline subgraph calls, move constants into branches ---------------------------

def _inline_call(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Replaces one invoke_subgraph call by the subgraph's nodes; False when its results are used
    other than by indexing (it then runs in PyTorch)."""
    if any(u.target is not operator.getitem or not isinstance(u.args[1], int) for u in node.users):
        return False
    sub = fetch_attr(gm, str(node.args[0].target))  # type: ignore[union-attr]
    if not isinstance(sub, fx.GraphModule):
        return False
    operands = list(node.args[2:])
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(operands):
        return False
    env: dict[fx.Node, Any] = dict(zip(placeholders, operands))
    results: Any = ()
    with gm.graph.inserting_before(node):
        for n in sub.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                results = n.args[0]
                break
            if n.op == "get_attr":
                new = gm.graph.get_attr(_set_attr(gm, str(n.target), fetch_attr(sub, str(n.target))))
                new.meta.update(n.meta)
            else:
                new = gm.graph.node_copy(n, lambda a: env[a])
            env[n] = new
    flat = [env[r] if isinstance(r, fx.Node) else r for r in results] \
        if isinstance(results, (tuple, list)) else [env[results]]
    for user in list(node.users):
        user.replace_all_uses_with(flat[user.args[1]])
        gm.graph.erase_node(user)
    gm.graph.erase_node(node)
    return True


def _inline_subgraph_calls(gm: fx.GraphModule) -> None:
    progress = True
    while progress:  # an inlined subgraph may call another
        progress = False
        for node in list(gm.graph.nodes):
            if _is_invoke_subgraph(node) and _inline_call(gm, node):
                progress = True


def _branch(gm: fx.GraphModule, attr: fx.Node, operands: list[Any], constants: list[int],
            fold_weights: bool) -> fx.GraphModule | None:
    """A copy of a cond branch whose constant operands (positions ``constants``) are its own
    constants, prepared like a lowered graph; None when its inputs do not match the operands."""
    source = fetch_attr(gm, str(attr.target))
    if not isinstance(source, fx.GraphModule):
        return None
    branch = _copy_graph_module(source)
    placeholders = [n for n in branch.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(operands):
        return None
    for i in constants:
        outer, node = operands[i], placeholders[i]
        name = _set_attr(branch, str(outer.meta.get("kiln_name", outer.target)), fetch_attr(gm, str(outer.target)))
        with branch.graph.inserting_before(node):
            new = branch.graph.get_attr(name)
        new.meta.update(outer.meta)
        node.replace_all_uses_with(new)
        branch.graph.erase_node(node)
    prepare_subgraphs(branch, fold_weights)
    cleanup(branch, fold_weights)
    return branch


def _prepare_cond(gm: fx.GraphModule, node: fx.Node, fold_weights: bool) -> None:
    node.target = call_cond
    gm._tracer_cls = CondTracer
    operands = list(node.args[3])  # type: ignore[arg-type]
    constants = [i for i, o in enumerate(operands) if isinstance(o, fx.Node) and o.op == "get_attr"
                 and isinstance(o.meta.get("val"), torch.Tensor)]
    branches = [_branch(gm, node.args[k], operands, constants, fold_weights) for k in (1, 2)]  # type: ignore[arg-type]
    if any(b is None for b in branches):
        log.debug("%s: branch inputs do not match its operands; its branches stay as lowered", node.name)
        return
    for k, (which, branch) in enumerate(zip(("true", "false"), branches), start=1):
        with gm.graph.inserting_before(node):
            new = gm.graph.get_attr(_set_attr(gm, f"{node.name}_{which}", branch))
        node.update_arg(k, new)
    kept = [o for i, o in enumerate(operands) if i not in constants]
    node.update_arg(3, type(node.args[3])(kept))  # type: ignore[arg-type]


def prepare_subgraphs(gm: fx.GraphModule, fold_weights: bool = False) -> None:
    """Inlines subgraph calls and gives each cond its own branches (see the module docstring).
    The caller cleans ``gm`` up afterwards (the branch attributes replaced become dead)."""
    _inline_subgraph_calls(gm)
    for node in list(gm.graph.nodes):
        if is_cond(node):
            _prepare_cond(gm, node, fold_weights)
    gm.graph.eliminate_dead_code()
    used = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for name, sub in list(gm.named_children()):
        if isinstance(sub, fx.GraphModule) and name not in used:
            delattr(gm, name)
    gm.recompile()


# ---- compiling the branches ------------------------------------------------------------------

CompileGraph = Callable[[LoweredGraph, str], fx.GraphModule]


def compile_subgraphs(gm: fx.GraphModule, compile_graph: CompileGraph) -> list[Any]:
    """Compiles each cond branch of ``gm`` in place with ``compile_graph(lowered, name)`` (the
    pipeline's compile_lowered). Returns the branches' CompileSummary objects."""
    summaries = []
    for node in gm.graph.nodes:
        if not is_cond(node):
            continue
        for which, attr in (("true", node.args[1]), ("false", node.args[2])):
            target = str(attr.target)  # type: ignore[union-attr]
            branch = fetch_attr(gm, target)
            if not isinstance(branch, fx.GraphModule) or "kiln_summary" in branch.meta:
                continue  # compiled already (one branch module named by two conds)
            compiled = compile_graph(LoweredGraph(branch, None, None), f"{node.name}.{which}")
            if compiled is not branch:
                setattr(gm, target, compiled)
            summary = compiled.meta.get("kiln_summary")
            if summary is not None:
                summaries.append(summary)
    return summaries


def add_subgraph_summaries(summary: Any, inner: list[Any]) -> Any:
    """Counts the branches' engines and ops as the graph's own (a CompileSummary, changed in place)."""
    for s in inner:
        summary.engines += s.engines
        summary.ops_in_engines.update(s.ops_in_engines)
        summary.ops_in_pytorch.update(s.ops_in_pytorch)
    return summary


# ---- saving: branches that read no tensor of their own ---------------------------------------
# torch.export bakes a tensor that a cond branch reads from its module (a constant, an engine's
# bytes) into the branch as a constant, which it cannot serialize. For kiln.save the compiled
# graph takes an export form where every such tensor is an operand of the cond and each engine
# in a branch is a kiln::execute_engine call on its bytes.

def _placeholder(graph: fx.Graph, name: str, after: fx.Node | None) -> fx.Node:
    """A new placeholder right after ``after`` (first in the graph when None)."""
    place = graph.inserting_after(after) if after is not None else graph.inserting_before(next(iter(graph.nodes)))
    with place:
        return graph.placeholder(name)


def _append_placeholder(graph: fx.Graph, name: str) -> fx.Node:
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    return _placeholder(graph, name, placeholders[-1] if placeholders else None)


def _explicit(gm: fx.GraphModule, lift: bool) -> tuple[fx.GraphModule, list[torch.Tensor]]:
    """The export form of ``gm`` and, with ``lift``, the tensors it now takes as trailing inputs
    (without ``lift``, the tensors its conds pass on are attributes of the result)."""
    from kiln.runtime import KilnEngineModule
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    attrs: dict[str, Any] = {str(n.target): fetch_attr(gm, str(n.target)) for n in graph.nodes
                             if n.op in ("get_attr", "call_module")}
    tensors: list[torch.Tensor] = []

    def source(tensor: torch.Tensor, user: fx.Node, hint: str) -> fx.Node:
        if lift:
            tensors.append(tensor)
            return _append_placeholder(graph, f"{hint}_{len(tensors)}")
        name = attr_name(hint, set(attrs))
        attrs[name] = tensor
        with graph.inserting_before(user):
            return graph.get_attr(name)

    for node in list(graph.nodes):
        value = attrs.get(str(node.target)) if node.op in ("get_attr", "call_module") else None
        if lift and node.op == "get_attr" and isinstance(value, torch.Tensor):
            node.replace_all_uses_with(source(value, node, "constant"))
            graph.erase_node(node)
        elif lift and node.op == "call_module" and isinstance(value, KilnEngineModule):
            blob = source(value.engine_blob, node, "engine")
            with graph.inserting_before(node):
                call = graph.call_function(torch.ops.kiln.execute_engine.default, (list(node.args), blob, value.spec))
            node.replace_all_uses_with(call)
            graph.erase_node(node)
        elif is_cond(node):
            parts = [_explicit(fetch_attr(gm, str(node.args[k].target)), True) for k in (1, 2)]  # type: ignore[union-attr]
            (true_gm, true_t), (false_gm, false_t) = parts
            for i in range(len(false_t)):  # both take the operands, then true's tensors, then false's
                _append_placeholder(true_gm.graph, f"unused_{i}")
            n_operands = len(node.args[3])  # type: ignore[arg-type]
            anchor = [n for n in false_gm.graph.nodes if n.op == "placeholder"][n_operands - 1] if n_operands else None
            for i in range(len(true_t)):
                anchor = _placeholder(false_gm.graph, f"unused_{i}", anchor)
            for k, (which, branch) in enumerate(zip(("true", "false"), (true_gm, false_gm)), start=1):
                branch.recompile()
                name = attr_name(f"{node.name}_{which}_export", set(attrs))
                attrs[name] = branch
                with graph.inserting_before(node):
                    node.update_arg(k, graph.get_attr(name))
            extra_nodes = [source(t, node, f"{node.name}_operand") for t in true_t + false_t]
            node.update_arg(3, tuple(node.args[3]) + tuple(extra_nodes))  # type: ignore[arg-type]
    for node in list(graph.nodes):
        if node.op == "get_attr" and not node.users:  # the branches replaced
            graph.erase_node(node)
    used = {str(n.target) for n in graph.nodes if n.op in ("get_attr", "call_module")}
    return fx.GraphModule({k: v for k, v in attrs.items() if k in used}, graph, class_name="KilnExportGraph"), tensors


def export_form(gm: fx.GraphModule) -> fx.GraphModule | None:
    """The graph kiln.save exports in place of ``gm`` (None when it has no cond): the same engines
    and ops, with every tensor a cond branch reads passed to it as an operand. The engines must
    be in exporting mode (KilnEngineModule.set_exporting)."""
    if not any(is_cond(n) for n in gm.graph.nodes):
        return None
    return _explicit(gm, lift=False)[0]
