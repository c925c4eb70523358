"""Instances (kiln/instances.py): a dynamic program's block is built once and serves other sizes
by instances of that engine. Outputs are compared with eager PyTorch at sizes never built; the
engines are checked to be instances (no build), refits and save/load to keep them right, and the
setting that turns them off to build per size again."""

from __future__ import annotations

import collections
import logging
import threading

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import kiln
from kiln.cached_build import cache_stats, reset_cache_stats
from kiln.dynamic import Specializations, dynamic_program_of
from kiln.instances import RowPadded
from kiln.runtime import KilnEngineModule, build_engine
from kiln.settings import CompilationSettings
from kiln.translate import SharedConstants


class Encoder(torch.nn.Module):
    """Embeddings with a position table sliced to the length, attention with a padding mask."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(50, dim)
        self.pos = torch.nn.Embedding(64, dim)
        self.register_buffer("positions", torch.arange(64)[None], persistent=False)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        h = self.embed(ids) + self.pos(self.positions[:, :s])
        q, k, v = self.qkv(h).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        bias = (1.0 - mask[:, None, None, :].to(h.dtype)) * -10000.0
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(b, s, -1)
        return self.out(self.norm(h + a))


class _IdsAndMask(torch.nn.Module):
    """A transformers model called with ids and an attention mask by keyword; its last hidden state."""

    def __init__(self, model: torch.nn.Module, **fixed: object) -> None:
        super().__init__()
        self.model, self.fixed = model, fixed

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask, **self.fixed).last_hidden_state


class _FeedForward(torch.nn.Module):
    """A transformer's feed-forward block with its residual and norm, on [batch, length, dim]."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.a, self.b, self.n = torch.nn.Linear(dim, hidden), torch.nn.Linear(hidden, dim), torch.nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.n(x + self.b(F.gelu(self.a(x))))

def _inputs(b: int, s: int) -> list[torch.Tensor]:
    ids = torch.randint(1, 50, (b, s))
    mask = torch.ones(b, s, dtype=torch.long)
    mask[0, s // 2:] = 0
    return [ids, mask]


def _engines(compiled: torch.nn.Module, size: int) -> list[KilnEngineModule]:
    table = dynamic_program_of(compiled)
    assert table is not None
    return [r for spec in table.live.values() if size in spec.binding.values() for r in spec.runners
            if isinstance(r, KilnEngineModule)]


def _assert_causal_instances(compiled: torch.nn.Module, s: int) -> None:
    """At length ``s`` (other than the opt length 16) the engines are instances, and every sdpa of
    their plans is causal with a padding mask read per key ([..., 1, s])."""
    engines = _engines(compiled, s)
    assert engines and all(e.engine.is_instance for e in engines if s != 16), s
    for e in engines:
        plan = e.engine.graph()
        sdpa = [n for n in plan.nodes if n.op == "sdpa"]
        assert sdpa and all(n.attrs.get("causal", False) for n in sdpa), s
        assert all(plan.type(n.inputs[3]).shape[-2:] == [1, s] for n in sdpa), s


def _compile(model: torch.nn.Module, **options: object) -> torch.nn.Module:
    seq = Dim("seq", min=4, max=64)
    options.setdefault("dynamic_instances", True)
    return kiln.compile(model, _inputs(2, 16), dynamic_shapes=({1: seq}, {1: seq}), **options)


class _KeysPerRow(torch.nn.Module):
    """Scores against a weight repeated once per batch row (DeBERTa's position keys): the repeat's
    operand expanded to the batch is no constant of one size."""

    def __init__(self) -> None:
        super().__init__()
        self.positions = torch.nn.Embedding(8, 64)
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, q: torch.Tensor) -> torch.Tensor:  # q [b, 4, 6, 16]
        b = q.shape[0]
        keys = self.proj(self.positions.weight).view(8, 4, 16).transpose(0, 1)  # [4, 8, 16]
        scores = torch.bmm(q.reshape(b * 4, 6, 16), keys.repeat(b, 1, 1).transpose(-1, -2))
        return scores.view(b, 4, 6, 8)


@torch.no_grad()
def test_a_weight_repeated_per_batch_row_fits_one_engine() -> None:
    torch.manual_seed(0)
    model = _KeysPerRow().eval()
    compiled = kiln.compile(model, [torch.randn(2, 4, 6, 16)], dynamic_shapes=({0: Dim("batch", min=1, max=8)},),
                            dynamic_instances=True, min_block_size=1)
    assert not compiled.summary.ops_in_pytorch
    reset_cache_stats()
    for b in (5, 1, 8):
        x = torch.randn(b, 4, 6, 16)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        assert all(e.engine.is_instance for e in _engines(compiled, b)), b
    assert cache_stats().get("builds", 0) == 0


@torch.no_grad()
def test_new_lengths_run_as_instances_of_the_opt_engine_and_match_eager() -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model)
    reset_cache_stats()
    for s in (5, 23, 64, 4, 37):
        x = _inputs(2, s)
        torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-4)
        engines = _engines(compiled, s)
        assert engines and all(e.engine.is_instance for e in engines), s
    assert cache_stats().get("builds", 0) == 0  # no engine was built for a new length


