"""The plan a CUDA build makes, run on the CPU: the passes that only GPU builds run (channels-last
convolutions and the layout propagation that moves their permutes through norms, concats, pads,
upsampling and reshapes; strided attention operands) must not change what a model computes.

Each reduced zoo model with convolutions is compiled with torch.compile(backend="kiln") while
every engine is built from ``Builder.optimize`` for a CUDA device (the plan graph, which needs no
GPU) by the CPU backend, and compared with eager.
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
from kiln.runtime import builder_config  # noqa: E402

CONV_MODELS = [m.name for m in zoo_models.MODELS.values()
               if m.family in ("cnn", "unet", "dense-prediction") or m.name in ("swin_t", "maxvit_t", "convnext_tiny")]


def _cuda_plan_on_cpu(description: Any, settings: Any, device: str, borrowed: Any = None) -> Any:
    plan = _C.Builder(builder_config(settings, "cuda:0")).optimize(_C.import_aten(description))
    return _C.Builder(builder_config(settings, "cpu")).build(plan)


@pytest.mark.parametrize("name", CONV_MODELS)
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
