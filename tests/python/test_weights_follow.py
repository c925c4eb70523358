"""Compiled models follow their model's weights when they change in place.

For kiln.compile and torch.compile(backend="kiln"), on a conv + batch norm + linear net whose
batch norms the builder folds (so the engine holds both weights it reads where the model keeps
them and weights it derived): after ``load_state_dict`` or ``copy_`` into one weight, the next
call gives eager PyTorch's outputs with the new weights, by a refit of the same engines (no
build); with ``immutable_weights=True`` the call raises instead. A ``.data`` swap is not
watched: the compiled model keeps the weights it had, whole, until ``kiln.refit``. Also:
nothing is refitted while nothing changes, a refit from other weights does not leave a mix
behind, kiln.save saves the followed weights, and concurrent calls of one compiled model give
eager's outputs, with one refit among racing callers.
"""

from __future__ import annotations

import copy
import importlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import kiln
from kiln.runtime import KilnEngineModule

refit_module = importlib.import_module("kiln.refit")


class ConvBnNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8 * 4 * 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.head(x.flatten(1))


class NoisyNet(ConvBnNet):
    """ConvBnNet plus zero times a random draw, which stays in PyTorch: a graph not to run twice."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y + 0.0 * torch.rand_like(y)


def randomized(seed: int, net: type[ConvBnNet] = ConvBnNet) -> torch.nn.Module:
    """A net whose every parameter and running statistic is random (variances in [0.5, 1])."""
    model = net()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if t.is_floating_point():
                t.copy_(torch.rand(t.shape, generator=g) * 0.5 + 0.5 if "running_var" in name
                        else torch.randn(t.shape, generator=g) * 0.3)
    return model.eval()


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(7))


def compile_with(model: torch.nn.Module, x: torch.Tensor, how: str, **options: Any) -> Callable[..., Any]:
    options.setdefault("min_block_size", 1)
    if how == "dynamo":
        torch._dynamo.reset()  # Dynamo reuses a graph across instances of one class
        compiled = torch.compile(model, backend="kiln", options=options, dynamic=False)
    else:
        compiled = kiln.compile(model, [x], **options)
    with torch.no_grad():
        compiled(x)
    return compiled


def engines_of(compiled: torch.nn.Module) -> list[KilnEngineModule]:
    return [m for m, _ in refit_module._targets_of(compiled).engines]


def check(compiled: Callable[..., Any], model: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)


@pytest.fixture
def no_builds(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an engine was built")

    def start() -> None:
        monkeypatch.setattr(kiln.runtime, "build_engine", fail)
        monkeypatch.setattr(kiln.pipeline, "build_engine", fail)
    return start


@pytest.mark.parametrize("how", ["aot", "dynamo"])
def test_load_state_dict_is_followed_by_a_refit(how: str, x: torch.Tensor, no_builds: Callable[[], None]) -> None:
    model, other = randomized(1), randomized(2)
    compiled = compile_with(model, x, how)
    engines = engines_of(compiled)
    assert engines and all(e.engine.borrowed_bytes > 0 for e in engines)  # a mix was possible
    before = [(e, e.engine, e.engine.weights_version) for e in engines]
    with torch.no_grad():
        old = model(x)
        assert (old - other(x)).abs().max() > 1e-1
    no_builds()
    model.load_state_dict(other.state_dict())
    check(compiled, other, x)
    for e, engine, version in before:
        assert e.engine is engine and e.engine.weights_version == version + 1
    assert engines_of(compiled) == engines


@pytest.mark.parametrize("how", ["aot", "dynamo"])
def test_each_kind_of_in_place_change_is_followed(how: str, x: torch.Tensor) -> None:
    model = randomized(3)
    compiled = compile_with(model, x, how)
    with torch.no_grad():
        model.bn2.running_var.mul_(1.7)   # folded into conv2's weight by the builder
    check(compiled, model, x)
    with torch.no_grad():
        model.head.bias.add_(0.5)         # read in place by the engine (borrowed)
    check(compiled, model, x)


@pytest.mark.parametrize("how", ["aot", "dynamo"])
@pytest.mark.parametrize("variant", ["engines", "a PyTorch op", "a random draw"])
def test_changes_are_followed_whether_the_run_is_launched_before_the_check_or_after(
        how: str, variant: str, x: torch.Tensor) -> None:
    # A graph that runs again alike (engines, PyTorch ops that write nothing) is launched, then its
    # weights checked, and made again after a change; one that draws random numbers checks first.
    # Either way the call after a change is eager's.
    model = randomized(5, NoisyNet if variant == "a random draw" else ConvBnNet)
    kept = {"aten.relu.default"} if variant == "a PyTorch op" else set()
    compiled = compile_with(model, x, how, torch_executed_ops=kept)
    if how == "aot":
        assert kiln.pipeline.runs_again_alike(compiled.gm) == (variant != "a random draw")
        assert (len(compiled.engines()) == 1) == (variant == "engines")  # the others leave ops in PyTorch
    for _ in range(2):
        with torch.no_grad():
            model.conv1.weight.mul_(-1.5)
            model.head.bias.add_(0.5)
        check(compiled, model, x)
        check(compiled, model, x)


@pytest.mark.parametrize("how", ["aot", "dynamo"])
def test_a_data_swap_keeps_the_old_weights_whole_until_a_refit(how: str, x: torch.Tensor) -> None:
    model = randomized(13)
    compiled = compile_with(model, x, how)
    before = copy.deepcopy(model)
    model.conv1.weight.data = torch.randn_like(model.conv1.weight)  # not an in-place write: not watched
    model.head.weight.data = torch.randn_like(model.head.weight)    # a weight the engine reads in place
    check(compiled, before, x)  # the weights it had, not a mix with the new ones
    kiln.refit(compiled if how == "aot" else model, model)
    check(compiled, model, x)


@pytest.mark.parametrize("how", ["aot", "dynamo"])
def test_nothing_is_refitted_while_nothing_changes(how: str, x: torch.Tensor) -> None:
    model = randomized(4)
    compiled = compile_with(model, x, how)
    for _ in range(3):
        check(compiled, model, x)
    assert all(e.engine.weights_version == 0 for e in engines_of(compiled))


@pytest.mark.parametrize("how", ["aot", "dynamo"])
def test_immutable_engines_raise_instead_of_giving_a_mix(how: str, x: torch.Tensor) -> None:
    model, other = randomized(5), randomized(6)
    compiled = compile_with(model, x, how, immutable_weights=True)
    check(compiled, model, x)
    model.load_state_dict(other.state_dict())
    for _ in range(2):  # every call, not only the first
        with pytest.raises(kiln.UnsupportedError, match=r"changed in place after compiling \(.*conv1\.weight.*"
                                                        r"immutable_weights=True"), torch.no_grad():
            compiled(x)


def test_a_refit_from_other_weights_leaves_no_mix_after_the_next_change(x: torch.Tensor) -> None:
    model, other = randomized(7), randomized(8)
    compiled = compile_with(model, x, "aot")
    kiln.refit(compiled, other.state_dict())
    check(compiled, other, x)  # the explicit refit holds while the model does not change
    with torch.no_grad():
        model.head.bias.add_(0.25)
    check(compiled, model, x)  # every weight is the model's again, not only head.bias


def test_pytorch_side_constants_follow_too(x: torch.Tensor) -> None:
    model, other = randomized(9), randomized(10)
    compiled = compile_with(model, x, "aot", torch_executed_ops={"aten.linear"})
    assert compiled.summary.ops_in_pytorch["aten.linear.default"] == 1
    model.load_state_dict(other.state_dict())
    check(compiled, other, x)
    with torch.no_grad():
        model.head.weight.mul_(-1.5)
    check(compiled, model, x)


def test_save_writes_the_followed_weights(tmp_path: Path, x: torch.Tensor) -> None:
    model, other = randomized(11), randomized(12)
    compiled = compile_with(model, x, "aot")
    model.load_state_dict(other.state_dict())
    kiln.save(compiled, tmp_path / "m.ep", [x])  # no call in between
    check(kiln.load(tmp_path / "m.ep").module(), other, x)


def test_mutable_module_refits_once_per_change(x: torch.Tensor) -> None:
    model, other = randomized(13), randomized(14)
    mm = kiln.MutableModule(model, min_block_size=1)
    check(mm, model, x)
    model.load_state_dict(other.state_dict())
    check(mm, other, x)
    check(mm, other, x)
    assert mm.refits == 1 and [e.engine.weights_version for e in mm.compiled.engines()] == [1]


@pytest.mark.parametrize("how", ["aot", "dynamo"])
def test_concurrent_calls_match_eager_and_race_to_one_refit(how: str, x: torch.Tensor) -> None:
    model, other = randomized(15), randomized(16)
    compiled = compile_with(model, x, how)
    inputs = [torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    for weights in (model, other):
        if weights is other:
            model.load_state_dict(other.state_dict())  # every thread's first call sees the change
        with torch.no_grad():
            want = [model(t) for t in inputs]
        start = threading.Barrier(len(inputs))
        got: list[Any] = [None] * len(inputs)

        def work(i: int) -> None:
            start.wait()
            with torch.no_grad():
                for _ in range(5):
                    got[i] = compiled(inputs[i])
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    assert [e.engine.weights_version for e in engines_of(compiled)] == [1]
