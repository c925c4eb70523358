"""The compile pipeline after lowering, shared by kiln.compile (aot.py) and the Dynamo backend
(dynamo.py).

:func:`compile_lowered` rewrites the graph into mixed precision when ``enable_autocast`` asks
(kiln/autocast.py), asks the importers, partitions, reports (dry run) or describes and builds
each block, and swaps each built block for a KilnEngineModule. With
``reuse_cached_engines`` / ``cache_built_engines`` a block's engine comes from / goes to the
engine cache (kiln/cached_build.py: a hit is loaded and refitted with the block's weights). A
block whose build fails stays in PyTorch with a warning naming the cause, unless
``pass_through_build_failures`` (or ``require_full_compilation``) asks for the error.
:func:`graph_runner` and :func:`unflattener` turn the result into a fast callable.

Compiled Dynamo graphs register in :data:`LIVE_GRAPHS`, so that refit finds the engines built
from a model without importing the backend.
"""

from __future__ import annotations

import collections
import dataclasses
import operator
import re
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from kiln import _C
from kiln._logging import get_logger
from kiln.autocast import apply_autocast
from kiln.cached_build import CachedBuild, count
from kiln.control_flow import add_subgraph_summaries, compile_subgraphs
from kiln.dryrun import emit_report, format_report
from kiln.lowering import LoweredGraph, drop_unused
from kiln.partition import Block, is_op, op_name, partition, replace_block
from kiln.runtime import KilnEngineModule, borrowable_weights, build_engine, build_policy, warm_up
from kiln.settings import CompilationSettings
from kiln.translate import Capability, EncodeError, SharedConstants, describe_block_parts, kiln_dtype

log = get_logger("compile")

__all__ = ["LIVE_GRAPHS", "CompileSummary", "compile_lowered", "device_of", "graph_runner", "runs_again_alike",
           "supported_targets", "unflattener"]

# The live Dynamo graphs (kiln.dynamo.KilnDynamoGraph), by weak reference.
LIVE_GRAPHS: weakref.WeakSet[Any] = weakref.WeakSet()


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
    """The engine's I/O must be exactly what PyTorch's metadata says, and its policy what the
    settings ask for (else it is not used)."""
    if engine.policy != build_policy(settings):
        raise _C.InternalError(f"engine was built with {engine.policy!r}, the settings ask for "
                               f"{build_policy(settings)!r}")
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


class _NodeFailed(Exception):
    """A block's build failed on one node that the error names: the block is partitioned again
    without it."""

    def __init__(self, node: fx.Node, err: Exception) -> None:
        super().__init__(str(err))
        self.node, self.err = node, err


def _node_named_in(block: Block, err: Exception) -> fx.Node | None:
    """The node of `block` that a build error names ("... (node 'NAME') ..."), if any."""
    found = re.search(r"\(node '([^']+)'\)", str(err))
    if found is None:
        return None
    return next((n for n in block.nodes if n.name == found.group(1)), None)


def build_block(gm: fx.GraphModule, block: Block, settings: CompilationSettings, device: str,
                name: str, split: bool = False, constants: SharedConstants | None = None,
                meanwhile: Callable[[], None] | None = None) -> KilnEngineModule | None:
    """The engine module of one block: from the engine cache (refitted) or freshly built; None
    (with a warning) when it cannot be built. With `split`, a failure on one node that the error
    names raises _NodeFailed instead, for the caller to partition again without that node.
    ``constants``: host copies of constants that other descriptions made or may reuse.
    ``meanwhile``: Python work to run while the engine builds (:func:`build_engine`); it does not
    run when no build starts (an engine cache hit, a description that fails)."""
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
            parts = lite if lite.weight_bytes else describe_block_parts(gm, block, settings, shared=constants)
        else:
            parts = describe_block_parts(gm, block, settings, shared=constants)
        truncated = _truncated(parts.constants)
        shared = borrowable_weights(parts.constants, device) if settings.share_weights else None
        engine = build_engine(parts.graph, settings, device, shared, meanwhile)
        count("builds")
        _check_engine(engine, block, settings)
    except (_C.KilnError, EncodeError) as err:
        if settings.pass_through_build_failures or settings.require_full_compilation:
            count("build_failures")
            raise
        node = _node_named_in(block, err) if split else None
        if split and node is not None and block.num_ops > 1:
            raise _NodeFailed(node, err) from err  # partitioned again: the program is still whole
        count("build_failures")
        ops = ", ".join(f"{k} x{v}" for k, v in block.histogram().most_common())
        msg = f"Kiln could not build {name} ({ops}); running it in PyTorch: {err}"
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        log.warning("%s", msg)
        return None
    log.debug("built %s: %d ops\n%s", name, block.num_ops, engine.build_log)
    if cached is not None and settings.cache_built_engines:
        cached.store(engine)
    return make_module(engine)


