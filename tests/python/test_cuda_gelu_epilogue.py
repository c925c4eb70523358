"""linear + exact GELU on CUDA: cuBLASLt's tanh GELU epilogue in half precision, exact in f32.

In f16 / bf16 a linear whose epilogue is exact GELU runs it inside the cuBLASLt GEMM in its
tanh form (at most 4.7e-4 apart); the build policy's exact_gelu keeps the exact function in a
generated epilogue, and f32 always does. Checks: the build log names the path, the result matches
the CPU engine and torch's exact GELU in float64, with and without a residual, and an engine built
either way keeps its choice and its policy when saved and loaded.
Skipped, with the reason, where Kiln has no CUDA device.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln import Builder, BuilderConfig, Engine, Graph
from kiln._C import BuildPolicy
from test_cuda_ops import _run as run_engine
from test_ops import TORCH_TO_KILN

pytestmark = pytest.mark.cuda  # skipped without a GPU (conftest.py)

TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2, torch.float32: 2e-3}  # f32: TF32 GEMMs


def _case(dtype: torch.dtype, residual: bool, seed: int = 0) -> tuple[Graph, list[torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x, w, b = torch.randn(4, 33, 96, generator=gen), torch.randn(160, 96, generator=gen) / 10, torch.randn(160, generator=gen)
    feeds = [x, w, b]
    ref = F.linear(x.double(), w.double(), b.double())
    if residual:
        r = torch.randn(4, 33, 160, generator=gen)
        feeds.append(r)
        ref = ref + r.double()
    ref = F.gelu(ref)
    feeds = [t.to(dtype) for t in feeds]
    kd = TORCH_TO_KILN[dtype]
    g = Graph()
    ids = [g.add_input(f"x{i}", kd, list(t.shape)) for i, t in enumerate(feeds)]
    g.mark_output(g.add_node("linear", ids, {"activation": "gelu"}, name="fc")[0], "y")
    return g, feeds, ref


def _run(engine: Engine, feeds: list[torch.Tensor]) -> torch.Tensor:
    return run_engine(engine, feeds)[0]


def _build(g: Graph, device: str, exact: bool = False) -> Engine:
    policy = BuildPolicy(exact_gelu=exact)
    return Builder(BuilderConfig(device=device, fuse_pointwise=False, policy=policy)).build(g)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


@pytest.mark.parametrize("residual", [False, True], ids=["bias", "bias-residual"])
@pytest.mark.parametrize("exact", [False, True], ids=["default", "exact_gelu"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["f16", "bf16", "f32"])
def test_linear_gelu_matches_exact(dtype: torch.dtype, exact: bool, residual: bool) -> None:
    g, feeds, ref = _case(dtype, residual)
    engine = _build(g, "cuda", exact)
    tanh = dtype != torch.float32 and not exact
    assert ("exact gelu as cuBLASLt's tanh form" in engine.build_log) == tanh, engine.build_log
    got = _run(engine, feeds)
    assert not torch.isnan(got).any()
    assert _rel(got, ref) < TOL[dtype], f"CUDA vs exact float64: {_rel(got, ref):.2e}"
    assert _rel(got, _run(_build(g, "cpu"), feeds)) < TOL[dtype]


@pytest.mark.parametrize("built_exact", [False, True], ids=["built-tanh", "built-exact"])
def test_a_loaded_engine_keeps_its_gelu(built_exact: bool) -> None:
    g, feeds, _ = _case(torch.float16, residual=False, seed=3)
    engine = _build(g, "cuda", built_exact)
    want = _run(engine, feeds)
    loaded = Engine.deserialize(engine.serialize(), device="cuda")
    assert loaded.policy == BuildPolicy(exact_gelu=built_exact)
    assert torch.equal(_run(loaded, feeds), want)
    # The other form computes something else: the equality above is the saved choice, not chance.
    assert not torch.equal(_run(_build(g, "cuda", not built_exact), feeds), want)
