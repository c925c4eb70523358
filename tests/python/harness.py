"""The shared test harness: compile a module with Kiln, run it, compare with eager PyTorch.

    result = compile_and_compare(model, [x], options={"min_block_size": 1})
    assert result.coverage == 100.0

``via="dynamo"`` goes through ``torch.compile(backend=...)`` (Kiln's backend wrapped so that
the harness sees every graph Dynamo hands over); ``via="aot"`` through ``kiln.compile``. The
comparison covers every tensor leaf of the outputs; the result records what each compiled
graph ran in engines and in PyTorch.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

import kiln.aot
import kiln.dynamo
from kiln.pipeline import CompileSummary
from kiln.testing import randomize_weights as randomize  # noqa: F401 (re-exported for the tests)
from kiln.testing import relative_error


def _leaves(out: Any) -> list[torch.Tensor]:
    if hasattr(out, "to_tuple"):  # transformers ModelOutput
        out = out.to_tuple()
    return [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]


@dataclasses.dataclass
class Result:
    compiled: Callable[..., Any]
    outputs: list[torch.Tensor]
    expected: list[torch.Tensor]
    summaries: list[CompileSummary]
    graphs: list[Any]  # KilnDynamoGraph per Dynamo graph (dynamo path)

    @property
    def engines(self) -> int:
        return sum(s.engines for s in self.summaries)

    @property
    def ops_in_engines(self) -> collections.Counter[str]:
        return sum((s.ops_in_engines for s in self.summaries), collections.Counter())

    @property
    def ops_in_pytorch(self) -> collections.Counter[str]:
        return sum((s.ops_in_pytorch for s in self.summaries), collections.Counter())

    @property
    def coverage(self) -> float:
        inside, outside = sum(self.ops_in_engines.values()), sum(self.ops_in_pytorch.values())
        return 100.0 * inside / (inside + outside) if inside + outside else 100.0


def compile_and_compare(model: torch.nn.Module | Callable[..., Any], inputs: Sequence[Any], *,
                        options: dict[str, Any] | None = None, via: str = "dynamo",
                        atol: float = 1e-4, rtol: float = 1e-4, reference: Sequence[Any] | None = None,
                        check: bool = True) -> Result:
    """Compiles ``model`` with Kiln, runs it on ``inputs`` and compares with eager (or ``reference``)."""
    options = dict(options or {})
    graphs: list[Any] = []
    with torch.no_grad():
        expected = _leaves(model(*(reference if reference is not None else inputs)))
        if via == "dynamo":
            torch._dynamo.reset()

            def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
                fn = kiln.dynamo.kiln_backend(gm, example_inputs, options=options)
                graphs.append(fn)
                return fn
            compiled: Callable[..., Any] = torch.compile(model, backend=backend, dynamic=False)
            outputs = _leaves(compiled(*inputs))
            summaries = [gm.meta["kiln_summary"] for g in graphs for gm in getattr(g, "graph_modules", [])]
        elif via == "aot":
            assert isinstance(model, torch.nn.Module)
            compiled = kiln.aot.compile(model, list(inputs), **options)
            outputs = _leaves(compiled(*inputs))
            summaries = [compiled.summary]
        else:
            raise ValueError(f"via must be 'dynamo' or 'aot', got {via!r}")
    result = Result(compiled, outputs, expected, summaries, graphs)
    if check:
        assert len(outputs) == len(expected), f"{len(outputs)} outputs, eager has {len(expected)}"
        for i, (got, want) in enumerate(zip(outputs, expected)):
            assert got.dtype == want.dtype and got.shape == want.shape, \
                f"output {i}: {got.dtype} {tuple(got.shape)} vs eager {want.dtype} {tuple(want.shape)}"
            torch.testing.assert_close(got, want, atol=atol, rtol=rtol, msg=lambda m: f"output {i}: {m}")
    return result


def compile_checked(model: torch.nn.Module, args: Sequence[torch.Tensor], reference: Any, dtype: torch.dtype,
                    tol: float, folder: str) -> Any:
    """``kiln.compile`` of ``model`` in ``dtype`` (every op in engines; f32 without TF32, so CUDA's
    GEMMs are held to the CPU's tolerance), checked on ``args`` against ``reference`` (every output
    within relative error ``tol``) as compiled and again after ``kiln.save`` to ``folder`` and
    ``kiln.load``. Returns the compiled module."""
    def check(out: Any) -> None:
        got, want = _leaves(out), _leaves(reference)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert relative_error(g, w) < tol, relative_error(g, w)

    with torch.no_grad():
        compiled = kiln.compile(model, list(args), enabled_precisions={dtype}, min_block_size=1,
                                    require_full_compilation=True, allow_tf32=False)
        check(compiled(*args))
        path = os.path.join(folder, "checked.ep")
        kiln.save(compiled, path, arg_inputs=list(args))
        check(kiln.load(path).module()(*args))
    return compiled
