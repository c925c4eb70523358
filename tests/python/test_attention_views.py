"""sdpa operand views on the CPU: q, k and v read as strided views of their buffers
(attributes q_view / k_view / v_view = [offset, size0, stride0, ...]) and the output written in a
permuted order (out_perm), as the fold_attention_layout pass makes them for torchvision's
MultiheadAttention (src/passes/fold_attention_layout.cpp).

  - one sdpa node with views, built by hand, against torch's sdpa in float64 on the same buffers
    read through torch.as_strided (f32 and f16; a bool mask, causal, a broadcast head, overlapping
    views, outputs permuted or not);
  - torchvision's vit_b_16 (random weights, batch 2) compiled with Kiln to compute in f16 on the
    CPU, where the default filter folds its attention: every sdpa reads the qkv linear's output
    directly and writes the [S, B, H, D] order the out-projection wants, and the model matches
    eager FP32 to f16 accuracy, on two sets of inputs.
The CUDA kernels for the same attributes are tested in test_cuda_attention_layout.py.
"""

from __future__ import annotations

from typing import Optional

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import Builder, BuilderConfig, Graph
from kiln.testing import first_output, randomize_weights, relative_error
from test_ops import KILN_TO_TORCH, TORCH_TO_KILN


def _view(buf: torch.Tensor, v: list[int]) -> torch.Tensor:
    """The logical tensor a view attribute [offset, size0, stride0, ...] describes."""
    return torch.as_strided(buf.reshape(-1), v[1::2], v[2::2], v[0])


def _run_cpu(g: Graph, feeds: list[torch.Tensor]) -> tuple[torch.Tensor, str]:
    engine = Builder(BuilderConfig(device="cpu", fuse_pointwise=False)).build(g)
    ins = [t.contiguous() for t in feeds]
    o = engine.outputs[0]
    out = torch.full(o.shape, float("nan"), dtype=KILN_TO_TORCH[o.dtype])
    engine.create_execution_context().execute_ptrs([t.data_ptr() for t in ins], [out.data_ptr()], 0)
    return out, engine.graph_text


# (name, buffer shapes, views of q, k, v (index of the buffer, attribute), out_perm, mask, causal)
B, S, H, D = 2, 9, 3, 8
E = H * D
QKV = [S, B, 3 * E]  # a qkv linear's output, as torchvision's MultiheadAttention has it


def _qkv_view(i: int) -> list[int]:
    return [i * E, B, 3 * E, H, D, S, B * 3 * E, D, 1]


