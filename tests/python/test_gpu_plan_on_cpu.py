"""The plan a CUDA build makes, run on the CPU: the passes that only GPU builds run (channels-last
convolutions and the layout propagation that moves their permutes through norms, concats, pads,
upsampling and reshapes; strided attention operands) must not change what a model computes.

Each reduced zoo model is compiled with torch.compile(backend="kiln") and with kiln.compile, while
every engine is built from ``Builder.optimize`` for a CUDA device (the plan graph, which needs no
GPU) by the CPU backend, and compared with eager: the whole zoo runs in one engine each, no op left
in PyTorch (and BART in FP16, whose encoder layers branch on tensor values there, built for the
CPU); each kiln.compile'd model also goes through kiln.save and kiln.load and runs its one saved
engine with the same outputs. The reduced-precision plans the zoo table measures (FP16 for every
model, BF16 for those that list it) run on the CPU too, within a few times eager's own error in
that precision.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import zoo  # noqa: E402
import zoo_models  # noqa: E402

import kiln.pipeline  # noqa: E402
from kiln import _C  # noqa: E402
from kiln.archive import engine_blobs  # noqa: E402
from kiln.runtime import builder_config  # noqa: E402


def _cuda_plan_on_cpu(description: Any, settings: Any, device: str, borrowed: Any = None,
                      meanwhile: Any = None) -> Any:
    plan = _C.Builder(builder_config(settings, "cuda:0")).optimize(_C.import_aten(description))
    if meanwhile is not None:
        meanwhile()
    # The plan is optimized already: the CPU build's passes must not lower its precision again.
    return _C.Builder(builder_config(settings.replace(enabled_precisions={torch.float32}), "cpu")).build(plan)


REDUCED = [(m.name, dt) for m in zoo_models.MODELS.values() for dt in ("fp16", "bf16") if dt in m.dtypes]


@pytest.mark.parametrize("name", list(zoo_models.MODELS))
def test_cuda_plan_matches_eager(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kiln.pipeline, "build_engine", _cuda_plan_on_cpu)
    entry = zoo_models.MODELS[name]
    model, inputs = entry.create_randomized(2, small=True)
    torch._dynamo.reset()
    with torch.no_grad():
        want = zoo.flat_output(model(*inputs))
        compiled = torch.compile(model, backend="kiln", dynamic=False,
                                 options={"min_block_size": 1, "cache_built_engines": False,
                                          "reuse_cached_engines": False, "pass_through_build_failures": True})
        got = zoo.flat_output(compiled(*inputs))
    assert zoo.rel_error(got, want) < 1e-4, f"{name}: relative error {zoo.rel_error(got, want):.2e}"


@pytest.mark.parametrize("name", list(zoo_models.MODELS))
def test_every_zoo_model_compiles_into_one_engine_and_round_trips(name: str, monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    monkeypatch.setattr(kiln.pipeline, "build_engine", _cuda_plan_on_cpu)
    model, inputs = zoo_models.MODELS[name].create_randomized(2, small=True)
    with torch.no_grad():
        want = zoo.flat_output(model(*inputs))
        compiled = kiln.compile(model, inputs, min_block_size=1, cache_built_engines=False,
                                reuse_cached_engines=False)
        got = zoo.flat_output(compiled(*inputs))
        assert zoo.rel_error(got, want) < 1e-4, f"{name}: relative error {zoo.rel_error(got, want):.2e}"
        assert compiled.summary.engines == 1 and not compiled.summary.ops_in_pytorch, compiled.summary
        path = tmp_path / f"{name}.ep"
        kiln.save(compiled, path, inputs)
        loaded = kiln.load(path)
        assert len(engine_blobs(loaded)) == 1
        again = zoo.flat_output(loaded.module()(*inputs))
    torch.testing.assert_close(again, got, rtol=0, atol=0)


def test_bart_in_fp16_compiles_into_one_engine() -> None:
    """In FP16 BART's encoder layers test ``torch.isfinite(h).all()``: kiln.compile takes the
    branch the example inputs take (kiln.lowering.export_specialized). A CPU build."""
    model, inputs = zoo_models.MODELS["bart_encoder"].create_randomized(2, small=True)
    with torch.no_grad():
        want = zoo.flat_output(model(*inputs))
        model = model.half()
        compiled = kiln.compile(model, inputs, min_block_size=1, enabled_precisions={torch.half},
                                cache_built_engines=False, reuse_cached_engines=False)
        got = zoo.flat_output(compiled(*inputs)).float()
        eager16 = zoo.flat_output(model(*inputs)).float()
    assert zoo.rel_error(got, want) < 5 * max(zoo.rel_error(eager16, want), 1e-4)
    assert compiled.summary.engines == 1 and not compiled.summary.ops_in_pytorch, compiled.summary


@pytest.mark.parametrize("name,dtype", REDUCED, ids=[f"{n}-{d}" for n, d in REDUCED])
def test_reduced_precision_plans_match_eager_in_their_precision(name: str, dtype: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA plan of a model compiled in FP16 / BF16 (the casts lower_precision puts in, the
    additive attention masks in q's dtype), run by the CPU backend: one engine, no op in PyTorch,
    its error against eager FP32 within 3x eager's own in that precision."""
    monkeypatch.setattr(kiln.pipeline, "build_engine", _cuda_plan_on_cpu)
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    model, inputs = zoo_models.MODELS[name].create_randomized(2, small=True)
    with torch.no_grad():
        want = zoo.flat_output(model(*inputs))
        model = model.to(dt)
        inputs = [x.to(dt) if x.is_floating_point() else x for x in inputs]
        eager = zoo.flat_output(model(*inputs)).float()
        compiled = kiln.compile(model, inputs, min_block_size=1, enabled_precisions={dt}, cache_built_engines=False,
                                reuse_cached_engines=False)
        got = zoo.flat_output(compiled(*inputs)).float()
    own = max(zoo.rel_error(eager, want), 1e-4)
    assert zoo.rel_error(got, want) < 3 * own, f"{name} {dtype}: {zoo.rel_error(got, want):.2e} (eager {own:.2e})"
    assert compiled.summary.engines == 1 and not compiled.summary.ops_in_pytorch, compiled.summary


