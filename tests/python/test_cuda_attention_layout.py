"""sdpa on CUDA in both layouts, against the CPU backend and PyTorch in float64.

layout "bshd" (q [B, L, H, D], k / v [B, S, H, D], out [B, L, H, D]) is what the
fold_attention_layout pass gives transformer blocks; on CUDA the fused flash kernel and the
fallback (cuBLASLt + generated softmax) read those tensors through row and batch strides, with
no copy. Each case builds one sdpa node, runs it on CUDA (output poisoned with NaN first, so an
unwritten element fails) and checks:
  - the CUDA result against the CPU engine for the same graph and inputs, and both against
    torch's sdpa in float64 on the permuted tensors, by relative error ||out - ref|| / ||ref||;
  - that the path the case is meant to take was taken (the build log names it);
cases: the shapes that matter (head dim 64, L = S = 128 with an additive [B, 1, 1, S] mask as
BERT, L = S = 197 unmasked as ViT), and what the flash kernel must keep right: causal, bool
masks, head dims 32 (Swin's 8 x 8 windows), 96 and 128, odd L and S, L != S, heads of k / v broadcast, f16 and bf16; f32 (BERT's
shape, rows of 1500 keys: the fallback's softmax takes a warp per row, k / v heads broadcast) and
head dim 40 go through the fallback, which in layout "bshd" at batch > 1 (two batch strides, b
and h) runs its GEMMs through pointer arrays; an engine saved and loaded keeps that path and its
bits. The default layout runs the same cases.

Operand views (q_view / k_view / v_view, out_perm: what the pass makes of torchvision's
MultiheadAttention) run on one [S, B, 3 * H * D] qkv buffer, checked the same way against torch
on torch.as_strided views of it, at optimization level 0 (the generated kernel, which must say
"strided views") and at the default level (whatever fused kernel the timing picks); offsets that
break 16-byte alignment take the fallback. A torchvision ViT encoder block compiled in FP16
checks the whole chain: qkv linear -> sdpa -> reshape -> out linear, matching eager FP32.
Skipped, with the reason, where Kiln has no CUDA device.
"""

from __future__ import annotations

from typing import Optional

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import Builder, BuilderConfig, Graph
from test_cuda_ops import _run as run_engine
from test_ops import TORCH_TO_KILN

pytestmark = pytest.mark.cuda  # skipped without a GPU (conftest.py)

# (batch, L, S, heads, kv heads, head dim, mask: none | additive | bool, causal, dtype)
CASES = [
    (2, 128, 128, 12, 12, 64, "additive", False, torch.float16),   # BERT
    (2, 197, 197, 12, 12, 64, "none", False, torch.float16),       # ViT
    (2, 197, 197, 4, 4, 64, "none", False, torch.bfloat16),
    (1, 128, 128, 3, 3, 64, "additive", False, torch.bfloat16),
    (2, 37, 53, 3, 3, 64, "bool", False, torch.float16),
    (2, 70, 70, 2, 2, 128, "none", True, torch.float16),
    (1, 100, 67, 2, 2, 128, "additive", True, torch.bfloat16),
    (2, 65, 130, 3, 1, 64, "none", False, torch.float16),          # one k / v head for all
    (1, 1, 9, 2, 2, 64, "bool", True, torch.float16),
    (4, 64, 64, 3, 3, 32, "additive", False, torch.float16),       # Swin: 8 x 8 windows, head dim 32
    (2, 49, 49, 4, 4, 32, "bool", True, torch.bfloat16),
    (2, 77, 90, 2, 2, 96, "additive", False, torch.float16),       # head dim 96
    (1, 130, 130, 2, 2, 96, "none", True, torch.bfloat16),
    (2, 33, 47, 3, 3, 40, "additive", False, torch.float16),       # fallback: head dim 40
    (2, 29, 31, 2, 2, 32, "bool", True, torch.float32),            # fallback: f32
    (2, 128, 128, 12, 12, 64, "additive", False, torch.float32),   # fallback: BERT in f32
    (1, 3, 1500, 2, 2, 32, "additive", False, torch.float32),      # fallback: rows of 1500 keys
    (3, 40, 50, 3, 1, 32, "bool", False, torch.float32),           # fallback: one k / v head for all
]


def _id(c: tuple) -> str:
    b, l, s, h, hkv, d, mask, causal, dt = c
    return f"b{b}-l{l}-s{s}-h{h}x{hkv}-d{d}-{mask}{'-causal' if causal else ''}-{str(dt).split('.')[-1]}"