@torch.no_grad()
def test_batch_range_of_a_cnn_is_served_by_instances() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4)).eval()
    compiled = kiln.compile(model, [torch.randn(4, 3, 16, 16)], dynamic_shapes=({0: Dim("b", min=1, max=16)},),
                            dynamic_instances=True)
    table = dynamic_program_of(compiled)
    assert table is not None
    for b in (1, 3, 16, 7):
        x = torch.randn(b, 3, 16, 16)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        table.wait_tuned()  # made in the background: the first call ran on padded rows
        assert all(e.engine.is_instance for e in _engines(compiled, b))
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_the_opt_build_and_the_range_fit_copy_each_constant_once(monkeypatch: pytest.MonkeyPatch) -> None:
    copies: collections.Counter[int] = collections.Counter()
    put = SharedConstants.put

    def counting_put(self: SharedConstants, tensor: torch.Tensor, dtype: torch.dtype, data: object) -> None:
        copies[tensor.data_ptr()] += 1
        put(self, tensor, dtype, data)  # type: ignore[arg-type]
    monkeypatch.setattr(SharedConstants, "put", counting_put)
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model)
    table = dynamic_program_of(compiled)
    assert table is not None and table.ranges and table.shared_constants is None  # fitted; the copies let go
    # The opt build and each of the fit's samples describe the weights: one host copy each.
    assert len(copies) >= len(list(model.parameters())) and set(copies.values()) == {1}
    x = _inputs(2, 41)
    torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_the_range_fit_is_described_while_the_opt_engine_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    # The build holds no GIL: the fit's samples are described on this thread meanwhile.
    building: list[bool] = []
    start_fits = Specializations.start_fits

    def watched(self: Specializations, *args: object, **kwargs: object) -> object:
        building.append(any(t.name.startswith("kiln-build") and t.is_alive() for t in threading.enumerate()))
        return start_fits(self, *args, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(Specializations, "start_fits", watched)
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model)
    table = dynamic_program_of(compiled)
    assert building == [True] and table is not None and table.ranges
    x = _inputs(2, 29)
    torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-4)
    assert all(e.engine.is_instance for e in _engines(compiled, 29))


@torch.no_grad()
def test_every_block_is_fitted_when_the_fits_are_described_during_the_first_build() -> None:
    # The layer norm forced to PyTorch splits the program into two engines; the fits of both are
    # described while the first one builds and finished after both are built.
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model, torch_executed_ops={"aten.native_layer_norm"}, min_block_size=1)
    table = dynamic_program_of(compiled)
    assert table is not None and len(table.blocks) == 2 and sorted(table.ranges) == [0, 1]
    x = _inputs(2, 37)
    torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-4)
    table.wait_tuned()  # the linear after the norm keeps rows apart: padded rows until its instance is made
    assert len(_engines(compiled, 37)) == 2 and all(e.engine.is_instance for e in _engines(compiled, 37))


def test_build_engine_runs_the_work_given_it_once_and_raises_its_error_after_the_build() -> None:
    graph = kiln._C.ImportGraph()
    x, y = graph.add_tensor(kiln._C.DType.f32, [4]), graph.add_tensor(kiln._C.DType.f32, [4])
    graph.add_input(x, "x")
    graph.add_node("aten.relu.default", [kiln._C.ImportArg.of_tensor(x)], outputs=[y])
    graph.add_output(y, "y")
    calls: list[int] = []
    engine = build_engine(graph, CompilationSettings(), "cpu", meanwhile=lambda: calls.append(1))
    assert calls == [1]
    t = torch.randn(4)
    torch.testing.assert_close(KilnEngineModule(engine, "cpu")(t)[0], t.relu())

    def failing() -> None:
        raise RuntimeError("the work failed")
    with pytest.raises(RuntimeError, match="the work failed"):
        build_engine(graph, CompilationSettings(), "cpu", meanwhile=failing)


def test_shared_constants_serve_a_copy_only_for_the_same_bytes() -> None:
    w = torch.randn(3, 4)
    graph = kiln._C.ImportGraph()
    copy = graph.add_constant_from_ptr(graph.add_tensor(kiln.DType.f32, [3, 4]), "w", w.data_ptr(), w.nbytes)
    shared = SharedConstants()
    shared.put(w, torch.float32, copy)
    assert shared.get(w, torch.float32) is copy
    assert shared.get(w, torch.float16) is None  # described in another dtype
    assert shared.get(w.t(), torch.float32) is None  # another view of the storage
    w.add_(1.0)  # changed in place: the copy holds the old values
    assert shared.get(w, torch.float32) is None


@torch.no_grad()
def test_the_setting_off_builds_an_engine_per_size() -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model, dynamic_instances=False)
    x = _inputs(2, 23)
    torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-4)
    engines = _engines(compiled, 23)
    assert engines and not any(e.engine.is_instance for e in engines)


@torch.no_grad()
def test_a_refit_remakes_the_instances_with_the_new_weights() -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model)
    x = _inputs(2, 23)
    compiled(*x)
    other = Encoder().eval()
    kiln.refit(compiled, other)
    torch.testing.assert_close(compiled(*x), other(*x), rtol=1e-4, atol=1e-4)
    assert all(e.engine.is_instance for e in _engines(compiled, 23))


