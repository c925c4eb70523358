"""torch.compile(backend="kiln"): registration, options, graph breaks, recompilation, fallbacks,
the dry-run report. Every compiled result is checked against eager PyTorch."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

import kiln
import kiln.cached_build
import kiln.dynamic
import kiln.dynamo
import kiln.pipeline
import kiln.runtime
from harness import compile_and_compare

torch.manual_seed(0)


class MLP(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(d, 32), nn.Linear(32, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = torch.sigmoid(self.fc2(h)) * h + h
        return self.fc3(h)


class Broken(nn.Module):
    """Two engines' worth of work around a graph break."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = MLP(), MLP(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        torch._dynamo.graph_break()
        return self.b(y) + 1.0


def _recording_backend() -> tuple[list[Any], Callable[..., Any]]:
    """A Dynamo backend that compiles with Kiln (min_block_size=1) and the KilnDynamoGraphs it made."""
    graphs: list[Any] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(kiln.dynamo.kiln_backend(gm, example_inputs, options={"min_block_size": 1}))
        return graphs[-1]
    return graphs, backend


def _counted_lowerings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """A list that grows by one with every lower_module call the Dynamo backend makes."""
    lowered: list[Any] = []
    real_lower = kiln.dynamo.lower_module
    monkeypatch.setattr(kiln.dynamo, "lower_module", lambda *a, **k: lowered.append(1) or real_lower(*a, **k))
    return lowered


def _entry_point() -> Any:
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    return next((ep for ep in eps if ep.name == "kiln"), None)


def test_kiln_is_a_registered_backend() -> None:
    assert "kiln" in torch.compiler.list_backends()
    from torch._dynamo.backends.registry import lookup_backend
    assert lookup_backend("kiln") is kiln.dynamo.kiln_backend


