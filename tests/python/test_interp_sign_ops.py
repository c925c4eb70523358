"""Interpolation (bilinear / bicubic through aten._unsafe_index, nearest, nearest-exact) and the
sign / rounding family (sign, floor, ceil, round, trunc, round(decimals), div rounding_mode="trunc")
run inside Kiln engines, with results matching PyTorch eager on random inputs.

Every model is compiled both ways, kiln.compile (torch.export) and torch.compile(backend="kiln")
with min_block_size=1, and both with require_full_compilation=True: a node left to PyTorch
raises, so a pass here means every op ran in an engine. The CUDA cases (marked ``cuda``) repeat
the comparisons on a GPU against eager on the GPU; they are skipped on a machine without one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import kiln

_gen = torch.Generator().manual_seed(35)


class Fn(torch.nn.Module):
    """A module that applies `fn` to its inputs."""

    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.fn(*xs)


def _options(device: str) -> dict[str, Any]:
    return {"min_block_size": 1, "require_full_compilation": True, "device": device}


def compiled_both_ways(module: torch.nn.Module, inputs: list[torch.Tensor], device: str = "cpu") -> list[torch.Tensor]:
    """The module's outputs through kiln.compile and through torch.compile(backend="kiln"); checks
    that kiln.compile left nothing in PyTorch."""
    with torch.no_grad():
        aot = kiln.compile(module, inputs, **_options(device))
        assert not aot.summary.ops_in_pytorch, aot.summary.ops_in_pytorch
        assert aot.summary.engines >= 1
        out_aot = aot(*inputs)
        torch._dynamo.reset()
        out_dynamo = torch.compile(module, backend="kiln", dynamic=False, options=_options(device))(*inputs)
    return [out_aot, out_dynamo]


def check_close(module: torch.nn.Module, inputs: list[torch.Tensor], rtol: float = 1e-5, atol: float = 1e-5,
                device: str = "cpu", exact: bool = False) -> None:
    with torch.no_grad():
        want = module(*inputs)
    for got in compiled_both_ways(module, inputs, device):
        assert got.dtype == want.dtype and got.shape == want.shape
        if exact:
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)


# ---- interpolation ---------------------------------------------------------------------------

# (input H, W), interpolate's keyword arguments: upscale and downscale, by size and by factor,
# square and not, integer and fractional ratios.
RESIZES = [
    ((6, 8), {"scale_factor": 2}),
    ((5, 7), {"size": (12, 9)}),
    ((16, 12), {"size": (7, 5)}),
    ((9, 9), {"scale_factor": 0.5}),
    ((4, 10), {"size": (4, 23)}),
    ((11, 3), {"scale_factor": (1.5, 2.5)}),
    ((1, 6), {"size": (3, 4)}),
]


def _resize_id(p: tuple[tuple[int, int], dict[str, Any]]) -> str:
    (h, w), kw = p
    return f"{h}x{w}-" + "-".join(f"{k}{v}" for k, v in kw.items())


@pytest.mark.parametrize("resize", RESIZES, ids=[_resize_id(r) for r in RESIZES])
@pytest.mark.parametrize("align_corners", [False, True])
def test_bilinear_matches_eager(resize: tuple[tuple[int, int], dict[str, Any]], align_corners: bool) -> None:
    (h, w), kw = resize
    x = torch.randn(2, 3, h, w, generator=_gen)
    m = Fn(lambda t: F.interpolate(t, mode="bilinear", align_corners=align_corners, **kw))
    check_close(m, [x])


@pytest.mark.parametrize("resize", RESIZES[:4], ids=[_resize_id(r) for r in RESIZES[:4]])
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bicubic"])
def test_other_modes_match_eager(resize: tuple[tuple[int, int], dict[str, Any]], mode: str) -> None:
    (h, w), kw = resize
    x = torch.randn(2, 3, h, w, generator=_gen)
    m = Fn(lambda t: F.interpolate(t, mode=mode, **kw))
    check_close(m, [x], exact=mode != "bicubic")


def test_bilinear_in_a_conv_net_matches_eager() -> None:
    """A segmentation head's shape: conv, bilinear upsampling to the input size, a conv after it."""
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=4, padding=1), torch.nn.ReLU()).eval()
    head = torch.nn.Conv2d(8, 4, 1).eval()

    class Seg(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.interpolate(net(x), size=x.shape[-2:], mode="bilinear", align_corners=False)
            return head(y)

    check_close(Seg().eval(), [torch.randn(2, 3, 29, 35, generator=_gen)], rtol=1e-4, atol=1e-5)


def test_unsafe_index_with_broadcast_index_tensors() -> None:
    """aten._unsafe_index with index tensors of shapes [Ho, 1] and [Wo] (computed from arange,
    as the decompositions do) and with one index tensor of rank 2."""
    def two(x: torch.Tensor) -> torch.Tensor:
        i = (torch.arange(5) * 3 % 7).unsqueeze(-1)
        j = torch.arange(4) * 2 + 1
        return torch.ops.aten._unsafe_index(x, [None, i, j])

    def one(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._unsafe_index(x, [None, None, idx]) * 2.0

    check_close(Fn(two), [torch.randn(3, 7, 9, generator=_gen)], exact=True)
    idx = torch.randint(0, 6, (3, 4), generator=_gen)
    check_close(Fn(one), [torch.randn(2, 3, 6, 5, generator=_gen), idx], exact=True)


# ---- sign and rounding -----------------------------------------------------------------------

def special_values(n: int, dtype: torch.dtype) -> torch.Tensor:
    """Random values with both signs, exact halves (ties for round) and integers, signed zeros,
    infinities and NaN."""
    body = torch.randn(n, generator=_gen) * 6
    halves = torch.randint(-12, 13, (n,), generator=_gen).float() / 2
    ties = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.0, -0.0, 1e30, -1e30,
                         float("inf"), float("-inf"), float("nan"), 0.49999997, -0.49999997, 8388609.0])
    return torch.cat([body, halves, ties]).to(dtype)


