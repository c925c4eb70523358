"""Partitioning: which nodes of a lowered graph go into engines, and in which blocks.

Input: a lowered Core ATen graph (kiln.lowering) and a capability function that answers, per
node, "can Kiln take this?" with a reason when not (kiln.translate.Capability asks the C++
importers). Output: a :class:`PartitionResult` naming the blocks that become engines and
accounting for every op that stays in PyTorch, which is also what the dry-run report prints.

Rules, in order:
1. an op named in ``torch_executed_ops`` (overload "aten.add.Tensor" or every overload of
   "aten.add") is never put in an engine;
2. the remaining supported nodes are grouped by torch's capability-based partitioner into
   blocks that can each run as one call without creating a cycle;
3. a block with fewer than ``min_block_size`` compute ops stays in PyTorch (a compute op is a
   call of an ATen overload that is not a view; views and getitems ride along for free);
4. with ``require_full_compilation`` every op must end up in a block (``min_block_size`` does
   not apply, there is nowhere to fall back to) or the function raises, naming the ops. A
   ``torch.cond`` is the exception: it stays as PyTorch's choice between its branches, which are
   compiled as graphs of their own (kiln.control_flow), each under the same rule.

Higher-order ops (``torch.cond``, ``while_loop``, ...) never go into an engine; the report
gives them their own reason rather than the importers' answer.

:func:`replace_block` then swaps a block's nodes for one call of a module (the engine).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import operator
from collections.abc import Callable

import torch
import torch.fx as fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from kiln._logging import get_logger
from kiln.control_flow import call_cond, higher_order_reason, is_cond, is_higher_order
from kiln.settings import CompilationSettings

log = get_logger("partition")

__all__ = ["Block", "PartitionResult", "SupportFn", "partition", "replace_block", "op_name",
           "is_op", "is_compute_op"]

SupportFn = Callable[[fx.Node], "tuple[bool, str]"]


def op_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    if target is call_cond:
        return "higher_order.cond"
    return getattr(target, "__qualname__", None) or str(target)


def is_op(node: fx.Node) -> bool:
    """An operation that counts for coverage: any call except a getitem on a tuple."""
    return node.op == "call_function" and node.target is not operator.getitem


def is_compute_op(node: fx.Node) -> bool:
    """An op that does work (not a view of its input)."""
    return is_op(node) and not (isinstance(node.target, torch._ops.OpOverload) and node.target.is_view)


def _excluded(node: fx.Node, ops: frozenset[str]) -> bool:
    if not ops or not isinstance(node.target, torch._ops.OpOverload):
        return False
    name = str(node.target)
    return name in ops or name.rsplit(".", 1)[0] in ops


@dataclasses.dataclass
class Block:
    """A set of nodes that becomes one engine."""

    nodes: list[fx.Node]        # graph order, getitems included
    inputs: list[fx.Node]       # runtime tensors from outside (placeholders or PyTorch-run nodes)
    constants: list[fx.Node]    # get_attr nodes the block reads
    outputs: list[fx.Node]      # nodes whose values are used outside the block

    @property
    def num_ops(self) -> int:
        return sum(1 for n in self.nodes if is_op(n))

    @property
    def num_compute_ops(self) -> int:
        return sum(1 for n in self.nodes if is_compute_op(n))

    def histogram(self) -> collections.Counter[str]:
        return collections.Counter(op_name(n) for n in self.nodes if is_op(n))


@dataclasses.dataclass
class PartitionResult:
    gm: fx.GraphModule
    total_ops: int
    supported_ops: int                                  # the importers take them (excluded or not)
    unsupported: dict[str, tuple[int, list[str]]]       # op -> (count, distinct reasons)
    excluded: collections.Counter[str]                  # op -> count, kept by torch_executed_ops
    blocks: list[Block]                                 # become engines
    small_blocks: list[Block]                           # left in PyTorch by min_block_size

    @property
    def ops_in_engines(self) -> int:
        return sum(b.num_ops for b in self.blocks)

    @property
    def coverage(self) -> float:
        """Percent of ops inside engines."""
        return 100.0 * self.ops_in_engines / self.total_ops if self.total_ops else 100.0

    def pytorch_ops(self) -> collections.Counter[str]:
        """Every op that would run in PyTorch, by name."""
        inside = {n for b in self.blocks for n in b.nodes}
        return collections.Counter(op_name(n) for n in self.gm.graph.nodes if is_op(n) and n not in inside)


class _Support(OperatorSupportBase):
    def __init__(self, ok: set[fx.Node]) -> None:
        self.ok = ok

    def is_node_supported(self, submodules: object, node: fx.Node) -> bool:
        if node.target is operator.getitem:
            return node.args[0] in self.ok  # type: ignore[operator]
        return node in self.ok


def _groups(gm: fx.GraphModule, support: _Support) -> list[set[fx.Node]]:
    """The node sets of the blocks. When every call in the graph is supported, torch's
    partitioner merges them all into one partition (with nothing unsupported between them, no
    merge can make a cycle); that case, the usual one, is answered directly, since the
    partitioner's merging costs most of a warm compile's partition step (BERT-base: 12 of
    17 ms)."""
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    if calls and all(support.is_node_supported({}, n) for n in calls):
        return [set(calls)]
    proposed = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True).propose_partitions()
    return [set(p.nodes) for p in proposed]


def _make_block(nodes: set[fx.Node], order: dict[fx.Node, int]) -> Block:
    ordered = sorted(nodes, key=order.__getitem__)
    inputs: dict[fx.Node, None] = {}
    constants: dict[fx.Node, None] = {}
    outputs: list[fx.Node] = []
    for n in ordered:
        for i in n.all_input_nodes:
            if i in nodes:
                continue
            (constants if i.op == "get_attr" else inputs).setdefault(i, None)
        if isinstance(n.meta.get("val"), (tuple, list)):
            continue  # reached through its getitems
        if any(u not in nodes for u in n.users):
            outputs.append(n)
    return Block(ordered, list(inputs), list(constants), outputs)


def partition(gm: fx.GraphModule, supports: SupportFn, settings: CompilationSettings) -> PartitionResult:
    ops = [n for n in gm.graph.nodes if is_op(n)]
    unsupported: dict[str, tuple[int, list[str]]] = {}
    excluded: collections.Counter[str] = collections.Counter()
    ok: set[fx.Node] = set()
    supported = 0
    for node in ops:
        good, reason = (False, higher_order_reason(node)) if is_higher_order(node) or is_cond(node) \
            else supports(node)
        if not good:
            count, reasons = unsupported.get(op_name(node), (0, []))
            if reason not in reasons:
                reasons.append(reason)
            unsupported[op_name(node)] = (count + 1, reasons)
            continue
        supported += 1
        if _excluded(node, settings.torch_executed_ops):
            excluded[op_name(node)] += 1
        else:
            ok.add(node)

    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    candidates = [_make_block(group, order) for group in _groups(gm, _Support(ok))]
    candidates = [b for b in candidates if b.num_ops > 0]
    candidates.sort(key=lambda b: order[b.nodes[0]])

    if settings.require_full_compilation:
        blocks, small = candidates, []
    else:
        limit = settings.min_block_size
        blocks = [b for b in candidates if b.num_compute_ops >= limit]
        small = [b for b in candidates if b.num_compute_ops < limit]
    result = PartitionResult(gm, len(ops), supported, unsupported, excluded, blocks, small)
    if settings.require_full_compilation:
        _check_full(result)
    log.debug("partitioned %d ops: %d blocks kept, %d too small, coverage %.1f%%", len(ops), len(blocks),
              len(small), result.coverage)
    return result


def _check_full(result: PartitionResult) -> None:
    inside = {n for b in result.blocks for n in b.nodes}
    left = collections.Counter(op_name(n) for n in result.gm.graph.nodes
                               if is_op(n) and n not in inside and not is_cond(n))
    if not left:
        return
    parts = []
    for name, count in sorted(left.items()):
        if name in result.unsupported:
            why = "; ".join(result.unsupported[name][1])
        elif name in result.excluded:
            why = "in torch_executed_ops"
        else:
            why = "not placeable in an engine"
        parts.append(f"{name} x{count} ({why})")
    raise _unsupported_error("require_full_compilation=True, but these ops would run in PyTorch: "
                             + ", ".join(parts))


def _unsupported_error(message: str) -> Exception:
    try:
        from kiln._C import UnsupportedError
        return UnsupportedError(message)
    except ImportError:  # pragma: no cover - bindings not built
        return NotImplementedError(message)


# ---- graph surgery -----------------------------------------------------------------------

def replace_block(gm: fx.GraphModule, block: Block, name: str, module: torch.nn.Module,
                  remap: dict[fx.Node, fx.Node] | None = None) -> fx.Node:
    """Replaces the block's nodes by ``name(*block.inputs)`` returning a tuple of its outputs.

    ``remap`` receives old output node -> new getitem, for blocks replaced later whose inputs
    name this block's outputs.
    """
    graph = gm.graph
    gm.add_submodule(name, module)
    with graph.inserting_before(block.nodes[0]):
        call = graph.call_module(name, tuple(block.inputs))
    call.meta["val"] = tuple(o.meta.get("val") for o in block.outputs)
    for i, out in enumerate(block.outputs):
        with graph.inserting_after(call):
            item = graph.call_function(operator.getitem, (call, i))
        item.meta.update(out.meta)
        out.replace_all_uses_with(item)
        if remap is not None:
            remap[out] = item
    for node in reversed(block.nodes):
        graph.erase_node(node)
    _topological_sort(graph)
    graph.lint()
    gm.recompile()
    return call


def _topological_sort(graph: fx.Graph) -> None:
    """Stable topological order (Kahn's algorithm preferring the current order)."""
    nodes = list(graph.nodes)
    rank = {"placeholder": 0, "output": 2}
    index = {n: (rank.get(n.op, 1), i) for i, n in enumerate(nodes)}
    pending = {n: len(set(n.all_input_nodes)) for n in nodes}
    ready = [(index[n], n) for n in nodes if pending[n] == 0]
    heapq.heapify(ready)
    ordered: list[fx.Node] = []
    while ready:
        _, n = heapq.heappop(ready)
        ordered.append(n)
        for u in n.users:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, (index[u], u))
    assert len(ordered) == len(nodes), "the graph has a cycle"
    cursor = nodes[0]
    if ordered[0] is not cursor:
        cursor.prepend(ordered[0])
    cursor = ordered[0]
    for n in ordered[1:]:
        if cursor.next is not n:
            cursor.append(n)
        cursor = n