@torch.no_grad()
def test_weights_changed_in_place_reach_every_length_of_a_program_launched_before_its_check() -> None:
    # A dynamic program runs again alike: its call launches first and checks its weights after,
    # so a call after a change is made again with the refitted engines and their new instances.
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model)
    assert kiln.pipeline.runs_again_alike(compiled.gm)
    for s in (16, 23, 9, 23):
        x = _inputs(2, s)
        compiled(*x)
        model.qkv.weight.mul_(-1.25)
        model.pos.weight.add_(0.5)
        torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-4)
    model.out.weight.mul_(0.5)  # then a length never run: its specialization is made in the stale run
    x = _inputs(2, 31)
    torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_a_saved_program_serves_new_lengths_by_instances_after_loading(tmp_path: object) -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model)
    compiled(*_inputs(2, 9))  # an instance: not saved, made again after loading
    path = f"{tmp_path}/encoder.ep"
    kiln.save(compiled, path, _inputs(2, 16))
    loaded = kiln.load(path).module()
    reset_cache_stats()
    for s in (9, 41):
        x = _inputs(2, s)
        torch.testing.assert_close(loaded(*x), model(*x), rtol=1e-4, atol=1e-4)
        assert all(e.engine.is_instance for e in _engines(loaded, s))
    assert cache_stats().get("builds", 0) == 0