def test_backend_found_without_importing_kiln(tmp_path: Path) -> None:
    """torch finds "kiln" through the torch_dynamo_backends entry point, and a later
    `import kiln` does not register it a second time. Without a pip install, the entry point
    is declared by a stand-in distribution on the path (the same metadata pip writes)."""
    env = dict(os.environ)
    package_root = str(Path(kiln.__file__).absolute().parent.parent)
    paths = [package_root]
    ep = _entry_point()
    if ep is None:
        dist = tmp_path / "kiln_entry_point-0.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kiln-entry-point\nVersion: 0.0\n")
        (dist / "entry_points.txt").write_text("[torch_dynamo_backends]\nkiln = kiln.dynamo:kiln_backend\n")
        paths.append(str(tmp_path))
    else:
        assert ep.value == "kiln.dynamo:kiln_backend"
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
    script = textwrap.dedent("""
        import sys, torch
        assert "kiln" not in sys.modules
        m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
        x = torch.randn(2, 4)
        with torch.no_grad():
            y = torch.compile(m, backend="kiln", options={"min_block_size": 1})(x)
            assert torch.allclose(y, m(x), atol=1e-5)
        assert "kiln" in torch.compiler.list_backends()
        import kiln
        from torch._dynamo.backends.registry import lookup_backend
        assert lookup_backend("kiln") is kiln.kiln_backend
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_string_backend_with_options_matches_eager(tmp_path: Path) -> None:
    m, x = MLP().eval(), torch.randn(4, 16)
    report = tmp_path / "report.txt"
    with torch.no_grad():
        y = torch.compile(m, backend="kiln", options={"min_block_size": 1, "debug": True, "dryrun": str(report)})(x)
    torch.testing.assert_close(y, m(x))
    assert "Kiln dry run" in report.read_text()  # the options reached the backend


def test_small_model_runs_in_one_engine() -> None:
    result = compile_and_compare(MLP().eval(), [torch.randn(4, 16)], options={"min_block_size": 1})
    assert result.engines == 1 and result.coverage == 100.0, result.ops_in_pytorch


def test_graph_break_gives_two_compiled_graphs() -> None:
    result = compile_and_compare(Broken().eval(), [torch.randn(4, 16)], options={"min_block_size": 1})
    assert len(result.graphs) == 2
    assert result.engines == 2 and result.coverage == 100.0


def test_recompiles_only_for_new_shapes_and_dtypes() -> None:
    calls: list[tuple[int, ...]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        calls.append(tuple(example_inputs[-1].shape))
        return kiln.dynamo.kiln_backend(gm, example_inputs, options={"min_block_size": 1})

    torch._dynamo.reset()
    m = MLP().eval()
    fn = torch.compile(m, backend=backend, dynamic=False)
    with torch.no_grad():
        for batch in (2, 3, 2, 3, 2):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(fn(x), m(x))
        assert len(calls) == 2
        m64 = MLP().eval().double()
        fn64 = torch.compile(m64, backend=backend, dynamic=False)
        x = torch.randn(2, 16, dtype=torch.float64)
        torch.testing.assert_close(fn64(x), m64(x))
        assert len(calls) == 3


def test_symbolic_graphs_build_one_program_with_engines_per_shape() -> None:
    graphs, backend = _recording_backend()

    torch._dynamo.reset()
    m = MLP().eval()
    fn = torch.compile(m, backend=backend, dynamic=True)
    with torch.no_grad():
        for batch in (2, 5, 2, 7):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(fn(x), m(x))
    assert len(graphs) == 1 and graphs[0].dynamic
    assert len(graphs[0].graph_modules) == 1  # one symbolic program
    table = kiln.dynamic.dynamic_program_of(graphs[0].graph_modules[0])
    assert sorted(s.binding[next(iter(s.binding))] for s in table.live.values()) == [2, 5, 7]
    table.wait_tuned()  # a new batch runs on padded rows until its instance is made in the background
    engines = [m for m in graphs[0].graph_modules[0].modules() if isinstance(m, kiln.runtime.KilnEngineModule)]
    assert len(engines) == 3  # batch 2, 5, 7: one engine each


class LengthAfterBreak(nn.Module):
    """A length read before a graph break and used after it: Dynamo passes it to the second graph
    as a symbolic int of its own, no tensor input's size."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.pos = nn.Linear(8, 8), nn.Embedding(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.lin(x)
        torch._dynamo.graph_break()
        p = self.pos(torch.arange(n)) * 2.0  # a graph whose only size is n (as BART's positions)
        torch._dynamo.graph_break()
        return torch.relu(h) + p


def test_a_symbolic_int_that_is_no_input_size_is_carried_and_served_by_one_program() -> None:
    graphs, backend = _recording_backend()

    torch._dynamo.reset()
    model = LengthAfterBreak().eval()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for n in (6, 11, 3, 6):
            x = torch.randn(2, n, 8)
            torch.testing.assert_close(compiled(x), model(x))
    (positions,) = [g for g in graphs if next(iter(g.gm.graph.nodes)).name == "l_n_"]  # n: its only size
    assert positions.symbolic and len(positions.graph_modules) == 1  # one program, no build per length


def _sizes_only_graph(*devices: str) -> torch.fx.GraphModule:
    """A Dynamo-style graph of one int input making an arange on each of ``devices`` (fake values)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    graph = torch.fx.Graph()
    n = graph.placeholder("n")
    n.meta["example_value"] = 5
    made = []
    with FakeTensorMode():
        for d in devices:
            node = graph.call_function(torch.arange, (n,), {"device": d})
            node.meta["example_value"] = torch.arange(5, device=d)
            made.append(node)
    graph.output(tuple(made))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


class MaskAfterBreak(nn.Module):
    """A mask made from a length alone between two graph breaks, as transformers makes attention
    masks: the middle graph takes no tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        torch._dynamo.graph_break()
        rows = torch.arange(n, device=x.device.type)
        mask = rows[None, :] > rows[:, None]
        torch._dynamo.graph_break()
        return x.masked_fill(mask, 0.0)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("dynamic", [False, True])
def test_a_mask_made_from_sizes_alone_comes_back_on_the_inputs_device(device: str, dynamic: bool) -> None:
    torch._dynamo.reset()
    model = MaskAfterBreak()
    compiled = torch.compile(model, backend="kiln", dynamic=dynamic, options={"min_block_size": 1})
    with torch.no_grad():
        for n in (5, 9):
            x = torch.randn(n, n, device=device) + 1.0
            out = compiled(x)
            assert out.device == x.device
            torch.testing.assert_close(out, model(x))


def test_a_graph_without_tensor_inputs_builds_for_the_device_it_makes_tensors_on() -> None:
    # transformers makes masks from sizes alone: built for the CPU, a CUDA mask came back on the CPU.
    settings = kiln.CompilationSettings()
    assert kiln.dynamo._device(settings, [5], _sizes_only_graph("cuda")) == "cuda:0"
    assert kiln.dynamo._device(settings, [5], _sizes_only_graph("cpu")) == "cpu"
    with pytest.raises(ValueError, match=r"makes tensors on \['cpu', 'cuda:0'\].*set Kiln option 'device'"):
        kiln.dynamo._device(settings, [5], _sizes_only_graph("cuda", "cpu"))


def test_gradients_required_runs_eagerly_with_a_warning() -> None:
    torch._dynamo.reset()
    m, x = MLP().eval(), torch.randn(2, 16)
    fn = torch.compile(m, backend="kiln", options={"min_block_size": 1})
    with pytest.warns(RuntimeWarning, match="inference only"):
        y = fn(x)
    assert y.requires_grad
    torch.testing.assert_close(y, m(x))
    torch._dynamo.reset()
    fn = torch.compile(m, backend="kiln", options={"require_full_compilation": True})
    with pytest.raises(Exception, match="inference only"):
        fn(x)


def _failing_build(target: str) -> Any:
    real = kiln.pipeline.build_engine

    def build(description: Any, settings: Any, device: str, borrowed: Any = None, meanwhile: Any = None) -> Any:
        for node in description.nodes:
            if node.target == target:
                raise kiln.UnsupportedError(f"[unsupported] {target} ({node.name}): no kernel for this case")
        return real(description, settings, device, borrowed, meanwhile)
    return build


def test_build_failure_falls_back_to_pytorch_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kiln.pipeline, "build_engine", _failing_build("aten.sigmoid.default"))
    with pytest.warns(RuntimeWarning) as record:
        result = compile_and_compare(MLP().eval(), [torch.randn(4, 16)], options={"min_block_size": 1})
    messages = [str(w.message) for w in record if "Kiln could not build" in str(w.message)]
    assert len(messages) == 1
    assert "aten.sigmoid.default" in messages[0] and "no kernel for this case" in messages[0]
    assert result.engines == 0 and result.ops_in_pytorch["aten.sigmoid.default"] == 1