def _inputs(c: tuple, seed: int) -> tuple[list[torch.Tensor], Optional[torch.Tensor]]:
    """q, k, v in [B, S, H, D] and the mask (indexing the scores [B, H, L, S]), on the CPU."""
    b, l, s, h, hkv, d, mask, _, dt = c
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, l, h, d, generator=gen).to(dt)
    k = torch.randn(b, s, hkv, d, generator=gen).to(dt)
    v = torch.randn(b, s, hkv, d, generator=gen).to(dt)
    m = None
    if mask == "additive":  # BERT's padding mask: 0 or a large negative per key
        keep = torch.rand(b, 1, 1, s, generator=gen) > 0.2
        m = torch.where(keep, 0.0, -10000.0).to(dt)
    elif mask == "bool":
        m = (torch.rand(l, s, generator=gen) > 0.3) | torch.eye(l, s, dtype=torch.bool)
    return [q, k, v], m


def _graph(c: tuple, bshd: bool, mask: Optional[torch.Tensor]) -> Graph:
    b, l, s, h, hkv, d, _, causal, dt = c
    kd = TORCH_TO_KILN[dt]
    shape = (lambda n, hh: [b, n, hh, d]) if bshd else (lambda n, hh: [b, hh, n, d])
    g = Graph()
    ids = [g.add_input("q", kd, shape(l, h)), g.add_input("k", kd, shape(s, hkv)), g.add_input("v", kd, shape(s, hkv))]
    if mask is not None:
        ids.append(g.add_input("mask", TORCH_TO_KILN[mask.dtype], list(mask.shape)))
    attrs: dict = {"causal": causal}
    if bshd:
        attrs["layout"] = "bshd"
    g.mark_output(g.add_node("sdpa", ids, attrs, name="attention")[0], "y")
    return g


def _run(g: Graph, device: str, feeds: list[torch.Tensor], optimization_level: Optional[int] = None
         ) -> tuple[torch.Tensor, str]:
    config = BuilderConfig(device=device, fuse_pointwise=False)
    if optimization_level is not None:
        config.optimization_level = optimization_level
    engine = Builder(config).build(g)
    return run_engine(engine, feeds)[0], engine.build_log  # the output starts as NaN


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


@pytest.mark.parametrize("bshd", [True, False], ids=["bshd", "bhsd"])
@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_sdpa_layouts_cuda_match_cpu(c: tuple, bshd: bool) -> None:
    b, l, s, h, hkv, d, mask_kind, causal, dt = c
    (q, k, v), mask = _inputs(c, seed=l * 31 + s)
    # torch's sdpa in float64 on [B, H, S, D]; heads of k / v broadcast by repeating them
    def t(x: torch.Tensor, hh: int) -> torch.Tensor:
        return x.double().transpose(1, 2).expand(b, h, -1, d) if hh == 1 else x.double().transpose(1, 2)

    ref_mask = None if mask is None else (mask if mask.dtype == torch.bool else mask.double())
    ref = F.scaled_dot_product_attention(t(q, h), t(k, hkv), t(v, hkv), attn_mask=ref_mask, is_causal=causal)
    feeds = [q, k, v] if bshd else [x.transpose(1, 2).contiguous() for x in (q, k, v)]
    if mask is not None:
        feeds.append(mask)
    g = _graph(c, bshd, mask)
    got, log = _run(g, "cuda", feeds)
    want, _ = _run(g, "cpu", feeds)
    if bshd:
        ref = ref.transpose(1, 2)
    assert not torch.isnan(got).any(), "CUDA left output elements unwritten (NaN)"
    fused = dt != torch.float32 and d in (32, 64, 96, 128)
    assert ("fused flash attention" in log) == fused, log
    tol = {torch.float16: 4e-3, torch.bfloat16: 2e-2, torch.float32: 2e-3}[dt]  # f32: TF32 GEMMs allowed
    assert _rel(want, ref) < tol, f"CPU vs float64: {_rel(want, ref):.2e}"
    assert _rel(got, ref) < tol, f"CUDA vs float64: {_rel(got, ref):.2e}"
    assert _rel(got, want) < tol, f"CUDA vs CPU: {_rel(got, want):.2e}"
    # Fresh inputs on the same engines: the same function, not a cached answer.
    (q2, k2, v2), _ = _inputs(c, seed=l * 31 + s + 1)
    feeds2 = [q2, k2, v2] if bshd else [x.transpose(1, 2).contiguous() for x in (q2, k2, v2)]
    feeds2 += feeds[3:]
    assert _rel(_run(g, "cuda", feeds2)[0], _run(g, "cpu", feeds2)[0]) < tol