class _Flattened(torch.nn.Module):
    """x [b, b] or [b, b, b] flattened: b * b or b ** 3 elements."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x.reshape(-1) * 2.0 + 1.0)


@pytest.mark.parametrize("rank", [2, 3])
@torch.no_grad()
def test_a_size_quadratic_in_a_symbol_is_fitted_and_a_cubic_one_builds_per_size(
        rank: int, caplog: pytest.LogCaptureFixture) -> None:
    b = Dim("b", min=2, max=16)
    with caplog.at_level(logging.INFO, logger="kiln.instances"):
        compiled = kiln.compile(_Flattened(), [torch.randn(*[6] * rank)], dynamic_shapes=({d: b for d in range(rank)},),
                                min_block_size=1, dynamic_instances=True)
    for n in (9, 2, 16):
        x = torch.randn(*[n] * rank)
        torch.testing.assert_close(compiled(x), torch.relu(x.reshape(-1) * 2.0 + 1.0))
        assert all(e.engine.is_instance for e in _engines(compiled, n)) == (rank == 2), n
    if rank == 3:  # b ** 3: the symbol is held at the engine's value, so nothing is left to fit
        assert "an engine per size" in caplog.text


def test_tuning_runs_jobs_in_order_off_the_calling_thread_and_survives_a_failing_one(
        caplog: pytest.LogCaptureFixture) -> None:
    import threading

    from kiln.instances import Tuning

    tuning = Tuning()
    ran: list[tuple[int, str]] = []
    gate = threading.Event()

    def job(i: int) -> None:
        gate.wait()
        ran.append((i, threading.current_thread().name))

    def failing() -> None:
        raise RuntimeError("boom")

    tuning.submit(lambda: job(0))
    tuning.submit(failing)
    tuning.submit(lambda: job(1))
    assert ran == []  # the caller did not wait
    gate.set()
    with caplog.at_level(logging.ERROR, logger="kiln.instances"):
        tuning.wait()
    assert ran == [(0, "kiln-tuning"), (1, "kiln-tuning")]
    assert "a tuning job failed" in caplog.text


@torch.no_grad()
def test_a_timed_instance_replaces_the_untimed_one_in_every_specialization_running_it() -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model, optimization_level=2)
    x = _inputs(2, 23)
    compiled(*x)
    table = dynamic_program_of(compiled)
    assert table is not None
    block = table.blocks[0]
    spec = next(s for s in table.live.values() if 23 in s.binding.values())
    untimed = spec.runners[0]
    assert untimed.engine.is_instance and untimed.engine.optimization_level == 0
    table._tune(block, dict(spec.binding), untimed)  # what the tuning thread does on a GPU
    timed = spec.runners[0]
    assert timed is not untimed and timed.engine.is_instance and timed.engine.optimization_level == 2
    assert timed in list(table.built.modules())  # refit and engines() see it
    torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-4)


def _range_parent(compiled: torch.nn.Module) -> KilnEngineModule:
    table = dynamic_program_of(compiled)
    assert table is not None and len(table.range_parents) == 1
    return next(iter(table.range_parents.values()))


@torch.no_grad()
def test_the_opt_engine_builds_untimed_and_runs_timed_kernels_made_in_the_background(
        monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    # As on a GPU, where builds time tactics (on the CPU the levels make the same kernels).
    monkeypatch.setattr(kiln.dynamic, "times_tactics", lambda settings, device: settings.optimization_level > 0)
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model, optimization_level=2)
    table = dynamic_program_of(compiled)
    assert table is not None
    parent = _range_parent(compiled)
    assert parent.engine.optimization_level == 0  # the compile did not wait for tactic timing
    table.wait_tuned()
    kernels = parent._kernels
    assert kernels is not None and kernels.is_instance and kernels.optimization_level == 2
    for s in (16, 23):
        x = _inputs(2, s)
        torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-4)

    path = f"{tmp_path}/timed.ep"  # the file holds the timed kernels: nothing to time after loading
    kiln.save(compiled, path, _inputs(2, 16))
    loaded = kiln.load(path).module()
    assert _range_parent(loaded).engine.optimization_level == 2 and _range_parent(loaded)._kernels is None

    other = Encoder().eval()  # a refit runs the engine's own kernels, on the new weights, until timed again
    kiln.refit(compiled, other)
    table.wait_tuned()
    assert parent._kernels is not None and parent._kernels is not kernels
    x = _inputs(2, 16)
    torch.testing.assert_close(compiled(*x), other(*x), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_a_program_saved_before_its_timing_is_timed_after_loading(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: object) -> None:
    monkeypatch.setattr(kiln.dynamic, "times_tactics", lambda settings, device: settings.optimization_level > 0)
    retime = Specializations.retime
    monkeypatch.setattr(Specializations, "retime", lambda self, specs: None)  # saved before any timing
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model, optimization_level=2)
    path = f"{tmp_path}/untimed.ep"
    kiln.save(compiled, path, _inputs(2, 16))
    monkeypatch.setattr(Specializations, "retime", retime)
    loaded = kiln.load(path).module()
    parent = _range_parent(loaded)
    assert parent.engine.optimization_level == 0
    table = dynamic_program_of(loaded)
    assert table is not None
    table.wait_tuned()
    assert parent._kernels is not None and parent._kernels.optimization_level == 2
    for s in (16, 30):
        x = _inputs(2, s)
        torch.testing.assert_close(loaded(*x), model(*x), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_an_engine_runs_the_kernels_of_an_instance_of_its_own_sizes_only() -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model)
    parent = _range_parent(compiled)
    compiled(*_inputs(2, 23))
    other = next(e for e in _engines(compiled, 23) if e.engine.is_instance)
    with pytest.raises(kiln.KilnError, match="other inputs or outputs"):
        parent.run_kernels_of(other.engine)
    x = _inputs(2, 16)
    before = compiled(*x)
    parent.run_kernels_of(parent.engine.instance(parent.engine.graph()))
    assert parent._kernels is not None
    torch.testing.assert_close(compiled(*x), before, rtol=0, atol=0)
    with parent._lock:
        parent.own_kernels()
    assert parent._kernels is None
    torch.testing.assert_close(compiled(*x), before, rtol=0, atol=0)


@torch.no_grad()
def test_instances_share_one_arena_sized_for_the_largest_size_and_one_lock() -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model)
    for s in (5, 23, 64):
        compiled(*_inputs(2, s))
    modules = [e for s in (5, 23, 64) for e in _engines(compiled, s)]
    assert len(modules) == 3 and all(m._context.shares_arena for m in modules)
    arena = modules[0]._arena
    assert all(m._arena is arena and m._lock is modules[0]._lock for m in modules)
    assert arena.bytes >= max(m.engine.arena_bytes for m in modules)  # 64 is the range's largest length
    assert arena.bytes == modules[2].engine.arena_bound(modules[2].engine.graph())


@pytest.mark.cuda
@torch.no_grad()
def test_cuda_instances_are_tuned_in_the_background_and_match_eager() -> None:
    torch.manual_seed(0)
    model = Encoder().eval().cuda().half()

    def inputs(s: int) -> list[torch.Tensor]:
        return [x.cuda() for x in _inputs(4, s)]
    seq = Dim("seq", min=4, max=64)
    compiled = kiln.compile(model, inputs(16), dynamic_shapes=({1: seq}, {1: seq}),
                            enabled_precisions={torch.half}, dynamic_instances=True)
    table = dynamic_program_of(compiled)
    assert table is not None
    for s in (37, 5, 64):
        x = inputs(s)
        first = compiled(*x)  # the untimed instance
        table.wait_tuned()
        engines = _engines(compiled, s)
        assert engines and all(e.engine.is_instance and e.engine.optimization_level == 3 for e in engines)
        assert all(e._context.shares_arena for e in engines)
        ref = model(*x).float()
        for out in (first, compiled(*x)):
            assert float((out.float() - ref).norm() / ref.norm()) < 1e-2, s


@pytest.mark.cuda
@torch.no_grad()
def test_cuda_opt_engine_is_timed_in_the_background_and_matches_eager() -> None:
    torch.manual_seed(0)
    model = Encoder().eval().cuda().half()
    seq = Dim("seq", min=4, max=64)
    x = [t.cuda() for t in _inputs(4, 16)]
    compiled = kiln.compile(model, x, dynamic_shapes=({1: seq}, {1: seq}), enabled_precisions={torch.half},
                            dynamic_instances=True)
    table = dynamic_program_of(compiled)
    assert table is not None
    parent = _range_parent(compiled)
    assert parent.engine.optimization_level == 0
    first = compiled(*x)
    table.wait_tuned()
    assert parent._kernels is not None and parent._kernels.optimization_level == 3
    ref = model(*x).float()
    for out in (first, compiled(*x)):
        assert float((out.float() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.cuda
@torch.no_grad()
def test_cuda_cnn_batch_instances_match_eager_before_and_after_tuning() -> None:
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = torch.nn.Conv2d(16, 16, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(16)
            self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.conv2(torch.relu(self.bn(self.conv1(x)))) + x)

    model = Block().eval().cuda().half()
    compiled = kiln.compile(model, [torch.randn(4, 16, 28, 28, device="cuda", dtype=torch.half)],
                            dynamic_shapes=({0: Dim("b", min=1, max=32)},), enabled_precisions={torch.half})
    table = dynamic_program_of(compiled)
    assert table is not None
    # The opt engine's graphs (its own buffers', the staging buffers') were captured at compile.
    (opt,) = _engines(compiled, 4)
    assert not opt.engine.is_instance and opt._context.graph_captures == 2
    for b in (3, 17):
        x = torch.randn(b, 16, 28, 28, device="cuda", dtype=torch.half)
        ref = model(x).float()
        first = compiled(x)  # an untimed instance, with no runtime-compiled cuDNN engine
        table.wait_tuned()
        assert all(e.engine.is_instance and e.engine.optimization_level == 3 for e in _engines(compiled, b))
        for out in (first, compiled(x)):
            assert float((out.float() - ref).norm() / ref.norm()) < 1e-2, b


@torch.no_grad()
def test_the_range_engine_and_its_instances_outlive_the_capacity_and_are_saved(tmp_path: object) -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model, specialization_cache_size=2)
    for s in (5, 23, 37, 41):
        compiled(*_inputs(2, s))
    table = dynamic_program_of(compiled)
    assert table is not None
    lengths = [next(iter(spec.binding.values())) for spec in table.live.values()]
    assert lengths == [16, 5, 23, 37, 41]  # instances are kept apart from the capacity
    path = f"{tmp_path}/encoder.ep"
    kiln.save(compiled, path, _inputs(2, 16))
    loaded = kiln.load(path).module()
    reset_cache_stats()
    x = _inputs(2, 30)
    torch.testing.assert_close(loaded(*x), model(*x), rtol=1e-4, atol=1e-4)
    assert all(e.engine.is_instance for e in _engines(loaded, 30))
    assert cache_stats().get("builds", 0) == 0


@torch.no_grad()
def test_a_program_whose_range_engine_is_kept_beyond_the_capacity_saves_at_most_the_capacity(
        tmp_path: object) -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model, specialization_cache_size=1, dynamic_instances=True)
    compiled(*_inputs(2, 23))
    table = dynamic_program_of(compiled)
    assert table is not None and len(table.live) == 2  # the opt engine's and the instance's
    path = f"{tmp_path}/encoder.ep"
    kiln.save(compiled, path, _inputs(2, 16))
    x = _inputs(2, 23)
    torch.testing.assert_close(kiln.load(path).module()(*x), model(*x), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_sizes_served_by_instances_stay_beyond_the_capacity_and_come_back_at_once() -> None:
    # A range serves many sizes: instances on the shared arena hold no weights or arena of their
    # own, so they are kept apart from specialization_cache_size (which bounds built engines),
    # and a size that comes back runs its instance instead of making it again.
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = _compile(model, specialization_cache_size=2)
    lengths = (23, 37, 41, 30, 19, 56)
    for s in lengths:
        compiled(*_inputs(2, s))
    table = dynamic_program_of(compiled)
    assert table is not None
    assert sorted(next(iter(spec.binding.values())) for spec in table.live.values()) == sorted((16, *lengths))
    assert all(spec.light() for spec in table.live.values() if 16 not in spec.binding.values())
    made = table._count
    reset_cache_stats()
    for s in reversed(lengths):
        x = _inputs(2, s)
        torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-4)
    assert table._count == made and cache_stats().get("builds", 0) == 0


@torch.no_grad()
def test_dynamo_dynamic_cnn_serves_batches_by_instances_and_builds_a_new_image_size() -> None:
    """dynamic=True makes height and width symbols too; a conv's output size is a floor division of
    them, so they are held at the engine's values and only the batch is fitted."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(8, 4)).eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="kiln", dynamic=True)
    reset_cache_stats()
    for b, hw in ((2, 32), (3, 32), (6, 32), (3, 48)):
        x = torch.randn(b, 3, hw, hw)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    # One engine for the first batch at 32x32, instances for 3 and 6, one engine for 48x48.
    assert cache_stats().get("builds", 0) == 2


