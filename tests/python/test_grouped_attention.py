"""Grouped-query attention and causal masks: a Llama-style block (separate q / k / v projections,
k and v with fewer heads repeated as transformers' repeat_kv does, a causal mask built in the
forward as transformers builds it, SwiGLU) compiles with the mask turned into sdpa's causal flag
(causal_attention_masks) and, on CUDA, k and v read once per group of heads through stride-0
views (fold_attention_layout): no expand left. Outputs match eager PyTorch (f32 reference) in f32
and f16, also after kiln.save / kiln.load; a padding mask input stays a mask, and the causal
triangle and-ed with one becomes the causal flag with the padding mask alone."""

from __future__ import annotations

import pytest
import torch

import kiln
from harness import compile_checked

_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not (torch.cuda.is_available() and kiln.cuda_available()), reason="needs a CUDA device"))]


class GroupedBlock(torch.nn.Module):
    """Attention with `kv_heads` k / v heads for `heads` query heads, then a SwiGLU MLP."""

    def __init__(self, dim: int, heads: int, kv_heads: int, mask: str) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.mask = heads, kv_heads, dim // heads, mask
        self.q = torch.nn.Linear(dim, dim, bias=False)
        self.k = torch.nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = torch.nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = torch.nn.Linear(dim, dim, bias=False)
        self.gate = torch.nn.Linear(dim, 2 * dim, bias=False)
        self.up = torch.nn.Linear(dim, 2 * dim, bias=False)
        self.down = torch.nn.Linear(2 * dim, dim, bias=False)

    def repeat_kv(self, x: torch.Tensor) -> torch.Tensor:
        b, h, s, d = x.shape
        n_rep = self.heads // h
        return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)

    def forward(self, x: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, -1).transpose(1, 2)
        k = self.repeat_kv(self.k(x).view(b, s, self.kv_heads, -1).transpose(1, 2))
        v = self.repeat_kv(self.v(x).view(b, s, self.kv_heads, -1).transpose(1, 2))
        causal = False
        if self.mask == "additive":  # transformers: the dtype's lowest above the diagonal
            mask = torch.full((s, s), torch.finfo(x.dtype).min, dtype=x.dtype, device=x.device).triu(1)[None, None]
        elif self.mask == "bool":
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        elif self.mask == "padding":
            mask = padding[:, None, None, :].to(torch.bool)
        elif self.mask == "causal+padding":
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril() & padding[:, None, None, :].to(torch.bool)
        else:
            mask, causal = None, True
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        x = x + self.o(y.transpose(1, 2).reshape(b, s, -1))
        return x + self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("mask", ["additive", "bool", "is_causal", "padding", "causal+padding"])
def test_grouped_causal_block_matches_eager(device: str, dtype: torch.dtype, mask: str, tmp_path) -> None:
    if device == "cpu" and dtype == torch.float16:
        pytest.skip("the CPU backend computes f16 through f32; f32 covers its kernels")
    torch.manual_seed(0)
    model = GroupedBlock(256, 4, 2, mask).eval().to(device)
    x = torch.randn(2, 24, 256, device=device)
    args = [x]
    if "padding" in mask:
        padding = torch.ones(2, 24, device=device)
        padding[1, 17:] = 0
        args.append(padding)
    with torch.no_grad():
        ref = model(*args)
    model.to(dtype)
    args = [a.to(dtype) if a.is_floating_point() and a is x else a for a in args]
    compiled = compile_checked(model, args, ref, dtype, 1e-5 if dtype == torch.float32 else 5e-3, str(tmp_path))
    (engine,) = compiled.engines()
    plan = engine.engine.graph()
    (sdpa,) = [n for n in plan.nodes if n.op == "sdpa"]
    assert sdpa.attrs.get("causal", False) == (mask != "padding")
    assert len(sdpa.inputs) == (4 if "padding" in mask else 3)
    if "padding" in mask:  # one mask row per batch, not one per score
        assert plan.type(sdpa.inputs[3]).shape[-2:] == [1, 24]
    if device == "cuda":  # k and v: stride-0 views over the repeated heads, no copy
        assert "k_view" in sdpa.attrs and "v_view" in sdpa.attrs
        assert not [n.op for n in plan.nodes if n.op in ("expand", "permute")]
