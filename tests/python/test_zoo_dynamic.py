"""The reduced zoo with a dynamic batch: each model compiled once by kiln.compile with a batch
``Dim`` (1..8, built at 2) runs at other batches in the range without a build, every op in
engines, its outputs within 1e-4 of eager at each batch (CPU builds)."""

from __future__ import annotations

import inspect
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

import kiln  # noqa: E402
from kiln.cached_build import cache_stats, reset_cache_stats  # noqa: E402


def _batch_dims(model: torch.nn.Module, inputs: list[torch.Tensor]) -> tuple[Any, ...]:
    """dim 0 of every input is the batch; a forward that takes ``*inputs`` takes them as one tuple."""
    batch = torch.export.Dim("batch", min=1, max=8)
    dims = tuple({0: batch} for _ in inputs)
    params = list(inspect.signature(model.forward).parameters.values())
    return (dims,) if params and params[0].kind == inspect.Parameter.VAR_POSITIONAL else dims


@pytest.mark.parametrize("name", list(zoo_models.MODELS))
def test_zoo_model_serves_a_batch_range_from_one_build(name: str) -> None:
    entry = zoo_models.MODELS[name]
    model, inputs = entry.create_randomized(2, small=True)
    with torch.no_grad():
        compiled = kiln.compile(model, inputs, dynamic_shapes=_batch_dims(model, inputs), min_block_size=1,
                                cache_built_engines=False, reuse_cached_engines=False)
        assert not compiled.summary.ops_in_pytorch, compiled.summary
        reset_cache_stats()
        for batch in (3, 1, 8):
            x = entry.make_inputs(batch, small=True, seed=batch)
            want, got = zoo.flat_output(model(*x)), zoo.flat_output(compiled(*x))
            assert got.shape == want.shape
            assert zoo.rel_error(got, want) < 1e-4, f"{name} batch {batch}: {zoo.rel_error(got, want):.2e}"
    assert cache_stats().get("builds", 0) == 0, f"{name}: a batch in the range built an engine"
