"""sdpa through cuDNN's fused attention, the tactic timed against Kiln's flash kernel.

F16 / bf16 attention has two fused implementations on CUDA: the generated flash kernel and
cuDNN's (its SDPA operation without a mask, cuDNN 9.13+; with a mask or causal, the chain of
operations cuDNN fuses into its flash kernel with a bias and / or a causal select). The build policy's
attention_tactic="cudnn" takes the cuDNN one so that it is the kernel under test (the build log must name it); each case compares
it with the CPU engine and with torch's sdpa in float64, in both layouts ([B, H, S, D] and
"bshd" [B, S, H, D], read through strides). Masks: additive [B, 1, 1, S] (BERT's padding shape)
and [B, 1, L, S] with finite values and dropped keys, and bool masks, which CUDA builds turn into
additive ones. Also: CUDA-graph replay, engine round trips that rebuild the saved cuDNN plan
without compiling anything (KILN_CUDA_NO_COMPILE, which forbids cuDNN's runtime compilation too),
unmasked from the engine config and masked from the plan's serialized form, the timed default
(whichever wins is correct and the log shows the timing), causal attention (alone and with an
additive mask, L = S and L != S, also through a plan rebuilt from its serialized form), masks
with unaligned rows never taking the cuDNN path, and a bad attention_tactic value being an error
that names it.
Skipped, with the reason, where Kiln has no CUDA device.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import Builder, BuilderConfig, Engine, Graph
from kiln._C import BuildPolicy
from test_cuda_ops import _run as run_engine
from test_ops import TORCH_TO_KILN

pytestmark = pytest.mark.cuda  # skipped without a GPU (conftest.py)

# (batch, L, S, heads, head dim, dtype)
CASES = [
    (2, 197, 197, 12, 64, torch.float16),   # ViT-B/16
    (2, 128, 128, 12, 64, torch.bfloat16),
    (1, 100, 67, 3, 128, torch.float16),    # L != S, head dim 128
    (3, 1, 9, 2, 64, torch.float16),        # one query row
]
TOL = {torch.float16: 4e-3, torch.bfloat16: 2e-2}


def _id(c: tuple) -> str:
    b, l, s, h, d, dt = c
    return f"b{b}-l{l}-s{s}-h{h}-d{d}-{str(dt).split('.')[-1]}"


# Mask kinds: "" none; "add" additive [B, 1, 1, S]; "add-rows" additive [B, 1, L, S]; "bool" [B, 1, 1, S].
MASK_SHAPES = {"add": lambda b, l, s: [b, 1, 1, s], "add-rows": lambda b, l, s: [b, 1, l, s],
               "bool": lambda b, l, s: [b, 1, 1, s]}


def _graph(c: tuple, bshd: bool, mask: str = "", causal: bool = False) -> Graph:
    b, l, s, h, d, dt = c
    kd = TORCH_TO_KILN[dt]
    shape = (lambda n: [b, n, h, d]) if bshd else (lambda n: [b, h, n, d])
    g = Graph()
    ids = [g.add_input("q", kd, shape(l)), g.add_input("k", kd, shape(s)), g.add_input("v", kd, shape(s))]
    if mask:
        ids.append(g.add_input("mask", TORCH_TO_KILN[torch.bool] if mask == "bool" else kd,
                               MASK_SHAPES[mask](b, l, s)))
    attrs: dict = {"causal": causal}
    if bshd:
        attrs["layout"] = "bshd"
    g.mark_output(g.add_node("sdpa", ids, attrs, name="attention")[0], "y")
    return g


def _inputs(c: tuple, bshd: bool, seed: int) -> list[torch.Tensor]:
    b, l, s, h, d, dt = c
    gen = torch.Generator().manual_seed(seed)
    shape = (lambda n: (b, n, h, d)) if bshd else (lambda n: (b, h, n, d))
    return [torch.randn(*shape(n), generator=gen).to(dt) for n in (l, s, s)]


def _run(engine: Engine, feeds: list[torch.Tensor], use_graphs: bool = False) -> torch.Tensor:
    ctx = engine.create_execution_context(use_graphs=use_graphs)
    out = run_engine(engine, feeds, ctx=ctx)
    if use_graphs:  # a graph context captures on the first call and replays on the second
        out = run_engine(engine, feeds, ctx=ctx)
    return out[0]


def _build(g: Graph, device: str, tactic: str = "auto") -> Engine:
    policy = BuildPolicy(attention_tactic=tactic)
    return Builder(BuilderConfig(device=device, fuse_pointwise=False, policy=policy)).build(g)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


def _mask(c: tuple, kind: str, seed: int) -> torch.Tensor:
    """A mask that drops about a third of the keys (every row keeps its first key); additive
    kinds also carry finite random values on the kept ones."""
    b, l, s, h, d, dt = c
    gen = torch.Generator().manual_seed(seed)
    keep = torch.rand(*MASK_SHAPES[kind](b, l, s), generator=gen) > 1 / 3
    keep[..., 0] = True
    if kind == "bool":
        return keep
    bias = torch.randn(keep.shape, generator=gen).masked_fill(~keep, float("-inf"))
    return bias.to(dt)


def _reference(feeds: list[torch.Tensor], bshd: bool, causal: bool = False) -> torch.Tensor:
    t = (lambda x: x.double().transpose(1, 2)) if bshd else (lambda x: x.double())
    mask = feeds[3] if len(feeds) > 3 else None
    if mask is not None and mask.is_floating_point():
        mask = mask.double()
    q, k, v = (t(x) for x in feeds[:3])
    if causal:  # top-left aligned, as sdpa's causal; torch takes no mask with is_causal
        seen = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        mask = seen if mask is None else mask.masked_fill(~seen, float("-inf"))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return ref.transpose(1, 2) if bshd else ref


@pytest.mark.parametrize("bshd", [True, False], ids=["bshd", "bhsd"])
@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_cudnn_sdpa_matches_cpu_and_float64(c: tuple, bshd: bool) -> None:
    g = _graph(c, bshd)
    engine = _build(g, "cuda", "cudnn")
    log = engine.build_log
    assert "fused flash attention by cuDNN" in log, log
    feeds = _inputs(c, bshd, seed=c[1] * 7 + c[2])
    tol = TOL[c[5]]
    got, want, ref = _run(engine, feeds), _run(_build(g, "cpu"), feeds), _reference(feeds, bshd)
    assert not torch.isnan(got).any(), "cuDNN left output elements unwritten (NaN)"
    assert _rel(got, ref) < tol, f"CUDA (cuDNN) vs float64: {_rel(got, ref):.2e}"
    assert _rel(got, want) < tol, f"CUDA (cuDNN) vs CPU: {_rel(got, want):.2e}"
    # Other inputs through a captured CUDA graph: the same function, not a cached answer.
    feeds2 = _inputs(c, bshd, seed=c[1] * 7 + c[2] + 1)
    assert _rel(_run(engine, feeds2, use_graphs=True), _reference(feeds2, bshd)) < tol


def test_cudnn_sdpa_round_trip_rebuilds_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    c = CASES[0]
    engine = _build(_graph(c, True), "cuda", "cudnn")
    feeds = _inputs(c, True, seed=5)
    blob = engine.serialize()
    monkeypatch.setenv("KILN_CUDA_NO_COMPILE", "1")
    loaded = Engine.deserialize(blob, device="cuda")
    assert loaded.policy == engine.policy == BuildPolicy(attention_tactic="cudnn")
    assert torch.equal(_run(loaded, feeds), _run(engine, feeds))


def test_timed_choice_is_correct_and_logged() -> None:
    c = CASES[0]
    g = _graph(c, True)
    engine = _build(g, "cuda")
    log = engine.build_log
    assert "vs cuDNN plans" in log or "timing cache" in log, log
    feeds = _inputs(c, True, seed=11)
    assert _rel(_run(engine, feeds), _reference(feeds, True)) < TOL[c[5]]


# (batch, L, S, heads, head dim, dtype): S a multiple of 8, so that the mask's rows are aligned.
MASKED_CASES = [
    (2, 128, 128, 12, 64, torch.float16),   # BERT-base
    (3, 100, 72, 3, 128, torch.bfloat16),   # L != S, head dim 128
]


@pytest.mark.parametrize("kind", ["add", "add-rows", "bool"])
@pytest.mark.parametrize("bshd", [True, False], ids=["bshd", "bhsd"])
@pytest.mark.parametrize("c", MASKED_CASES, ids=[_id(c) for c in MASKED_CASES])
def test_cudnn_masked_sdpa_matches_cpu_and_float64(c: tuple, bshd: bool, kind: str) -> None:
    g = _graph(c, bshd, mask=kind)
    engine = _build(g, "cuda", "cudnn")
    log = engine.build_log
    assert "by cuDNN" in log and "additive mask as bias" in log, log
    if kind == "bool":
        assert "pass additive_attention_masks: changed" in log, log
    tol = TOL[c[5]]
    for i, use_graphs in enumerate((False, True)):
        seed = c[1] * 7 + c[2] + i
        feeds = _inputs(c, bshd, seed) + [_mask(c, kind, seed)]
        got, ref = _run(engine, feeds, use_graphs=use_graphs), _reference(feeds, bshd)
        assert not torch.isnan(got).any(), "cuDNN left output elements unwritten (NaN)"
        assert _rel(got, ref) < tol, f"CUDA (cuDNN) vs float64: {_rel(got, ref):.2e}"
        if not use_graphs:
            want = _run(_build(g, "cpu"), feeds)
            assert _rel(got, want) < tol, f"CUDA (cuDNN) vs CPU: {_rel(got, want):.2e}"


def test_cudnn_masked_sdpa_round_trip_uses_the_serialized_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    # The masked graph's plan is runtime-compiled: loading must rebuild it from the serialized
    # form the state stores, since finalizing its engine config would compile cuDNN's kernel.
    c = MASKED_CASES[0]
    engine = _build(_graph(c, True, "add"), "cuda", "cudnn")
    assert "additive mask as bias" in engine.build_log, engine.build_log
    seed = 17
    feeds = _inputs(c, True, seed) + [_mask(c, "add", seed)]
    blob = engine.serialize()
    monkeypatch.setenv("KILN_CUDA_NO_COMPILE", "1")
    loaded = Engine.deserialize(blob, device="cuda")
    assert torch.equal(_run(loaded, feeds), _run(engine, feeds))


@pytest.mark.parametrize("c,mask", [(CASES[1], ""), (CASES[2], ""), (MASKED_CASES[0], "add-rows"),
                                    (MASKED_CASES[1], "add")], ids=["l=s", "l>s", "masked-rows", "masked-l>s"])
def test_cudnn_causal_sdpa_matches_cpu_and_float64(c: tuple, mask: str, monkeypatch: pytest.MonkeyPatch) -> None:
    g = _graph(c, True, mask=mask, causal=True)
    engine = _build(g, "cuda", "cudnn")
    log = engine.build_log
    assert "by cuDNN" in log and ", causal" in log, log
    tol = TOL[c[5]]
    seed = c[1] + c[2]
    feeds = _inputs(c, True, seed) + ([_mask(c, mask, seed)] if mask else [])
    got, ref = _run(engine, feeds), _reference(feeds, True, causal=True)
    assert not torch.isnan(got).any(), "cuDNN left output elements unwritten (NaN)"
    assert _rel(got, ref) < tol, f"CUDA (cuDNN) vs float64: {_rel(got, ref):.2e}"
    assert _rel(got, _run(_build(g, "cpu"), feeds)) < tol
    assert _rel(_run(engine, feeds, use_graphs=True), ref) < tol
    # The causal chain's plan is runtime-compiled: a load rebuilds it from its serialized form.
    blob = engine.serialize()
    monkeypatch.setenv("KILN_CUDA_NO_COMPILE", "1")
    assert torch.equal(_run(Engine.deserialize(blob, device="cuda"), feeds), got)


def test_unaligned_mask_never_takes_cudnn() -> None:
    log = _build(_graph(CASES[0], True, mask="add"), "cuda", "cudnn").build_log
    assert "by cuDNN" not in log and "fused flash attention (generated" in log, log


def test_bad_tactic_is_an_error_naming_it() -> None:
    with pytest.raises(kiln.InvalidArgumentError, match="attention_tactic"):
        _build(_graph(CASES[0], True), "cuda", "fastest")
