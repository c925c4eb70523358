"""kiln.compile / save / load / extract_engines: the ahead-of-time path and its artifacts.

The saved program is loaded in a fresh Python process and must give the outputs of the
compiled module; its engines, extracted as .kiln files, must run by themselves (through
kiln.Engine and, when it is built, the kiln-run command-line runner).
"""

from __future__ import annotations

import copy
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import kiln
from harness import compile_and_compare, randomize


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.mean(dim=(2, 3))) * scale


class TwoInTwoOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
        h = torch.relu(self.fc(a) + b)
        return {"h": h, "s": torch.sigmoid(h) * a}


@pytest.fixture(scope="module")
def net() -> nn.Module:
    torch.manual_seed(0)
    return randomize(Net().eval())


def test_compile_module_matches_eager(net: nn.Module) -> None:
    result = compile_and_compare(net, [torch.randn(2, 3, 8, 8)], via="aot", options={"min_block_size": 1})
    assert result.coverage == 100.0 and result.engines == 1


def test_compile_structured_inputs_and_outputs() -> None:
    m = randomize(TwoInTwoOut().eval())
    a, b = torch.randn(3, 6), torch.randn(3, 6)
    compiled = kiln.compile(m, arg_inputs=[a, b], min_block_size=1)
    out, ref = compiled(a, b), m(a, b)
    assert set(out) == {"h", "s"}
    for k in out:
        torch.testing.assert_close(out[k], ref[k])
    with pytest.raises(ValueError, match="structured"):
        compiled(a)


class Shapes(nn.Module):
    """Outputs of one element, with a dim of one, and of four dims."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.sum().reshape(1), torch.tanh(x[:, :1]), x.reshape(2, 1, 3, 4) * 2.0


def test_outputs_are_new_contiguous_tensors_on_every_call() -> None:
    x = torch.randn(2, 12)
    compiled = kiln.compile(Shapes(), [x], min_block_size=1)
    with torch.no_grad():
        first, second = compiled(x), compiled(x)
        for a, b, want in zip(first, second, Shapes()(x)):
            torch.testing.assert_close(a, want)
            assert a.stride() == want.contiguous().stride() and a.dtype == want.dtype
            assert a.data_ptr() != b.data_ptr()  # the first call's outputs stay the caller's


def test_compile_exported_program(net: nn.Module) -> None:
    x = torch.randn(1, 3, 8, 8)
    ep = torch.export.export(net, (x,))
    compiled = kiln.compile(ep, min_block_size=1)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), net(x), atol=1e-4, rtol=1e-4)
    assert compiled.summary.engines == 1


def test_wrong_input_shape_is_a_clear_error(net: nn.Module) -> None:
    compiled = kiln.compile(net, arg_inputs=[torch.randn(2, 3, 8, 8)], min_block_size=1)
    with pytest.raises(kiln.ShapeMismatchError, match=r"\[2, 3, 8, 8\].*got torch.float32 \[1, 3, 8, 8\]"):
        compiled(torch.randn(1, 3, 8, 8))


def test_compiled_module_pickles_with_its_engines(net: nn.Module) -> None:
    x = torch.randn(2, 3, 8, 8)
    compiled = kiln.compile(net, arg_inputs=[x], min_block_size=1)
    clone = pickle.loads(pickle.dumps(compiled))
    twin = copy.deepcopy(compiled)
    torch.testing.assert_close(clone(x), compiled(x), atol=0, rtol=0)
    torch.testing.assert_close(twin(x), compiled(x), atol=0, rtol=0)


def _python_env() -> dict[str, str]:
    env = dict(os.environ)
    package_root = str(Path(kiln.__file__).absolute().parent.parent)  # the kiln under test
    env["PYTHONPATH"] = os.pathsep.join([package_root, env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="module")
def saved(net: nn.Module, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor, torch.Tensor]:
    out = tmp_path_factory.mktemp("aot")
    x = torch.randn(2, 3, 8, 8)
    compiled = kiln.compile(net, arg_inputs=[x], min_block_size=1)
    with torch.no_grad():
        expected = compiled(x)
    path = out / "model.ep"
    ep = kiln.save(compiled, path, arg_inputs=[x])
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count("kiln.execute_engine.default") == 1
    torch.save(x, out / "x.pt")
    return path, x, expected


def test_saved_program_runs_in_a_fresh_process(saved: tuple[Path, torch.Tensor, torch.Tensor]) -> None:
    path, _, expected = saved
    script = textwrap.dedent(f"""
        import torch, kiln
        program = kiln.load({str(path)!r})
        x = torch.load({str(path.parent / "x.pt")!r})
        with torch.no_grad():
            torch.save(program.module()(x), {str(path.parent / "y.pt")!r})
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_python_env())
    assert run.returncode == 0, run.stderr
    torch.testing.assert_close(torch.load(path.parent / "y.pt"), expected, atol=0, rtol=0)


def test_loaded_program_in_this_process(saved: tuple[Path, torch.Tensor, torch.Tensor]) -> None:
    path, x, expected = saved
    with torch.no_grad():
        torch.testing.assert_close(kiln.load(path).module()(x), expected, atol=0, rtol=0)


def test_extracted_engines_run_alone(saved: tuple[Path, torch.Tensor, torch.Tensor], tmp_path: Path) -> None:
    path, x, expected = saved
    files = kiln.extract_engines(path, tmp_path / "engines")
    assert [f.name for f in files] == ["engine_0.kiln"]
    engine = kiln.Engine.load(str(files[0]))
    assert [list(io.shape) for io in engine.inputs] == [[2, 3, 8, 8]]
    (out,) = engine.create_execution_context().execute([x.numpy()])
    np.testing.assert_allclose(out, expected.numpy(), atol=1e-6, rtol=0)

    build = os.environ.get("KILN_BUILD_DIR")
    runner = str(Path(build) / "kiln-run") if build and (Path(build) / "kiln-run").exists() else shutil.which("kiln-run")
    if runner is None:
        pytest.skip("kiln-run is not built (set KILN_BUILD_DIR)")
    np.save(tmp_path / "x.npy", x.numpy())
    outdir = tmp_path / "out"
    outdir.mkdir()
    run = subprocess.run([runner, str(files[0]), "--inputs", str(tmp_path / "x.npy"), "--iterations", "2",
                          "--outputs", str(outdir)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    (result,) = sorted(outdir.glob("*.npy"))
    np.testing.assert_allclose(np.load(result), expected.numpy(), atol=1e-6, rtol=0)


def test_truncate_double_runs_float64_models_in_float32() -> None:
    torch.manual_seed(0)
    m = randomize(TwoInTwoOut().eval()).double()
    a, b = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64)
    compiled = kiln.compile(m, arg_inputs=[a, b], min_block_size=1, truncate_double=True)
    (engine,) = compiled.engines()
    assert {io.dtype for io in engine.engine.inputs} == {kiln.DType.f32}
    out, ref = compiled(a, b), m(a, b)
    for k in ref:
        assert out[k].dtype == torch.float64
        torch.testing.assert_close(out[k], ref[k], atol=1e-5, rtol=1e-5)
