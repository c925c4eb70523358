"""Matmuls read permuted, expanded and scaled operands where they lie (a_view / b_view, alpha)
and write the order their reader wants (out_perm): DeBERTa-style relative scores, with head
splits, a key transposed and divided by a scale, a position table expanded over the batch and
transposed, and the head merge after p @ v, build with no permute, expand or division left,
and match eager PyTorch (f32 reference) in f32 and f16, also after kiln.save / kiln.load."""

from __future__ import annotations

import pytest
import torch

import kiln
from harness import compile_checked
from kiln.testing import relative_error

_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not (torch.cuda.is_available() and kiln.cuda_available()), reason="needs a CUDA device"))]


class RelativeScores(torch.nn.Module):
    """DeBERTa's score terms without its softmax (which would become one sdpa): q k^T / scale plus
    q . pos^T over a position table given as an input (so not folded) and shared by every
    sequence, then tanh(scores) v merged back to [b, s, h * d]."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(3))
        self.pos = torch.nn.Linear(dim, dim)
        self.out = torch.nn.Linear(dim, dim)

    def split(self, x: torch.Tensor) -> torch.Tensor:  # [b, s, h * d] -> [b * h, s, d]
        b, s, _ = x.shape
        return x.view(b, s, self.heads, -1).permute(0, 2, 1, 3).contiguous().view(b * self.heads, s, -1)

    def forward(self, x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        b, s, e = x.shape
        q, k, v = (self.split(p(x)) for p in self.qkv)
        d = q.shape[-1]
        scale = (3 * d) ** 0.5
        pos = self.pos(table).view(1, -1, self.heads, d).permute(0, 2, 1, 3)  # [1, h, p, d]
        pos = pos.expand(b, -1, -1, -1).reshape(b * self.heads, -1, d)
        scores = q @ (k.transpose(-1, -2) / scale) + (q @ pos.transpose(-1, -2))[..., :s] / scale
        out = torch.tanh(scores) @ v
        return self.out(out.view(b, self.heads, s, d).permute(0, 2, 1, 3).contiguous().view(b, s, e))


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_relative_attention_reads_operands_in_place(device: str, dtype: torch.dtype, tmp_path) -> None:
    if device == "cpu" and dtype == torch.float16:
        pytest.skip("the CPU backend computes f16 through f32; f32 covers its kernels")
    torch.manual_seed(0)
    model = RelativeScores(dim=64, heads=4).eval().to(device)
    x = torch.randn(3, 24, 64, device=device)
    table = torch.randn(40, 64, device=device)
    with torch.no_grad():
        ref = model(x, table)
    model.to(dtype)
    compiled = compile_checked(model, [x.to(dtype), table.to(dtype)], ref, dtype,
                               1e-5 if dtype == torch.float32 else 1e-2, str(tmp_path))
    (engine,) = compiled.engines()
    plan = engine.engine.graph()
    matmuls = [n for n in plan.nodes if n.op == "matmul"]
    assert len(matmuls) == 3
    # tanh(scores) is read as it is (reshaped to [b, h, s, s]); the others through views
    assert all("b_view" in n.attrs for n in matmuls) and sum("a_view" in n.attrs for n in matmuls) == 2
    assert sum("alpha" in n.attrs for n in matmuls) == 1
    producers = {v: n for n in plan.nodes for v in n.outputs}
    for n in matmuls:
        for v in n.inputs:
            assert producers[v].op not in ("permute", "expand", "div") if v in producers else True
    assert not [n for n in plan.nodes if n.op in ("expand", "permute")]  # the head merge too: out_perm
    assert [n.attrs.get("out_perm") for n in matmuls if "out_perm" in n.attrs] == [[0, 2, 1, 3]]


@torch.no_grad()
def test_a_sequence_range_is_served_by_instances_of_one_engine() -> None:
    """The views' sizes and strides are integers of the plan; a dense operand is reshaped rather
    than viewed, so every size in the range fits one engine (its strides would be s * s)."""
    from kiln.dynamic import dynamic_program_of
    from kiln.runtime import KilnEngineModule

    torch.manual_seed(0)
    model = RelativeScores(dim=64, heads=4).eval()
    seq = torch.export.Dim("seq", min=4, max=32)
    table = torch.randn(40, 64)
    try:
        compiled = kiln.compile(model, [torch.randn(2, 16, 64), table], dynamic_shapes=({1: seq}, None),
                                dynamic_instances=True)
    except torch._dynamo.exc.UserError as err:  # raised by torch.export itself, before Kiln
        if "min(16*" not in str(err):
            raise
        pytest.skip(f"torch {torch.__version__}'s export cannot prove its own stride guard for this model")
    program = dynamic_program_of(compiled)
    assert program is not None
    for s in (5, 17, 32, 4):
        x = torch.randn(2, s, 64)
        assert relative_error(compiled(x, table), model(x, table)) < 1e-5
        runners = [r for spec in program.live.values() if s in spec.binding.values() for r in spec.runners
                   if isinstance(r, KilnEngineModule)]
        assert runners and all(r.engine.is_instance for r in runners), s
