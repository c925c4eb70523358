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


def _is_one_sdpa_matching_eager(model: torch.nn.Module, x: torch.Tensor) -> None:
    ops = [n.op for g in plan_graphs(model, [x], torch.float32, "cpu") for n in g.nodes]
    assert ops.count("sdpa") == 1 and "softmax" not in ops and "matmul" not in ops, ops
    with torch.no_grad():
        want = model(x)
        got = kiln.compile(model, [x], min_block_size=1, require_full_compilation=True)(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_window_attention_is_one_sdpa_and_matches_eager() -> None:
    torch.manual_seed(0)
    _is_one_sdpa_matching_eager(WindowAttention().eval(), torch.randn(4, 9, 32))


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


class EinsumAttention(torch.nn.Module):
    """MaxViT-style: 5-D [B, G, H, N, D] heads, scores and output by einsum, a relative bias."""

    def __init__(self, dim: int = 32, heads: int = 4, tokens: int = 9, scale_k: bool = False) -> None:
        super().__init__()
        self.heads, self.scale_k = heads, scale_k
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.bias = torch.nn.Parameter(torch.randn(heads, tokens, tokens))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, g, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, g, n, self.heads, 3 * c // self.heads).transpose(2, 3).chunk(3, dim=-1)
        if self.scale_k:  # as torchvision's MaxViT does, after the head split
            k = k * (c // self.heads) ** -0.5
        else:
            q = q * (c // self.heads) ** -0.5
        scores = torch.einsum("bghid,bghjd->bghij", q, k) + self.bias
        out = torch.einsum("bghij,bghjd->bghid", scores.softmax(dim=-1), v)
        return out.transpose(2, 3).reshape(b, g, n, c)


@pytest.mark.parametrize("scale_k", [False, True], ids=["q-scaled", "k-scaled"])
def test_einsum_attention_is_one_sdpa_and_matches_eager(scale_k: bool) -> None:
    """Either operand's scale, through the head split, goes into sdpa's scale: no multiply is left."""
    torch.manual_seed(0)
    model, x = EinsumAttention(scale_k=scale_k).eval(), torch.randn(2, 3, 9, 32)
    _is_one_sdpa_matching_eager(model, x)
    ops = [n.op for g in plan_graphs(model, [x], torch.float32, "cpu") for n in g.nodes]
    assert "mul" not in ops and "fused_pointwise" not in ops, ops


@pytest.mark.cuda
def test_cuda_einsum_attention_with_a_scaled_key_fp16() -> None:
    torch.manual_seed(0)
    model = EinsumAttention(scale_k=True).eval().to("cuda")
    x = torch.randn(2, 3, 9, 32, device="cuda")
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model.half(), backend="kiln", options={
            "min_block_size": 1, "require_full_compilation": True, "enabled_precisions": {torch.float16}})(x.half())
    assert ((got.float() - want).norm() / want.norm()).item() < 5e-3


class Einsum(torch.nn.Module):
    def __init__(self, equation: str) -> None:
        super().__init__()
        self.equation = equation

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return torch.einsum(self.equation, *xs)


# (equation, operand shapes): batched products in any letter order, several letters per matrix
# dim, a broadcast batch dim, outer and inner products; then what stays PyTorch's decomposition
# (one or three operands, "...", a letter summed within one operand, a diagonal).
EINSUMS = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhid,bhjd->bhij", [(2, 3, 5, 8), (2, 3, 6, 8)]),
    ("ijb,bkj->bki", [(3, 4, 2), (2, 5, 4)]),
    ("bxyc,cd->bxyd", [(2, 3, 4, 5), (5, 6)]),
    ("abcd,abed->acbe", [(2, 3, 4, 5), (2, 1, 6, 5)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,ij->", [(3, 4), (3, 4)]),
    ("bmnk,bkpq->bmnpq", [(2, 3, 4, 5), (2, 5, 2, 3)]),
    ("ij->ji", [(3, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("bij,bjk->bi", [(2, 3, 4), (2, 4, 5)]),
    ("ii,ij->ij", [(3, 3), (3, 4)]),
]


@pytest.mark.parametrize("equation,shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
def test_einsum_matches_eager(equation: str, shapes: list[tuple[int, ...]]) -> None:
    gen = torch.Generator().manual_seed(len(equation))
    xs = [torch.randn(*s, generator=gen) for s in shapes]
    model = Einsum(equation).eval()
    with torch.no_grad():
        got = kiln.compile(model, xs, min_block_size=1)(*xs)
    torch.testing.assert_close(got, torch.einsum(equation, *xs), rtol=1e-5, atol=1e-5)