# The zoo's decoders and encoders as transformers spells them: RMSNorm is one layer_norm {rms}
# with no reduction or cast left (Llama, Qwen2 and T5 upcast to float32 around it), and
# NewGELU's tanh form rides in the GEMM epilogue (GPT-2, ALBERT), in the FP16 CUDA plan.
@pytest.mark.parametrize("name,rms,gelu", [("llama", True, False), ("qwen2", True, False),
                                           ("t5_encoder", True, False), ("gpt2", False, True),
                                           ("albert", False, True)])
def test_fp16_plans_name_written_out_norms_and_activations(name: str, rms: bool, gelu: bool) -> None:
    import plan_traffic  # noqa: E402

    model, inputs = zoo_models.MODELS[name].create_randomized(2, small=True)
    model = model.half()
    inputs = [x.half() if x.is_floating_point() else x for x in inputs]
    with torch.no_grad():
        plans = plan_traffic.plan_graphs(model, inputs, torch.float16)
    nodes = [n for p in plans for n in p.nodes]
    ops = [b.op for n in nodes for b in (n.body.nodes if n.body is not None else [n])]
    same_type_casts = [n for p in plans for n in p.nodes
                       if n.op == "cast" and p.type(n.inputs[0]).dtype == p.type(n.outputs[0]).dtype]
    assert not same_type_casts, ops
    norms = [n for n in nodes if n.op == "layer_norm" and n.attrs.get("rms")]
    assert bool(norms) == rms, ops
    if rms:
        assert "reduce_mean" not in ops, ops
    activations = [n.attrs.get("activation") for n in nodes if n.op == "linear"]
    assert ("gelu_tanh" in activations) == gelu, activations
    if gelu:
        assert "tanh" not in ops, ops