ROUNDING: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sign": torch.sign, "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16],
                         ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("name", list(ROUNDING))
def test_rounding_ops_match_eager_exactly(name: str, dtype: torch.dtype) -> None:
    fn = ROUNDING[name]
    x = special_values(61, dtype)
    # x * 1 keeps the op off the graph input, so the engine computes it (and fuses it).
    check_close(Fn(lambda t: fn(t * 1.0)), [x], exact=True)
    check_close(Fn(fn), [x.reshape(1, -1)], exact=True)
    got = kiln.compile(Fn(fn), [x], **_options("cpu"))(x)
    assert torch.equal(got.signbit(), fn(x).signbit()), f"{name}: signs of zeros differ"


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool],
                         ids=lambda d: str(d).split(".")[-1])
def test_sign_and_rounding_of_integers(dtype: torch.dtype) -> None:
    lo = 0 if dtype in (torch.uint8, torch.bool) else -100
    hi = 2 if dtype == torch.bool else 100
    x = torch.randint(lo, hi, (5, 7), generator=_gen).to(dtype)
    for name, fn in ROUNDING.items():
        if dtype == torch.bool and name != "sign":
            continue  # PyTorch has no floor / ceil / round / trunc of bool
        check_close(Fn(lambda t, f=fn: f(t)), [x], exact=True)