def test_sdpa_pointer_array_fallback_survives_save_and_load() -> None:
    """The fallback over [B, S, H, D] operands at B > 1 batches its GEMMs through pointer
    arrays; the engine file keeps that path and its algorithms: a loaded engine gives the same
    bits as the built one, and both match the CPU engine."""
    c = (3, 128, 128, 4, 4, 64, "additive", False, torch.float32)
    (q, k, v), mask = _inputs(c, seed=7)
    g = _graph(c, True, mask)
    engine = Builder(BuilderConfig(device="cuda", fuse_pointwise=False)).build(g)
    assert "through pointer arrays" in engine.build_log, engine.build_log
    loaded = kiln.Engine.deserialize(engine.serialize(), "cuda")
    feeds = [q, k, v, mask]
    got, again = run_engine(engine, feeds)[0], run_engine(loaded, feeds)[0]
    assert torch.equal(got, again)
    want = run_engine(Builder(BuilderConfig(device="cpu", fuse_pointwise=False)).build(g), feeds)[0]
    assert _rel(got, want) < 2e-3, f"CUDA vs CPU: {_rel(got, want):.2e}"


# ---- operand views (q_view / k_view / v_view, out_perm) --------------------------------------
# What fold_attention_layout makes of torchvision's MultiheadAttention: q, k and v read straight
# out of the qkv linear's output [S, B, 3 * H * D] (k and v at element offsets H * D and
# 2 * H * D), the output written [S, B, H, D] for the out-projection. Each case runs one sdpa
# node with those attributes on CUDA and the CPU and checks both against torch's sdpa in
# float64 on the same buffer read through torch.as_strided.

# (batch, S, heads, head dim, mask, causal, dtype, qkv offset shift in elements, expected path)
VIEW_CASES = [
    (2, 197, 12, 64, "none", False, torch.float16, 0, "fused"),      # ViT-B/16
    (3, 77, 4, 128, "none", False, torch.bfloat16, 0, "fused"),
    (2, 50, 3, 64, "bool", True, torch.float16, 0, "fused"),
    (1, 33, 2, 64, "additive", False, torch.float16, 8, "fused"),    # 16-byte shift: still aligned
    (2, 40, 3, 64, "none", False, torch.float16, 4, "fallback"),     # 8-byte shift: not for vector loads
    (2, 29, 2, 32, "none", True, torch.float32, 0, "fallback"),      # f32 and head dim 32
]


def _view_id(c: tuple) -> str:
    b, s, h, d, mask, causal, dt, shift, path = c
    return f"b{b}-s{s}-h{h}-d{d}-{mask}{'-causal' if causal else ''}-{str(dt).split('.')[-1]}-shift{shift}-{path}"


@pytest.mark.parametrize("c", VIEW_CASES, ids=[_view_id(c) for c in VIEW_CASES])
def test_sdpa_operand_views_cuda_match_cpu(c: tuple) -> None:
    b, s, h, d, mask_kind, causal, dt, shift, path = c
    e = h * d
    gen = torch.Generator().manual_seed(s * 7 + d)
    qkv = torch.randn(s, b, 3 * e + shift, generator=gen).to(dt)
    views = [[shift + i * e, b, 3 * e + shift, h, d, s, b * (3 * e + shift), d, 1] for i in range(3)]
    logical = [torch.as_strided(qkv.reshape(-1), v[1::2], v[2::2], v[0]).double() for v in views]
    mask = None
    if mask_kind == "additive":
        mask = torch.where(torch.rand(b, 1, 1, s, generator=gen) > 0.2, 0.0, -10000.0).to(dt)
    elif mask_kind == "bool":
        mask = (torch.rand(s, s, generator=gen) > 0.3) | torch.eye(s, dtype=torch.bool)
    ref_mask = None if mask is None else (mask if mask.dtype == torch.bool else mask.double())
    if causal:  # torch takes a mask or is_causal
        keep = torch.ones(s, s, dtype=torch.bool).tril()
        ref_mask = keep if ref_mask is None else ref_mask & keep
    ref = F.scaled_dot_product_attention(*logical, attn_mask=ref_mask).permute(2, 0, 1, 3)

    g = Graph()
    x = g.add_input("qkv", TORCH_TO_KILN[dt], list(qkv.shape))
    ids, feeds = [x, x, x], [qkv]
    if mask is not None:
        ids.append(g.add_input("mask", TORCH_TO_KILN[mask.dtype], list(mask.shape)))
        feeds.append(mask)
    attrs = {"causal": causal, "q_view": views[0], "k_view": views[1], "v_view": views[2], "out_perm": [2, 0, 1, 3]}
    g.mark_output(g.add_node("sdpa", ids, attrs, name="attention")[0], "y")
    want, _ = _run(g, "cpu", feeds)
    tol = {torch.float16: 4e-3, torch.bfloat16: 2e-2, torch.float32: 2e-3}[dt]
    assert _rel(want, ref) < tol, f"CPU vs float64: {_rel(want, ref):.2e}"
    # Level 0 takes the generated kernel without timing; the default level may time it against
    # other fused kernels (cuDNN) and keep the fastest: every choice must read the views right.
    for level in (0, None):
        got, log = _run(g, "cuda", feeds, optimization_level=level)
        assert got.shape == (s, b, h, d)
        assert not torch.isnan(got).any(), f"level {level}: CUDA left output elements unwritten (NaN)\n{log}"
        assert _rel(got, ref) < tol, f"level {level}: CUDA vs float64: {_rel(got, ref):.2e}\n{log}"
        assert _rel(got, want) < tol, f"level {level}: CUDA vs CPU: {_rel(got, want):.2e}\n{log}"
        if level == 0:
            assert ("fused flash attention" in log) == (path == "fused"), log
            assert path != "fused" or "strided views" in log, log
            assert path == "fused" or "not fused" in log, log


