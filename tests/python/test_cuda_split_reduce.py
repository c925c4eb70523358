"""Few long rows split across blocks (plan.h's split_rows), and short rows sharing a warp, on
CUDA, against PyTorch.

A norm, reduction or softmax whose rows are fewer than two per multiprocessor (under 228 on any
H100 or H200) and long runs each row on several blocks: a first kernel writes each chunk's
statistics to the engine's workspace, a second combines them and writes the result. Every case
below takes that path (the build log must say "split" and the engine must have a workspace):
  - group_norm (a UNet's at batch 1; no affine; channels not a multiple of the vector width; an
    odd group length, which loads one element at a time), layer_norm over rows of more than
    16384 elements (odd too, and over three dims);
  - reduce_sum / mean / var / max over rows (one long row; several; a variance over two dims;
    reduced runs around a kept dim; short odd runs crossing the chunks);
  - softmax / log_softmax over rows of more than 8192 elements (a vocabulary; odd rows);
  - channels-last group_norm, which always takes two kernels over chunks of positions.
Each runs in f32, f16 and bf16 on random inputs against PyTorch computing in float64 on the same
(rounded) inputs: directly, as a CUDA graph replay on new inputs, and (f16) with the input and
output one element past an aligned address, or only the output (the narrower kernels run for
one launch or both). Skipped where Kiln has no CUDA device.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import pytest
import torch
import torch.nn.functional as F

from kiln import Builder, BuilderConfig, Engine, Graph
from test_cuda_ops import STRICT_F32, _rolled, _run, _side_stream
from test_ops import KILN_TO_TORCH, TORCH_TO_KILN

pytestmark = pytest.mark.cuda  # skipped without a GPU (conftest.py)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["f32", "f16", "bf16"]


@dataclass
class Case:
    id: str
    op: str
    shapes: list[Optional[list[int]]]  # x first; None: an absent weight / bias
    attrs: dict[str, Any]
    ref: Callable[..., torch.Tensor]  # on float64 tensors
    scale: float = 1.0  # x = scale * (randn + 0.5), or scale * uniform(0.5, 1.5) for reductions
    uniform: bool = False
    exact: bool = False  # max: the result is one of the inputs
    probabilities: bool = False  # softmax: values far below 1, compared with a smaller atol


def _gn(groups: int) -> Callable[..., torch.Tensor]:
    return lambda x, w=None, b=None: F.group_norm(x, groups, w, b, 1e-5)


def _ln(k: int) -> Callable[..., torch.Tensor]:
    return lambda x, w=None, b=None: F.layer_norm(x, x.shape[-k:], w, b, 1e-5)


CASES = [
    Case("gn-unet-g32", "group_norm", [[1, 320, 64, 64], [320], [320]], {"groups": 32, "eps": 1e-5}, _gn(32)),
    Case("gn-unet-g8", "group_norm", [[1, 640, 32, 32], [640], [640]], {"groups": 8, "eps": 1e-5}, _gn(8)),
    Case("gn-no-affine", "group_norm", [[2, 64, 32, 32], None, None], {"groups": 8, "eps": 1e-5}, _gn(8)),
    Case("gn-odd-spatial", "group_norm", [[1, 96, 37, 41], [96], [96]], {"groups": 4, "eps": 1e-5}, _gn(4)),
    Case("gn-odd-length", "group_norm", [[1, 15, 47, 47], [15], [15]], {"groups": 3, "eps": 1e-5}, _gn(3)),
    Case("ln-long", "layer_norm", [[2, 40000], [40000], [40000]], {"normalized_rank": 1, "eps": 1e-5}, _ln(1)),
    Case("ln-odd", "layer_norm", [[3, 20001], [20001], None], {"normalized_rank": 1, "eps": 1e-5}, _ln(1)),
    Case(
        "ln-rank3",
        "layer_norm",
        [[1, 4, 96, 96], [4, 96, 96], [4, 96, 96]],
        {"normalized_rank": 3, "eps": 1e-5},
        _ln(3),
    ),
    Case(
        "sum-one-row",
        "reduce_sum",
        [[1 << 20]],
        {"axes": [0], "keepdim": False},
        lambda x: x.sum(),
        scale=0.01,
        uniform=True,
    ),
    Case(
        "mean-rows",
        "reduce_mean",
        [[4, 262144]],
        {"axes": [1], "keepdim": True},
        lambda x: x.mean(1, keepdim=True),
        uniform=True,
    ),
    Case(
        "var-two-dims",
        "reduce_var",
        [[2, 64, 4096]],
        {"axes": [1, 2], "keepdim": False, "correction": 1.0},
        lambda x: x.var((1, 2), correction=1),
        uniform=True,
    ),
    Case(
        "var-runs-around-kept",
        "reduce_var",
        [[64, 2, 4096]],
        {"axes": [0, 2], "keepdim": False, "correction": 0.0},
        lambda x: x.var((0, 2), correction=0),
        uniform=True,
    ),
    Case(
        "sum-short-runs",
        "reduce_sum",
        [[4096, 2, 7]],
        {"axes": [0, 2], "keepdim": False},
        lambda x: x.sum((0, 2)),
        scale=0.1,
        uniform=True,
    ),
    Case("max-odd", "reduce_max", [[3, 100003]], {"axes": [1], "keepdim": False}, lambda x: x.amax(1), exact=True),
    Case(
        "softmax-vocab",
        "softmax",
        [[1, 50257]],
        {"axis": 1},
        lambda x: torch.softmax(x, 1),
        scale=3.0,
        probabilities=True,
    ),
    Case("log-softmax-rows", "log_softmax", [[4, 100000]], {"axis": 1}, lambda x: torch.log_softmax(x, 1), scale=3.0),
    Case("softmax-odd", "softmax", [[2, 3, 30001]], {"axis": 2}, lambda x: torch.softmax(x, 2), probabilities=True),
]


def _tolerance(case: Case, dtype: torch.dtype) -> tuple[float, float]:
    if case.exact:
        return 0.0, 0.0
    rtol, atol = {torch.float32: (1e-4, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}[dtype]
    if case.probabilities:
        atol = 1e-7 if dtype == torch.float32 else 1e-6
    return rtol, atol


def _inputs(case: Case, dtype: torch.dtype, seed: int) -> list[Optional[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    out: list[Optional[torch.Tensor]] = []
    for i, shape in enumerate(case.shapes):
        if shape is None:
            out.append(None)
        elif i == 0 and case.uniform:
            out.append((case.scale * (torch.rand(shape, generator=gen) + 0.5)).to(dtype))
        elif i == 0:
            out.append((case.scale * (torch.randn(shape, generator=gen) + 0.5)).to(dtype))
        else:  # weight and bias
            out.append((torch.randn(shape, generator=gen) * 0.5 + (1.0 if i == 1 else 0.0)).to(dtype))
    return out


def _graph(case: Case, dtype: torch.dtype) -> Graph:
    g = Graph()
    ids: list[Optional[int]] = [
        None if s is None else g.add_input(f"x{i}", TORCH_TO_KILN[dtype], s) for i, s in enumerate(case.shapes)
    ]
    (y,) = g.add_node(case.op, ids, case.attrs, name=f"{case.op}_split")
    g.mark_output(y, "y")
    return g


def _build(g: Graph) -> Engine:
    return Builder(BuilderConfig(device="cuda", fuse_pointwise=False, policy=STRICT_F32)).build(g)


def _compare(
    case: Case, dtype: torch.dtype, got: torch.Tensor, inputs: list[Optional[torch.Tensor]], what: str
) -> None:
    want = case.ref(*[None if t is None else t.double() for t in inputs])
    assert got.dtype == dtype and list(got.shape) == list(want.shape), f"{case.id}{what}: {got.dtype}{list(got.shape)}"
    rtol, atol = _tolerance(case, dtype)
    torch.testing.assert_close(
        got.double(),
        want,
        rtol=rtol,
        atol=atol,
        msg=lambda m: f"{case.id} {dtype}{what} (CUDA vs PyTorch in float64): {m}",
    )


def _run_offset(engine: Engine, feeds: list[torch.Tensor], inputs_too: bool) -> torch.Tensor:
    """Runs with the output (and, inputs_too, every input) one element past an aligned address."""

    def shifted(shape: list[int], dtype: torch.dtype) -> torch.Tensor:
        n = 1
        for d in shape:
            n *= d
        return torch.empty(n + 1, dtype=dtype, device="cuda")[1:].view(shape)

    ins = []
    for t in feeds:
        if inputs_too:
            s = shifted(list(t.shape), t.dtype)
            s.copy_(t)
            ins.append(s)
        else:
            ins.append(t.cuda().contiguous())
    (o,) = engine.outputs
    out = shifted(list(o.shape), KILN_TO_TORCH[o.dtype]).fill_(float("nan"))
    assert out.data_ptr() % 16 != 0
    stream = torch.cuda.current_stream().cuda_stream
    engine.create_execution_context(use_graphs=False).execute_ptrs(
        [t.data_ptr() for t in ins], [out.data_ptr()], stream
    )
    torch.cuda.current_stream().synchronize()
    return out.cpu()


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_split_rows_match_pytorch(case: Case, dtype: torch.dtype) -> None:
    engine = _build(_graph(case, dtype))
    assert "(split: " in engine.build_log, engine.build_log
    assert engine.workspace_size > 0
    _check_runs(case, dtype, engine, seed=1)


def _gn_nhwc(groups: int) -> Callable[..., torch.Tensor]:
    return lambda x, w=None, b=None: _gn(groups)(x.permute(0, 3, 1, 2), w, b).permute(0, 2, 3, 1)


def _nhwc(id: str, shape: list[int], groups: int, affine: bool = True) -> Case:
    ps: Optional[list[int]] = [shape[3]] if affine else None
    return Case(id, "group_norm", [shape, ps, ps], {"groups": groups, "eps": 1e-5, "layout": "nhwc"}, _gn_nhwc(groups))


# Channels-last group_norm ([N, H, W, C]) reads whole rows of channels, a block per sample where
# the sample is small, else in blocks of (sample, chunk of positions) over two kernels: a UNet's at
# batch 1 (groups of 10 channels: 2-wide loads in f16) and at batch 32 (groups of 4 and 8 channels
# over 32x32 and 4x4 positions), Stable Diffusion's groups of 40, groups of 3 (one channel a word),
# no affine, positions not a multiple of a block's rows, and the largest sample one block takes.
NHWC_CASES = [
    _nhwc("gn-nhwc-g32", [1, 64, 64, 320], 32),
    _nhwc("gn-nhwc-cg4", [1, 64, 64, 128], 32, affine=False),
    _nhwc("gn-nhwc-b32-cg4", [32, 32, 32, 128], 32),
    _nhwc("gn-nhwc-b32-small", [32, 4, 4, 256], 32),
    _nhwc("gn-nhwc-cg40", [8, 8, 8, 1280], 32),
    _nhwc("gn-nhwc-cg3-odd", [3, 7, 5, 9], 3),
    _nhwc("gn-nhwc-one-block", [4, 8, 8, 256], 32),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", NHWC_CASES, ids=[c.id for c in NHWC_CASES])
def test_channels_last_group_norm_reads_rows_of_channels_and_matches_pytorch(case: Case, dtype: torch.dtype) -> None:
    engine = _build(_graph(case, dtype))
    assert "(channels last: " in engine.build_log, engine.build_log
    # Chunks of a sample keep their statistics in the workspace; a block per sample needs none.
    assert (engine.workspace_size > 0) == ("blocks per sample" in engine.build_log), engine.build_log
    _check_runs(case, dtype, engine, seed=5)


def _check_runs(case: Case, dtype: torch.dtype, engine: Engine, seed: int) -> None:
    """Runs the engine directly, as a captured graph replayed on new inputs (a workspace is the
    same memory on every call), and (f16) on buffers one element past an aligned address; each
    result against PyTorch."""
    inputs = _inputs(case, dtype, seed)
    feeds = [t for t in inputs if t is not None]
    (got,) = _run(engine, feeds)
    _compare(case, dtype, got, inputs, "")

    ctx = engine.create_execution_context(use_graphs=True)
    with _side_stream():
        _run(engine, [_rolled(t) for t in feeds], ctx=ctx)  # captures the graph
        other = _inputs(case, dtype, seed + 1)
        (got,) = _run(engine, [t for t in other if t is not None], ctx=ctx)
    assert ctx.uses_graphs, ctx.graph_refusal
    _compare(case, dtype, got, other, " (CUDA graph replay)")

    if dtype == torch.float16:
        for inputs_too in (True, False):
            got = _run_offset(engine, feeds, inputs_too)
            _compare(case, dtype, got, inputs, " (misaligned output" + (" and inputs)" if inputs_too else ")"))


def test_many_rows_keep_one_block_per_row() -> None:
    """group_norm at batch 32 has rows enough for every multiprocessor: no split, no workspace."""
    case = Case("gn-batch32", "group_norm", [[32, 320, 16, 16], [320], [320]], {"groups": 32, "eps": 1e-5}, _gn(32))
    inputs = _inputs(case, torch.float16, seed=3)
    engine = _build(_graph(case, torch.float16))
    assert "(split: " not in engine.build_log and "block per group" in engine.build_log, engine.build_log
    assert engine.workspace_size == 0
    (got,) = _run(engine, [t for t in inputs if t is not None])
    _compare(case, torch.float16, got, inputs, "")


# Short rows: a single reduced run of at most 16 words takes the power of two of lanes that covers
# it, several outputs per warp (Swin V2's norm over a head dim of 32; odd lengths; output counts
# that leave a warp's last groups past the end; a variance's two passes; a run of one word), and
# so does a layer_norm row (SegFormer's 32 and 64 channels, 48, odd ones).
SHORT_CASES = [
    Case("sum-head-dim", "reduce_sum", [[6 * 64 + 5, 32]], {"axes": [1], "keepdim": True},
         lambda x: x.sum(1, keepdim=True), uniform=True),
    Case("mean-24", "reduce_mean", [[77, 24]], {"axes": [1], "keepdim": False}, lambda x: x.mean(1), uniform=True),
    Case("var-odd-7", "reduce_var", [[50, 7]], {"axes": [1], "keepdim": False, "correction": 1.0},
         lambda x: x.var(1, correction=1), uniform=True),
    Case("max-16", "reduce_max", [[33, 3, 16]], {"axes": [2], "keepdim": False}, lambda x: x.amax(2), exact=True),
    Case("sum-one-word", "reduce_sum", [[9, 8]], {"axes": [1], "keepdim": False}, lambda x: x.sum(1), uniform=True),
    Case("ln-32", "layer_norm", [[4 * 256 + 3, 32], [32], [32]], {"normalized_rank": 1, "eps": 1e-5}, _ln(1)),
    Case("ln-64-no-bias", "layer_norm", [[2, 77, 64], [64], None], {"normalized_rank": 1, "eps": 1e-5}, _ln(1)),
    Case("ln-48", "layer_norm", [[3, 7, 7, 48], [48], [48]], {"normalized_rank": 1, "eps": 1e-5}, _ln(1)),
    Case("ln-odd-7", "layer_norm", [[50, 7], None, None], {"normalized_rank": 1, "eps": 1e-5}, _ln(1)),
    Case("ln-3x8", "layer_norm", [[37, 3, 8], [3, 8], [3, 8]], {"normalized_rank": 2, "eps": 1e-5}, _ln(2)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", SHORT_CASES, ids=[c.id for c in SHORT_CASES])
def test_short_rows_share_a_warp_and_match_pytorch(case: Case, dtype: torch.dtype) -> None:
    engine = _build(_graph(case, dtype))
    assert re.search(r"\(\d+ lanes? per (output|row)", engine.build_log), engine.build_log
    _check_runs(case, dtype, engine, seed=4)


def _activated(case: Case, act: str) -> Case:
    """The case with a fused activation: silu, or clipped_relu to [0, 1] (values cross both bounds)."""
    attrs = dict(case.attrs, activation=act)
    if act == "clipped_relu":
        attrs["activation_max"] = 1.0
    fn = F.silu if act == "silu" else (lambda y: y.clamp(0.0, 1.0))
    return Case(f"{case.id}-{act}", case.op, case.shapes, attrs, lambda *a, ref=case.ref: fn(ref(*a)))


# Every layer_norm / group_norm kernel applies a fused activation (fuse_epilogue folds a UNet's
# group norm + SiLU into one node) as it writes: warp and block rows, split rows, a block per
# group, and the channels-last kernels in one launch, in chunks and the fallback at batch 1.
ACTIVATION_CASES = [
    (Case("ln-warp", "layer_norm", [[64, 768], [768], [768]], {"normalized_rank": 1, "eps": 1e-5}, _ln(1)),
     "warp per row"),
    (Case("ln-block", "layer_norm", [[64, 4096], [4096], None], {"normalized_rank": 1, "eps": 1e-5}, _ln(1)),
     "block per row in registers"),
    (CASES[5], "(split: "),
    (Case("gn-block", "group_norm", [[2, 64, 8, 8], [64], [64]], {"groups": 32, "eps": 1e-5}, _gn(32)),
     "block per group"),
    (CASES[0], "(split: "),
    (NHWC_CASES[2], "blocks per sample"),
    (NHWC_CASES[6], "block per sample"),
    (_nhwc("gn-nhwc-b1", [1, 32, 32, 128], 32), "block per group, channels last"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("act", ["silu", "clipped_relu"])
@pytest.mark.parametrize("case,path", ACTIVATION_CASES, ids=[c.id for c, _ in ACTIVATION_CASES])
def test_norm_kernels_apply_a_fused_activation(case: Case, path: str, act: str, dtype: torch.dtype) -> None:
    fused = _activated(case, act)
    engine = _build(_graph(fused, dtype))
    assert path in engine.build_log and f"+ {act}" in engine.build_log, engine.build_log
    _check_runs(fused, dtype, engine, seed=6)