@pytest.mark.parametrize("decimals", [-2, -1, 1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=lambda d: str(d).split(".")[-1])
def test_round_decimals(decimals: int, dtype: torch.dtype) -> None:
    x = (torch.randn(4, 33, generator=_gen) * 300).to(dtype)
    check_close(Fn(lambda t: torch.round(t, decimals=decimals)), [x], exact=True)


def test_div_trunc_of_floats() -> None:
    a = torch.randn(6, 9, generator=_gen) * 20
    b = torch.randn(9, generator=_gen) * 3
    check_close(Fn(lambda x, y: torch.div(x, y, rounding_mode="trunc")), [a, b], exact=True)
    h = (a.half(), b.half())
    check_close(Fn(lambda x, y: torch.div(x, y, rounding_mode="trunc")), list(h), exact=True)


def test_deberta_log_bucket_position() -> None:
    """DeBERTa-v2's relative-position bucketing (sign, abs, log, ceil, where) as transformers
    writes it, on every relative position of a 96-token sequence."""
    modeling = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")

    def buckets(q: torch.Tensor) -> torch.Tensor:
        rel = q[:, None] - torch.arange(96)[None, :]
        return modeling.make_log_bucket_position(rel, 32, 256)

    check_close(Fn(buckets), [torch.arange(96)], exact=True)


# ---- the reduced zoo models ------------------------------------------------------------------

def _zoo() -> Any:
    pytest.importorskip("torchvision")
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import zoo_models
    return zoo_models


@pytest.mark.parametrize("name", ["deeplabv3_resnet50", "segformer_b0", "deberta_v3"])
def test_zoo_model_runs_fully_in_engines(name: str) -> None:
    entry = _zoo().MODELS[name]
    model, inputs = entry.create_randomized(2, small=True)
    with torch.no_grad():
        want = model(*inputs)
        want = want if isinstance(want, torch.Tensor) else want[0]
        compiled = torch.compile(model, backend="kiln", dynamic=False, options=_options("cpu"))
        got = compiled(*inputs)
        got = got if isinstance(got, torch.Tensor) else got[0]
    err = (got - want).norm() / want.norm()
    assert err < 1e-4, f"{name}: relative error {err:.2e}"


# ---- CUDA: the same comparisons on a GPU -----------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("align_corners", [False, True])
def test_cuda_bilinear(align_corners: bool, dtype: torch.dtype) -> None:
    for (h, w), kw in RESIZES:
        x = torch.randn(2, 3, h, w, generator=_gen).to("cuda", dtype)
        m = Fn(lambda t, kw=kw: F.interpolate(t, mode="bilinear", align_corners=align_corners, **kw))
        tol = 1e-5 if dtype == torch.float32 else 2e-3
        check_close(m, [x], rtol=tol, atol=tol, device="cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_cuda_upsample_between_convs(mode: str, dtype: torch.dtype) -> None:
    """Upsampling between channels-last convs and read by pointwise ops: the gathers run inside
    the fused kernels (vectorized along the channels) and match eager."""
    torch.manual_seed(3)
    conv1, conv2 = torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.Conv2d(32, 8, 3, padding=1)

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = F.interpolate(conv1(x), scale_factor=2, mode=mode)
        return conv2(torch.cat([F.silu(y) * 0.5, y], dim=1))
    m = Fn(fn)
    m.conv1, m.conv2 = conv1, conv2
    x = torch.randn(2, 8, 6, 10, generator=_gen).to("cuda", dtype)
    tol = 5e-3 if dtype == torch.float32 else 1e-2  # convs in f32 run on TF32 tensor cores
    check_close(m.to("cuda", dtype), [x], rtol=tol, atol=tol, device="cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16],
                         ids=lambda d: str(d).split(".")[-1])
def test_cuda_rounding_ops(dtype: torch.dtype) -> None:
    x = special_values(61, dtype).cuda()
    for fn in ROUNDING.values():
        check_close(Fn(lambda t, f=fn: f(t * 1.0)), [x], exact=True, device="cuda")
    ints = torch.randint(-100, 100, (5, 7), generator=_gen).cuda()
    for dt in (torch.int64, torch.int32, torch.int8):
        check_close(Fn(lambda t: torch.sign(t * 1)), [ints.to(dt)], exact=True, device="cuda")