@pytest.mark.parametrize("via", ["dynamo", "aot"])
def test_a_node_that_fails_to_build_is_left_out_and_the_rest_built(monkeypatch: pytest.MonkeyPatch,
                                                                   via: str) -> None:
    real = kiln.pipeline.build_engine
    failed: list[str] = []

    def build(description: Any, settings: Any, device: str, borrowed: Any = None, meanwhile: Any = None) -> Any:
        for node in description.nodes:
            if node.target == "aten.sigmoid.default":
                failed.append(node.name)
                raise kiln.UnsupportedError(f"[unsupported] backend cpu cannot run sigmoid (node '{node.name}'): "
                                            "no kernel for this case")
        return real(description, settings, device, borrowed, meanwhile)
    monkeypatch.setattr(kiln.pipeline, "build_engine", build)
    with pytest.warns(RuntimeWarning) as record:
        result = compile_and_compare(MLP().eval(), [torch.randn(4, 16)], options={"min_block_size": 1}, via=via)
    messages = [str(w.message) for w in record if "Kiln could not build" in str(w.message)]
    graph = r"graph \d+" if via == "dynamo" else "MLP"
    assert len(messages) == 1 and re.fullmatch(
        f"Kiln could not build node '{failed[0]}' \\(aten.sigmoid.default\\) of {graph}; it runs in PyTorch and "
        f"the rest is built: \\[unsupported\\] backend cpu cannot run sigmoid \\(node '{failed[0]}'\\): no kernel "
        "for this case", messages[0]), messages
    assert len(failed) == 1  # tried once, then partitioned around
    assert result.ops_in_pytorch == {"aten.sigmoid.default": 1}
    assert result.engines == 2  # the ops before and after the sigmoid


