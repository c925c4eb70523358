"""Every op case of test_ops.py on the CUDA backend, against the CPU backend's result.

Each case's one-node graph is built for device "cuda" (pointwise fusion off, so the op's own
kernel runs), its inputs are copied to the GPU with torch, and the engine runs through
execute_ptrs on torch's current stream; the outputs must match what the CPU backend computes
for the same graph and inputs:
  f32: 1e-5 relative (1e-4 for ops that accumulate), f64: 1e-12, f16: 2e-3, bf16: 1.6e-2,
  integers and bools: exactly.
Every case runs with use_graphs False and True; with True it runs on a side stream (the legacy
default stream cannot be captured, and there the engine runs uncaptured) twice, first on
permuted inputs, so the second call checks that the captured graph reads new inputs. The
pointwise cases also run as fused two-op chains. Also checked: an engine serialized and
loaded on CUDA runs without compiling anything (KILN_CUDA_NO_COMPILE makes any compile fail),
a non-contiguous tensor made contiguous by the caller, and inputs at an address that is not
16-byte aligned (the vectorized pointwise kernel is not allowed there).
Skipped, with the reason, where Kiln has no CUDA device.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any, Optional

import pytest
import torch

import kiln
from kiln import Builder, BuilderConfig, DType, Engine, Graph
from kiln._C import BuildPolicy
from test_ops import ACCUMULATING, CASES, KILN_TO_TORCH, TORCH_TO_KILN, Case, _chain_graph, _then, case_id, r

pytestmark = pytest.mark.cuda  # skipped without a GPU (conftest.py)

_POINTWISE = [c for c in CASES if kiln.op_family(c.op) in ("unary", "binary", "where", "cast")]

# The comparison is against the CPU's FP32 at 1e-5: FP32 matmul, conv and attention must not use TF32.
STRICT_F32 = BuildPolicy(allow_tf32=False)


def _graph(op: str, inputs: list[Optional[torch.Tensor]], attrs: dict[str, Any],
           then: Optional[str] = None) -> Graph:
    g = Graph()
    ids: list[Optional[int]] = []
    for i, t in enumerate(inputs):
        ids.append(None if t is None else g.add_input(f"x{i}", TORCH_TO_KILN[t.dtype], list(t.shape)))
    outs = g.add_node(op, ids, attrs, name=f"{op}_under_test")
    if then is not None:
        outs = [g.add_node(then, [o])[0] for o in outs]
    for j, o in enumerate(outs):
        g.mark_output(o, f"y{j}")
    return g


def _feeds(inputs: list[Optional[torch.Tensor]]) -> list[torch.Tensor]:
    return [t.contiguous() for t in inputs if t is not None]


def _run(engine: Engine, feeds: list[torch.Tensor], use_graphs: bool = False,
         ctx: Any = None) -> list[torch.Tensor]:
    """Runs the engine on `feeds` (moved to the engine's device) on torch's current stream.
    Floating outputs start as NaN, so an element the engine leaves unwritten fails a comparison."""
    device = "cpu" if engine.device == "cpu" else f"cuda:{engine.device.split(':')[-1]}"
    ctx = ctx or engine.create_execution_context(use_graphs=use_graphs)
    ins = [t.to(device).contiguous() for t in feeds]
    outs = [torch.full(o.shape, float("nan"), dtype=KILN_TO_TORCH[o.dtype], device=device)
            if KILN_TO_TORCH[o.dtype].is_floating_point else torch.empty(o.shape, dtype=KILN_TO_TORCH[o.dtype], device=device)
            for o in engine.outputs]
    stream = torch.cuda.current_stream().cuda_stream if device != "cpu" else 0
    ctx.execute_ptrs([t.data_ptr() for t in ins], [t.data_ptr() for t in outs], stream)
    if device != "cpu":
        torch.cuda.current_stream().synchronize()
    return [o.cpu() for o in outs]


def _build(g: Graph, device: str, fuse: bool = False) -> Engine:
    return Builder(BuilderConfig(device=device, fuse_pointwise=fuse, policy=STRICT_F32)).build(g)


def _tolerance(op: str, dtype: torch.dtype) -> tuple[float, float]:
    if dtype == torch.float32:
        return (1e-4, 1e-5) if op in ACCUMULATING else (1e-5, 1e-6)
    if dtype == torch.float64:
        return 1e-12, 1e-12
    if dtype == torch.float16:
        return 2e-3, 2e-3
    if dtype == torch.bfloat16:
        return 1.6e-2, 1.6e-2
    return 0.0, 0.0


def _compare(op: str, got: list[torch.Tensor], want: list[torch.Tensor], what: str = "", slack: float = 1.0) -> None:
    assert len(got) == len(want)
    for j, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, f"{op}{what} output {j}: {g.dtype}{list(g.shape)} vs {w.dtype}{list(w.shape)}"
        if w.is_floating_point():
            rtol, atol = _tolerance(op, w.dtype)
            torch.testing.assert_close(g, w, rtol=rtol * slack, atol=atol * slack, equal_nan=True,
                                       msg=lambda m, j=j: f"{op}{what} output {j} (CUDA vs CPU): {m}")
        else:
            assert torch.equal(g, w), f"{op}{what} output {j} (CUDA vs CPU): {g} != {w}"


def _rolled(t: torch.Tensor) -> torch.Tensor:
    """The same values in another order (same domain: positive, nonzero, in range...)."""
    return t.flatten().roll(1).reshape(t.shape) if t.numel() > 1 else t.clone()


@contextlib.contextmanager
def _side_stream() -> Iterator[None]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream().wait_stream(stream)


@pytest.mark.parametrize("use_graphs", [False, True], ids=["direct", "graphs"])
@pytest.mark.parametrize("c", CASES, ids=[case_id(c) for c in CASES])
def test_op_cuda_matches_cpu(c: Case, use_graphs: bool) -> None:
    g = _graph(c.op, c.inputs, c.attrs)
    feeds = _feeds(c.inputs)
    want = _run(_build(g, "cpu"), feeds)
    engine = _build(g, "cuda")
    assert engine.device.startswith("cuda")
    if not use_graphs:
        _compare(c.op, _run(engine, feeds), want)
        return
    ctx = engine.create_execution_context(use_graphs=True)
    with _side_stream():
        _run(engine, [_rolled(t) for t in feeds], ctx=ctx)  # captures the graph
        got = _run(engine, feeds, ctx=ctx)  # replays it on new inputs
    _compare(c.op, got, want, " (CUDA graph replay)")


def test_graph_replay_on_the_legacy_default_stream() -> None:
    """PyTorch's default current stream is the legacy stream (handle 0), which cannot be captured:
    the context records its graph on a stream of its own and replays it on the legacy stream."""
    c = next(c for c in CASES if c.op == "matmul")
    g = _graph(c.op, c.inputs, c.attrs)
    feeds = _feeds(c.inputs)
    want = _run(_build(g, "cpu"), feeds)
    engine = _build(g, "cuda")
    ctx = engine.create_execution_context(use_graphs=True)
    assert torch.cuda.current_stream().cuda_stream == 0
    _run(engine, [_rolled(t) for t in feeds], ctx=ctx)  # captures
    assert ctx.uses_graphs, "the context gave up graph replay on the legacy stream"
    _compare(c.op, _run(engine, feeds, ctx=ctx), want, " (graph replay on the legacy stream)")


@pytest.mark.parametrize("c", _POINTWISE, ids=[case_id(c) for c in _POINTWISE])
def test_op_fused_cuda_matches_cpu(c: Case) -> None:
    """The pointwise case followed by neg / logical_not / copy, fused into one generated kernel."""
    then, _ = _then(c)
    g = _graph(c.op, c.inputs, c.attrs, then=then)
    engine = _build(g, "cuda", fuse=True)
    assert "fused_pointwise" in engine.graph_text, engine.graph_text
    feeds = _feeds(c.inputs)
    _compare(c.op, _run(engine, feeds), _run(_build(g, "cpu", fuse=True), feeds), " (fused)")


def test_fused_chain_with_constants_and_two_outputs() -> None:
    g, feeds = _chain_graph()
    engine = _build(g, "cuda", fuse=True)
    assert "fused_pointwise" in engine.graph_text
    _compare("fused_pointwise", _run(engine, feeds), _run(_build(g, "cpu", fuse=True), feeds))


def test_engine_round_trip_on_cuda_compiles_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    g, feeds = _chain_graph()
    engine = _build(g, "cuda", fuse=True)
    want = _run(engine, feeds)
    data = engine.serialize()
    path = tmp_path / "chain.kiln"
    engine.save(path)
    monkeypatch.setenv("KILN_CUDA_NO_COMPILE", "1")
    # The guard is real: building again must now fail, since the builder compiles.
    with pytest.raises(kiln.KilnError, match="KILN_CUDA_NO_COMPILE"):
        _build(_graph("add", [r(3, 5), r(3, 5)], {}), "cuda")
    for loaded in (Engine.deserialize(data, device="cuda"), Engine.load(path, device="cuda")):
        assert loaded.device.startswith("cuda")
        got = _run(loaded, feeds)
        for a, b in zip(got, want):
            assert torch.equal(a, b), "a loaded engine must run the same kernels as the built one"
        with _side_stream():
            got = _run(loaded, feeds, use_graphs=True)
        for a, b in zip(got, want):
            assert torch.equal(a, b)


def test_each_pointwise_family_round_trips_without_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    picked: dict[str, Case] = {}
    for c in _POINTWISE:
        picked.setdefault(kiln.op_family(c.op), c)
    built = [(c, _build(_graph(c.op, c.inputs, c.attrs), "cuda")) for c in picked.values()]
    blobs = [(c, e.serialize(), _run(e, _feeds(c.inputs))) for c, e in built]
    monkeypatch.setenv("KILN_CUDA_NO_COMPILE", "1")
    for c, blob, want in blobs:
        got = _run(Engine.deserialize(blob, device="cuda"), _feeds(c.inputs))
        for a, b in zip(got, want):
            assert torch.equal(a, b), case_id(c)


def test_non_contiguous_input_made_contiguous_by_the_caller() -> None:
    base = torch.randn(16, 6, device="cuda")
    x = base.t()  # [6, 16], not contiguous
    assert not x.is_contiguous()
    bias = torch.randn(16, device="cuda")
    g = Graph()
    xi = g.add_input("x", DType.f32, [6, 16])
    bi = g.add_input("b", DType.f32, [16])
    (y,) = g.add_node("add", [xi, bi])
    (z,) = g.add_node("gelu", [y], {"approximate": "none"})
    g.mark_output(z, "z")
    engine = _build(g, "cuda", fuse=True)
    xc = x.contiguous()
    got = _run(engine, [xc, bias])
    want = _run(_build(g, "cpu", fuse=True), [xc.cpu(), bias.cpu()])
    _compare("gelu", got, want)
    torch.testing.assert_close(got[0], torch.nn.functional.gelu(x + bias).cpu(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
def test_unaligned_inputs_take_the_scalar_kernel(dtype: torch.dtype) -> None:
    n = 4099  # not a multiple of any vector width either
    g = Graph()
    a = g.add_input("a", TORCH_TO_KILN[dtype], [n])
    b = g.add_input("b", TORCH_TO_KILN[dtype], [n])
    (y,) = g.add_node("mul", [a, b])
    (z,) = g.add_node("silu", [y])
    g.mark_output(z, "z")
    engine = _build(g, "cuda", fuse=True)
    storage = torch.randn(2, n + 1, device="cuda").to(dtype)
    xa, xb = storage[0, 1:], storage[1, 1:]  # contiguous, one element past an aligned address
    assert xa.data_ptr() % 16 != 0
    ctx = engine.create_execution_context(use_graphs=False)
    out_storage = torch.empty(n + 1, dtype=dtype, device="cuda")
    out = out_storage[1:]
    ctx.execute_ptrs([xa.data_ptr(), xb.data_ptr()], [out.data_ptr()], torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    want = _run(_build(g, "cpu", fuse=True), [xa.cpu(), xb.cpu()])
    _compare("silu", [out.cpu()], want, " (unaligned)")
    # And the aligned copies through the vectorized kernel agree with it.
    _compare("silu", _run(engine, [xa.clone(), xb.clone()]), want, " (aligned)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("op,x_shape,other_shape", [
    ("add", [2, 5, 5, 64], [64]),           # a per-channel bias of a channels-last tensor
    ("mul", [2, 5, 5, 64], [2, 1, 1, 64]),  # a squeeze-excite scale
    ("sub", [3, 4, 16], [3, 1, 16]),        # one row per batch, against every row
], ids=["bias", "scale", "rows"])
def test_strided_vectorized_pointwise_matches_cpu(op: str, x_shape: list[int], other_shape: list[int],
                                                  dtype: torch.dtype) -> None:
    """Broadcasts whose innermost dim is contiguous in every input run 16-byte vectors walked once
    each; at an unaligned address they take the scalar kernel. Both match the CPU."""
    g = Graph()
    a = g.add_input("a", TORCH_TO_KILN[dtype], x_shape)
    b = g.add_input("b", TORCH_TO_KILN[dtype], other_shape)
    (y,) = g.add_node(op, [a, b])
    (z,) = g.add_node("relu", [y])
    g.mark_output(z, "z")
    engine = _build(g, "cuda", fuse=True)
    assert re.search(r"strided rank \d+ vec\d+", engine.build_log), engine.build_log
    xa, xb = torch.randn(x_shape).to(dtype), torch.randn(other_shape).to(dtype)
    want = _run(_build(g, "cpu", fuse=True), [xa, xb])
    _compare(op, _run(engine, [xa, xb]), want, " (vectorized)")
    with _side_stream():
        _compare(op, _run(engine, [xa, xb], use_graphs=True), want, " (vectorized, graph replay)")
    storage = torch.empty(xa.numel() + 1, dtype=dtype, device="cuda")
    ua = storage[1:].view(x_shape)
    ua.copy_(xa)
    assert ua.data_ptr() % 16 != 0
    out = torch.empty(xa.numel() + 1, dtype=dtype, device="cuda")[1:]
    ctx = engine.create_execution_context(use_graphs=False)
    ub = xb.cuda()
    ctx.execute_ptrs([ua.data_ptr(), ub.data_ptr()], [out.data_ptr()], torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    _compare(op, [out.cpu().view(x_shape)], want, " (unaligned)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("act,residual", [("hardswish", False), ("hardsigmoid", True)])
def test_conv_hard_activation_as_cudnn_chain(act: str, residual: bool, dtype: torch.dtype) -> None:
    """hardswish / hardsigmoid after a conv: cuDNN runs them as a chain of pointwise ops on
    by-value scalars (+3, clip to [0, 6], * 1/6, and * v for hardswish). At optimization level 0
    the fused plan is taken untimed, so the chain itself runs; at the default level it is timed
    against the conv alone + the generated epilogue. Both match the CPU."""
    gen = torch.Generator().manual_seed(7)
    g = Graph()
    x = g.add_input("x", TORCH_TO_KILN[dtype], [2, 8, 11, 9])
    # CPU tensors go in through DLPack (numpy has no bfloat16).
    w = g.add_constant("w", (torch.randn(16, 8, 3, 3, generator=gen) * 0.3).to(dtype), weight=True)
    b = g.add_constant("b", (torch.randn(16, generator=gen) * 0.3).to(dtype), weight=True)
    inputs = [x, w, b]
    feeds = [(torch.randn(2, 8, 11, 9, generator=gen) * 2).to(dtype)]
    if residual:
        inputs.append(g.add_input("r", TORCH_TO_KILN[dtype], [2, 16, 11, 9]))
        feeds.append(torch.randn(2, 16, 11, 9, generator=gen).to(dtype))
    g.mark_output(g.add_node("conv", inputs, {"padding": [1, 1], "activation": act})[0], "y")
    want = _run(_build(g, "cpu"), feeds)
    untimed = Builder(BuilderConfig(device="cuda", optimization_level=0, policy=STRICT_F32)).build(g)
    assert f"+ {act} [" in untimed.build_log and "generated epilogue" not in untimed.build_log, untimed.build_log
    _compare("conv", _run(untimed, feeds), want, f" ({act} as a cuDNN chain)")
    timed = _build(g, "cuda")
    assert "fused #0 vs conv alone + generated epilogue #1" in timed.build_log, timed.build_log
    _compare("conv", _run(timed, feeds), want, f" ({act}, timed tactic)", slack=2.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_clipped_relu_epilogue_of_conv_and_linear(layout: str, dtype: torch.dtype) -> None:
    """ReLU6-style clamps fused into a conv (cuDNN's relu with its upper clip, in the fused graph)
    and a linear (the generated GEMM epilogue, cuBLASLt having no clip) match the CPU; inputs
    cross both bounds."""
    gen = torch.Generator().manual_seed(13)
    g = Graph()
    kd = TORCH_TO_KILN[dtype]
    x_shape = [2, 8, 10, 9] if layout == "nchw" else [2, 10, 9, 8]
    w_shape = [16, 8, 3, 3] if layout == "nchw" else [16, 3, 3, 8]
    x = g.add_input("x", kd, x_shape)
    w = g.add_constant("w", (torch.randn(*w_shape, generator=gen) * 0.3).to(dtype), weight=True)
    b = g.add_constant("b", (torch.randn(16, generator=gen) * 0.3).to(dtype), weight=True)
    attrs = {"padding": [1, 1], "activation": "clipped_relu", "activation_max": 1.5, "layout": layout}
    g.mark_output(g.add_node("conv", [x, w, b], attrs)[0], "conv")
    t = g.add_input("t", kd, [6, 40])
    lw = g.add_constant("lw", (torch.randn(24, 40, generator=gen) * 0.3).to(dtype), weight=True)
    g.mark_output(g.add_node("linear", [t, lw], {"activation": "clipped_relu", "activation_max": 0.5})[0], "linear")
    feeds = [(torch.randn(*x_shape, generator=gen) * 2).to(dtype), torch.randn(6, 40, generator=gen).to(dtype)]
    want = _run(_build(g, "cpu"), feeds)
    for out, bound in zip(want, (1.5, 0.5)):
        assert (out == 0).any() and (out.float() == bound).any() and ((out > 0) & (out < bound)).any()
    untimed = Builder(BuilderConfig(device="cuda", optimization_level=0, policy=STRICT_F32)).build(g)
    log = untimed.build_log
    assert "+ clipped_relu [" in log and "generated epilogue + clipped_relu" in log, log
    _compare("conv", _run(untimed, feeds), want, " (clipped_relu, untimed)")
    _compare("conv", _run(_build(g, "cuda"), feeds, use_graphs=True), want, " (clipped_relu, timed)", slack=2.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("groups,residual", [(2, False), (5, True)])
def test_grouped_conv_fused_plan_timed_against_the_conv_alone(groups: int, residual: bool, dtype: torch.dtype) -> None:
    """A grouped conv (RegNet's 24 channels a group) with bias, relu and optionally a residual:
    cuDNN's fused plan is timed against the conv alone + the generated epilogue, whichever
    wins matches the CPU, and a round trip of the engine keeps the choice."""
    gen = torch.Generator().manual_seed(11)
    c = 24 * groups
    g = Graph()
    x = g.add_input("x", TORCH_TO_KILN[dtype], [2, c, 9, 10])
    w = g.add_constant("w", (torch.randn(c, 24, 3, 3, generator=gen) * 0.2).to(dtype), weight=True)
    b = g.add_constant("b", (torch.randn(c, generator=gen) * 0.3).to(dtype), weight=True)
    inputs = [x, w, b]
    feeds = [torch.randn(2, c, 9, 10, generator=gen).to(dtype)]
    if residual:
        inputs.append(g.add_input("r", TORCH_TO_KILN[dtype], [2, c, 9, 10]))
        feeds.append(torch.randn(2, c, 9, 10, generator=gen).to(dtype))
    g.mark_output(g.add_node("conv", inputs, {"padding": [1, 1], "groups": groups, "activation": "relu"})[0], "y")
    want = _run(_build(g, "cpu"), feeds)
    timed = _build(g, "cuda")
    assert "fused #0 vs conv alone + generated epilogue #1" in timed.build_log, timed.build_log
    _compare("conv", _run(timed, feeds), want, f" (groups {groups}, timed tactic)", slack=2.0)
    again = Engine.deserialize(timed.serialize(), device="cuda")
    _compare("conv", _run(again, feeds), want, f" (groups {groups}, reloaded)", slack=2.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("channels", [16, 6], ids=["c16", "c6"])
@pytest.mark.parametrize("pool,act", [("max_pool", "relu"), ("avg_pool", "relu"), ("max_pool", "hardswish")])
def test_channels_last_region_cuda_matches_cpu(pool: str, act: str, channels: int, dtype: torch.dtype) -> None:
    """conv -> pool -> conv: a CUDA build runs it channels-last (to_channels_last; the pool's
    vectorized kernel when 16 bytes of channels divide C), and matches the CPU's channels-first run.
    hardswish has no cuDNN pointwise mode: the conv runs it as a chain of cuDNN pointwise ops or
    as the generated epilogue (its 16-byte variant when 16 bytes of channels divide C), whichever
    timed faster."""
    gen = torch.Generator().manual_seed(channels)
    g = Graph()
    x = g.add_input("x", TORCH_TO_KILN[dtype], [2, 3, 15, 13])
    w1 = g.add_constant("w1", (torch.randn(channels, 3, 3, 3, generator=gen) * 0.3).to(dtype).numpy(), weight=True)
    w2 = g.add_constant("w2", (torch.randn(5, channels, 1, 1, generator=gen) * 0.3).to(dtype).numpy(), weight=True)
    b1 = g.add_constant("b1", (torch.randn(channels, generator=gen) * 0.3).to(dtype).numpy(), weight=True)
    y = g.add_node("conv", [x, w1, b1], {"padding": [1, 1], "activation": act})[0]
    y = g.add_node(pool, [y], {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]})[0]
    g.mark_output(g.add_node("conv", [y, w2])[0], "y")
    feeds = [torch.randn(2, 3, 15, 13, generator=gen).to(dtype)]
    engine = _build(g, "cuda")
    assert f'{pool}' in engine.graph_text and 'layout="nhwc"' in engine.graph_text, engine.graph_text
    assert "input_perm" in engine.graph_text, engine.graph_text  # the image padded as it moves channels last
    # A generated epilogue reads the conv's result rounded to the dtype: one rounding more than
    # the CPU's fused epilogue (and cuDNN's), hence twice the tolerance.
    _compare("conv", _run(engine, feeds), _run(_build(g, "cpu"), feeds), " (channels-last region)",
             slack=1.0 if act == "relu" else 2.0)


@pytest.mark.parametrize("batch", [1, 2])
def test_concat_part_read_through_a_view_of_a_larger_buffer(batch: int) -> None:
    """A concat part read through a view ("view0") of a buffer twice its size: the first half of
    the channels of a channel-shuffled tensor. At batch 1 the view is dense (row-major from the
    buffer's start; its batch dim of 1 has stride 0) and the concat kernel copies it as a part of
    its own; at batch 2 it is a strided copy. Both match the CPU."""
    gen = torch.Generator().manual_seed(batch)
    g = Graph()
    base = g.add_input("base", DType.f16, [batch, 4, 2, 3, 5])
    other = g.add_input("other", DType.f16, [batch, 4, 3, 5])
    view = [0, batch, 120 if batch > 1 else 0, 4, 15, 3, 5, 5, 1]
    g.mark_output(g.add_node("concat", [base, other], {"axis": 1, "view0": view})[0], "y")
    feeds = [torch.randn(batch, 4, 2, 3, 5, generator=gen).half(), torch.randn(batch, 4, 3, 5, generator=gen).half()]
    got = _run(_build(g, "cuda"), feeds)[0]
    want = torch.cat([feeds[0].reshape(batch, 8, 3, 5)[:, :4], feeds[1]], dim=1)
    assert torch.equal(got, want)
    assert torch.equal(_run(_build(g, "cpu"), feeds)[0], want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("batch", [1, 3])
def test_channel_shuffle_stays_channels_last(batch: int, dtype: torch.dtype) -> None:
    """ShuffleNet's unit (split the channels, convs on one half, concat, channel shuffle) twice:
    a CUDA build keeps the chain channels-last (no permute left but the image's entry and the
    output's exit), the shuffle is a concat that writes the parts interleaved, and the result
    matches the CPU's channels-first run."""
    gen = torch.Generator().manual_seed(batch)
    g = Graph()
    x = g.add_input("x", TORCH_TO_KILN[dtype], [batch, 12, 7, 9])

    def conv(v: Any, cin: int, cout: int, name: str) -> Any:
        w = g.add_constant(name, (torch.randn(cout, cin, 1, 1, generator=gen) * 0.4).to(dtype).numpy(), weight=True)
        return g.add_node("conv", [v, w], {"activation": "relu"})[0]

    s = conv(x, 12, 12, "w0")
    for unit in range(2):
        a, b = g.add_node("split", [s], {"axis": 1, "sizes": [6, 6]})
        c = g.add_node("concat", [a, conv(b, 6, 6, f"w{unit + 1}")], {"axis": 1})[0]
        c = g.add_node("reshape", [c], {"shape": [batch, 2, 6, 7, 9]})[0]
        c = g.add_node("permute", [c], {"perm": [0, 2, 1, 3, 4]})[0]
        s = g.add_node("reshape", [c], {"shape": [batch, 12, 7, 9]})[0]
    g.mark_output(conv(s, 12, 5, "w9"), "y")
    feeds = [torch.randn(batch, 12, 7, 9, generator=gen).to(dtype)]
    engine = _build(g, "cuda", fuse=True)
    text = engine.graph_text
    assert text.count("permute") == 2 and text.count('concat') == 2 and "axis=4" in text, text
    _compare("conv", _run(engine, feeds), _run(_build(g, "cpu"), feeds), " (channel shuffle)")


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["f16", "f32"])
def test_window_and_grid_partitions_are_row_gathers(batch: int, dtype: torch.dtype) -> None:
    """MaxViT between two convs, written channels-first as the model writes it: the conv's
    output split into a grid of 3 x 3 cells of 4 x 4 pixels, tokens through a layer norm, merged
    back into an image, a per-channel scale, the next conv. A CUDA build moves the rows of 16
    channels with two gathers and no permute but the image's entry and the output's exit, and
    matches the CPU's channels-first run."""
    gen = torch.Generator().manual_seed(batch)
    c = 16
    g = Graph()
    x = g.add_input("x", TORCH_TO_KILN[dtype], [batch, c, 12, 12])

    def const(name: str, shape: list[int], weight: bool = True) -> Any:
        return g.add_constant(name, (torch.randn(*shape, generator=gen) * 0.3).to(dtype).numpy(), weight=weight)

    def node(op: str, ins: list[Any], **attrs: Any) -> Any:
        return g.add_node(op, ins, attrs)[0]

    y = node("conv", [x, const("w0", [c, c, 3, 3])], padding=[1, 1])
    t = node("permute", [node("reshape", [y], shape=[batch, c, 3, 4, 3, 4])], perm=[0, 2, 4, 3, 5, 1])
    t = node("reshape", [t], shape=[batch, 9, 16, c])
    t = node("layer_norm", [t, const("lw", [c]), const("lb", [c])], eps=1e-5, normalized_rank=1)
    m = node("permute", [node("reshape", [t], shape=[batch, 3, 3, 4, 4, c])], perm=[0, 5, 1, 3, 2, 4])
    m = node("mul", [node("reshape", [m], shape=[batch, c, 12, 12]), const("s", [c, 1, 1])])
    g.mark_output(node("conv", [node("relu", [m]), const("w1", [c, c, 3, 3])], padding=[1, 1]), "z")
    feeds = [torch.randn(batch, c, 12, 12, generator=gen).to(dtype)]
    engine = _build(g, "cuda", fuse=True)
    text = engine.graph_text
    assert text.count("permute") == 2 and text.count("index_select") == 2, text
    _compare("conv", _run(engine, feeds), _run(_build(g, "cpu"), feeds), " (window and grid partitions)")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["f16", "f32"])
def test_a_plain_matmul_is_one_gemm_with_no_epilogue_kernel(dtype: torch.dtype) -> None:
    """A matmul with nothing fused into it runs cuBLASLt alone: no generated epilogue kernel
    passes over its output. It matches the CPU."""
    g = Graph()
    a = g.add_input("a", TORCH_TO_KILN[dtype], [3, 40, 24])
    b = g.add_input("b", TORCH_TO_KILN[dtype], [3, 24, 56])
    (y,) = g.add_node("matmul", [a, b])
    g.mark_output(y, "y")
    engine = _build(g, "cuda")
    assert "cuBLASLt matmul" in engine.build_log and "generated epilogue" not in engine.build_log, engine.build_log
    xa, xb = torch.randn(3, 40, 24).to(dtype), torch.randn(3, 24, 56).to(dtype)
    _compare("matmul", _run(engine, [xa, xb]), _run(_build(g, "cpu"), [xa, xb]))


# Transposes of 2-byte elements whose extents and strides are even move as pairs in 64 x 64 tiles
# (NHWC, DeBERTa's scores, tile edges, batch dims); odd extents take the 32 x 32 kernel, and so
# does a buffer that is not 4-byte aligned (the launch's fallback). Every copy is exact.
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("shape,perm,pairs", [
    ([8, 64, 56, 56], [0, 2, 3, 1], True),
    ([6, 128, 128], [0, 2, 1], True),
    ([3, 70, 66], [0, 2, 1], True),
    ([2, 6, 10, 14], [0, 3, 1, 2], True),
    ([2, 4, 66, 3, 2], [0, 2, 4, 3, 1], False),
    ([4, 33, 18], [0, 2, 1], False),
])
def test_transposes_of_pairs_match_torch(shape: list[int], perm: list[int], pairs: bool, dtype: torch.dtype) -> None:
    x = torch.randn(shape).to(dtype)
    g = _graph("permute", [x], {"perm": perm})
    engine = _build(g, "cuda")
    assert ("tiled transpose of pairs" in engine.build_log) == pairs, engine.build_log
    want = x.permute(perm).contiguous()
    assert torch.equal(_run(engine, [x])[0], want)
    # Input and output one element past an aligned address: the 32 x 32 kernel, the same bytes.
    n = x.numel()
    xs = torch.empty(n + 1, dtype=dtype, device="cuda")[1:]
    xs.copy_(x.flatten())
    out = torch.empty(n + 1, dtype=dtype, device="cuda")[1:].fill_(float("nan"))
    engine.create_execution_context(use_graphs=False).execute_ptrs([xs.data_ptr()], [out.data_ptr()],
                                                                   torch.cuda.current_stream().cuda_stream)
    torch.cuda.current_stream().synchronize()
    assert torch.equal(out.cpu().view(want.shape), want)
