"""The reduced zoo with dynamic shapes: each model compiled once by kiln.compile with a batch
``Dim`` (1..8, built at 2) runs at other batches in the range without a build, every op in
engines, its outputs within 1e-4 of eager at each batch; each model of token ids (and masks)
likewise over a sequence range (4..16, built at 16). CPU builds."""

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
from dynamic_zoo import dynamic_dims, takes_token_ids  # noqa: E402

import kiln  # noqa: E402
from kiln.cached_build import cache_stats, reset_cache_stats  # noqa: E402
from kiln.dynamic import dynamic_program_of  # noqa: E402

_TEXT = [name for name, m in zoo_models.MODELS.items() if takes_token_ids(m)]


def _builds_serving(name: str, model: torch.nn.Module, inputs: list[torch.Tensor], dims: tuple[Any, ...],
                    calls: list[list[torch.Tensor]], rows: bool | None = None) -> int:
    """Compiles ``model`` once with ``dims`` (every op in engines; with ``rows``, a row symbol in
    every block or in none), runs it on each of ``calls`` against eager, first as the program
    serves a new size before its background work (padded rows where the block has a row symbol),
    then after it (instances), and returns how many engines those calls built."""
    with torch.no_grad():
        compiled = kiln.compile(model, inputs, dynamic_shapes=dims, min_block_size=1, cache_built_engines=False,
                                reuse_cached_engines=False)
        assert not compiled.summary.ops_in_pytorch, compiled.summary
        table = dynamic_program_of(compiled)
        assert table is not None and table.ranges
        assert rows is None or all((r.rows is not None) == rows for r in table.ranges.values()), name
        held: list[Any] = []
        table.tuning.submit = held.append  # type: ignore[method-assign]
        reset_cache_stats()
        for _ in range(2):
            for x in calls:
                want, got = zoo.flat_output(model(*x)), zoo.flat_output(compiled(*x))
                assert got.shape == want.shape
                assert zoo.rel_error(got, want) < 1e-4, f"{name} at {list(x[0].shape)}: {zoo.rel_error(got, want):.2e}"
            while held:
                held.pop(0)()
    return cache_stats().get("builds", 0)


@pytest.mark.parametrize("name", list(zoo_models.MODELS))
def test_zoo_model_serves_a_batch_range_from_one_build(name: str) -> None:
    entry = zoo_models.MODELS[name]
    model, inputs = entry.create_randomized(2, small=True)
    dims = dynamic_dims(model, inputs, 0, torch.export.Dim("batch", min=1, max=8))
    calls = [entry.make_inputs(batch, small=True, seed=batch) for batch in (3, 1, 8)]
    builds = _builds_serving(name, model, inputs, dims, calls, rows=True)
    assert builds == 0, f"{name}: a batch in the range built an engine"


@pytest.mark.parametrize("name", _TEXT)
def test_zoo_text_model_serves_a_sequence_range(name: str) -> None:
    model, inputs = zoo_models.MODELS[name].create_randomized(2, small=True)
    full = inputs[0].shape[1]
    dims = dynamic_dims(model, inputs, 1, torch.export.Dim("seq", min=4, max=full))
    calls = [[t[:, :length].contiguous() for t in inputs] for length in (full - 3, 4, full // 2 + 1)]
    builds = _builds_serving(name, model, inputs, dims, calls)
    assert builds == 0, f"{name}: {builds} engine(s) built for lengths in the range"