def test_pass_through_build_failures_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kiln.pipeline, "build_engine", _failing_build("aten.sigmoid.default"))
    with pytest.raises(Exception, match="no kernel for this case"):
        compile_and_compare(MLP().eval(), [torch.randn(4, 16)],
                            options={"min_block_size": 1, "pass_through_build_failures": True})


@pytest.mark.parametrize("via", ["dynamo", "aot"])
def test_a_view_left_to_pytorch_after_a_permute_gets_its_dense_copy(via: str) -> None:
    """nn.MultiheadAttention views its heads after a transpose and contiguous(): with views left
    to PyTorch the copy that makes them dense must stay, or the view raises."""
    m = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    x = torch.randn(2, 10, 32)

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = m

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.m(x, x, x, need_weights=False)[0]
    result = compile_and_compare(SelfAttention(), [x], via=via,
                                 options={"torch_executed_ops": {"aten.view.default"}, "min_block_size": 1})
    assert result.ops_in_pytorch["aten.view.default"] > 0 and result.engines > 0


def test_torch_executed_ops_split_the_engine() -> None:
    result = compile_and_compare(MLP().eval(), [torch.randn(4, 16)],
                                 options={"min_block_size": 1, "torch_executed_ops": {"aten.sigmoid"}})
    assert result.ops_in_pytorch == {"aten.sigmoid.default": 1}
    assert result.engines == 2 and "aten.sigmoid.default" not in result.ops_in_engines


def test_min_block_size_keeps_small_graphs_in_pytorch() -> None:
    result = compile_and_compare(nn.ReLU(), [torch.randn(4, 16)], options={"min_block_size": 2})
    assert result.engines == 0 and result.ops_in_pytorch == {"aten.relu.default": 1}


