"""A workspace limit picks CPU conv tactics that fit it (im2col in chunks of output rows) before an
engine fails; a limit nothing fits under is a build failure naming the workspace."""

from __future__ import annotations

import pytest
import torch

import kiln
from kiln._C import Engine
from kiln.testing import relative_error


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(16, 8, 3, stride=2, padding=1, groups=2),
                               torch.nn.Conv2d(8, 8, (5, 3), padding=(2, 1), dilation=(1, 1))).eval()


def _engines(compiled: torch.nn.Module) -> list[Engine]:
    return [Engine.deserialize(m.engine_bytes()) for m in compiled.modules()
            if type(m).__name__ == "KilnEngineModule"]


@pytest.mark.parametrize("limit", [1 << 30, 1 << 17, 96 << 10])
def test_conv_fits_the_workspace_limit(limit: int) -> None:
    model, x = _model(), torch.randn(2, 8, 33, 31)
    compiled = kiln.compile(model, [x], min_block_size=1, workspace_size=limit, require_full_compilation=True)
    (engine,) = _engines(compiled)
    assert engine.workspace_size <= limit
    with torch.no_grad():
        assert relative_error(compiled(x), model(x)) < 1e-5
    chunked = "im2col in chunks" in engine.build_log
    unlimited = _engines(kiln.compile(model, [x], min_block_size=1))[0].workspace_size
    assert chunked == (unlimited > limit), engine.build_log


def test_a_limit_nothing_fits_names_the_workspace() -> None:
    model, x = _model(), torch.randn(2, 8, 33, 31)
    with pytest.raises(kiln.KilnError, match="over the workspace limit of 1024"):
        kiln.compile(model, [x], min_block_size=1, workspace_size=1024, pass_through_build_failures=True)
