"""Sums and means of squares read their input once (reduce {square}): an L2 normalization over
the channel dim and a sum of squares over every dim build with no square of their own left; RMSNorm
as Llama and T5 write it (an f32 upcast, pow(2), mean over the last dim) builds into one
layer_norm {rms} with no reduction at all. All match eager PyTorch (f32 reference) in f32 and f16
(CUDA), also after kiln.save / kiln.load."""

from __future__ import annotations

import pytest
import torch

import kiln
from harness import compile_checked

_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not (torch.cuda.is_available() and kiln.cuda_available()), reason="needs a CUDA device"))]


class RmsNormBlock(torch.nn.Module):
    """A linear, then RMSNorm computed in f32 as transformers' Llama / T5 do, then its weight."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(dim, dim)
        self.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        f = h.to(torch.float32)
        f = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * f.to(h.dtype)


class Norms(torch.nn.Module):
    """An L2 normalization over dim 1 of [n, c, l] (an outer dim), and the total sum of squares."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.nn.functional.normalize(x, dim=1), (x * x).sum()


def _squares_left(compiled: kiln.KilnModule) -> int:
    """Reductions in the plans that still read a mul of a value by itself."""
    left = 0
    for engine in compiled.engines():
        plan = engine.engine.graph()
        producers = {v: n for n in plan.nodes for v in n.outputs}
        for n in plan.nodes:
            p = producers.get(n.inputs[0]) if n.op.startswith("reduce_") else None
            left += p is not None and p.op == "mul" and p.inputs[0] == p.inputs[1]
    return left


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", ["rms_norm", "norms"])
def test_squares_are_formed_by_the_reduction(device: str, dtype: torch.dtype, case: str, tmp_path) -> None:
    if device == "cpu" and dtype == torch.float16:
        pytest.skip("the CPU backend computes f16 through f32; f32 covers its kernels")
    torch.manual_seed(0)
    if case == "rms_norm":
        model, x = RmsNormBlock(96).eval().to(device), torch.randn(2, 17, 96, device=device)
    else:
        model, x = Norms().eval(), torch.randn(3, 40, 33, device=device)
    with torch.no_grad():
        ref = model(x)
    model.to(dtype)
    compiled = compile_checked(model, [x.to(dtype)], ref, dtype, 1e-5 if dtype == torch.float32 else 5e-3,
                               str(tmp_path))
    plans = [e.engine.graph() for e in compiled.engines()]
    squared = [n for p in plans for n in p.nodes if n.op.startswith("reduce_") and n.attrs.get("square")]
    rms = [n for p in plans for n in p.nodes if n.op == "layer_norm" and n.attrs.get("rms")]
    assert (len(squared), len(rms)) == ((0, 1) if case == "rms_norm" else (2, 0))
    assert _squares_left(compiled) == 0
