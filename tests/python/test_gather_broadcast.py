"""A gather whose index is expanded over batch and heads (DeBERTa's relative-position scores)
reads the index broadcast: the engine has no expand and no index of the expanded size, and its
outputs match eager PyTorch."""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln.testing import relative_error


class RelativeScores(torch.nn.Module):
    """content-to-position scores: q . rel^T over 2s-1 relative positions, gathered per (i, j)."""

    def __init__(self, seq: int, dim: int) -> None:
        super().__init__()
        self.rel = torch.nn.Parameter(torch.randn(2 * seq - 1, dim))
        pos = torch.arange(seq)
        self.register_buffer("index", (pos[None, :] - pos[:, None] + seq - 1)[None], persistent=False)

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        c2p = q @ self.rel.t()  # [b * h, s, 2s - 1]
        idx = self.index.expand(q.shape[0], q.shape[1], q.shape[1])
        return torch.gather(c2p, -1, idx).softmax(-1)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not (torch.cuda.is_available() and kiln.cuda_available()), reason="needs a CUDA device"))])
def test_expanded_gather_index_is_read_broadcast(device: str) -> None:
    torch.manual_seed(0)
    model = RelativeScores(seq=24, dim=16).eval().to(device)
    q = torch.randn(12, 24, 16, device=device)
    with torch.no_grad():
        ref = model(q)
        compiled = kiln.compile(model, [q], min_block_size=1, require_full_compilation=True)
        assert relative_error(compiled(q), ref) < 1e-5
    (engine,) = compiled.engines()
    plan = engine.engine.graph()
    gathers = [n for n in plan.nodes if n.op == "gather"]
    assert len(gathers) == 1 and gathers[0].attrs["broadcast"] == [0]
    assert plan.type(gathers[0].inputs[1]).shape == [1, 24, 24]
    assert not [n for n in plan.nodes if n.op == "expand"]
