"""Deployment without Python, end to end: a small CNN compiled by Kiln on the CPU and saved as a
Kiln bundle, run by the C++ example run_bundle (built against the installed package), whose
outputs must match eager PyTorch.

    python examples/cpp/check_bundle.py build/example/run_bundle

scripts/test.sh runs it after building examples/cpp (examples/cpp/CMakeLists.txt).
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import kiln

log = logging.getLogger("kiln.example")


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.bn(self.conv1(x)))
        y = torch.relu(self.conv2(torch.nn.functional.max_pool2d(y, 2)))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(y, 1), 1)), y


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_bundle", help="the run_bundle binary built from examples/cpp")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    torch.manual_seed(0)
    model = SmallCNN().eval()
    with torch.no_grad():  # non-trivial batch-norm statistics, so that folding it is checked
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 16, 16)
    compiled = kiln.compile(model, [x], min_block_size=1, require_full_compilation=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        kiln.save(compiled, folder / "model.kiln", [x], output_format="kiln_bundle")
        x.numpy().tofile(folder / "input0.bin")
        run = subprocess.run([args.run_bundle, str(folder / "model.kiln"), tmp, tmp], capture_output=True, text=True)
        log.info("%s", run.stdout.rstrip())
        if run.returncode != 0:
            log.error("run_bundle failed (exit %d): %s", run.returncode, run.stderr.strip())
            return 1
        with torch.no_grad():
            want = model(x)
        for i, ref in enumerate(want):
            got = np.fromfile(folder / f"output{i}.bin", dtype=np.float32).reshape(ref.shape)
            error = float(np.abs(got - ref.numpy()).max())
            if not np.allclose(got, ref.numpy(), rtol=1e-4, atol=1e-4):
                log.error("output %d differs from eager PyTorch: max abs error %.3g", i, error)
                return 1
            log.info("output %d %s matches eager PyTorch (max abs error %.3g)", i, list(ref.shape), error)
    return 0


if __name__ == "__main__":
    sys.exit(main())
