"""Partitioning rules with a fake capability function (no C++ importer involved).

Each graph is lowered for real (torch.export + Core ATen decompositions); the capability
function says which overloads are "supported". Blocks are then swapped for modules that run
the block's own nodes, so the rewritten graph must still compute what eager PyTorch does.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.fx as fx
import torch.nn as nn

from kiln.dryrun import format_report
from kiln.lowering import LoweredGraph, lower_module
from kiln.partition import Block, PartitionResult, is_compute_op, partition, replace_block
from kiln.settings import CompilationSettings


def _lower(fn: nn.Module, *args: torch.Tensor) -> LoweredGraph:
    return lower_module(fn, list(args))


def _supports(*names: str):
    def check(node: fx.Node) -> tuple[bool, str]:
        name = str(node.target)
        return (True, "") if name in names else (False, f"no importer for {name}")
    return check


class _BlockRunner(nn.Module):
    """Runs a block's nodes (copied into their own graph) in PyTorch: a stand-in engine."""

    def __init__(self, gm: fx.GraphModule, block: Block) -> None:
        super().__init__()
        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        for n in block.inputs:
            env[n] = g.placeholder(n.name)
        for n in block.constants:
            env[n] = g.get_attr(n.target)
        for n in block.nodes:
            env[n] = g.node_copy(n, lambda x: env[x])
        g.output(tuple(env[o] for o in block.outputs))
        self.sub = fx.GraphModule(gm, g)

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.sub(*xs)


def _replace_all(result: PartitionResult) -> fx.GraphModule:
    gm = result.gm
    runners = [_BlockRunner(gm, b) for b in result.blocks]
    remap: dict[fx.Node, fx.Node] = {}
    for i, (block, runner) in enumerate(zip(result.blocks, runners)):
        block.inputs = [remap.get(n, n) for n in block.inputs]
        replace_block(gm, block, f"_kiln_engine_{i}", runner, remap)
    return gm


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        y = y + torch.sigmoid(y)
        return self.fc(y.mean(dim=(2, 3)))


ALL_CONVNET = ("aten.convolution.default", "aten.relu.default", "aten.sigmoid.default", "aten.add.Tensor",
               "aten.mean.dim", "aten.addmm.default", "aten.permute.default", "aten.t.default")


def test_fully_supported_graph_is_one_block_and_runs() -> None:
    torch.manual_seed(0)
    m, x = ConvNet().eval(), torch.randn(2, 3, 8, 8)
    low = _lower(m, x)
    result = partition(low.gm, _supports(*ALL_CONVNET), CompilationSettings(min_block_size=1))
    assert len(result.blocks) == 1 and not result.unsupported
    assert result.coverage == 100.0 and result.ops_in_engines == result.total_ops
    block = result.blocks[0]
    assert [n.op for n in block.inputs] == ["placeholder"]
    assert all(c.op == "get_attr" for c in block.constants) and len(block.constants) >= 3
    gm = _replace_all(result)
    assert [n.op for n in gm.graph.nodes if n.op == "call_function"] == ["call_function"]  # one getitem
    torch.testing.assert_close(gm(x)[0], m(x))


class TwoBranches(nn.Module):
    """Two independent chains and a tuple-returning op: one block when everything is supported."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values, indices = torch.max(x.relu(), dim=1)
        return values + 1, indices, torch.sigmoid(y) * 2


@pytest.mark.parametrize("model,args", [(ConvNet, (torch.randn(2, 3, 8, 8),)),
                                        (TwoBranches, (torch.randn(3, 4), torch.randn(5)))])
def test_a_fully_supported_graph_gives_the_block_torchs_partitioner_gives(model: type[nn.Module],
                                                                           args: tuple[torch.Tensor, ...]) -> None:
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    from kiln.partition import _groups, _Support
    gm = _lower(model().eval(), *args).gm
    ok = {n for n in gm.graph.nodes if n.op == "call_function" and "getitem" not in str(n.target)}
    def torchs(supported: set[fx.Node]) -> list[set[fx.Node]]:
        parts = CapabilityBasedPartitioner(gm, _Support(supported), allows_single_node_partition=True).propose_partitions()
        return [set(p.nodes) for p in parts]
    calls = {n for n in gm.graph.nodes if n.op == "call_function"}
    assert _groups(gm, _Support(ok)) == torchs(ok) == [calls]  # getitems included
    # With one op unsupported, the general partitioner answers.
    relu = next(n for n in ok if "relu" in str(n.target))
    groups = _groups(gm, _Support(ok - {relu}))
    assert groups == torchs(ok - {relu}) and all(relu not in g for g in groups)


def test_torch_executed_ops_stay_in_pytorch() -> None:
    m, x = ConvNet().eval(), torch.randn(2, 3, 8, 8)
    for excluded in ("aten.relu", "aten.relu.default"):
        low = _lower(m, x)
        settings = CompilationSettings(min_block_size=1, torch_executed_ops={excluded})
        result = partition(low.gm, _supports(*ALL_CONVNET), settings)
        assert result.excluded == {"aten.relu.default": 1}
        assert all(str(n.target) != "aten.relu.default" for b in result.blocks for n in b.nodes)
        assert result.pytorch_ops() == {"aten.relu.default": 1}
        assert len(result.blocks) == 2  # conv before, the rest after
        gm = _replace_all(result)
        torch.testing.assert_close(gm(x)[0], m(x))


class Chains(nn.Module):
    """3 compute ops, an unsupported op, then 6 compute ops (plus views, which do not count)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x).exp().neg()
        y = torch.sin(y)
        y = y.view(-1).view(x.shape).permute(1, 0)
        return (y * 2).relu().exp().neg().abs().tanh()