def _cnn() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3, padding=1, groups=2),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4)).eval()


@torch.no_grad()
def test_a_new_batch_runs_on_padded_rows_until_its_instance_is_made() -> None:
    torch.manual_seed(0)
    model = _cnn()
    for layer in model:
        if isinstance(layer, torch.nn.BatchNorm2d):  # statistics that are not the identity
            layer.running_mean.uniform_(-1, 1)
            layer.running_var.uniform_(0.5, 2)
    compiled = kiln.compile(model, [torch.randn(4, 3, 16, 16)], dynamic_shapes=({0: Dim("b", min=1, max=16)},))
    table = dynamic_program_of(compiled)
    assert table is not None
    held: list[object] = []
    table.tuning.submit = held.append  # type: ignore[method-assign]  # the background work waits
    reset_cache_stats()
    for b, built_rows in ((3, 4), (11, 4), (1, 4)):  # padded rows, then chunks of 4 rows
        x = torch.randn(b, 3, 16, 16)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        spec = next(s for s in table.live.values() if b in s.binding.values())
        assert isinstance(spec.runners[0], RowPadded) and spec.runners[0].built_rows == built_rows
    assert len(held) == 3 and cache_stats().get("builds", 0) == 0
    for job in held:
        job()  # type: ignore[operator]
    for b in (3, 11, 1):
        assert all(e.engine.is_instance for e in _engines(compiled, b))
        x = torch.randn(b, 3, 16, 16)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


class _Rows(torch.nn.Module):
    """A conv whose output goes through ``tail``: what decides whether rows stay apart."""

    def __init__(self, tail: object) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.tail = tail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tail(self.conv(x))  # type: ignore[operator]


