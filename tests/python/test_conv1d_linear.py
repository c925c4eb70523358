"""GPT-2's Conv1D: addmm(bias, x, w) with a [K, N] weight becomes a linear on w's transpose.

The transpose is folded into a constant, so the bias (and a following residual add) join the
GEMM's epilogue instead of running as their own kernel. Checked on the CPU and, where Kiln has a
CUDA device, on CUDA: the plan holds one linear and no matmul or top-level add, the output
matches eager on random weights and inputs, and kiln.refit with other weights gives their output.
"""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln.runtime import KilnEngineModule
from kiln.testing import relative_error


class _Conv1D(torch.nn.Module):
    """transformers' Conv1D followed by a residual add: x @ w + b + x."""

    def __init__(self, seed: int, k: int = 32) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(k, k, generator=g) / k**0.5)
        self.bias = torch.nn.Parameter(torch.randn(k, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[:-1] + (self.weight.shape[1],)
        y = torch.addmm(self.bias, x.view(-1, x.shape[-1]), self.weight).view(shape)
        return y + x


def _plan(compiled: torch.nn.Module) -> str:
    engines = [m for m in compiled.modules() if isinstance(m, KilnEngineModule)]
    assert len(engines) == 1
    return engines[0].engine.graph_text


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_conv1d_is_a_linear_with_its_bias_and_residual_in_the_epilogue(device: str) -> None:
    torch.manual_seed(0)
    old, new = _Conv1D(seed=1).eval(), _Conv1D(seed=2).eval()
    dtype = torch.half if device == "cuda" else torch.float32
    tol = 1e-2 if dtype == torch.half else 1e-4
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        want_old, want_new = old(x), new(x)
        model = old.to(device, dtype)
        xd = x.to(device, dtype)
        compiled = kiln.compile(model, [xd], enabled_precisions={dtype}, min_block_size=1, immutable_weights=False)
        err = relative_error(compiled(xd).float().cpu(), want_old)
        assert err < tol, f"relative error {err:.2e} against eager FP32"
        plan = _plan(compiled)
        top = [line for line in plan.splitlines() if not line.startswith("    ")]
        assert sum("= linear(" in line for line in top) == 1, plan
        assert not any("= matmul(" in line or "= add(" in line for line in top), plan
        kiln.refit(compiled, new.to(device, dtype))
        err = relative_error(compiled(xd).float().cpu(), want_new)
    assert err < tol, f"relative error {err:.2e} after kiln.refit against the new weights' eager output"