@pytest.mark.parametrize("level", [0, None], ids=["generated", "default-level"])
def test_vit_encoder_block_fp16_reads_qkv_through_views(level: Optional[int]) -> None:
    """torchvision's ViT encoder block compiled in FP16: the plan's sdpa reads the qkv linear's
    output (no slice or permute between them) and writes what the out-projection reads, runs a
    fused kernel, and the block matches eager FP32. Level 0 takes the generated flash kernel; the
    default level may pick another fused kernel by timing, which must read the views too."""
    vt = pytest.importorskip("torchvision.models.vision_transformer")
    torch.manual_seed(0)
    block = vt.EncoderBlock(num_heads=12, hidden_dim=768, mlp_dim=3072, dropout=0.0, attention_dropout=0.0)
    block = block.eval().cuda()
    x = torch.randn(4, 197, 768, device="cuda")
    options = {} if level is None else {"optimization_level": level}
    with torch.no_grad():
        ref = block(x)
        fast = kiln.compile(block.half(), arg_inputs=[x.half()], enabled_precisions={torch.half}, min_block_size=1,
                            require_full_compilation=True, **options)
        got = fast(x.half()).float()
    (engine,) = [m.engine for m in fast.engines()]
    assert _rel(got, ref) < 1e-2, f"{_rel(got, ref):.2e}\n{engine.build_log}"
    plan = engine.graph()
    producer = {v: n.op for n in plan.nodes for v in n.outputs}
    (sdpa,) = [n for n in plan.nodes if n.op == "sdpa"]
    assert {producer[v] for v in sdpa.inputs} == {"linear"} and len(set(sdpa.inputs)) == 1, engine.graph_text
    assert sdpa.attrs["out_perm"] == [2, 0, 1, 3]
    assert "slice" not in [n.op for n in plan.nodes]
    assert "fused flash attention" in engine.build_log, engine.build_log
    if level == 0:
        assert "strided views" in engine.build_log, engine.build_log


@pytest.mark.parametrize("batch", [1, 3])
def test_bert_layer_fp32_reads_heads_in_place(batch: int) -> None:
    """An HF BERT layer in FP32 (TF32 allowed) takes the fallback attention path. Its GEMMs read
    strided operands, so the q, k and v projections run as one linear, sdpa reads its output
    through views and writes the order the merge wants: no permute copy is left. At batch 1 the
    heads are one batch stride; at batch 3 the [B, S, H, D] views have two (b and h), which the
    GEMMs take through pointer arrays in one pass. Both match eager FP32 within TF32."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=256, num_attention_heads=4, intermediate_size=512,
                                     attn_implementation="sdpa")
    torch.manual_seed(0)
    layer = transformers.models.bert.modeling_bert.BertLayer(config).eval().cuda()
    x = torch.randn(batch, 128, 256, device="cuda")
    with torch.no_grad():
        ref = layer(x)
        ref = ref[0] if isinstance(ref, tuple) else ref
        fast = kiln.compile(layer, arg_inputs=[x], min_block_size=1, require_full_compilation=True)
        got = fast(x)
        got = got[0] if isinstance(got, tuple) else got
    (engine,) = [m.engine for m in fast.engines()]
    assert _rel(got, ref) < 2e-3, f"{_rel(got, ref):.2e}\n{engine.build_log}"
    ops = [n.op for n in engine.graph().nodes]
    assert ops.count("sdpa") == 1, engine.graph_text
    assert "sdpa fallback" in engine.build_log and "not fused: the fused kernel takes f16/bf16" in engine.build_log
    assert ops.count("linear") == 4, engine.graph_text  # qkv, out, and the two of the MLP
    assert "permute" not in ops, engine.graph_text
    assert ("through pointer arrays" in engine.build_log) == (batch > 1), engine.build_log