_MIXING = {
    "scaled by the batch": lambda y: y * y.shape[0],
    "minus the batch mean": lambda y: y - y.mean(0),
    "softmax over the batch": lambda y: torch.softmax(y, 0),
    "flipped rows": lambda y: y.flip(0),
    "running sum over rows": lambda y: y.cumsum(0),
    "row index added": lambda y: y + torch.arange(y.shape[0], dtype=y.dtype)[:, None, None, None],
    "rows picked by index": lambda y: y[torch.arange(y.shape[0] - 1, -1, -1)],
    "normalized over every dim": lambda y: torch.nn.functional.layer_norm(y, y.shape[1:]) * 0
    + torch.nn.functional.layer_norm(y.reshape(-1), (y.numel(),)).reshape(y.shape),
    # [2b] regrouped as [b, 2]: row r takes entries 2r and 2r + 1 of the concat, rows of other r.
    "rows concatenated, then regrouped": lambda y: torch.cat([y, 2 * y], 0).reshape(y.shape[0], 2, *y.shape[1:])[:, 0],
    "rows repeated, then regrouped": lambda y: y.repeat(2, 1, 1, 1).reshape(y.shape[0], 2, *y.shape[1:])[:, 1],
    "new_full filled with the batch": lambda y: y + y.new_full((8, 8), y.shape[0]),
    # [4, b] merged, then read as [b, 4]: row r takes entries of rows 4r % b .. of the merge.
    "batch merged behind the channels, then regrouped": lambda y: y.transpose(0, 1).reshape(-1, 64)
    .reshape(y.shape[0], 4, 8, 8).softmax(1),
}


@pytest.mark.parametrize("what", sorted(_MIXING))
@torch.no_grad()
def test_a_block_that_mixes_rows_is_not_run_on_padded_rows(what: str) -> None:
    torch.manual_seed(0)
    model = _Rows(_MIXING[what]).eval()
    try:
        compiled = kiln.compile(model, [torch.randn(4, 3, 8, 8)], dynamic_shapes=({0: Dim("b", min=1, max=16)},))
    except Exception as err:  # noqa: BLE001 - a model export cannot take with a dynamic batch: nothing to check
        pytest.skip(f"not exported with a dynamic batch: {type(err).__name__}")
    table = dynamic_program_of(compiled)
    assert table is not None
    assert all(r.rows is None for r in table.ranges.values())
    for b in (3, 9):
        x = torch.randn(b, 3, 8, 8)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        spec = next(s for s in table.live.values() if b in s.binding.values())
        assert not any(isinstance(r, RowPadded) for r in spec.runners)


_KEEPING = {
    "upsampled bilinearly": lambda y: F.interpolate(y, scale_factor=2, mode="bilinear"),
    "hardswish": F.hardswish,
    "where with a scalar": lambda y: torch.where(y > 0, y, -1.0),
    # [b * 4, 8, 8]: each row's 4 channels stay its own through the batched product.
    "batch merged with the channels": lambda y: torch.bmm(y.reshape(-1, 8, 8), y.reshape(-1, 8, 8).transpose(1, 2))
    .softmax(-1).reshape(y.shape),
    # nn.MultiheadAttention's layout: [length, b] merged, so each row repeats along the merged dim.
    "batch merged behind the channels": lambda y: (y.transpose(0, 1).reshape(-1, 64).softmax(-1) * 2)
    .reshape(4, -1, 8, 8).transpose(0, 1),
    # Swin's shifted-window mask: a rowless tensor made with new_zeros from a tensor with rows.
    "a mask made by new_zeros": lambda y: y + y.new_zeros(8, 8).index_fill(0, torch.tensor([1, 5]), -2.0),
}


@pytest.mark.parametrize("what", sorted(_KEEPING))
@torch.no_grad()
def test_a_block_that_keeps_rows_apart_runs_a_new_batch_on_padded_rows(what: str) -> None:
    torch.manual_seed(0)
    model = _Rows(_KEEPING[what]).eval()
    compiled = kiln.compile(model, [torch.randn(4, 3, 8, 8)], dynamic_shapes=({0: Dim("b", min=1, max=16)},),
                            min_block_size=1)
    table = dynamic_program_of(compiled)
    assert table is not None and table.ranges
    assert all(r.rows is not None for r in table.ranges.values())
    held: list[object] = []
    table.tuning.submit = held.append  # type: ignore[method-assign]  # the instances wait
    for b in (3, 9):
        x = torch.randn(b, 3, 8, 8)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        spec = next(s for s in table.live.values() if b in s.binding.values())
        assert isinstance(spec.runners[0], RowPadded)


@torch.no_grad()
def test_the_batch_of_an_encoder_is_its_row_symbol_and_its_length_is_not() -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=4, max=64)
    compiled = kiln.compile(model, _inputs(2, 16), dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
    table = dynamic_program_of(compiled)
    assert table is not None and table.ranges
    rows = [r.rows for r in table.ranges.values()]
    assert all(r is not None and str(r[0]) == str(table.shapes.symbols[0]) for r in rows), rows
    for b, s in ((5, 16), (3, 23)):  # padded rows at the engine's length; a new length is an instance
        x = _inputs(b, s)
        torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-4)
    table.wait_tuned()
    for b, s in ((5, 16), (3, 23)):
        x = _inputs(b, s)
        torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-4)



