"""Lowering torch.export's training IR without tracing it again (kiln/training_ops.py): where it
applies, the graph holds only ops the importers take, the same ones as the graph run_decompositions
gives but for the shape composites the importers take whole (reshape, flatten, unflatten,
contiguous, chunk, eval dropout), and computes the same values; where it cannot (another op, an in-place
write that something reads afterwards or through a view), the program is decomposed as before."""

from __future__ import annotations

import collections
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from kiln import lowering, training_ops
from kiln.pipeline import supported_targets

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import zoo  # noqa: E402
import zoo_models  # noqa: E402

KEEP = set(supported_targets())


class Residual(torch.nn.Module):
    """Convolution, eval batch norm, in-place ReLU and residual addition, as torchvision writes them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)
        self.conv1d = torch.nn.Conv1d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu_(self.bn(self.conv(x)))
        y += x
        return F.hardswish(self.conv1d(y.flatten(2)), inplace=True).view(y.shape)


class Masked(torch.nn.Module):
    """Layer norm, ``.to`` casts (one of them a no-op) and an ``&`` of masks."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keep = (mask > 0) & (mask < 3)
        h = self.norm(x) * keep.to(x.dtype)[..., None]
        return h + mask.to(dtype=torch.long).to(x.device).to(torch.float32)[..., None]


# What the decomposition makes of the shape composites that the importers also take whole.
_SHAPE_FORMS = {"aten.reshape.default", "aten.flatten.using_ints", "aten.unflatten.int", "aten.contiguous.default",
                "aten.dropout.default", "aten.view.default", "aten.clone.default", "aten._unsafe_view.default",
                "aten.chunk.default", "aten.split.Tensor"}


class Composites(torch.nn.Module):
    """Group norm, constant pad, type_as, min / max of two tensors, eval dropout in place, detach_,
    diff and zero_."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.GroupNorm(2, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = F.pad(self.norm(x), (1, 2, 0, 1), value=0.5)
        h = F.dropout(h * 1, p=0.3, training=False, inplace=True)
        m = torch.min(h[..., :3, :3], y).detach_() + torch.max(h[..., 1:4, 1:4], y)
        return m.type_as(y.half()).float() + y.diff(dim=2, prepend=y[:, :, :1] - 1)[..., :1, :] + (y * 3).zero_()


def _histogram(gm: torch.fx.GraphModule) -> collections.Counter[str]:
    """The ops of a lowered graph, but for the shape composites and their decompositions."""
    ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert all(op in KEEP or not op.startswith("aten.") for op in ops), [op for op in ops if op not in KEEP]
    return collections.Counter(op for op in ops if op not in _SHAPE_FORMS)


def _both(model: torch.nn.Module, inputs: list[Any], monkeypatch: pytest.MonkeyPatch,
          dynamic_shapes: Any = None) -> tuple[Any, Any]:
    """The lowered graph without the trace (asserted to apply) and with run_decompositions."""
    ep = torch.export.export(model, tuple(inputs), dynamic_shapes=dynamic_shapes)
    assert training_ops.rewritable(ep.graph, KEEP) is None
    direct = lowering.lower_exported_program(ep, KEEP)
    with monkeypatch.context() as m:
        m.setattr(training_ops, "rewritable", lambda graph, keep: "made to decompose")
        traced = lowering.lower_exported_program(ep, KEEP)
    return direct, traced


@pytest.mark.parametrize("make", [
    lambda: (Residual(), [torch.randn(2, 4, 6, 6)]),
    lambda: (Masked(), [torch.randn(2, 5, 8), torch.randint(0, 4, (2, 5))]),
    lambda: (Composites(), [torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3)]),
], ids=["residual", "masked", "composites"])
@torch.no_grad()
def test_the_rewritten_graph_holds_the_decomposed_ops_and_values(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model, inputs = make()
    model = model.eval()
    if isinstance(model, Residual):
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    want = model(*[x.clone() for x in inputs])
    direct, traced = _both(model, inputs, monkeypatch)
    assert _histogram(direct.gm) == _histogram(traced.gm)
    for lowered in (direct, traced):
        torch.testing.assert_close(lowered.gm(*inputs)[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["resnet50", "bert", "vit_b_16", "mobilenet_v3_large", "swin_t", "unet_ddpm", "t5_encoder", "llama"])
@torch.no_grad()
def test_zoo_models_lower_without_the_trace_and_match_eager(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, inputs = zoo_models.MODELS[name].create_randomized(2, small=True)
    model = model.eval()
    want = zoo.flat_output(model(*inputs))
    direct, traced = _both(model, inputs, monkeypatch)
    assert _histogram(direct.gm) == _histogram(traced.gm)
    got = direct.gm(*inputs)
    assert zoo.rel_error(zoo.flat_output(got if isinstance(got, (list, tuple)) else [got]), want) < 1e-5


@torch.no_grad()
def test_a_symbolic_program_lowers_without_the_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = Masked().eval()
    inputs = [torch.randn(2, 5, 8), torch.randint(0, 4, (2, 5))]
    seq = Dim("seq", min=2, max=16)
    direct, traced = _both(model, inputs, monkeypatch, dynamic_shapes=({1: seq}, {1: seq}))
    assert _histogram(direct.gm) == _histogram(traced.gm)
    for s in (3, 11):
        x = [torch.randn(2, s, 8), torch.randint(0, 4, (2, s))]
        torch.testing.assert_close(direct.gm(*x)[0], model(*x), rtol=1e-5, atol=1e-5)


class ReadAfterWrite(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        v = y.view(-1)
        y.relu_()
        return v + 1  # y read after the in-place write, through a view made before it


class WriteThroughView(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        v = y.view(-1)
        v.relu_()  # writes y through a view
        return y + 1


class Unlisted(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bij,bjk->bik", x, x)


@pytest.mark.parametrize("model", [ReadAfterWrite(), WriteThroughView(), Unlisted()],
                         ids=["read-after-write", "write-through-view", "unlisted-op"])
@torch.no_grad()
def test_what_the_rewrite_cannot_take_is_decomposed_and_still_matches(model: torch.nn.Module) -> None:
    x = torch.randn(2, 3, 3)
    ep = torch.export.export(model, (x,))
    assert training_ops.rewritable(ep.graph, KEEP) is not None
    lowered = lowering.lower_exported_program(ep, KEEP)
    torch.testing.assert_close(lowered.gm(x)[0], model(x.clone()), rtol=1e-5, atol=1e-5)
