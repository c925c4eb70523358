"""Concats computed part by part in one generated CUDA kernel (fuse_pointwise_concats), against
eager PyTorch in FP32 on a GPU: GPT-NeoX's partial rotary embedding (the rotated first columns of
each head joined to the columns that pass, read where the qkv projection left them) with rotary
widths whose parts start on a 16-byte boundary (the vectorized kernel) and widths that do not (the
element kernel), and Swin's patch merge (four strided views of one tensor joined). Each plan must
hold a fused node whose body ends in the concat and no concat of its own; outputs within 1e-2
(FP16 / BF16) or 2e-3 (FP32, whose linears run with TF32) of eager FP32, with and without CUDA
graphs replaying the engine.
Skipped, with the reason, where Kiln has no CUDA device."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kiln
import kiln.pipeline
from kiln import _C
from kiln.runtime import builder_config
from kiln.testing import relative_error

pytestmark = pytest.mark.cuda  # skipped without a GPU (conftest.py)

# FP32 linears run with TF32, Kiln's default (as torch.compile's users get): 2e-3.
TOLERANCE = {torch.float32: 2e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}


class PartialRotary(torch.nn.Module):
    """q and k of a GPT-NeoX attention: the first `rot` of each head's columns rotate."""

    def __init__(self, heads: int, head_dim: int, rot: int) -> None:
        super().__init__()
        self.heads, self.head_dim, self.rot = heads, head_dim, rot
        self.qkv = torch.nn.Linear(heads * head_dim, 3 * heads * head_dim)
        inv = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
        angles = torch.outer(torch.arange(512).float(), inv)
        self.register_buffer("cos", torch.cat([angles, angles], -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat([angles, angles], -1).sin(), persistent=False)

    @staticmethod
    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat([-x[..., half:], x[..., :half]], -1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, self.heads, 3 * self.head_dim).permute(0, 2, 1, 3)
        q, k = qkv[..., :self.head_dim], qkv[..., self.head_dim:2 * self.head_dim]
        cos, sin = self.cos[:s].to(x.dtype), self.sin[:s].to(x.dtype)
        out = []
        for t in (q, k):
            r, p = t[..., :self.rot], t[..., self.rot:]
            out.append(torch.cat([r * cos + self.rotate_half(r) * sin, p], -1))
        return out[0], out[1]


class PatchMerge(torch.nn.Module):
    """Swin's patch merging: the four 2x2-strided views of [B, H, W, C] joined along C, a norm."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(4 * c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]]
        return self.norm(torch.cat(parts, -1))


def _concat_bodies(plan: Any) -> tuple[int, int]:
    bodies = sum(1 for n in plan.nodes if n.op == "fused_pointwise" and any(b.op == "concat" for b in n.body.nodes))
    return bodies, sum(1 for n in plan.nodes if n.op == "concat")


def _check(model: torch.nn.Module, inputs: list[torch.Tensor], dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch,
           bodies: int) -> None:
    build = kiln.pipeline.build_engine
    plans: list[Any] = []

    def recording(description: Any, settings: Any, device: str, *args: Any) -> Any:
        plans.append(_C.Builder(builder_config(settings, device)).optimize(_C.import_aten(description)))
        return build(description, settings, device, *args)

    monkeypatch.setattr(kiln.pipeline, "build_engine", recording)
    model = model.eval()
    with torch.no_grad():
        want = model(*inputs)
        model, inputs = model.to("cuda", dtype), [t.to("cuda", dtype) for t in inputs]
        for graphs in (False, True):
            torch._dynamo.reset()
            compiled = torch.compile(model, backend="kiln", dynamic=False,
                                     options={"min_block_size": 1, "enabled_precisions": {dtype},
                                              "use_cuda_graphs": graphs, "cache_built_engines": False,
                                              "reuse_cached_engines": False})
            for _ in range(2):
                got = compiled(*inputs)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert relative_error(g.float(), w) < TOLERANCE[dtype], (dtype, graphs)
    assert plans and _concat_bodies(plans[-1]) == (bodies, 0), plans[-1].to_string()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("rot", [16, 6], ids=["aligned", "unaligned"])
def test_partial_rotary_is_one_kernel_per_concat(rot: int, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    head_dim = 64 if rot == 16 else 24
    _check(PartialRotary(4, head_dim, rot), [torch.randn(3, 37, 4 * head_dim)], dtype, monkeypatch, bodies=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_patch_merge_joins_its_strided_views_in_one_kernel(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(1)
    _check(PatchMerge(24), [torch.randn(2, 14, 14, 24)], dtype, monkeypatch, bodies=1)
