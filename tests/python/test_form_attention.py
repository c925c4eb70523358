"""Attention written out as ops (q @ k^T, a scale, a relative-position bias, a window mask, softmax,
@ v) runs as one sdpa inside the engine and matches eager, on the CPU and (marked ``cuda``) on a
GPU in FP16."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import kiln

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from plan_traffic import plan_graphs  # noqa: E402


class WindowAttention(torch.nn.Module):
    """Swin-style: qkv projection, per-head relative bias, a shift mask over windows."""

    def __init__(self, dim: int = 32, heads: int = 4, tokens: int = 9, windows: int = 2) -> None:
        super().__init__()
        self.heads, self.windows = heads, windows
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.bias = torch.nn.Parameter(torch.randn(heads, tokens, tokens))
        self.register_buffer("mask", torch.where(torch.rand(windows, tokens, tokens) > 0.3, 0.0, -100.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1) + self.bias
        attn = attn.view(b // self.windows, self.windows, self.heads, n, n) + self.mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, self.heads, n, n).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


def test_window_attention_is_one_sdpa_and_matches_eager() -> None:
    torch.manual_seed(0)
    model, x = WindowAttention().eval(), torch.randn(4, 9, 32)
    ops = [n.op for g in plan_graphs(model, [x], torch.float32, "cpu") for n in g.nodes]
    assert ops.count("sdpa") == 1 and "softmax" not in ops and "matmul" not in ops, ops
    with torch.no_grad():
        want = model(x)
        got = kiln.compile(model, [x], min_block_size=1, require_full_compilation=True)(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
def test_cuda_window_attention_fp16() -> None:
    torch.manual_seed(0)
    model = WindowAttention().eval().to("cuda", torch.float16)
    x = torch.randn(4, 9, 32).to("cuda", torch.float16)
    with torch.no_grad():
        want = model.float()(x.float())
        model.half()
        got = torch.compile(model, backend="kiln", options={"min_block_size": 1, "require_full_compilation": True,
                                                            "enabled_precisions": {torch.float16}})(x)
    assert ((got.float() - want).norm() / want.norm()).item() < 5e-3
