"""Fused pointwise kernels and concats read permuted, split and sliced inputs where they lie
("view<i>", fold_input_views): rotary embeddings on a head split (Llama's, rotating whole heads)
and on part of each head of a fused q / k / v projection (GPT-NeoX's partial rotary, its rotated
part concatenated with the rest) build with no permute, split or slice left, and match eager
PyTorch (f32 reference) in f32 and f16, also after kiln.save / kiln.load."""

from __future__ import annotations

import pytest
import torch

import kiln
from harness import compile_checked

_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not (torch.cuda.is_available() and kiln.cuda_available()), reason="needs a CUDA device"))]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rotary(torch.nn.Module):
    """Projects x to q and k heads and rotates the first `rot` dims of each head (all of them for
    Llama; a quarter for GPT-NeoX, whose q, k and v come from one projection and are split)."""

    def __init__(self, dim: int, heads: int, rot: int, fused_qkv: bool, seq: int) -> None:
        super().__init__()
        self.heads, self.head_dim, self.rot, self.fused = heads, dim // heads, rot, fused_qkv
        self.proj = torch.nn.Linear(dim, 3 * dim if fused_qkv else 2 * dim)
        angles = torch.arange(seq)[:, None] * torch.rand(rot // 2)[None, :]
        self.register_buffer("cos", torch.cat((angles, angles), -1).cos())
        self.register_buffer("sin", torch.cat((angles, angles), -1).sin())

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        x_rot, x_pass = x[..., :self.rot], x[..., self.rot:]
        x_rot = x_rot * self.cos + _rotate_half(x_rot) * self.sin
        return torch.cat((x_rot, x_pass), dim=-1) if x_pass.shape[-1] else x_rot

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        p = self.proj(x)
        if self.fused:  # [b, s, h, 3d] -> [b, h, s, 3d], split
            q, k, _ = p.view(b, s, self.heads, -1).permute(0, 2, 1, 3).chunk(3, dim=-1)
        else:
            q, k = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in p.chunk(2, dim=-1))
        return self.rotate(q) * 0.5 + self.rotate(k).sigmoid()


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("variant", ["llama", "neox"])
def test_rotary_kernels_read_the_projection_in_place(device: str, dtype: torch.dtype, variant: str,
                                                       tmp_path) -> None:
    if device == "cpu" and dtype == torch.float16:
        pytest.skip("the CPU backend computes f16 through f32; f32 covers its kernels")
    torch.manual_seed(0)
    rot, fused = (32, False) if variant == "llama" else (8, True)
    model = Rotary(128, 4, rot, fused, seq=12).eval().to(device)
    x = torch.randn(2, 12, 128, device=device)
    with torch.no_grad():
        ref = model(x)
    model.to(dtype)
    compiled = compile_checked(model, [x.to(dtype)], ref, dtype, 1e-5 if dtype == torch.float32 else 5e-3,
                               str(tmp_path))
    (engine,) = compiled.engines()
    plan = engine.engine.graph()
    assert not [n.op for n in plan.nodes if n.op in ("permute", "split", "slice")]
    viewed = [n.op for n in plan.nodes for k in n.attrs if k.startswith("view")]
    assert viewed.count("fused_pointwise") >= 2  # q's and k's rotations at least
    assert viewed.count("concat") == (2 if variant == "neox" else 0)  # q's and k's passing parts