def test_dry_run_builds_nothing_and_reports(caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    with caplog.at_level(logging.DEBUG, logger="kiln.dryrun"):
        result = compile_and_compare(Broken().eval(), [torch.randn(4, 16)], options={"dryrun": True})
    assert result.engines == 0
    reports = [r.getMessage() for r in caplog.records if r.name == "kiln.dryrun"]
    assert len(reports) == 2  # one per graph
    assert capsys.readouterr().out.count("Kiln dry run: graph") == 2  # dryrun=True prints them
    for text in reports:
        assert "total ops:" in text and "supported ops:" in text and "coverage: 100.0%" in text
        assert "engine 0:" in text and "inputs:" in text and "outputs:" in text
        assert "min_block_size -> engines" in text
    path = tmp_path / "dry.txt"
    compile_and_compare(Broken().eval(), [torch.randn(4, 16)], options={"dryrun": str(path)})
    assert path.read_text().count("Kiln dry run: graph") == 2


def test_debug_with_infinite_min_block_size_is_a_dry_run(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="kiln"):
        result = compile_and_compare(MLP().eval(), [torch.randn(4, 16)],
                                     options={"debug": True, "min_block_size": float("inf")})
    assert result.engines == 0
    assert any("Kiln dry run" in r.getMessage() for r in caplog.records)


def test_dry_run_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    compile_and_compare(nn.ReLU(), [torch.randn(3)], options={"dryrun": "-"})
    assert "Kiln dry run" in capsys.readouterr().out


def test_unknown_mode_is_rejected() -> None:
    torch._dynamo.reset()
    fn = torch.compile(nn.ReLU(), backend="kiln", mode="turbo")
    with pytest.raises(Exception, match="mode 'turbo' is not a mode Kiln knows"):
        with torch.no_grad():
            fn(torch.randn(3))


def test_require_full_compilation_raises_on_unsupported_ops() -> None:
    supported = set(kiln.supported_aten_targets())
    candidates = {"aten.cumsum.default": lambda x: torch.cumsum(x, 1),
                  "aten.sort.default": lambda x: torch.sort(x, 1)[0],
                  "aten.flip.default": lambda x: torch.flip(x, [1])}
    target, fn = next(((t, f) for t, f in candidates.items() if t not in supported), (None, None))
    if target is None:
        pytest.skip("every candidate op is supported")

    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return fn(torch.relu(x)) + 1

    with pytest.raises(Exception, match=target.replace(".", r"\.")):
        compile_and_compare(M(), [torch.randn(2, 5)], options={"require_full_compilation": True})
    result = compile_and_compare(M(), [torch.randn(2, 5)], options={"min_block_size": 1})
    assert result.ops_in_pytorch[target] == 1


def test_inference_mode_works() -> None:
    torch._dynamo.reset()
    m, x = MLP().eval(), torch.randn(3, 16)
    with torch.inference_mode():
        y = torch.compile(m, backend="kiln", options={"min_block_size": 1})(x)
        torch.testing.assert_close(y, m(x))


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    yield
    torch._dynamo.reset()


def test_engine_weights_keep_their_module_paths() -> None:
    result = compile_and_compare(MLP().eval(), [torch.randn(4, 16)], options={"min_block_size": 1})
    (gm,) = result.graphs[0].graph_modules
    (engine,) = [m for m in gm.modules() if isinstance(m, kiln.runtime.KilnEngineModule)]
    names = set(engine.engine.weight_names)
    assert {"fc1.weight", "fc1.bias"} <= names, names


def test_second_instance_of_a_class_runs_with_its_own_weights() -> None:
    # Dynamo reuses one captured graph for every instance of a class (parameters are graph
    # inputs); the engines were built from the first instance's weights and must not serve the second.
    graphs, backend = _recording_backend()

    torch._dynamo.reset()
    a, b = MLP().eval(), MLP().eval()
    fa, fb = torch.compile(a, backend=backend, dynamic=False), torch.compile(b, backend=backend, dynamic=False)
    x = torch.randn(4, 16)
    with torch.no_grad():
        for _ in range(2):  # alternate: each instance keeps its own engines
            torch.testing.assert_close(fa(x), a(x))
            torch.testing.assert_close(fb(x), b(x))
        assert not torch.allclose(a(x), b(x))
        c = MLP().eval()
        c.load_state_dict(a.state_dict())  # equal values, other tensors: engines of its own
        torch.testing.assert_close(torch.compile(c, backend=backend, dynamic=False)(x), a(x))
    (graph,) = graphs  # one Dynamo graph, one specialization per instance
    assert len(graph.graph_modules) == 3


def test_an_instance_sharing_only_the_first_weight_of_another_runs_with_its_own() -> None:
    # A call to the last specialization is launched when its first constant is that one's, and
    # the others are checked while it runs: an instance that shares that tensor (a tied layer) but
    # not the rest gets its own engines' output, not the launched run's.
    graphs, backend = _recording_backend()

    torch._dynamo.reset()
    a, b = MLP().eval(), MLP().eval()
    b.fc1 = a.fc1
    fa, fb = torch.compile(a, backend=backend, dynamic=False), torch.compile(b, backend=backend, dynamic=False)
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert not torch.allclose(a(x), b(x))
        for _ in range(2):
            torch.testing.assert_close(fa(x), a(x))
            torch.testing.assert_close(fb(x), b(x))
    (graph,) = graphs
    first, second = graph.compiled.values()
    assert first.checks_after_launch and second.checks_after_launch
    assert first.constants[0] is second.constants[0]
    assert any(c is not d for c, d in zip(first.constants, second.constants))


class Scale(nn.Module):
    """One parameter: a graph with exactly one constant input."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * self.w) + 1.0


@pytest.mark.parametrize("instances", [1, 2])
def test_graphs_with_one_constant_or_none_check_them_on_every_call(instances: int) -> None:
    # The per-call identity check of the constants, at its edge sizes: one constant (each
    # instance's own weight must be used) and none (a module without parameters).
    graphs, backend = _recording_backend()

    torch._dynamo.reset()
    modules = [Scale().eval() for _ in range(instances)]
    compiled = [torch.compile(m, backend=backend, dynamic=False) for m in modules]
    plain = torch.compile(nn.Sequential(nn.Tanh(), nn.Softplus()), backend=backend, dynamic=False)
    x = torch.randn(3, 16)
    with torch.no_grad():
        for _ in range(2):
            for m, f in zip(modules, compiled):
                torch.testing.assert_close(f(x), m(x))
            torch.testing.assert_close(plain(x), torch.nn.functional.softplus(torch.tanh(x)))
    one, none = graphs
    assert len(one.constant_idx) == 1 and len(one.graph_modules) == instances
    assert none.constant_idx == [] and len(none.graph_modules) == 1


class GatedLayer(nn.Module):
    """A layer whose forward branches on a value: Dynamo breaks the graph there, so that every
    layer of a deep stack runs one captured graph with its own parameters."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc, self.norm = nn.Linear(d, d), nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc(self.norm(x)))
        if h.sum() > 0:  # data-dependent: a graph break
            h = h * 0.5
        return x + h


def test_a_deep_stack_of_one_graph_builds_once_per_layer_and_lowers_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # More layers than input signatures kept: each layer's engines stay (a bound on constant sets
    # equal to the signature bound rebuilt every layer on every call); the graph is exported and
    # decomposed once, the other layers compile from a copy of that lowering with their own weights.
    layers = kiln.dynamo._MAX_SIGNATURES + 4
    model = nn.Sequential(*[GatedLayer() for _ in range(layers)]).eval()
    lowered = _counted_lowerings(monkeypatch)
    graphs, backend = _recording_backend()

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=False)
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        kiln.cached_build.reset_cache_stats()
        for _ in range(2):
            torch.testing.assert_close(compiled(x), model(x))
        assert kiln.cached_build.cache_stats()["builds"] == 0
        x2 = torch.randn(4, 16)  # the other branch for some layers, other values for all
        torch.testing.assert_close(compiled(-x2), model(-x2))
        model[layers - 1].fc.weight.mul_(-2.0)  # a later layer's weights change in place: refitted by its names
        torch.testing.assert_close(compiled(x2), model(x2))
    shared = max(graphs, key=lambda g: len(g.graph_modules))
    assert len(shared.graph_modules) == layers and len(shared.constant_idx) == 4
    assert len(lowered) == len(graphs), (len(lowered), len(graphs))  # one lowering per captured graph