def test_min_block_size_counts_compute_ops_only() -> None:
    x = torch.randn(4, 6)
    low = _lower(Chains(), x)
    supported = _supports("aten.relu.default", "aten.exp.default", "aten.neg.default", "aten.view.default",
                          "aten.permute.default", "aten.mul.Tensor", "aten.abs.default", "aten.tanh.default")
    result = partition(low.gm, supported, CompilationSettings(min_block_size=5))
    assert [b.num_compute_ops for b in result.blocks] == [6]
    assert [b.num_compute_ops for b in result.small_blocks] == [3]
    assert result.blocks[0].num_ops == 9  # 6 compute + 3 views
    assert result.unsupported == {"aten.sin.default": (1, ["no importer for aten.sin.default"])}
    assert partition(_lower(Chains(), x).gm, supported, CompilationSettings(min_block_size=3)).small_blocks == []
    assert partition(_lower(Chains(), x).gm, supported, CompilationSettings(min_block_size=math.inf)).blocks == []
    gm = _replace_all(result)
    torch.testing.assert_close(gm(x)[0], Chains()(x))


def test_require_full_compilation_names_the_ops_left_behind() -> None:
    x = torch.randn(4, 6)
    supported = _supports("aten.relu.default", "aten.exp.default", "aten.neg.default", "aten.view.default",
                          "aten.permute.default", "aten.mul.Tensor", "aten.abs.default", "aten.tanh.default")
    with pytest.raises(NotImplementedError) as info:
        partition(_lower(Chains(), x).gm, supported, CompilationSettings(require_full_compilation=True))
    assert "aten.sin.default x1 (no importer for aten.sin.default)" in str(info.value)
    # Small blocks do not count against full compilation: min_block_size does not apply.
    everything = _supports("aten.relu.default", "aten.exp.default", "aten.neg.default", "aten.view.default",
                           "aten.permute.default", "aten.mul.Tensor", "aten.abs.default", "aten.tanh.default",
                           "aten.sin.default")
    result = partition(_lower(Chains(), x).gm, everything,
                       CompilationSettings(require_full_compilation=True, min_block_size=50))
    assert len(result.blocks) == 1 and result.coverage == 100.0


class Diamond(nn.Module):
    """relu feeds both an unsupported sin and the final add: merging relu and add would make a cycle."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(x)
        return a + torch.sin(a)


def test_blocks_never_form_a_cycle() -> None:
    x = torch.randn(5)
    result = partition(_lower(Diamond(), x).gm, _supports("aten.relu.default", "aten.add.Tensor"),
                       CompilationSettings(min_block_size=1))
    assert sorted(str(n.target) for b in result.blocks for n in b.nodes) == ["aten.add.Tensor", "aten.relu.default"]
    assert len(result.blocks) == 2
    gm = _replace_all(result)
    torch.testing.assert_close(gm(x)[0], Diamond()(x))


class Pool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool2d(x, 2).relu()


def test_tuple_outputs_keep_their_getitems_in_the_block() -> None:
    x = torch.randn(1, 2, 6, 6)
    low = _lower(Pool(), x)
    targets = {str(n.target) for n in low.gm.graph.nodes}
    assert "aten.max_pool2d_with_indices.default" in targets
    result = partition(low.gm, _supports("aten.max_pool2d_with_indices.default"), CompilationSettings(min_block_size=1))
    (block,) = result.blocks
    assert any(n.op == "call_function" and "getitem" in str(n.target) for n in block.nodes)
    assert block.num_ops == 1 and len(block.outputs) == 1 and "getitem" in block.outputs[0].name
    gm = _replace_all(result)
    torch.testing.assert_close(gm(x)[0], Pool()(x))


def test_views_are_not_compute_ops() -> None:
    low = _lower(Chains(), torch.randn(4, 6))
    views = [n for n in low.gm.graph.nodes if str(n.target) in ("aten.view.default", "aten.permute.default")]
    assert views and not any(is_compute_op(n) for n in views)


def test_dry_run_report_content() -> None:
    x = torch.randn(4, 6)
    supported = _supports("aten.relu.default", "aten.exp.default", "aten.neg.default", "aten.view.default",
                          "aten.permute.default", "aten.mul.Tensor", "aten.abs.default", "aten.tanh.default")
    settings = CompilationSettings(min_block_size=5, dryrun=True, torch_executed_ops={"aten.abs"})
    result = partition(_lower(Chains(), x).gm, supported, settings)
    text = format_report(result, settings, "graph 7")
    assert "Kiln dry run: graph 7" in text
    assert f"total ops: {result.total_ops}" in text
    assert f"supported ops: {result.supported_ops}" in text and "coverage:" in text
    assert "aten.sin.default x1: no importer for aten.sin.default" in text
    assert "kept in PyTorch by torch_executed_ops: aten.abs.default x1" in text
    assert "blocks left in PyTorch by min_block_size=5" in text
    assert "inputs:  x: float32[4, 6]" in text
    assert "min_block_size -> engines" in text and "<- current" in text
    lines = [line.strip() for line in text.splitlines()]
    # abs (excluded) splits the 6-op chain into 4 + 1; the first chain has 3 compute ops.
    assert "1: 3 engines (11 ops, 84.6%)" in lines
    assert "2..3: 2 engines (10 ops, 76.9%)" in lines
    assert "4: 1 engine (7 ops, 53.8%)" in lines
    assert ">= 5: 0 engines  <- current" in lines
