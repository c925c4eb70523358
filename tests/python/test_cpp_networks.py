"""Networks built by the C++ API alone (examples/cpp/networks.cpp), saved as engine files, run in
a fresh process by kiln-run, must match PyTorch eager modules loaded with the same weights."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


def _find(binary: str) -> str | None:
    build = os.environ.get("KILN_BUILD_DIR")
    if build and (Path(build) / binary).exists():
        return str(Path(build) / binary)
    return shutil.which(binary)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    networks = _find("kiln-networks")
    if networks is None:
        pytest.skip("kiln-networks is not built (set KILN_BUILD_DIR to the CMake build directory)")
    out = tmp_path_factory.mktemp("cpp_networks")
    subprocess.run([networks, str(out)], check=True, capture_output=True, text=True)
    return out


def _kiln_run(artifacts: Path, net: str) -> np.ndarray:
    kiln_run = _find("kiln-run")
    assert kiln_run is not None, "kiln-run is not installed"
    outdir = artifacts / f"{net}.out"
    outdir.mkdir(exist_ok=True)
    subprocess.run(
        [kiln_run, str(artifacts / f"{net}.kiln"), "--inputs", str(artifacts / f"{net}.input.npy"),
         "--iterations", "3", "--outputs", str(outdir)],
        check=True, capture_output=True, text=True)
    files = sorted(outdir.glob("*.npy"))
    assert len(files) == 1, files
    return np.load(files[0])


def _w(artifacts: Path, net: str, name: str) -> torch.Tensor:
    return torch.from_numpy(np.load(artifacts / f"{net}.{name}.npy"))


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_convnet_matches_eager(artifacts: Path) -> None:
    w = lambda name: _w(artifacts, "convnet", name)  # noqa: E731
    x = torch.from_numpy(np.load(artifacts / "convnet.input.npy"))
    h = F.conv2d(x, w("conv1.weight"), w("conv1.bias"), padding=1)
    h = F.batch_norm(h, w("bn1.running_mean"), w("bn1.running_var"), w("bn1.weight"), w("bn1.bias"), eps=1e-5)
    h = F.max_pool2d(F.relu(h), 2)
    h = F.relu(F.conv2d(h, w("conv2.weight"), w("conv2.bias"), padding=1))
    h = F.adaptive_avg_pool2d(h, 1).flatten(1)
    ref = F.linear(h, w("fc.weight"), w("fc.bias"))
    out = torch.from_numpy(_kiln_run(artifacts, "convnet"))
    assert out.shape == ref.shape
    assert _rel_err(out, ref) < 1e-4


def test_transformer_block_matches_eager(artifacts: Path) -> None:
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                       activation="gelu", batch_first=True).eval()
    names = {
        "self_attn.in_proj_weight": "self_attn.in_proj.weight",
        "self_attn.in_proj_bias": "self_attn.in_proj.bias",
    }
    state = {k: _w(artifacts, "transformer", names.get(k, k)) for k in layer.state_dict()}
    layer.load_state_dict(state)
    x = torch.from_numpy(np.load(artifacts / "transformer.input.npy"))
    with torch.no_grad():
        ref = layer(x)
    out = torch.from_numpy(_kiln_run(artifacts, "transformer"))
    assert out.shape == ref.shape
    assert _rel_err(out, ref) < 1e-4
