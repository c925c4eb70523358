"""Control flow: torch.cond branches build into engines of their own, nested_compile_region regions
join the engines around them (kiln/control_flow.py).

A cond stays in the compiled graph: PyTorch evaluates the predicate and runs the branch it picks,
whose ops run in that branch's engines. Every test compares with eager PyTorch on random inputs
that take each branch, through kiln.compile, torch.compile(backend="kiln") and a saved program.
"""

from __future__ import annotations

import collections
import copy
import pickle
from collections.abc import Iterator

import pytest
import torch
import torch.nn as nn

import kiln
from harness import compile_and_compare
from kiln.runtime import KilnEngineModule


class Branchy(nn.Module):
    """cond on the sign of the input's sum; each branch has its own weights."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def positive(x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.a(x)) * self.scale + 1

        def negative(x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(self.b(x)) - self.scale

        return torch.cond(x.sum() > 0, positive, negative, (x,)) * 2


class Nested(nn.Module):
    """cond inside a cond's true branch: three paths."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def inner_true(y: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.b(y)) + y

        def inner_false(y: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.c(y)) - y

        def outer_true(x: torch.Tensor) -> torch.Tensor:
            y = self.a(x) * 3
            return torch.cond(y.mean() > 0, inner_true, inner_false, (y,))

        def outer_false(x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(self.c(x)) * 2 - 1

        return torch.cond(x[0, 0] > 0, outer_true, outer_false, (x,))


def _input(sign: float, shape: tuple[int, ...] = (4, 8)) -> torch.Tensor:
    """Random non-zero data whose sum (and first element) has the given sign."""
    return (torch.rand(shape) + 0.1) * sign


def _nested_inputs(model: Nested) -> Iterator[tuple[str, torch.Tensor]]:
    """Inputs that take each of Nested's three paths (found by search on random data)."""
    wanted = {"outer_false": None, "inner_true": None, "inner_false": None}
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(1000):
            x = torch.randn(4, 8, generator=gen)
            if x[0, 0] <= 0:
                path = "outer_false"
            else:
                path = "inner_true" if (model.a(x) * 3).mean() > 0 else "inner_false"
            if wanted[path] is None:
                wanted[path] = x
            if all(v is not None for v in wanted.values()):
                break
    assert all(v is not None for v in wanted.values()), wanted
    yield from wanted.items()  # type: ignore[misc]


def _engine_calls(compiled: nn.Module) -> collections.Counter[str]:
    """Counts the calls of each engine module of ``compiled`` (by module path) from now on."""
    calls: collections.Counter[str] = collections.Counter()
    for name, m in compiled.named_modules():
        if isinstance(m, KilnEngineModule):
            m.register_forward_hook(lambda mod, args, out, name=name: calls.update([name]))
    return calls


def _assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_cond_both_branches_run_in_their_engines() -> None:
    torch.manual_seed(0)
    model = Branchy().eval()
    compiled = kiln.compile(model, [_input(1.0)], min_block_size=1)
    summary = compiled.summary
    # The predicate (sum, gt), the final multiply and each branch: engines; the cond itself in PyTorch.
    assert summary.ops_in_pytorch == collections.Counter({"higher_order.cond": 1})
    assert summary.ops_in_engines["aten.linear.default"] == 2
    assert summary.engines == len(compiled.engines()) == 4
    calls = _engine_calls(compiled)
    for sign, branch in ((1.0, "cond_true"), (-1.0, "cond_false")):
        x = _input(sign)
        calls.clear()
        with torch.no_grad():
            _assert_close(compiled(x), model(x))
        taken = [name for name in calls if "cond_" in name]
        assert len(taken) == 1 and branch in taken[0], dict(calls)
        assert sum(calls.values()) == 3, dict(calls)  # predicate + branch + final multiply


def test_branch_ops_left_in_pytorch_keep_their_weights() -> None:
    """A branch op Kiln leaves in PyTorch reads its weight from the branch graph."""
    torch.manual_seed(1)
    model = Branchy().eval()
    compiled = kiln.compile(model, [_input(1.0)], min_block_size=1, torch_executed_ops={"aten.mul.Tensor"})
    assert compiled.summary.ops_in_pytorch["aten.mul.Tensor"] == 2  # x scale in the true branch, x 2 outside
    for sign in (1.0, -1.0):
        x = _input(sign)
        with torch.no_grad():
            _assert_close(compiled(x), model(x))


def test_nested_cond() -> None:
    torch.manual_seed(2)
    model = Nested().eval()
    compiled = kiln.compile(model, [torch.randn(4, 8)], min_block_size=1)
    assert compiled.summary.ops_in_pytorch == collections.Counter({"higher_order.cond": 2})
    assert compiled.summary.ops_in_engines["aten.linear.default"] == 4  # c is used in two branches
    for _path, x in _nested_inputs(model):
        with torch.no_grad():
            _assert_close(compiled(x), model(x))


def test_weights_changed_in_place_reach_the_branches() -> None:
    torch.manual_seed(3)
    model = Branchy().eval()
    compiled = kiln.compile(model, [_input(1.0)], min_block_size=1)
    with torch.no_grad():
        model.a.weight.mul_(-2)
        model.b.bias.add_(1)
        for sign in (1.0, -1.0):
            x = _input(sign)
            _assert_close(compiled(x), model(x))
        other = Branchy().eval()
        kiln.refit(compiled, other)
        for sign in (1.0, -1.0):
            x = _input(sign)
            _assert_close(compiled(x), other(x))


def test_cond_under_torch_compile() -> None:
    torch.manual_seed(4)
    model = Branchy().eval()
    result = compile_and_compare(model, [_input(1.0)], options={"min_block_size": 1}, atol=1e-5, rtol=1e-5)
    (summary,) = result.summaries
    assert summary.engines == 4
    assert summary.ops_in_pytorch == collections.Counter({"higher_order.cond": 1})
    (graph,) = result.graphs
    (gm,) = graph.graph_modules
    calls = _engine_calls(gm)
    with torch.no_grad():
        x = _input(-1.0)  # the other branch, same graph: no recompilation
        _assert_close(result.compiled(x), model(x))
    assert any("cond_false" in name for name in calls) and not any("cond_true" in name for name in calls)


def test_nested_cond_under_torch_compile() -> None:
    torch.manual_seed(5)
    model = Nested().eval()
    paths = dict(_nested_inputs(model))
    result = compile_and_compare(model, [paths["inner_true"]], options={"min_block_size": 1},
                                 atol=1e-5, rtol=1e-5)
    assert result.summaries[0].ops_in_pytorch == collections.Counter({"higher_order.cond": 2})
    for x in paths.values():
        with torch.no_grad():
            _assert_close(result.compiled(x), model(x))


@pytest.mark.parametrize("model_class", [Branchy, Nested])
def test_save_load_round_trip(tmp_path, model_class: type[nn.Module]) -> None:
    torch.manual_seed(6)
    model = model_class().eval()
    example = _input(1.0)
    compiled = kiln.compile(model, [example], min_block_size=1, torch_executed_ops={"aten.tanh.default"})
    path = tmp_path / "cond.ep"
    kiln.save(compiled, path, [example])
    program = kiln.load(path)
    engines = kiln.extract_engines(path, tmp_path / "engines")
    assert len(engines) == len(compiled.engines())
    loaded = program.module()
    inputs = [x for _, x in _nested_inputs(model)] if model_class is Nested else [_input(1.0), _input(-1.0)]
    for x in inputs:
        with torch.no_grad():
            _assert_close(loaded(x), model(x))


def test_compiled_cond_pickles() -> None:
    """Pickling a GraphModule traces its code again; the cond calls survive that."""
    torch.manual_seed(10)
    model = Nested().eval()
    compiled = kiln.compile(model, [torch.randn(4, 8)], min_block_size=1)
    clone, twin = pickle.loads(pickle.dumps(compiled)), copy.deepcopy(compiled)
    assert len(clone.engines()) == len(twin.engines()) == len(compiled.engines())
    for _path, x in _nested_inputs(model):
        with torch.no_grad():
            want = model(x)
            _assert_close(clone(x), want)
            _assert_close(twin(x), want)


def test_dry_run_reports_each_branch(capsys) -> None:
    model = Branchy().eval()
    compiled = kiln.compile(model, [_input(1.0)], dryrun="-", min_block_size=1)
    text = capsys.readouterr().out
    assert "Kiln dry run: Branchy\n" in text
    assert "higher_order.cond x1: control flow: PyTorch picks the branch; each branch is compiled as a graph " \
           "of its own" in text
    assert "Kiln dry run: Branchy/cond.true\n" in text and "Kiln dry run: Branchy/cond.false\n" in text
    assert compiled.summary.engines == 0 and not compiled.engines()
    with torch.no_grad():  # nothing built: the lowered graph runs in PyTorch
        x = _input(-1.0)
        _assert_close(compiled(x), model(x))


def test_require_full_compilation_accepts_cond() -> None:
    torch.manual_seed(7)
    model = Branchy().eval()
    compiled = kiln.compile(model, [_input(1.0)], require_full_compilation=True)
    assert compiled.summary.ops_in_pytorch == collections.Counter({"higher_order.cond": 1})
    with torch.no_grad():
        x = _input(-1.0)
        _assert_close(compiled(x), model(x))


class Lgamma(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: torch.lgamma(x.abs() + 1), lambda x: x * 2, (x,))


def test_require_full_compilation_names_a_branch_op_left_out() -> None:
    with pytest.raises(kiln.UnsupportedError, match=r"these ops would run in PyTorch: aten\.lgamma\.default x1 \("):
        kiln.compile(Lgamma(), [_input(1.0)], require_full_compilation=True)
    compiled = kiln.compile(Lgamma(), [_input(1.0)], min_block_size=1)  # without it: that op runs in PyTorch
    assert compiled.summary.ops_in_pytorch["aten.lgamma.default"] == 1
    for sign in (1.0, -1.0):
        x = _input(sign)
        _assert_close(compiled(x), Lgamma()(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    @torch.compiler.nested_compile_region
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) + x


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x * 2


@pytest.mark.skipif(not hasattr(torch.compiler, "nested_compile_region"), reason="torch without nested_compile_region")
@pytest.mark.parametrize("via", ["dynamo", "aot"])
def test_nested_compile_region(via: str) -> None:
    """The regions (one subgraph called with each block's weights) join one engine."""
    torch.manual_seed(8)
    model = Stack().eval()
    result = compile_and_compare(model, [torch.randn(4, 8)], options={"min_block_size": 1}, via=via,
                                 atol=1e-5, rtol=1e-5)
    (summary,) = result.summaries
    assert summary.engines == 1 and not summary.ops_in_pytorch
    assert summary.ops_in_engines["aten.linear.default"] == 3


def test_other_higher_order_ops_run_in_pytorch(tmp_path) -> None:
    from torch._higher_order_ops.while_loop import while_loop

    class Loop(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            def cond_fn(i: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                return i < 3

            def body_fn(i: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return i + 1, torch.tanh(self.fc(y))
            return while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), x))[1]

    torch.manual_seed(9)
    model = Loop().eval()
    x = torch.randn(4, 8)
    compiled = kiln.compile(model, [x], min_block_size=1, dryrun=str(tmp_path / "report.txt"))
    assert "higher_order.while_loop x1: higher-order op while_loop runs in PyTorch with its subgraphs" in \
        (tmp_path / "report.txt").read_text()
    compiled = kiln.compile(model, [x], min_block_size=1)
    assert compiled.summary.ops_in_pytorch["higher_order.while_loop"] == 1
    with torch.no_grad():
        _assert_close(compiled(x), model(x))


class ValueBranch(nn.Module):
    """A Python `if` on a tensor's values (as BART's FP16 overflow clamp), not a torch.cond."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        if (y.abs() > 3.0).any():  # the branch torch.export cannot trace
            y = y.clamp(-3.0, 3.0)
        return torch.relu(y) * 2


@pytest.mark.parametrize("scale", [0.1, 10.0], ids=["not-taken", "taken"])
def test_branch_on_tensor_values_takes_the_example_branch(scale: float, tmp_path, caplog) -> None:
    """kiln.compile specializes a branch on tensor values to the one the example inputs take,
    with a warning naming the line; inputs that take the same branch match eager, saved too."""
    torch.manual_seed(3)
    model = ValueBranch().eval()
    x = torch.randn(4, 8) * scale
    with torch.no_grad(), caplog.at_level("WARNING", logger="kiln"):
        compiled = kiln.compile(model, [x], min_block_size=1)
        expected = model(x)
        torch.testing.assert_close(compiled(x), expected, rtol=1e-5, atol=1e-5)
        other = torch.randn(4, 8) * scale  # the same branch
        torch.testing.assert_close(compiled(other), model(other), rtol=1e-5, atol=1e-5)
        warned = [r.getMessage() for r in caplog.records if "branches on tensor values" in r.getMessage()]
        assert len(warned) == 1 and "test_control_flow.py:" in warned[0] and "y.abs() > 3.0" in warned[0], warned
        assert compiled.summary.ops_in_pytorch == collections.Counter(), compiled.summary
        path = tmp_path / "branch.pt2"
        kiln.save(compiled, path, arg_inputs=[x])
        torch.testing.assert_close(kiln.load(path).module()(other), model(other), rtol=1e-5, atol=1e-5)


def test_branch_on_tensor_values_with_dynamic_shapes_still_raises() -> None:
    """With dynamic shapes the export is not specialized: torch.export's error reaches the caller."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    batch = torch.export.Dim("batch", min=2, max=16)
    with torch.no_grad(), pytest.raises(GuardOnDataDependentSymNode):
        kiln.compile(ValueBranch().eval(), [torch.randn(4, 8)], min_block_size=1, dynamic_shapes=({0: batch},))