def test_a_deep_stack_of_one_symbolic_graph_exports_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # With dynamic shapes each layer is a symbolic program of its own (its own weights), all made
    # from one symbolic export and decomposition of the shared graph.
    layers = 5
    model = nn.Sequential(*[GatedLayer() for _ in range(layers)]).eval()
    lowered = _counted_lowerings(monkeypatch)
    graphs, backend = _recording_backend()

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for rows in (6, 3, 9):
            x = torch.randn(rows, 16)
            torch.testing.assert_close(compiled(x), model(x))
    shared = max(graphs, key=lambda g: len(g.graph_modules))
    assert shared.dynamic and shared.symbolic and len(shared.graph_modules) == layers
    assert len(lowered) == len(graphs), (len(lowered), len(graphs))


def test_graph_mutating_its_input_runs_eagerly_with_a_warning() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x.add_(1.0)
        return torch.relu(x) * 2.0

    torch._dynamo.reset()
    x = torch.randn(3, 4)
    expected_x, expected = x.clone() + 1.0, torch.relu(x + 1.0) * 2.0
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="running it in eager PyTorch"):
        y = torch.compile(f, backend="kiln", options={"min_block_size": 1})(x)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(x, expected_x)


def test_outputs_that_alias_inputs() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x, x.view(-1), torch.relu(x).sum(0) + 1.0

    torch._dynamo.reset()
    x = torch.randn(3, 4)
    with torch.no_grad():
        a, b, c = torch.compile(f, backend="kiln", options={"min_block_size": 1})(x)
    assert a is x or torch.equal(a, x)
    torch.testing.assert_close(b, x.view(-1))
    torch.testing.assert_close(c, torch.relu(x).sum(0) + 1.0)


def test_float16_model_with_half_precision() -> None:
    m = MLP().eval().half()
    x = torch.randn(4, 16, dtype=torch.float16)
    result = compile_and_compare(m, [x], options={"min_block_size": 1, "enabled_precisions": {torch.half}},
                                 atol=1e-2, rtol=1e-2)
    assert result.engines == 1 and result.outputs[0].dtype == torch.float16


def test_non_contiguous_inputs() -> None:
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    result = compile_and_compare(conv, [x], options={"min_block_size": 1})
    assert result.engines == 1
    t = torch.randn(16, 4).t()  # a transposed view as the input
    result = compile_and_compare(MLP().eval(), [t], options={"min_block_size": 1})
    assert result.engines == 1
