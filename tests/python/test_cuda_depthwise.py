"""The CUDA conv family's generated depthwise kernel against the CPU backend.

A depthwise conv (groups == C == O) in channels-last layout runs on CUDA either through cuDNN or
through a generated kernel; the build times both and keeps the faster. These tests build with
optimization level 0, where nothing is timed and the generated kernel is taken, so that it is
the kernel under test (the build log must say "generated depthwise"), then compare with the CPU
engine for the same graph and inputs (tolerances of test_cuda_ops: conv accumulates):
  - nhwc convs given directly: f32 / f16 / bf16, kernel sizes 1 to 7, stride 2, padding,
    dilation, C a multiple of 8, of 4 only, and odd (the scalar variant), with and without bias
    and residual, each activation the epilogue supports;
  - an NCHW depthwise conv with constant weights, which the CUDA build makes nhwc
    (to_channels_last) and runs on the generated kernel;
  - inputs and output one element past an aligned address (the scalar variant must run);
  - CUDA-graph replay, and an engine round trip that compiles nothing (KILN_CUDA_NO_COMPILE);
  - at the default optimization level (timed against cuDNN), whichever wins is correct.
Skipped, with the reason, where Kiln has no CUDA device.
"""

from __future__ import annotations

import math
from typing import Optional

import pytest
import torch

from kiln import Builder, BuilderConfig, Engine, Graph
from test_cuda_ops import STRICT_F32, _compare, _run, _side_stream
from test_ops import TORCH_TO_KILN

pytestmark = pytest.mark.cuda  # skipped without a GPU (conftest.py)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["f32", "f16", "bf16"]


def _build(g: Graph, device: str, level: int = 0) -> Engine:
    # Strict FP32: the cuDNN candidate compares at FP32 precision too.
    return Builder(BuilderConfig(device=device, optimization_level=level, fuse_pointwise=False,
                                 policy=STRICT_F32)).build(g)


def _nhwc_case(dtype: torch.dtype, n: int, h: int, w: int, c: int, k: int, stride: int, pad: int, dil: int,
               bias: bool, residual: bool, act: str, seed: int = 0) -> tuple[Graph, list[torch.Tensor]]:
    """x [N, H, W, C], weight [C, K, K, 1] (a graph input), [bias [C]], [residual [N, OH, OW, C]]."""
    gen = torch.Generator().manual_seed(seed)
    oh = (h + 2 * pad - dil * (k - 1) - 1) // stride + 1
    ow = (w + 2 * pad - dil * (k - 1) - 1) // stride + 1
    kd = TORCH_TO_KILN[dtype]
    g = Graph()
    ids: list[Optional[int]] = [g.add_input("x", kd, [n, h, w, c]), g.add_input("w", kd, [c, k, k, 1])]
    feeds = [torch.randn(n, h, w, c, generator=gen).to(dtype),
             (torch.randn(c, k, k, 1, generator=gen) / k).to(dtype)]
    ids.append(g.add_input("b", kd, [c]) if bias else None)
    if bias:
        feeds.append(torch.randn(c, generator=gen).to(dtype))
    if residual:
        ids.append(g.add_input("r", kd, [n, oh, ow, c]))
        feeds.append(torch.randn(n, oh, ow, c, generator=gen).to(dtype))
    attrs = {"stride": [stride, stride], "padding": [pad, pad], "dilation": [dil, dil], "groups": c, "layout": "nhwc"}
    if act != "none":
        attrs["activation"] = act
    if act == "clipped_relu":
        attrs["activation_max"] = 0.75
    (y,) = g.add_node("conv", ids, attrs, name="dw")
    g.mark_output(y, "y")
    return g, feeds


def _check(g: Graph, feeds: list[torch.Tensor], what: str, level: int = 0) -> Engine:
    engine = _build(g, "cuda", level)
    if level == 0:
        assert "generated depthwise" in engine.build_log, engine.build_log
    _compare("conv", _run(engine, feeds), _run(_build(g, "cpu"), feeds), f" ({what})")
    return engine


# (C, H, W, K, stride, pad, dilation): vec8 / vec4 / scalar over C, odd sizes, stride 2, dilation.
SHAPES = [
    (32, 13, 17, 3, 1, 1, 1),
    (72, 15, 15, 5, 2, 2, 1),
    (12, 9, 11, 3, 1, 2, 2),
    (7, 10, 9, 3, 2, 1, 1),
    (20, 8, 8, 7, 1, 3, 1),
    (16, 5, 6, 1, 1, 0, 1),
    (40, 11, 7, 3, 2, 0, 2),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "c{}_{}x{}_k{}_s{}_p{}_d{}".format(*s))