@torch.no_grad()
def test_a_transformers_padding_mask_is_read_per_key_at_every_length() -> None:
    """transformers builds BERT's mask from index comparisons over aranges of the length; in a
    dynamic block they stay nodes, and the mask's rows side (`q_idx >= 0`) is still recognized as
    all true: every sdpa reads a [B, 1, 1, S] mask, as a static build's does, at the opt length
    and in the instances at other lengths, with eager's outputs."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64)
    model = transformers.BertModel(config).eval()
    compiled = _compile(model)
    for s in (16, 23, 64, 4):
        x = _inputs(2, s)
        torch.testing.assert_close(compiled(*x).last_hidden_state, model(*x).last_hidden_state,
                                   rtol=1e-4, atol=1e-4)
        engines = _engines(compiled, s)
        assert engines
        for e in engines:
            plan = e.engine.graph()
            masks = [plan.type(n.inputs[3]).shape for n in plan.nodes if n.op == "sdpa" and len(n.inputs) > 3]
            assert masks and all(m[-2] == 1 and m[-1] == s for m in masks), (s, masks)


@torch.no_grad()
def test_a_decoders_causal_and_padding_mask_becomes_the_causal_flag_at_every_length() -> None:
    """GPT-2 with a padding mask: transformers ands kv_idx <= q_idx with the padding rows. In a
    dynamic block the comparison stays a node over aranges of the length; it is still seen as the
    causal pattern, so every sdpa is causal and reads the [B, 1, 1, S] padding mask, with eager's
    outputs, at the opt length and in the instances. (Its position ids are a cumsum of the mask:
    the instances need that cumsum's triangle computed, not a constant of the length.)"""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    model = _IdsAndMask(transformers.GPT2Model(config), use_cache=False).eval()
    compiled = _compile(model)
    reset_cache_stats()
    for s in (16, 23, 64, 5):
        x = _inputs(2, s)
        torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-4)
        _assert_causal_instances(compiled, s)
    assert cache_stats().get("builds", 0) == 0  # no engine was built for a new length


@torch.no_grad()
def test_t5_relative_position_buckets_match_eager_at_every_length() -> None:
    """T5's bias buckets are log(d / 8) / log(16) * 8 + 8 truncated to an integer: exactly 10 at
    distance 16. A dynamic block computes them at run time (a static build folds them), in a fused
    kernel with i64 values; its f32 steps must round as f32, or the lengths past 16 take a wrong
    bucket."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=50, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                   relative_attention_num_buckets=32, relative_attention_max_distance=128)
    model = _IdsAndMask(transformers.T5EncoderModel(config)).eval()
    compiled = _compile(model)
    x = _inputs(2, 16)
    torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-4)
    # The [S, S] buckets gathered as S * S rows: a size the range fit takes as a square term.
    _serves_lengths_by_instances(model, compiled, 1e-4)
    for s in (17, 33):
        x = _inputs(2, s)
        torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-4)


def _serves_lengths_by_instances(model: torch.nn.Module, compiled: torch.nn.Module, tol: float) -> None:
    """A dynamic program runs lengths 5, 23 and 64 of a batch of 2 as instances of its engines, with
    eager's outputs within `tol`, building nothing."""
    table = dynamic_program_of(compiled)
    assert table is not None and table.ranges
    reset_cache_stats()
    for s in (5, 23, 64):
        x = _inputs(2, s)
        torch.testing.assert_close(compiled(*x), model(*x), rtol=tol, atol=tol)
        assert all(e.engine.is_instance for e in _engines(compiled, s))
    assert cache_stats().get("builds", 0) == 0