def _build_blocks(gm: fx.GraphModule, blocks: Sequence[Block], settings: CompilationSettings, device: str,
                  graph_name: str, modules: dict[tuple[fx.Node, ...], KilnEngineModule | None]
                  ) -> list[tuple[Block, KilnEngineModule]]:
    """Each block with its engine module (blocks that fail to build are left out), taken from
    `modules` where an earlier attempt built the same nodes, else built and added there."""
    built: list[tuple[Block, KilnEngineModule]] = []
    for i, block in enumerate(blocks):
        key = tuple(block.nodes)
        if key not in modules:
            modules[key] = build_block(gm, block, settings, device, f"engine {i} of {graph_name}", split=True)
        module = modules[key]
        if module is not None:
            built.append((block, module))
    return built


def compile_lowered(lowered: LoweredGraph, settings: CompilationSettings, device: str,
                    graph_name: str = "graph") -> fx.GraphModule:
    """Partitions the lowered graph and replaces each buildable block by an engine module."""
    start = time.perf_counter()
    if not settings.builds_nothing:
        warm_up(device)  # overlaps the partitioning (a no-op when kiln.compile started it already)
    gm = lowered.gm
    if settings.enable_autocast:
        apply_autocast(gm, settings)  # explicit casts: the engines are built as the graph is typed
    capability = Capability(gm, settings, device)
    left_out: dict[fx.Node, str] = {}  # nodes whose engine build failed: they stay in PyTorch

    def supports(node: fx.Node) -> tuple[bool, str]:
        return (False, left_out[node]) if node in left_out else capability(node)
    result = partition(gm, supports, settings)
    if settings.builds_nothing or settings.debug:
        emit_report(format_report(result, settings, graph_name), settings)
    inner = compile_subgraphs(gm, lambda sub, name: compile_lowered(sub, settings, device, f"{graph_name}/{name}"))
    if settings.builds_nothing:
        gm.meta["kiln_summary"] = add_subgraph_summaries(
            CompileSummary(graph_name, 0, collections.Counter(), result.pytorch_ops()), inner)
        return gm
    # A block whose build fails on one node it names is partitioned again without that node;
    # blocks that come out the same are not built again.
    modules: dict[tuple[fx.Node, ...], KilnEngineModule | None] = {}
    while True:
        try:
            built = _build_blocks(gm, result.blocks, settings, device, graph_name, modules)
            break
        except _NodeFailed as failed:
            why = f"its engine could not be built: {failed.err}"
            msg = (f"Kiln could not build node '{failed.node.name}' ({op_name(failed.node)}) of {graph_name}; "
                   f"it runs in PyTorch and the rest is built: {failed.err}")
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            log.warning("%s", msg)
            left_out[failed.node] = why
            result = partition(gm, supports, settings)
    remap: dict[fx.Node, fx.Node] = {}
    for i, (block, module) in enumerate(built):
        block.inputs = [remap.get(n, n) for n in block.inputs]
        replace_block(gm, block, f"_kiln_engine_{i}", module, remap)
    drop_unused(gm)
    if not settings.share_weights:
        for attr, buffer in list(gm.named_buffers(recurse=False)):
            gm.register_buffer(attr, buffer.clone())  # a snapshot: the PyTorch parts too
        gm.meta.pop("kiln_weight_sources", None)  # nothing to follow
    gm.recompile()
    in_engines: collections.Counter[str] = collections.Counter()
    for block, _ in built:
        in_engines.update(block.histogram())
    in_pytorch = collections.Counter(op_name(n) for n in gm.graph.nodes if is_op(n))
    seconds = time.perf_counter() - start
    gm.meta["kiln_summary"] = add_subgraph_summaries(
        CompileSummary(graph_name, len(built), in_engines, in_pytorch, seconds), inner)
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
    call on its inputs in order (or a dynamic program's one block on them), that engine's
    forward directly (saves the GraphModule's few microseconds per call; hooks on the engine
    module do not run on this path)."""
    from kiln.dynamic import DynamicBlock, Specializations  # it builds on this module

    nodes = list(gm.graph.nodes)
    placeholders = tuple(n for n in nodes if n.op == "placeholder")
    calls = [n for n in nodes if n.op == "call_module"]
    output = nodes[-1]
    modules = [gm.get_submodule(str(n.target)) for n in calls]
    if len(calls) == 1 and tuple(calls[0].args) == placeholders and isinstance(modules[0], KilnEngineModule):
        forward: Callable[..., Any] = modules[0].forward
        width = len(modules[0].output_names)
    elif len(calls) == 2 and isinstance(modules[0], Specializations) and isinstance(modules[1], DynamicBlock) \
            and tuple(calls[0].args) == placeholders and tuple(calls[1].args) == (calls[0], *placeholders):
        # A dynamic program of one block on its inputs: the specialization's runner for it directly.
        choose, index = modules[0].forward, modules[1].index
        width = len(modules[0].blocks[index].block.outputs)

        def forward(*inputs: Any) -> Any:
            return choose(*inputs).runners[index](*inputs)
    else:
        return gm
    rest = [n for n in nodes if n.op not in ("placeholder", "call_module", "output")]
    results = output.args[0]
    if any(n.kwargs for n in calls) or not isinstance(results, (tuple, list)) or any(
            n.target is not operator.getitem or n.args[0] is not calls[-1] for n in rest) \
            or any(r not in rest for r in results):
        return gm
    order = [r.args[1] for r in results]
    if order == list(range(width)):
        return forward

    def reordered(*inputs: Any) -> tuple[Any, ...]:
        outs = forward(*inputs)
        return tuple(outs[i] for i in order)
    return reordered


# Python functions a graph calls on sizes and tuples (a dynamic program's glue): none writes anything.
_PURE_FUNCTIONS = frozenset({operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv,
                             operator.truediv, operator.mod, operator.neg, operator.pow, operator.eq, operator.ne,
                             operator.lt, operator.le, operator.gt, operator.ge, torch.sym_max, torch.sym_min,
                             torch.sym_not, torch.sym_int, torch.sym_float, torch.sym_sqrt, torch.sym_ite})


def runs_again_alike(gm: fx.GraphModule) -> bool:
    """Whether running ``gm`` a second time gives what one run gives, and leaves what one run
    leaves: it writes none of its inputs or constants (no op with a mutable schema, no module but
    Kiln's engines and dynamic blocks, no higher-order op) and draws no random numbers. A caller may
    then launch it before checking that the weights its engines hold are current, and run it again
    if they are not."""
    from kiln.dynamic import DynamicBlock, Specializations  # it builds on this module

    for node in gm.graph.nodes:
        if node.op == "call_module":
            if not isinstance(gm.get_submodule(str(node.target)), (KilnEngineModule, DynamicBlock, Specializations)):
                return False
        elif node.op == "call_function":
            target = node.target
            if isinstance(target, torch._ops.OpOverload):
                if target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags:
                    return False
            elif target not in _PURE_FUNCTIONS:
                return False
        elif node.op not in ("placeholder", "get_attr", "output"):
            return False
    return True


def device_of(settings: CompilationSettings, tensors: Sequence[Any]) -> str:
    """The device to build for: the 'device' option, which the inputs must be on, else theirs. A
    dry run for a GPU may take inputs on the CPU: it builds nothing, and the backend answers
    without its device (the graph is then the one exported on the CPU)."""
    devices = {t.device for t in tensors if isinstance(t, torch.Tensor)}
    if settings.device is not None:
        if settings.builds_nothing and devices == {torch.device("cpu")} and settings.device != "cpu":
            log.info("dry run for %s on inputs on the CPU: ops that dispatch otherwise on the GPU "
                     "(nn.RMSNorm's fused kernel) show as the CPU exports them", settings.device)
        elif devices and any(str(d if d.index is not None or d.type == "cpu" else torch.device(d.type, 0))
                             != settings.device for d in devices):
            raise ValueError(f"Kiln option 'device' is {settings.device!r}, but the inputs are on "
                             f"{sorted(str(d) for d in devices)}")
        return settings.device
    if len(devices) > 1:
        raise ValueError(f"inputs on several devices ({sorted(str(d) for d in devices)}); set 'device'")
    dev = devices.pop() if devices else torch.device("cpu")
    return "cpu" if dev.type == "cpu" else f"cuda:{dev.index or 0}"