def test_depthwise_shapes_match_cpu(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    c, h, w, k, s, p, d = shape
    g, feeds = _nhwc_case(dtype, 2, h, w, c, k, s, p, d, bias=True, residual=False, act="relu", seed=c)
    _check(g, feeds, f"depthwise {shape}")


EPILOGUES = [
    (False, False, "none"), (True, False, "none"), (False, True, "none"), (True, True, "relu"),
    (True, True, "silu"), (False, True, "gelu_tanh"), (True, False, "gelu"), (True, False, "sigmoid"),
    (False, False, "tanh"), (True, False, "hardswish"), (True, True, "hardsigmoid"), (True, True, "clipped_relu"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: f"{'b' if e[0] else ''}{'r' if e[1] else ''}_{e[2]}")
def test_depthwise_epilogues_match_cpu(epi: tuple[bool, bool, str], dtype: torch.dtype) -> None:
    bias, residual, act = epi
    for c in (24, 7):  # vectorized and scalar variants
        g, feeds = _nhwc_case(dtype, 3, 9, 10, c, 3, 2, 1, 1, bias, residual, act, seed=c + 1)
        _check(g, feeds, f"depthwise epilogue {epi} C={c}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_nchw_depthwise_conv_becomes_the_generated_kernel(dtype: torch.dtype) -> None:
    """An NCHW depthwise conv with constant weights: to_channels_last makes it nhwc on CUDA."""
    gen = torch.Generator().manual_seed(5)
    c = 24
    g = Graph()
    x = g.add_input("x", TORCH_TO_KILN[dtype], [2, c, 14, 13])
    w = g.add_constant("w", (torch.randn(c, 1, 3, 3, generator=gen) / 3).to(dtype).numpy(), weight=True)
    b = g.add_constant("b", torch.randn(c, generator=gen).to(dtype).numpy(), weight=True)
    (y,) = g.add_node("conv", [x, w, b], {"stride": [2, 2], "padding": [1, 1], "groups": c, "activation": "relu"})
    g.mark_output(y, "y")
    feeds = [torch.randn(2, c, 14, 13, generator=gen).to(dtype)]
    engine = _check(g, feeds, "nchw depthwise")
    assert 'layout="nhwc"' in engine.graph_text, engine.graph_text


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_unaligned_buffers_take_the_scalar_variant(dtype: torch.dtype) -> None:
    g, feeds = _nhwc_case(dtype, 2, 7, 9, 16, 3, 1, 1, 1, bias=True, residual=True, act="silu", seed=9)
    engine = _build(g, "cuda")
    want = _run(_build(g, "cpu"), feeds)
    shifted = []
    for t in feeds:  # contiguous, one element past an aligned address
        storage = torch.empty(t.numel() + 1, dtype=dtype, device="cuda")
        storage[1:].copy_(t.flatten().cuda())
        shifted.append(storage[1:].view(t.shape))
    assert shifted[0].data_ptr() % 16 != 0
    out_storage = torch.empty(math.prod(want[0].shape) + 1, dtype=dtype, device="cuda")
    out = out_storage[1:].view(want[0].shape)
    ctx = engine.create_execution_context(use_graphs=False)
    ctx.execute_ptrs([t.data_ptr() for t in shifted], [out.data_ptr()], torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    _compare("conv", [out.cpu()], want, " (unaligned)")


def test_graph_replay_and_round_trip_compile_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    g, feeds = _nhwc_case(torch.float16, 2, 12, 12, 40, 5, 1, 2, 1, bias=True, residual=True, act="relu", seed=3)
    engine = _build(g, "cuda")
    want = _run(engine, feeds)
    with _side_stream():
        got = _run(engine, feeds, use_graphs=True)
    assert torch.equal(got[0], want[0])
    blob = engine.serialize()
    monkeypatch.setenv("KILN_CUDA_NO_COMPILE", "1")
    loaded = Engine.deserialize(blob, device="cuda")
    assert "generated depthwise" in loaded.build_log
    assert torch.equal(_run(loaded, feeds)[0], want[0]), "a loaded engine must run the same kernel"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_timed_choice_against_cudnn_is_correct(dtype: torch.dtype) -> None:
    """At the default level both tactics are timed; whichever is kept must match the CPU."""
    g, feeds = _nhwc_case(dtype, 8, 28, 28, 64, 3, 1, 1, 1, bias=True, residual=False, act="relu", seed=4)
    engine = _check(g, feeds, "timed", level=3)
    assert "generated depthwise" in engine.build_log or "cudnn" in engine.build_log, engine.build_log