@torch.no_grad()
def test_a_cumsum_over_the_length_is_served_by_instances() -> None:
    """cumsum is a matmul with a triangle of ones over the scanned dim. In a dynamic block that
    triangle has the length's size: it is computed from indices, not a constant per size, so the
    plans fit one engine and every length runs as an instance, with eager's outputs."""
    class Positions(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(70, 8)

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            positions = mask.cumsum(-1) * mask  # transformers' position ids of a padded batch
            return self.embed(positions) + ids[..., None].float()

    model = Positions().eval()
    _serves_lengths_by_instances(model, _compile(model), 1e-5)


@torch.no_grad()
def test_an_f32_model_compiled_for_f16_serves_new_lengths_by_instances() -> None:
    """enabled_precisions={torch.half} on an f32 model: lower_precision rebuilds the graph, and
    must keep which values have the range's sizes, or fold_constants folds the position rows
    (a table gathered at positions[:, :s]) into a constant that differs at every length, and the
    plans no longer fit one engine."""
    torch.manual_seed(0)
    model = Encoder().eval()
    _serves_lengths_by_instances(model, _compile(model, enabled_precisions={torch.half}), 2e-2)


def test_the_sample_grid_follows_the_symbols_names() -> None:
    """SizeProgram::fit reads bit i of a corner's index as the i-th symbol by name: whatever order
    a block meets its symbols in, samples 0 and 1 differ in the first name, 0 and 2 in the second."""
    import sympy

    from kiln.dynamic import SymbolRange
    from kiln.instances import sample_bindings

    late, early = sympy.Symbol("s95"), sympy.Symbol("s85")
    ranges = {late: SymbolRange(late, 2, 64, 3), early: SymbolRange(early, 2, 64, 16)}
    bindings = sample_bindings((late, early), ranges, {late: 3, early: 16})
    assert bindings is not None
    assert bindings[0][late] == bindings[1][late] and bindings[0][early] != bindings[1][early]
    assert bindings[0][early] == bindings[2][early] and bindings[0][late] != bindings[2][late]


@torch.no_grad()
def test_two_symbols_of_torch_compile_dynamic_fit_one_engine() -> None:
    """torch.compile(dynamic=True) makes a batch and a length symbol: one engine serves both, every
    later size an instance, no build."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _FeedForward(8, 16).eval()
    compiled = torch.compile(model, backend="kiln", dynamic=True)
    x = torch.randn(3, 16, 8)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    reset_cache_stats()
    for b, s in ((5, 19), (4, 27), (7, 9)):
        x = torch.randn(b, s, 8)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert cache_stats().get("builds", 0) == 0


@torch.no_grad()
def test_dynamo_symbols_of_ids_and_mask_fit_one_engine_tied() -> None:
    """torch.compile(dynamic=True) gives a transformers model's ids and mask a batch and a length
    symbol each. Fitted apart their plans do not fit (a sample pairs a mask with another batch),
    nor with a sample at a length of 2 (its plan differs from the one at 16): the second fit ties the
    symbols of equal base values and starts at 3. Every later size is an instance with eager's
    outputs; a length of 2 builds an engine of its own."""
    from kiln.instances import tie_symbols

    transformers = pytest.importorskip("transformers")
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64)
    model = transformers.BertModel(config).eval()
    compiled = torch.compile(model, backend="kiln", dynamic=True)

    def check(b: int, s: int) -> None:
        ids, mask = _inputs(b, s)
        torch.testing.assert_close(compiled(input_ids=ids, attention_mask=mask).last_hidden_state,
                                   model(input_ids=ids, attention_mask=mask).last_hidden_state, rtol=1e-4, atol=1e-4)
    check(2, 16)
    reset_cache_stats()
    for b, s in ((3, 23), (4, 9), (5, 31)):
        check(b, s)
    assert cache_stats().get("builds", 0) == 0
    check(3, 2)
    assert cache_stats().get("builds", 0) == 1

    import sympy
    a, b, c = sympy.symbols("s1 s2 s3")
    assert tie_symbols({a: 2, b: 16, c: 2}, (c, b, a)) == {c: a}


def _decoder(arch: str) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    if arch == "gpt2":
        config = transformers.GPT2Config(vocab_size=50, n_embd=128, n_layer=2, n_head=2, n_positions=64,
                                         bos_token_id=0, eos_token_id=0)
        return _IdsAndMask(transformers.GPT2Model(config), use_cache=False)
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=256, max_position_embeddings=64)
    return _IdsAndMask(transformers.LlamaModel(config), use_cache=False)


@pytest.mark.cuda
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@torch.no_grad()
def test_cuda_f32_decoders_for_f16_with_padding_serve_every_length_by_instances(arch: str) -> None:
    """The CUDA side of the decoder tests above: an f32 decoder (head dim 64) compiled for f16
    with a dynamic length, called with a padding mask. Every sdpa is causal with a [B, 1, 1, S]
    mask (cuDNN's or the flash kernel's causal path with a padding mask), every later length is an
    instance (no build) and matches eager FP32 within f16's error."""
    torch.manual_seed(0)
    model = _decoder(arch).eval().cuda()

    def inputs(s: int) -> list[torch.Tensor]:
        return [x.cuda() for x in _inputs(3, s)]
    seq = Dim("seq", min=4, max=64)
    compiled = kiln.compile(model, inputs(16), dynamic_shapes=({1: seq}, {1: seq}), enabled_precisions={torch.half},
                            dynamic_instances=True)
    table = dynamic_program_of(compiled)
    assert table is not None and table.ranges
    reset_cache_stats()
    for s in (16, 37, 64, 5):
        x = inputs(s)
        ref = model(*x)
        first = compiled(*x)
        table.wait_tuned()
        for out in (first, compiled(*x)):
            assert float((out.float() - ref).norm() / ref.norm()) < 1e-2, s
        _assert_causal_instances(compiled, s)
    assert cache_stats().get("builds", 0) == 0


@pytest.mark.cuda
@torch.no_grad()
def test_cuda_torch_compile_dynamic_serves_batch_and_length_from_one_engine() -> None:
    """torch.compile(dynamic=True) on CUDA in f16: a batch and a length symbol, one engine, every
    later size an instance with eager's outputs."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _FeedForward(64, 256).eval().cuda().half()
    compiled = torch.compile(model, backend="kiln", dynamic=True, options={"enabled_precisions": {torch.half}})
    x = torch.randn(3, 16, 64, device="cuda", dtype=torch.half)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-2, atol=1e-2)
    reset_cache_stats()
    for b, s in ((5, 19), (4, 27), (7, 9)):
        x = torch.randn(b, s, 64, device="cuda", dtype=torch.half)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-2, atol=1e-2)
    assert cache_stats().get("builds", 0) == 0


@pytest.mark.cuda
@torch.no_grad()
def test_cuda_dynamo_symbols_of_ids_and_mask_fit_one_engine_tied() -> None:
    """The tied fit above on CUDA in f16: every later size an instance, eager FP32's outputs
    within f16's error."""
    transformers = pytest.importorskip("transformers")
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=256, max_position_embeddings=64)
    model = transformers.BertModel(config).eval().cuda()
    compiled = torch.compile(model, backend="kiln", dynamic=True, options={"enabled_precisions": {torch.half}})

    def check(b: int, s: int) -> None:
        ids, mask = (x.cuda() for x in _inputs(b, s))
        ref = model(input_ids=ids, attention_mask=mask).last_hidden_state
        out = compiled(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        assert float((out - ref).norm() / ref.norm()) < 1e-2, (b, s)
    check(2, 16)
    reset_cache_stats()
    for b, s in ((3, 23), (4, 9), (5, 31)):
        check(b, s)
    assert cache_stats().get("builds", 0) == 0

