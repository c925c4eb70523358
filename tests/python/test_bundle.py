"""Kiln bundles: kiln.save(..., output_format="kiln_bundle") writes a program's engines and glue in
one file that kiln-run and the C++ runtime (kiln._C.Bundle, the binding of kiln/bundle.h) run
without Python, with the outputs of eager PyTorch. A program a bundle cannot hold (ops left to
PyTorch, outputs that are no tensor, float64 converted by truncate_double) and a damaged bundle
are errors naming the cause.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import kiln
from harness import randomize
from kiln import _C
from kiln.bundle import write_bundle


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.bn(self.conv1(x)))
        y = torch.relu(self.conv2(nn.functional.max_pool2d(y, 2)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1)), y


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
        h = torch.relu(self.fc(a) + b)
        return {"h": h, "s": torch.sigmoid(h) * a, "a": a}


def kiln_run() -> str | None:
    build = os.environ.get("KILN_BUILD_DIR")
    if build and (Path(build) / "kiln-run").exists():
        return str(Path(build) / "kiln-run")
    return shutil.which("kiln-run")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = randomize(SmallCNN().eval())
    x = torch.randn(2, 3, 16, 16)
    path = tmp_path_factory.mktemp("bundle") / "cnn.kiln"
    compiled = kiln.compile(model, [x], min_block_size=1)
    kiln.save(compiled, path, [x], output_format="kiln_bundle")
    return path, model, x


def assert_eager(outs: list[np.ndarray], ref: tuple[torch.Tensor, ...]) -> None:
    assert len(outs) == len(ref)
    for got, want in zip(outs, ref):
        np.testing.assert_allclose(got, want.detach().numpy(), atol=2e-5, rtol=1e-5)


def test_the_cpp_runtime_runs_a_bundle_as_eager(saved: tuple[Path, nn.Module, torch.Tensor]) -> None:
    path, model, x = saved
    bundle = _C.Bundle.load(path)
    assert bundle.device == "cpu" and bundle.kiln_version == kiln.__version__ and len(bundle.engines) == 1
    assert [(io.name, list(io.shape)) for io in bundle.inputs] == [("args_0", [2, 3, 16, 16])]
    assert [list(io.shape) for io in bundle.outputs] == [[2, 5], [2, 8, 6, 6]]
    assert [(name, engine, args) for name, engine, args in bundle.steps] == [(bundle.steps[0][0], 0, [(-1, 0)])]
    with torch.no_grad():
        assert_eager(bundle.run([x.numpy()]), model(x))
        context = bundle.create_context()
        for seed in (1, 2):  # one context, new inputs each call
            x2 = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(seed))
            assert_eager(context.run([x2.numpy()]), model(x2))
    with pytest.raises(kiln.ShapeMismatchError, match=r"bundle input 0 'args_0' must be f32\[2,3,16,16\], got "
                                                      r"f32\[1,3,16,16\]"):
        bundle.run([x[:1].numpy()])


def test_kiln_run_runs_a_bundle_as_eager(saved: tuple[Path, nn.Module, torch.Tensor], tmp_path: Path) -> None:
    runner = kiln_run()
    if runner is None:
        pytest.skip("kiln-run is not built (set KILN_BUILD_DIR)")
    path, model, x = saved
    np.save(tmp_path / "x.npy", x.numpy())
    run = subprocess.run([runner, str(path), "--inputs", str(tmp_path / "x.npy"), "--iterations", "2", "--outputs",
                          str(tmp_path / "out")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert f"bundle: {path} (" in run.stdout and "1 engine, 1 step, on cpu)" in run.stdout, run.stdout
    outs = [np.load(f) for f in sorted((tmp_path / "out").glob("out*.npy"))]
    with torch.no_grad():
        assert_eager(outs, model(x))


def test_inputs_and_outputs_are_the_flattened_leaves(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = randomize(TwoInputs().eval())
    a, b = torch.randn(3, 6), torch.randn(3, 6)
    compiled = kiln.compile(model, [a, b], min_block_size=1)
    kiln.save(compiled, tmp_path / "two.kiln", [a, b], output_format="kiln_bundle")
    bundle = _C.Bundle.load(tmp_path / "two.kiln")
    assert [io.name for io in bundle.inputs] == ["args_0", "args_1"]
    h, s, a_out = bundle.run([a.numpy(), b.numpy()])
    with torch.no_grad():
        ref = model(a, b)
    assert_eager([h, s], (ref["h"], ref["s"]))
    np.testing.assert_array_equal(a_out, a.numpy())  # an input returned as is: copied


def test_write_bundle_of_a_module_or_its_exported_program_is_one_file(saved: tuple[Path, nn.Module, torch.Tensor],
                                                                      tmp_path: Path) -> None:
    _, model, x = saved
    compiled = kiln.compile(model, [x], min_block_size=1)
    ep = kiln.save(compiled, tmp_path / "cnn.ep", [x])
    write_bundle(ep, tmp_path / "program.kiln")
    write_bundle(compiled, tmp_path / "module.kiln", [x])
    kiln.save(compiled, tmp_path / "save.kiln", [x], output_format="kiln_bundle")
    data = (tmp_path / "module.kiln").read_bytes()
    assert (tmp_path / "program.kiln").read_bytes() == data and (tmp_path / "save.kiln").read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn.ep", "module.kiln", "program.kiln", "save.kiln"]
    with torch.no_grad():
        assert_eager(_C.Bundle.deserialize(data).run([x.numpy()]), model(x))


def test_ops_left_to_pytorch_are_named(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = randomize(SmallCNN().eval())
    x = torch.randn(2, 3, 16, 16)
    compiled = kiln.compile(model, [x], min_block_size=1, torch_executed_ops={"aten.max_pool2d"})
    assert compiled.summary.engines == 2
    with pytest.raises(kiln.UnsupportedError) as info:
        kiln.save(compiled, tmp_path / "m.kiln", [x], output_format="kiln_bundle")
    assert str(info.value).startswith(
        "kiln.save(output_format='kiln_bundle'): 1 op(s) of the program run in PyTorch, which a Kiln "
        "bundle cannot hold: aten.max_pool2d.default (node 'max_pool2d'); compile so that "
        "every op runs in an engine"), info.value
    assert not (tmp_path / "m.kiln").exists()


def test_what_a_bundle_cannot_hold_is_named(tmp_path: Path) -> None:
    class WithNone(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
            return torch.relu(x) * 2, None

    x = torch.randn(4, 4)
    compiled = kiln.compile(WithNone(), [x], min_block_size=1)
    with pytest.raises(kiln.UnsupportedError, match="output 1 is the constant None, not a value a Kiln bundle "
                                                    "computes"):
        kiln.save(compiled, tmp_path / "m.kiln", [x], output_format="kiln_bundle")

    torch.manual_seed(0)
    model = randomize(TwoInputs().eval()).double()
    a, b = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64)
    compiled = kiln.compile(model, [a, b], min_block_size=1, truncate_double=True)
    with pytest.raises(kiln.UnsupportedError, match=r"passes program input 0 'args_0' \(f64\[3,6\]\) to engine 0 "
                                                    r"input 0 .* \(f32\[3,6\]\) \(engines built with "
                                                    r"truncate_double=True"):
        kiln.save(compiled, tmp_path / "m.kiln", [a, b], output_format="kiln_bundle")

    with pytest.raises(ValueError, match="kiln.save: unknown output_format 'bundle'; expected one of "
                                         "'exported_program', 'kiln_bundle'"):
        kiln.save(compiled, tmp_path / "m.kiln", [a, b], output_format="bundle")
    assert not (tmp_path / "m.kiln").exists()


def test_a_damaged_bundle_is_a_clear_error(saved: tuple[Path, nn.Module, torch.Tensor], tmp_path: Path) -> None:
    path, model, x = saved
    data = bytearray(path.read_bytes())
    damaged = tmp_path / "damaged.kiln"
    data[100] ^= 1
    damaged.write_bytes(bytes(data))
    with pytest.raises(kiln.CorruptedError, match=rf"bundle checksum mismatch .*: the file is damaged \(file "
                                                  rf"'{damaged}'\)"):
        _C.Bundle.load(damaged)
    with pytest.raises(kiln.TruncatedError, match=r"bundle truncated: it has 60 bytes, its header records"):
        _C.Bundle.deserialize(path.read_bytes()[:60])
    with pytest.raises(kiln.CorruptedError, match="not a Kiln bundle: bad magic"):
        _C.Bundle.deserialize(_C.Bundle.load(path).engines[0].serialize())

    runner = kiln_run()
    if runner is None:
        pytest.skip("kiln-run is not built (set KILN_BUILD_DIR)")
    run = subprocess.run([runner, str(damaged)], capture_output=True, text=True)
    assert run.returncode == 1 and "kiln-run: error: [corrupted] bundle checksum mismatch" in run.stderr, run.stderr
    assert f"(bundle '{damaged}')" in run.stderr
    # A program saved as a torch.export archive: kiln-run says how to save a bundle instead.
    compiled = kiln.compile(model, [x], min_block_size=1)
    kiln.save(compiled, tmp_path / "cnn.ep", [x])
    run = subprocess.run([runner, str(tmp_path / "cnn.ep")], capture_output=True, text=True)
    assert run.returncode == 1 and "is a zip archive" in run.stderr, run.stderr
    assert 'kiln.save(..., output_format="kiln_bundle")' in run.stderr


@pytest.mark.cuda
def test_a_cuda_bundle_runs_as_eager(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = randomize(SmallCNN().eval()).cuda()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    compiled = kiln.compile(model, [x], min_block_size=1)
    kiln.save(compiled, tmp_path / "cnn.kiln", [x], output_format="kiln_bundle")
    bundle = _C.Bundle.load(tmp_path / "cnn.kiln")
    assert bundle.device == "cuda:0"
    with torch.no_grad():
        ref = tuple(t.cpu() for t in model(x))
    for got, want in zip(bundle.run([x.cpu().numpy()]), ref):  # TF32 may round the convolutions
        np.testing.assert_allclose(got, want.numpy(), atol=2e-2, rtol=2e-2)
    # On device buffers, through a context, twice (the second call replays CUDA graphs).
    outs = [torch.empty_like(t, device="cuda") for t in ref]
    context = bundle.create_context()
    for _ in range(2):
        context.execute_ptrs([x.data_ptr()], [o.data_ptr() for o in outs], torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        for got, want in zip(outs, ref):
            torch.testing.assert_close(got.cpu(), want, atol=2e-2, rtol=2e-2)
