"""Clear errors at the Python API, naming the cause, where there were puzzles or silent changes.

Calls with None or a numpy array instead of a tensor; kiln.compile given a bare tensor, a numpy
example input or no module; kiln.refit given a non-tensor or a float64 weight (no silent cast;
an engine built with truncate_double from a float64 model still takes float64 weights); the
weight names of a compiled function's engines (the module's own keys, not Dynamo's ``L['s']``)
and kiln.refit through the module it runs; ``device="cpu:1"``.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

import kiln
from kiln.settings import CompilationSettings

refit_module = importlib.import_module("kiln.refit")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def net(seed: int) -> Net:
    torch.manual_seed(seed)
    return Net().eval()


X = torch.randn(2, 16, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def compiled() -> tuple[Any, Net]:
    model = net(0)
    return kiln.compile(model, [X], min_block_size=1), model


@pytest.mark.parametrize("value,kind", [(None, "NoneType"), (X.numpy(), r"numpy\.ndarray"), (3.0, "float")])
def test_a_call_with_something_else_than_a_tensor(compiled: Any, value: Any, kind: str) -> None:
    program, _ = compiled
    with pytest.raises(TypeError, match=rf"input 0 \('x'\) must be torch.float32 \[2, 16\] on cpu, got a {kind}, "
                                        r"not a torch.Tensor"):
        program(value)
    with pytest.raises(TypeError, match="torch.from_numpy"):
        program(X.numpy())


def test_compile_names_bad_example_inputs() -> None:
    model = net(0)
    with pytest.raises(TypeError, match=r"arg_inputs must be a list or tuple .* got a Tensor \(pass \[x\]\)"):
        kiln.compile(model, X)
    with pytest.raises(TypeError, match=r"an example input is a numpy\.ndarray, not a torch\.Tensor \(convert it"):
        kiln.compile(model, [X.numpy()])
    with pytest.raises(TypeError, match=r"compiles a torch\.nn\.Module or a torch\.export\.ExportedProgram, got a NoneType"):
        kiln.compile(None, [X])  # type: ignore[arg-type]


def test_refit_names_a_weight_that_is_not_a_tensor(compiled: Any) -> None:
    program, _ = compiled
    state = dict(net(1).state_dict(), **{"b.weight": "not a tensor"})
    with pytest.raises(TypeError, match=r"weight 'b.weight' must be a torch.Tensor \(f32\[4,32\]\), got a str"):
        kiln.refit(program, state)


def test_refit_converts_no_dtype() -> None:
    model, other = net(0), net(1)
    program = kiln.compile(model, [X], min_block_size=1)
    state = {k: v.double() for k, v in other.state_dict().items()}
    with pytest.raises(kiln.InvalidArgumentError, match=r"weight 'a.(weight|bias)' must be f32\[.*\], got a torch.float64 "
                                                        r"tensor \(a refit converts no weight's dtype"):
        kiln.refit(program, state)
    with torch.no_grad():
        torch.testing.assert_close(program(X), model(X))  # nothing changed


def test_refit_of_a_truncate_double_engine_takes_float64_weights() -> None:
    model, other = net(0).double(), net(1).double()
    program = kiln.compile(model, [X.double()], min_block_size=1, truncate_double=True)
    kiln.refit(program, other.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(program(X.double()), other(X.double()), rtol=1e-5, atol=1e-5)


def test_a_compiled_functions_engines_take_the_modules_own_names() -> None:
    model, other = net(0), net(1)
    torch._dynamo.reset()

    def run(s: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return s(x)
    fn = torch.compile(run, backend="kiln", options={"min_block_size": 1}, dynamic=False)
    with torch.no_grad():
        fn(model, X)
    (engine,), = [[m for m, _ in refit_module._targets_of(model).engines]]
    assert set(engine.engine.weight_names) == set(model.state_dict())
    with pytest.raises(TypeError, match=r"pass the module it runs: kiln.refit\(model, new_weights\)"):
        kiln.refit(fn, other)  # type: ignore[arg-type]
    bad = dict(other.state_dict(), **{"b.weight": torch.zeros(4, 31)})
    with pytest.raises(kiln.InvalidArgumentError, match=r"^weight 'b.weight' must have shape f32\[4,32\], got \[4, 31\]"):
        kiln.refit(model, bad)
    kiln.refit(model, other)  # through the module the function ran
    with torch.no_grad():
        torch.testing.assert_close(fn(model, X), other(X), atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()


def test_cpu_device_index_is_refused() -> None:
    with pytest.raises(ValueError, match=r"Kiln option 'device' is 'cpu:1', but the CPU is one device: use 'cpu'"):
        CompilationSettings(device="cpu:1")
    with pytest.raises(ValueError, match="'device'"):
        kiln.compile(net(0), [X], device="cpu:1")
    assert CompilationSettings(device="cpu:0").device == "cpu"