CASES = {
    "vit-qkv": ([QKV], [(0, _qkv_view(0)), (0, _qkv_view(1)), (0, _qkv_view(2))], [2, 0, 1, 3], None, False),
    "vit-qkv-causal-bool": ([QKV], [(0, _qkv_view(0)), (0, _qkv_view(1)), (0, _qkv_view(2))], None, "bool", True),
    # q a plain input; k overlapping q's buffer one row on; v one head for all (stride 0).
    "mixed": ([[B, H, S, D], QKV], [(0, None), (1, [E, B, 3 * E, H, D, S - 1, B * 3 * E, D, 1]),
                                    (1, [2 * E, B, 3 * E, H, 0, S - 1, B * 3 * E, D, 1])],
              [0, 2, 1, 3], "additive", False),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("name", list(CASES))
def test_sdpa_views_match_torch_on_strided_tensors(name: str, dtype: torch.dtype) -> None:
    shapes, views, out_perm, mask_kind, causal = CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    bufs = [torch.randn(*s, generator=gen).to(dtype) for s in shapes]
    g = Graph()
    ids = [g.add_input(f"buf{i}", TORCH_TO_KILN[dtype], s) for i, s in enumerate(shapes)]
    attrs: dict = {"causal": causal}
    logical = []
    for key, (b, v) in zip(("q_view", "k_view", "v_view"), views):
        if v is not None:
            attrs[key] = v
        logical.append(bufs[b] if v is None else _view(bufs[b], v))
    L, Skv = logical[0].shape[-2], logical[1].shape[-2]
    mask: Optional[torch.Tensor] = None
    if mask_kind == "bool":
        mask = (torch.rand(L, Skv, generator=gen) > 0.3) | torch.eye(L, Skv, dtype=torch.bool)
    elif mask_kind == "additive":
        mask = torch.where(torch.rand(B, 1, 1, Skv, generator=gen) > 0.2, 0.0, -10000.0).to(dtype)
    if out_perm is not None:
        attrs["out_perm"] = out_perm
    inputs = [ids[b] for b, _ in views]
    feeds = list(bufs)
    if mask is not None:
        inputs.append(g.add_input("mask", TORCH_TO_KILN[mask.dtype], list(mask.shape)))
        feeds.append(mask)
    g.mark_output(g.add_node("sdpa", inputs, attrs, name="attention")[0], "y")
    got, _ = _run_cpu(g, feeds)

    ref_mask = None if mask is None else (mask if mask.dtype == torch.bool else mask.double())
    if causal:  # torch takes a mask or is_causal; the causal mask is top-left aligned in both
        keep = torch.ones(L, Skv, dtype=torch.bool).tril()
        ref_mask = keep if ref_mask is None else ref_mask & keep
    ref = F.scaled_dot_product_attention(*(t.double() for t in logical), attn_mask=ref_mask)
    if out_perm is not None:
        ref = ref.permute(*out_perm)
    assert got.shape == ref.shape
    assert not torch.isnan(got).any()
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    assert relative_error(got.double(), ref) < tol


def test_vit_b_16_in_f16_on_cpu_reads_qkv_through_views() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = randomize_weights(torchvision.models.vit_b_16().eval())
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        ref = first_output(model(x))
        # A CPU build computes in f16 when f32 is not enabled (lower_precision); f16 attention with
        # head dim 64 is what the pass folds by default.
        compiled = kiln.compile(model, arg_inputs=[x], enabled_precisions={torch.half}, min_block_size=1,
                                require_full_compilation=True)
        out = first_output(compiled(x))
        assert out.dtype == torch.float32
        assert relative_error(out, ref) <= 1e-2, relative_error(out, ref)
        x2 = torch.randn(2, 3, 224, 224)
        assert relative_error(first_output(compiled(x2)), first_output(model(x2))) <= 1e-2

    engines = compiled.engines()
    assert len(engines) == 1
    plan = engines[0].engine.graph()
    producer = {v: n for n in plan.nodes for v in n.outputs}
    readers: dict[int, list] = {}
    for n in plan.nodes:
        for v in n.inputs:
            readers.setdefault(v, []).append(n)
    sdpas = [n for n in plan.nodes if n.op == "sdpa"]
    assert len(sdpas) == 12
    for n in sdpas:
        # Straight from the qkv linear: q, k, v at 0, 768 and 1536 of each [197, 2, 2304] row.
        assert len(set(n.inputs)) == 1 and producer[n.inputs[0]].op == "linear", n.attrs
        assert [n.attrs[k][0] for k in ("q_view", "k_view", "v_view")] == [0, 768, 1536]
        assert n.attrs["out_perm"] == [2, 0, 1, 3]
        assert plan.type(n.outputs[0]).shape == [197, 2, 12, 64]
        # ... and into the out-projection through a reshape alone.
        (merge,) = readers[n.outputs[0]]
        assert merge.op == "reshape" and [r.op for r in readers[merge.outputs[0]]] == ["linear"]
    ops = [n.op for n in plan.nodes]
    # Per block only the [B, S] -> [S, B] permute that its qkv linear reads remains (and one for
    # the patch embedding): the residual add reads the attention's output back in [B, S] order
    # through a view instead of a permute; the one slice left takes the class token.
    assert ops.count("permute") == 12 + 1 and ops.count("slice") == 1, ops
    assert sum(n.op == "fused_pointwise" and "view0" in n.attrs for n in plan.nodes) == 12
