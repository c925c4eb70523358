"""Pointwise patterns that decoders and CNNs share, compiled whole with kiln.compile and checked
against eager PyTorch on random inputs: the tanh-form GELU written out with pow (GPT-2's
NewGELU, alone and between two linears), pow by the constants PyTorch's kernels special-case,
RMSNorm (also with the upcast to float32 of transformers' LlamaRMSNorm, and torch.nn.RMSNorm),
rotate_half RoPE (a gather along the head dim) and a SwiGLU MLP.

On the CPU: outputs against eager FP32, and the plans of the powers (no pow where PyTorch's
kernels use none), of the SwiGLU MLP (gate and up one GEMM, silu computed in the kernel of the
mul it feeds, which reads both halves in place, not in the gate GEMM's epilogue), of the GPT-2
MLP (the written-out GELU named and folded into the first GEMM's epilogue, no kernel of its own),
of RMSNorm (one layer_norm {rms} node) and of the upcasting RMSNorm built in FP16 / BF16 (its casts
to float32 and back are no kernels). On CUDA (skipped without a GPU): outputs in FP32 and FP16
against eager FP32, the vectorized pointwise kernel the RoPE pattern gets (its describe line in
the engine's build log), and RMSNorm's layer_norm {rms} kernel on rows that stay in registers,
rows split across blocks and long rows read in passes."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch

import kiln
from kiln.testing import relative_error


class NewGelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Powers(torch.nn.Module):
    EXPONENTS = (2.0, 3.0, 0.5, -0.5, -1.0, -2.0, 2.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        base = x.abs() + 0.5
        return tuple(base ** e for e in self.EXPONENTS)


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + 1e-6) * self.weight


class UpcastRMSNorm(RMSNorm):
    """transformers' LlamaRMSNorm: statistics and scaling in float32, the weight applied after the
    cast back to the input's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class Gpt2Mlp(torch.nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc, self.proj, self.act = torch.nn.Linear(dim, hidden), torch.nn.Linear(hidden, dim), NewGelu()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Rope(torch.nn.Module):
    def __init__(self, seq: int, dim: int) -> None:
        super().__init__()
        angles = torch.outer(torch.arange(seq, dtype=torch.float32), torch.rand(dim // 2))
        self.register_buffer("cos", torch.cat([angles.cos(), angles.cos()], -1))
        self.register_buffer("sin", torch.cat([angles.sin(), angles.sin()], -1))

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        half = q.shape[-1] // 2
        rotated = torch.cat([-q[..., half:], q[..., :half]], dim=-1)
        return q * self.cos + rotated * self.sin


class SwiGLU(torch.nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(dim, hidden, bias=False)
        self.up = torch.nn.Linear(dim, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def _torch_rms_norm(dim: int) -> torch.nn.RMSNorm:
    norm = torch.nn.RMSNorm(dim, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    return norm


class FusedRMSNorm(torch.nn.Module):
    """aten._fused_rms_norm, what nn.RMSNorm dispatches to on CUDA: with a weight and the default
    eps (float's epsilon, which matters at this input scale), then without a weight."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._fused_rms_norm(x * 1e-3, [x.shape[-1]], self.weight, None)[0]
        return torch.ops.aten._fused_rms_norm(y + 1, [x.shape[-2], x.shape[-1]], None, 1e-5)[0]


def _patterns() -> dict[str, tuple[torch.nn.Module, list[torch.Tensor]]]:
    torch.manual_seed(0)
    return {
        "new_gelu": (NewGelu(), [torch.randn(4, 16, 96) * 2]),
        "powers": (Powers(), [torch.randn(4, 16, 64)]),
        "rms_norm": (RMSNorm(64), [torch.randn(2, 24, 64)]),
        "rms_norm_upcast": (UpcastRMSNorm(64), [torch.randn(2, 24, 64)]),
        "torch_rms_norm": (_torch_rms_norm(64), [torch.randn(2, 24, 64)]),
        "fused_rms_norm": (FusedRMSNorm(64), [torch.randn(2, 24, 64)]),
        "gpt2_mlp": (Gpt2Mlp(64, 256), [torch.randn(2, 24, 64)]),
        "rope": (Rope(24, 64), [torch.randn(2, 4, 24, 64)]),
        "swiglu": (SwiGLU(64, 160), [torch.randn(2, 24, 64)]),
    }


def _outputs(out: torch.Tensor | tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    return list(out) if isinstance(out, tuple) else [out]


def _check(name: str, device: str, dtype: torch.dtype, tolerance: float, **options: object) -> list[str]:
    """Compiles pattern `name` for `device` in `dtype`, checks every output against eager FP32
    and returns the engines' build logs."""
    model, inputs = _patterns()[name]
    model = model.eval().to(device)
    inputs = [x.to(device) for x in inputs]
    with torch.no_grad():
        want = _outputs(model(*inputs))
        low = model.to(dtype)
        cast = [x.to(dtype) for x in inputs]
        compiled = kiln.compile(low, cast, enabled_precisions={dtype}, min_block_size=1,
                                require_full_compilation=True, **options)
        got = _outputs(compiled(*cast))
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        err = relative_error(g.float(), w)
        assert err <= tolerance, f"{name} output {k}: relative error {err:.2e} > {tolerance:.0e}"
    return [e.engine.build_log for e in compiled.engines()]


def _one_engine(name: str) -> Any:
    """Pattern `name` compiled with kiln.compile in FP32 on the CPU: its one engine."""
    model, inputs = _patterns()[name]
    with torch.no_grad():
        compiled = kiln.compile(model.eval(), inputs, min_block_size=1)
    (engine,) = compiled.engines()
    return engine.engine


def _ops(plan: Any) -> list[str]:
    """The ops of a plan, those inside fused_pointwise bodies included."""
    return [b.op for n in plan.nodes for b in (n.body.nodes if n.body is not None else [n])]


@pytest.mark.parametrize("name", list(_patterns()))
def test_pattern_matches_eager_on_cpu(name: str) -> None:
    _check(name, "cpu", torch.float32, 1e-5)


def test_pow_by_a_constant_that_pytorch_special_cases_imports_without_pow() -> None:
    # 2, 3, 0.5, -0.5, -1, -2 become multiplies, a root or a reciprocal; 2.5 stays a pow.
    ops = _ops(_one_engine("powers").graph())
    assert ops.count("pow") == 1, ops
    for op in ("sqrt", "rsqrt", "reciprocal"):
        assert op in ops, ops


def test_swiglu_computes_silu_in_the_kernel_of_its_mul() -> None:
    engine = _one_engine("swiglu")
    plan = engine.graph()
    # gate and up run as one GEMM (fuse_sibling_linears); the kernel of silu(gate) * up reads its
    # two halves in place.
    linears = [n for n in plan.nodes if n.op == "linear"]
    assert len(linears) == 2
    assert all(n.attrs.get("activation", "none") == "none" for n in linears), engine.graph_text
    fused = [n for n in plan.nodes if n.op == "fused_pointwise"]
    assert len(fused) == 1 and [b.op for b in fused[0].body.nodes] == ["silu", "mul"], engine.graph_text
    assert {"view0", "view1"} <= set(fused[0].attrs), engine.graph_text
    assert not [n for n in plan.nodes if n.op == "slice"], engine.graph_text


def test_written_out_gelu_rides_in_the_gemm_epilogue() -> None:
    engine = _one_engine("gpt2_mlp")
    plan = engine.graph()
    assert [n.attrs.get("activation", "none") for n in plan.nodes if n.op == "linear"] == ["gelu_tanh", "none"], \
        engine.graph_text
    assert not [n for n in plan.nodes if n.op in ("fused_pointwise", "tanh", "mul")], engine.graph_text


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", ["rms_norm_upcast", "torch_rms_norm"])
def test_upcast_rms_norm_in_half_precision_has_no_cast_kernels(name: str, dtype: torch.dtype) -> None:
    # Built in `dtype` only, the model's casts to float32 and back cast values to their own type.
    model, inputs = _patterns()[name]
    with torch.no_grad():
        want = model.eval()(*inputs)
        low = model.to(dtype)
        compiled = kiln.compile(low, [x.to(dtype) for x in inputs], enabled_precisions={dtype}, min_block_size=1)
        got = compiled(*[x.to(dtype) for x in inputs])
    (engine,) = compiled.engines()
    assert "cast" not in _ops(engine.engine.graph()), engine.engine.graph_text
    assert relative_error(got.float(), want) <= (4e-3 if dtype == torch.float16 else 2e-2)


def test_rms_norm_is_one_layer_norm_node() -> None:
    for name in ("rms_norm", "rms_norm_upcast", "torch_rms_norm"):
        engine = _one_engine(name)
        assert [(n.op, n.attrs.get("rms")) for n in engine.graph().nodes] == [("layer_norm", True)], engine.graph_text
    norms = [n for n in _one_engine("fused_rms_norm").graph().nodes if n.op == "layer_norm"]
    assert [(n.attrs.get("rms"), n.attrs.get("normalized_rank")) for n in norms] == [(True, 1), (True, 2)]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape, path", [((4, 24, 1024), "in registers"), ((2, 12288), "in registers"),
                                         ((2, 40000), "split"), ((512, 40000), "three passes")])
def test_rms_norm_kernels_on_cuda(shape: tuple[int, ...], path: str, dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    model = RMSNorm(shape[-1]).eval().cuda()
    x = torch.randn(*shape, device="cuda") * 3 + 0.5
    with torch.no_grad():
        want = model(x)
        compiled = kiln.compile(model.to(dtype), [x.to(dtype)], enabled_precisions={dtype}, min_block_size=1)
        got = compiled(x.to(dtype))
    err = relative_error(got.float(), want)
    assert err <= (1e-5 if dtype == torch.float32 else 2e-3), err
    lines = [line for e in compiled.engines() for line in e.engine.build_log.splitlines() if "layer_norm (rms)" in line]
    assert len(lines) == 1 and path in lines[0], lines


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", list(_patterns()))
def test_pattern_matches_eager_on_cuda(name: str, dtype: torch.dtype) -> None:
    # FP32 against FP32 (the GEMMs of swiglu without TF32); FP16 against FP32 at half's precision.
    logs = _check(name, "cuda", dtype, 1e-5 if dtype == torch.float32 else 2e-3, allow_tf32=False)
    if name == "rope" and dtype == torch.float16:
        kernels = [line for log in logs for line in log.splitlines()
                   if line.startswith("kernel fused_pointwise")]
        assert kernels and all(re.search(r"vec8\b", line) for line in kernels), kernels
