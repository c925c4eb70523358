"""kiln.tune: the wrapper, inspect / wrap, the strategies, the rejection of wrong, failing and slow
candidates, the report, save / load (in a fresh process, and with a damaged artifact), the
whole-model comparison (a backend lifted to the root, or the wrappers' choices kept), the tuning
cache and the JIT hook (through KILN_TUNE=1 and through ``python -m kiln.tune.run``).

Backends that measure deterministically are fakes defined here: a module that sleeps makes eager
slow, a fake that skips the sleep is faster, one that adds a known relative error tests the
tolerances. Real Kiln JIT and AOT compiles are kept to a few small models; one test uses Inductor.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

import kiln
import kiln.tune as kt
import kiln.tune.hook
from kiln.tune.inputs import Inputs
from kiln.tune.results import COMPOSED, CandidateResult
from kiln.tune.root import Runner

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Any:
    """One intra-op thread: tiny ops on a loaded machine time steadily, and tests run faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---- models ------------------------------------------------------------------------------------

class Net(nn.Module):
    """A conv stem, an MLP body and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x).mean(dim=(2, 3))
        return self.head(self.body(y))


def make_net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net().eval()


class Slow(nn.Module):
    """A linear layer whose eager call also sleeps ``delay`` seconds."""

    def __init__(self, delay: float = 0.01) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.delay = delay

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay:  # none: nothing that Dynamo cannot trace
            time.sleep(self.delay)
        return self.compute(x)


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.slow = Slow()
        self.post = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.post(self.slow(x)) * scale


GLUE_S = 0.05


class Glued(nn.Module):
    """Slow glue around a quick submodule: the forward sleeps ``GLUE_S`` outside ``slow`` when it
    runs eagerly (counted in ``glue_runs``); compiled whole (Dynamo, torch.export), the sleep is gone."""

    def __init__(self) -> None:
        super().__init__()
        self.slow = Slow(0.0)
        self.post = nn.Linear(8, 2)
        self.glue_runs = 0

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.slow(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            self.glue_runs += 1
            time.sleep(GLUE_S)
        return self.compute(x)


def make_glued() -> Glued:
    torch.manual_seed(0)
    return Glued().eval()


# ---- fake backends -----------------------------------------------------------------------------

COMPILES: Counter[str] = Counter()


class Wrong(kt.Backend):
    """Compiles, runs, and returns wrong outputs."""

    kind = "test-wrong"

    def compile(self, module: nn.Module, samples: Sequence[Inputs]) -> Callable[..., Any]:
        COMPILES[self.name] += 1
        return lambda *args, **kwargs: module(*args, **kwargs) + 1.0


class WrongOnWhole(kt.Backend):
    """The module itself, but fast and wrong on a whole model: the kind of backend the whole-model
    comparison must reject rather than lift."""

    kind = "test-wrong-on-whole"

    def compile(self, module: nn.Module, samples: Sequence[Inputs]) -> Callable[..., Any]:
        if isinstance(module, Runner):
            return lambda x: module.model.compute(x) * 2.0
        return module


class Raising(kt.Backend):
    """Fails to compile."""

    kind = "test-raising"

    def compile(self, module: nn.Module, samples: Sequence[Inputs]) -> Callable[..., Any]:
        COMPILES[self.name] += 1
        raise RuntimeError("boom: this backend compiles nothing")


class Scaled(kt.Backend):
    """The module's result times (1 + rel); ``fast`` skips the sleeps (a module's ``compute``; on the
    whole model, the model's), ``delay`` adds one."""

    kind = "test-scaled"

    def __init__(self, rel: float = 0.0, fast: bool = False, delay: float = 0.0, precision: str | None = None,
                 name: str | None = None) -> None:
        super().__init__(name)
        self.rel, self.fast, self.delay, self.precision = rel, fast, delay, precision

    def compile(self, module: nn.Module, samples: Sequence[Inputs]) -> Callable[..., Any]:
        COMPILES[self.name] += 1
        target = module.model if isinstance(module, Runner) else module
        run = target.compute if self.fast else module

        def call(x: torch.Tensor) -> torch.Tensor:
            if self.delay:
                time.sleep(self.delay)
            return run(x) * (1.0 + self.rel)
        return call

    def config(self) -> dict[str, Any]:
        return {"rel": self.rel, "fast": self.fast, "delay": self.delay, "precision": self.precision}

    def precisions(self) -> frozenset[torch.dtype]:
        return frozenset({getattr(torch, self.precision)}) if self.precision else frozenset()


QUICK = dict(runs=3, warmup=1, progress=False, report=False, compare_whole=False)


def quick(**changes: Any) -> kt.TuneConfig:
    return kt.TuneConfig(**{**QUICK, **changes})


def statuses(report: kt.ModuleReport) -> dict[str, str]:
    return {c.backend: c.status for c in report.candidates}


# ---- the wrapper, inspect, wrap ----------------------------------------------------------------

def test_module_is_a_drop_in_wrapper() -> None:
    outer = Outer().eval()
    plain = copy.deepcopy(outer)
    wrapped = kt.Module(outer, "outer")
    x = torch.randn(3, 8)
    torch.testing.assert_close(wrapped(x, scale=2.0), plain(x, scale=2.0), rtol=0, atol=0)
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    assert wrapped.post is outer.post and wrapped.slow.delay == 0.01  # attributes of the wrapped module
    other = Outer().eval()
    wrapped.load_state_dict(other.state_dict())  # a checkpoint of the unwrapped model loads as is
    torch.testing.assert_close(wrapped(x), other(x), rtol=0, atol=0)
    assert wrapped.choice is None and wrapped.source is None
    with pytest.raises(TypeError, match="already wrapped"):
        kt.Module(wrapped)
    with pytest.raises(ValueError, match="backend names must differ"):
        kt.Module(Outer(), backends=[Scaled(), Scaled()])


def test_inspect_ranks_submodules_by_time() -> None:
    model = Outer().eval()
    data = [torch.randn(2, 8) for _ in range(3)]
    found = kt.inspect(model, data, min_share=0.0)
    slow = found[0]
    assert slow.name == "slow" and slow.type == "Slow" and slow.calls == 3 and slow.share > 0.5
    assert slow.shapes == ["float32[2, 8]"] and slow.params == 72
    assert found.total_ms >= slow.total_ms >= 3 * 10.0  # three calls of at least 10 ms each
    assert "slow" in found.table() and "share" in found.table()
    assert kt.inspect(model, data, min_share=0.5).names() == ["slow"]


def test_wrap_by_name_and_by_type() -> None:
    model = make_net()
    wrappers = kt.wrap(model, ["stem", nn.Linear])
    assert [w.name for w in wrappers] == ["stem", "head", "body.0", "body.2"]
    assert isinstance(model.stem, kt.Module) and isinstance(model.body[0], kt.Module)
    assert [p for p, _ in kt.wrapped_modules(model)] == ["stem", "body.0", "body.2", "head"]
    assert kt.wrap(model, "stem") == [model.stem]  # wrapped already: the same wrapper
    with pytest.raises(ValueError, match=r"no submodule 'bdy' \(did you mean 'body'"):
        kt.wrap(make_net(), "bdy")
    with pytest.raises(ValueError, match="'body.0' is inside 'body'"):
        kt.wrap(make_net(), ["body", "body.0"])
    with pytest.raises(ValueError, match="root cannot be wrapped in place"):
        kt.wrap(make_net(), "")
    with pytest.raises(ValueError, match="is inside the wrapped module 'stem'"):
        kt.wrap(model, "stem.module.0")
    with pytest.raises(ValueError, match="no wrapped module"):
        kt.tune(make_net(), [torch.randn(1, 3, 4, 4)])


# ---- strategies --------------------------------------------------------------------------------

def _row(name: str, ms: float, items_s: float, error: float = 0.0, status: str = "ok", p90: float | None = None,
         reference: bool = False) -> CandidateResult:
    return CandidateResult(name, "fake", status=status, latency_ms=ms, latency_p90_ms=p90 if p90 is not None else ms,
                           throughput=items_s, error=error, reference=reference)


def test_strategies_choose_by_their_own_rule() -> None:
    rows = [_row("eager", 4.0, 250, reference=True), _row("a", 1.0, 1000, 1e-5, p90=3.5),
            _row("b", 2.0, 3000, 1e-6), _row("c", 0.5, 5000, status="wrong")]
    order = ["a", "b", "c"]
    assert kt.MinLatency().select(rows, order)[0] == "a"
    assert kt.MaxThroughput().select(rows, order)[0] == "b"
    winner, why = kt.LatencyBudget(3.0).select(rows, order)  # p90: a is 3.5, b is 2.0
    assert winner == "b" and "most accurate within 3 ms" in why
    assert kt.LatencyBudget(3.0, statistic="median").select(rows, order)[0] == "b"  # b is more accurate than a
    assert kt.LatencyBudget(10.0).select(rows, order)[0] == "eager"  # eager is exact
    winner, why = kt.LatencyBudget(0.1).select(rows, order)
    assert winner == "b" and why == "no candidate within 0.1 ms (p90); the fastest: 2.000 ms"
    assert kt.LatencyBudget(0.1, statistic="median").select(rows, order)[0] == "a"
    assert kt.FirstThatWorks().select(rows, ["c", "b", "a"]) == ("b", "the first backend in the order that works (c did not)")
    assert kt.OneBackend(Scaled(name="c")).select(rows, order)[0] == "eager"
    assert kt.OneBackend(Scaled(name="b")).select(rows, order)[0] == "b"
    with pytest.raises(ValueError, match="positive number of milliseconds"):
        kt.LatencyBudget(0)


def test_strategy_specs_round_trip() -> None:
    for strategy in (kt.MinLatency(), kt.MaxThroughput(), kt.LatencyBudget(5, "median"), kt.FirstThatWorks(),
                     kt.FirstThatWorks(["kiln-aot", Scaled(0.1)]), kt.OneBackend("kiln-jit")):
        assert kt.strategy_from_spec(json.loads(json.dumps(strategy.to_json()))) == strategy
    assert kt.strategy_from_spec("max-throughput") == kt.MaxThroughput()
    assert kt.strategy_from_spec({"kind": "budget", "ms": 2}) == kt.LatencyBudget(2)
    with pytest.raises(ValueError, match="unknown strategy 'fastest'; valid: first_that_works, latency_budget"):
        kt.strategy_from_spec("fastest")


def test_backend_specs_round_trip() -> None:
    backends = [kt.Eager(), kt.KilnJit({"enabled_precisions": {torch.float16}, "min_block_size": 1}, fullgraph=True,
                                       autocast_enabled=True, autocast_dtype=torch.bfloat16, name="kiln-bf16"),
                kt.KilnAot({"min_block_size": float("inf"), "torch_executed_ops": ["aten.relu"]}),
                kt.Inductor("reduce-overhead"), Scaled(0.5, name="half")]
    for b in backends:
        assert kt.backend_from_spec(json.loads(json.dumps(b.to_json()))) == b
    assert backends[1].precisions() == {torch.float16, torch.bfloat16}
    assert kt.backend_from_spec({"kind": "kiln-jit", "name": "k", "options": {"min_block_size": 2}}).config()[
        "options"] == {"min_block_size": 2}
    assert kt.backend_from_spec("inductor-reduce-overhead").name == "inductor-reduce-overhead"
    settings = kiln.CompilationSettings(min_block_size=1, enabled_precisions={torch.float16})
    assert kt.KilnAot(settings).config() == {"options": {"enabled_precisions": ["float16"], "min_block_size": 1}}
    with pytest.raises(ValueError, match="unknown Kiln option 'min_blok_size' \\(did you mean 'min_block_size'"):
        kt.KilnJit({"min_blok_size": 1})
    with pytest.raises(ValueError, match="unknown backend kind 'tensorrt'"):
        kt.backend_from_spec("tensorrt")
    with pytest.raises(ValueError, match="backend 'kiln-aot': .*'min_block_size'; its settings: options "
                                         r"\(Kiln options go in 'options'\)"):
        kt.backend_from_spec({"kind": "kiln-aot", "min_block_size": 1})


# ---- tuning: correctness, rejection, speed -----------------------------------------------------

def test_wrong_and_raising_backends_are_rejected_with_their_reason() -> None:
    model = Outer().eval()
    kt.wrap(model, "slow", backends=[Wrong(), Raising(), Scaled(fast=True)])
    data = [torch.randn(2, 8), torch.randn(5, 8)]
    report = kt.tune(model, data, config=quick())["slow"]
    rows = {c.backend: c for c in report.candidates}
    assert rows["test-wrong"].status == "wrong" and "above the tolerance 3e-03" in rows["test-wrong"].reason
    assert rows["test-wrong"].error > 0.1 and rows["test-wrong"].latency_ms != rows["test-wrong"].latency_ms  # not timed
    assert rows["test-raising"].status == "failed"
    assert rows["test-raising"].reason == "RuntimeError: boom: this backend compiles nothing"
    assert rows["test-scaled"].status == "ok" and rows["test-scaled"].error == 0.0
    assert report.winner == "test-scaled" and model.slow.choice == Scaled(fast=True)
    assert report.samples == 2 and report.signatures == ["float32[2, 8]", "float32[5, 8]"]
    x = torch.randn(5, 8)
    torch.testing.assert_close(model(x), model.post(model.slow.module.compute(x)))


def test_structure_and_dtype_differences_are_wrong() -> None:
    class Pair(kt.Backend):
        kind = "test-pair"

        def compile(self, module: nn.Module, samples: Sequence[Inputs]) -> Callable[..., Any]:
            return lambda x: (module(x), module(x))

    class Half(kt.Backend):
        kind = "test-half"

        def compile(self, module: nn.Module, samples: Sequence[Inputs]) -> Callable[..., Any]:
            return lambda x: module(x).half()

    class NaNs(kt.Backend):
        kind = "test-nan"

        def compile(self, module: nn.Module, samples: Sequence[Inputs]) -> Callable[..., Any]:
            return lambda x: module(x) * torch.tensor(float("nan"))

    mod = kt.Module(nn.Linear(4, 4).eval(), "lin", backends=[Pair(), Half(), NaNs()])
    report = kt.tune(mod, [torch.randn(2, 4)], config=quick())["lin"]
    rows = {c.backend: c for c in report.candidates}
    assert rows["test-pair"].reason.startswith("output structure")
    assert rows["test-half"].reason == "output 0 is torch.float16[2, 4], eager's torch.float32[2, 4]"
    assert rows["test-nan"].status == "wrong" and rows["test-nan"].error == float("inf")
    assert report.winner == "eager"


def test_tolerance_follows_precision_and_config() -> None:
    data = [torch.randn(4, 8)]
    off = [Scaled(5e-3, name="fp32-like"), Scaled(5e-3, precision="float16", name="fp16-like"),
           Scaled(5e-2, precision="float16", name="too-far")]
    mod = kt.Module(Slow(0.0).eval(), "slow", strategy="first_that_works", backends=off)
    report = kt.tune(mod, data, config=quick(reject_slower_than_eager=False))["slow"]
    assert statuses(report) == {"eager": "ok", "fp32-like": "wrong", "fp16-like": "ok", "too-far": "skipped"}
    assert report.candidate("fp16-like").tolerance == 1e-2 and report.winner == "fp16-like"
    assert report.candidate("fp16-like").error == pytest.approx(5e-3, rel=1e-3)
    loose = quick(reject_slower_than_eager=False, tolerances={"float32": 1e-2})
    report = kt.tune(mod, data, config=loose)["slow"]
    assert report.winner == "fp32-like" and report.candidate("fp32-like").tolerance == 1e-2


def test_slower_than_eager_is_rejected_and_strategies_use_speed_and_error() -> None:
    data = [torch.randn(4, 8)]
    backends = [Scaled(delay=0.04, name="sleepy"), Scaled(1e-6, fast=True, name="fast")]
    mod = kt.Module(Slow(0.02).eval(), "slow", backends=backends)
    report = kt.tune(mod, data, config=quick())["slow"]
    assert statuses(report) == {"eager": "ok", "sleepy": "slower", "fast": "ok"}
    assert report.candidate("sleepy").reason.startswith("slower than eager: ")
    assert report.winner == "fast" and "lowest median latency" in report.reason
    assert kt.tune(mod, data, config=quick(strategy="max_throughput"))["slow"].winner == "fast"
    assert kt.tune(mod, data, config=quick(strategy=kt.LatencyBudget(12.0)))["slow"].winner == "fast"
    report = kt.tune(mod, data, config=quick(strategy=kt.LatencyBudget(1000.0)))["slow"]
    assert report.winner == "eager" and "most accurate" in report.reason  # eager's error is 0
    kept = kt.tune(mod, data, config=quick(reject_slower_than_eager=False))["slow"]
    assert kept.candidate("sleepy").status == "ok" and kept.winner == "fast"
    one = kt.tune(mod, data, config=quick(strategy=kt.OneBackend(Scaled(delay=0.04, name="sleepy"))))["slow"]
    assert one.winner == "eager" and one.reason.startswith("sleepy was rejected (slower: slower than eager")


def test_training_mode_with_batch_norm_is_refused() -> None:
    model = make_net().train()
    model.stem.append(nn.BatchNorm2d(8))
    kt.wrap(model, "stem")
    with pytest.raises(ValueError, match="stem is in training mode with batch norm or dropout"):
        kt.tune(model, [torch.randn(2, 3, 4, 4)], config=quick())


def test_progress_bar_and_table_go_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    mod = kt.Module(Slow(0.0).eval(), "slow", backends=[Wrong()])
    kt.tune(mod, [torch.randn(2, 8)], config=quick(progress=True, report=True))
    out, err = capsys.readouterr()
    assert out == ""
    assert "kiln.tune [" in err and "1/2 slow: test-wrong" in err
    assert "kiln.tune: slow (tuned; 1 sample(s): float32[2, 8]; strategy min_latency)" in err
    assert "winner: eager: lowest median latency" in err
    kt.tune(mod, [torch.randn(2, 8)], config=quick())
    assert capsys.readouterr() == ("", "")


# ---- real Kiln backends ------------------------------------------------------------------------

def test_kiln_jit_and_aot_candidates_match_eager(tmp_path: Path) -> None:
    model = make_net()
    data = [torch.randn(2, 3, 8, 8), torch.randn(2, 3, 8, 8)]
    with torch.no_grad():
        expected = model(data[0])
    kt.wrap(model, ["stem", "body"])
    config = quick(backends=["eager", kt.KilnJit({"min_block_size": 1}), kt.KilnAot({"min_block_size": 1})],
                   reject_slower_than_eager=False)
    report = kt.tune(model, data, config=config)
    for name in ("stem", "body"):
        rows = report[name].candidates
        assert [(c.backend, c.status) for c in rows] == [("eager", "ok"), ("kiln-jit", "ok"), ("kiln-aot", "ok")]
        assert all(c.error < 1e-5 and c.latency_ms > 0 and c.latency_p90_ms >= c.latency_ms for c in rows)
        assert all(c.compile_s > 0 for c in rows[1:]) and all(c.throughput > 0 for c in rows)
    with torch.no_grad():
        torch.testing.assert_close(model(data[0]), expected, atol=1e-5, rtol=1e-5)
    again = kt.TuneReport.from_json(json.loads(json.dumps(report.to_json())))
    assert again.to_json() == report.to_json()
    assert kt.report(model).to_json()["modules"] == report.to_json()["modules"]
    report.save_json(tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["modules"][1]["name"] == "body"


def test_first_that_works_stops_at_the_first_accepted_backend() -> None:
    model = make_net()
    kt.wrap(model, "body", strategy=kt.FirstThatWorks([Raising(), kt.KilnAot({"min_block_size": 1}), Wrong()]))
    before = COMPILES["test-wrong"]
    report = kt.tune(model, [torch.randn(3, 3, 4, 4)], config=quick(reject_slower_than_eager=False))["body"]
    assert statuses(report) == {"eager": "ok", "test-raising": "failed", "kiln-aot": "ok", "test-wrong": "skipped"}
    assert report.winner == "kiln-aot" and report.reason.endswith("(test-raising did not)")
    assert COMPILES["test-wrong"] == before


def test_inductor_candidate() -> None:
    """The one test that compiles with TorchInductor (slow on a CPU)."""
    mod = kt.Module(nn.Sequential(nn.Linear(8, 16), nn.ReLU()).eval(), "mlp", strategy=kt.OneBackend("inductor"))
    x = torch.randn(2, 8)
    report = kt.tune(mod, [x], config=quick(reject_slower_than_eager=False))["mlp"]
    assert statuses(report) == {"eager": "ok", "inductor": "ok"} and report.winner == "inductor"
    with torch.no_grad():
        torch.testing.assert_close(mod(x), mod.module(x))


# ---- the tuning cache --------------------------------------------------------------------------

def test_tuning_cache_reuses_a_choice(tmp_path: Path) -> None:
    config = quick(cache=True, cache_dir=str(tmp_path / "cache"))
    backends = [Wrong(name="w"), Scaled(1e-6, fast=True, name="cached-fast")]
    data = [torch.randn(4, 8)]
    first = kt.Module(Slow().eval(), "slow", backends=backends)
    assert kt.tune(first, data, config=config)["slow"].source == "tuned"
    compiled = Counter(COMPILES)
    second = kt.Module(Slow().eval(), "slow", backends=backends)
    report = kt.tune(second, data, config=config)["slow"]
    assert report.source == "cache" and report.winner == "cached-fast" and second.source == "cache"
    assert COMPILES["w"] == compiled["w"]  # nothing measured again
    assert COMPILES["cached-fast"] == compiled["cached-fast"] + 1  # compiled once and checked against eager
    x = data[0]
    torch.testing.assert_close(second(x), second.module.compute(x) * (1 + 1e-6))
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1
    # Another input signature or other candidates: another key.
    assert kt.tune(second, [torch.randn(2, 8)], config=config)["slow"].source == "tuned"
    other = kt.Module(Slow().eval(), "slow", backends=backends[1:])
    assert kt.tune(other, data, config=config)["slow"].source == "tuned"
    assert len(list((tmp_path / "cache").glob("*.json"))) == 3


def test_a_cached_choice_that_turned_wrong_is_tuned_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = quick(cache=True, cache_dir=str(tmp_path))
    mod = kt.Module(Slow().eval(), "slow", backends=[Scaled(1e-6, fast=True)])
    kt.tune(mod, [torch.randn(4, 8)], config=config)
    entry = next(tmp_path.glob("*.json"))
    data = json.loads(entry.read_text())
    data["choice"] = Wrong(name="test-scaled").to_json()  # as if the backend now computed something else
    entry.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="kiln.tune"):
        report = kt.tune(mod, [torch.randn(4, 8)], config=config)["slow"]
    assert report.source == "tuned" and report.winner == "test-scaled"
    assert "the cached choice does not work here (ValueError: error" in caplog.text


# ---- save / load -------------------------------------------------------------------------------

def _tuned_net(tmp_path: Path) -> tuple[Net, list[torch.Tensor], Path]:
    model = make_net()
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    kt.wrap(model, "stem", strategy=kt.OneBackend(kt.KilnAot({"min_block_size": 1})))
    kt.wrap(model, "body", strategy=kt.OneBackend(kt.KilnJit({"min_block_size": 1})))
    data = [torch.randn(2, 3, 8, 8)]
    report = kt.tune(model, data, config=quick(reject_slower_than_eager=False))
    assert [m.winner for m in report.modules] == ["kiln-aot", "kiln-jit"]
    kt.save(model, tmp_path / "tuned")
    return model, data, tmp_path / "tuned"


def test_save_then_load_in_a_fresh_process_tunes_nothing(tmp_path: Path) -> None:
    _, data, saved = _tuned_net(tmp_path)
    manifest = json.loads((saved / "tune.json").read_text())
    stem = manifest["modules"]["stem"]
    assert manifest["format"] == "kiln.tune/1" and stem["choice"]["kind"] == "kiln-aot"
    assert [a["file"] for a in stem["artifacts"]] == ["artifacts/0-stem.0.pt2"] and len(stem["artifacts"][0]["sha256"]) == 64
    assert manifest["modules"]["body"]["artifacts"] == []
    torch.save(data[0], tmp_path / "x.pt")
    script = textwrap.dedent(f"""
        import json, logging, sys, torch
        logging.basicConfig(level=logging.INFO)
        sys.path.insert(0, {str(TESTS)!r})
        import kiln.tune as kt
        from test_tune import Net
        torch.set_num_threads(1)
        model = Net().eval()
        model.load_state_dict(torch.load({str(tmp_path / 'weights.pt')!r}))
        x = torch.load({str(tmp_path / 'x.pt')!r})
        with torch.no_grad():
            expected = model(x)
            model = kt.load(model, {str(saved)!r})
            loaded = model.stem._choice.fn is not None
            out = model(x)
        print(json.dumps({{"diff": (out - expected).abs().max().item(), "artifact_loaded": loaded,
                          "sources": [model.stem.source, model.body.source],
                          "choices": [model.stem.choice.kind, model.body.choice.kind]}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"diff": result["diff"], "artifact_loaded": True, "sources": ["file", "file"],
                      "choices": ["kiln-aot", "kiln-jit"]}
    assert result["diff"] < 1e-5
    assert "kiln.tune [" not in proc.stderr and "kiln.tune: stem ->" not in proc.stderr
    assert "kiln.tune: body ->" not in proc.stderr
    assert "2 module(s) restored, 0 re-tuned" in proc.stderr


def test_a_damaged_or_missing_artifact_is_tuned_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, data, saved = _tuned_net(tmp_path)
    with torch.no_grad():
        expected = model(data[0])
    artifact = saved / "artifacts" / "0-stem.0.pt2"
    blob = bytearray(artifact.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    artifact.write_bytes(bytes(blob))
    fresh = make_net()
    with caplog.at_level(logging.WARNING, logger="kiln.tune"):
        fresh = kt.load(fresh, saved, data)
    assert "artifact artifacts/0-stem.0.pt2 is damaged (SHA-256 mismatch); re-tuning stem" in caplog.text
    assert fresh.stem.source == "tuned" and fresh.stem.choice.kind == "kiln-aot" and fresh.body.source == "file"
    with torch.no_grad():
        torch.testing.assert_close(fresh(data[0]), expected, atol=1e-5, rtol=1e-5)

    artifact.unlink()
    caplog.clear()
    fresh = make_net()
    with caplog.at_level(logging.WARNING, logger="kiln.tune"):
        fresh = kt.load(fresh, saved)  # no data: tuned at its first call
    assert "artifact artifacts/0-stem.0.pt2 is missing; re-tuning stem" in caplog.text
    assert fresh.stem.choice is None and fresh.stem.tune_on_call
    with torch.no_grad():
        torch.testing.assert_close(fresh(data[0]), expected, atol=1e-5, rtol=1e-5)
    assert fresh.stem.source == "tuned" and fresh.stem.choice.kind == "kiln-aot"


def test_load_checks_weights_and_model(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _, data, saved = _tuned_net(tmp_path)
    other = make_net(seed=1)  # the same model with other weights: the saved program's weights are stale
    with torch.no_grad():
        expected = other(data[0])
    with caplog.at_level(logging.WARNING, logger="kiln.tune"):
        other = kt.load(other, saved)
    assert "the module's weights differ from those its saved kiln-aot program holds" in caplog.text
    with torch.no_grad():
        torch.testing.assert_close(other(data[0]), expected, atol=1e-5, rtol=1e-5)
    assert other.stem.source == "file"
    with pytest.raises(ValueError, match="the model has no submodule 'stem'"):
        kt.load(nn.Sequential(nn.Linear(2, 2)), saved)
    with pytest.raises(FileNotFoundError, match="holds no saved tuning"):
        kt.load(make_net(), tmp_path)
    with pytest.raises(ValueError, match="is not tuned; run kiln.tune.tune first"):
        kt.save(kt.Module(make_net()), tmp_path / "untuned")


def test_tuned_module_copies_and_pickles() -> None:
    mod = kt.Module(Slow().eval(), "slow", backends=[Scaled(1e-6, fast=True)])
    kt.tune(mod, [torch.randn(4, 8)], config=quick())
    x = torch.randn(4, 8)
    for twin in (copy.deepcopy(mod), pickle.loads(pickle.dumps(mod))):
        assert twin.choice == Scaled(1e-6, fast=True) and twin._choice.fn is None
        torch.testing.assert_close(twin(x), mod(x))  # compiled again at the first call


# ---- the whole model ---------------------------------------------------------------------------

def _call(model: Glued, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The output, and whether the eager glue ran (False: the call went to a whole-model choice)."""
    before = model.glue_runs
    with torch.no_grad():
        out = model(x)
    return out, model.glue_runs != before


def test_a_faster_whole_model_backend_is_lifted_to_the_root_and_a_wrong_one_rejected() -> None:
    model = make_glued()
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = model.compute(x)
    kt.wrap(model, "slow")
    backends = ["eager", Scaled(1e-6, fast=True, name="fast"), WrongOnWhole(name="broken")]
    config = quick(backends=backends, compare_whole=True, reject_slower_than_eager=False)  # slow is quick: a tie
    report = kt.tune(model, [x], config=config)
    whole = report.whole
    assert whole is not None and whole.name == "whole model" and report.lifted
    assert statuses(whole) == {"eager": "ok", "fast": "ok", "broken": "wrong", COMPOSED: "ok"}
    assert whole.candidate("broken").reason.startswith("error ") and whole.candidate("broken").error > 0.1
    assert whole.winner == "fast" and whole.reason.startswith("lifted to the root: ")
    composed, fast = whole.candidate(COMPOSED), whole.candidate("fast")
    assert composed.latency_ms >= GLUE_S * 1e3 > fast.latency_ms  # the glue sleeps between the wrappers
    slow = report["slow"]  # the wrapper keeps its own results and choice (broken is right on a module)
    assert statuses(slow) == {"eager": "ok", "fast": "ok", "broken": "ok"} and model.slow.choice.name == slow.winner
    assert model.slow.superseded and model.slow.report.superseded.startswith("by fast on the whole model: ")
    root = kt.root_choice(model)
    assert root is not None and root.lifted and root.backend == Scaled(1e-6, fast=True, name="fast")
    assert root.source == "tuned" and model.__dict__["forward"] is root
    out, glued = _call(model, x)
    torch.testing.assert_close(out, expected * (1 + 1e-6))
    assert not glued  # the call went to the whole-model choice
    table = report.table()
    assert "kiln.tune: whole model (tuned; 1 sample(s): float32[4, 8]; strategy min_latency)" in table
    assert "decision: fast: lifted to the root: " in table and "superseded: by fast on the whole model" in table
    again = kt.TuneReport.from_json(json.loads(json.dumps(report.to_json())))
    assert again.to_json() == report.to_json() and again.lifted and again.whole.candidate(COMPOSED).kind == COMPOSED
    assert kt.report(model).to_json() == {**report.to_json(), "device": kt.report(model).device}
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        twin_root = kt.root_choice(twin)
        assert twin_root is not None and twin_root.model is twin and twin_root.fn is None and twin.slow.superseded
        out, glued = _call(twin, x)  # compiled again at the first call
        torch.testing.assert_close(out, expected * (1 + 1e-6))
        assert not glued

    # Without the comparison (or tuned again): the lift is undone, the wrappers' own choices run.
    report = kt.tune(model, [x], config=config.replace(compare_whole=False))
    assert report.whole is None and not report.lifted and kt.root_choice(model) is None
    assert "forward" not in model.__dict__ and not model.slow.superseded and model.slow.report.superseded == ""
    out, glued = _call(model, x)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert glued
    assert kt.tune(model, [x], config=config).whole.winner == "fast"
    assert kt.root_choice(model).lifted and model.slow.superseded


def test_the_wrappers_choices_are_kept_when_they_beat_the_whole_model() -> None:
    model = Outer().eval()  # slow sleeps; on it, "fast" skips the sleep; Outer has no compute() for the whole
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = model.post(model.slow.compute(x) * (1 + 1e-3))
    kt.wrap(model, "slow")
    backends = ["eager", Scaled(1e-3, fast=True, name="fast"), Scaled(delay=0.02, name="sleepy")]
    report = kt.tune(model, [x], config=quick(backends=backends, compare_whole=True))
    whole = report.whole
    assert statuses(whole) == {"eager": "ok", "fast": "failed", "sleepy": "slower", COMPOSED: "ok"}
    assert whole.winner == COMPOSED and not report.lifted and whole.reason.startswith("kept: ")
    assert whole.candidate(COMPOSED).latency_ms < whole.candidate("eager").latency_ms
    assert report["slow"].winner == "fast" and not model.slow.superseded and report["slow"].superseded == ""
    root = kt.root_choice(model)
    assert root is not None and not root.lifted and root.report is whole and "forward" not in model.__dict__
    with torch.no_grad():
        out = model(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)  # the wrapper's choice ran
    with pytest.raises(ValueError, match="'compare_whole' must be a bool"):
        quick(compare_whole="yes")


def test_dynamo_compiles_the_whole_model_through_passing_wrappers() -> None:
    model = make_glued()
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = model.compute(x)
    kt.wrap(model, "slow", strategy=kt.OneBackend(Scaled(1e-6, fast=True, name="fast")))
    jit = kt.KilnJit({"min_block_size": 1}, fullgraph=True)  # fullgraph: a graph break through a wrapper fails
    report = kt.tune(model, [x], config=quick(backends=["eager", jit], compare_whole=True,
                                              reject_slower_than_eager=False))
    assert statuses(report.whole) == {"eager": "ok", "kiln-jit": "ok", COMPOSED: "ok"}
    assert report.whole.winner == "kiln-jit" and kt.root_choice(model).backend == jit
    with torch._dynamo.config.patch(error_on_recompile=True):  # the lifted program serves the calls as compiled
        for _ in range(2):
            out, glued = _call(model, x)
            torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
            assert not glued


def _lifted_aot(tmp_path: Path) -> tuple[Glued, list[torch.Tensor], Path]:
    model = make_glued()
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    kt.wrap(model, "slow", strategy=kt.OneBackend(Scaled(1e-6, fast=True, name="fast")))
    data = [torch.randn(4, 8)]
    report = kt.tune(model, data, config=quick(backends=["eager", kt.KilnAot({"min_block_size": 1})],
                                               compare_whole=True, reject_slower_than_eager=False))
    assert report.whole.winner == "kiln-aot" and model.slow.superseded
    kt.save(model, tmp_path / "tuned")
    return model, data, tmp_path / "tuned"


def test_a_lifted_kiln_aot_choice_saves_and_loads_in_a_fresh_process(tmp_path: Path) -> None:
    _, data, saved = _lifted_aot(tmp_path)
    manifest = json.loads((saved / "tune.json").read_text())
    root, slow = manifest["root"], manifest["modules"]["slow"]
    assert root["choice"]["kind"] == "kiln-aot" and root["source"] == "tuned" and root["report"]["winner"] == "kiln-aot"
    assert [a["file"] for a in root["artifacts"]] == ["artifacts/root.0.pt2"] and len(root["artifacts"][0]["sha256"]) == 64
    assert slow["superseded"] is True and slow["artifacts"] == [] and slow["choice"]["name"] == "fast"
    torch.save(data[0], tmp_path / "x.pt")
    script = textwrap.dedent(f"""
        import json, logging, sys, torch
        logging.basicConfig(level=logging.INFO)
        sys.path.insert(0, {str(TESTS)!r})
        import kiln.tune as kt
        from test_tune import Glued
        torch.set_num_threads(1)
        model = Glued().eval()
        model.load_state_dict(torch.load({str(tmp_path / 'weights.pt')!r}))
        x = torch.load({str(tmp_path / 'x.pt')!r})
        with torch.no_grad():
            expected = model.compute(x)
            model = kt.load(model, {str(saved)!r})
            root = kt.root_choice(model)
            loaded = root.fn is not None
            out = model(x)
        print(json.dumps({{"diff": (out - expected).abs().max().item(), "artifact_loaded": loaded,
                          "glue_runs": model.glue_runs,
                          "root": [root.backend.kind, root.source, root.report.source, root.report.winner],
                          "slow": [model.slow.source, model.slow.choice.name, model.slow.superseded]}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"diff": result["diff"], "artifact_loaded": True, "glue_runs": 0,
                      "root": ["kiln-aot", "file", "file", "kiln-aot"], "slow": ["file", "fast", True]}
    assert result["diff"] < 1e-5
    assert "kiln.tune [" not in proc.stderr and "kiln.tune: whole model ->" not in proc.stderr
    assert "1 module(s) restored, 0 re-tuned" in proc.stderr


def test_a_damaged_or_missing_root_artifact_is_tuned_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _, data, saved = _lifted_aot(tmp_path)
    with torch.no_grad():
        expected = make_glued().compute(data[0])
    artifact = saved / "artifacts" / "root.0.pt2"
    blob = bytearray(artifact.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    artifact.write_bytes(bytes(blob))
    with caplog.at_level(logging.WARNING, logger="kiln.tune"):
        fresh = kt.load(make_glued(), saved, data)
    assert "artifact artifacts/root.0.pt2 is damaged (SHA-256 mismatch); re-tuning the model" in caplog.text
    root = kt.root_choice(fresh)
    assert root.source == "tuned" and root.backend.kind == "kiln-aot" and root.fn is not None
    assert fresh.slow.superseded and fresh.slow.source == "tuned"
    out, glued = _call(fresh, data[0])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert not glued

    artifact.unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kiln.tune"):
        fresh = kt.load(make_glued(), saved)  # no data: tuned at its first call
    assert "artifact artifacts/root.0.pt2 is missing; re-tuning the model" in caplog.text
    assert "the model is tuned at its first call" in caplog.text
    assert kt.root_choice(fresh).retune and fresh.slow.choice is None and not fresh.slow.superseded
    with pytest.raises(ValueError, match="the model is tuned again at its next call"):
        kt.save(fresh, tmp_path / "again")
    with torch.no_grad():
        torch.testing.assert_close(fresh(data[0]), expected, atol=1e-5, rtol=1e-5)
    root = kt.root_choice(fresh)
    assert not root.retune and root.source == "tuned" and root.backend.kind == "kiln-aot" and fresh.slow.superseded
    with pytest.raises(ValueError, match="a backend on the whole model supersedes the wrappers"):
        kt.tune(fresh, data, config=quick(), modules=["slow"])


# ---- the JIT hook ------------------------------------------------------------------------------

def test_hook_tunes_top_level_modules_only() -> None:
    config = quick(backends=[Scaled(1e-6, fast=True, name="jit-fast")], cache=False)
    model = Outer().eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = model(x)
    kiln.tune.hook.install(config)
    try:
        with torch.no_grad():
            out = model(x)
        slot = model.__dict__["_kiln_tune_jit"]
        assert slot.wrapper.source == "tuned" and slot.wrapper.report.winner == "eager"  # Outer has no compute()
        assert "_kiln_tune_jit" not in model.slow.__dict__  # called inside Outer: passed through
        torch.testing.assert_close(out, expected)
        slow = Slow().eval()
        with torch.no_grad():
            slow(x[:, :8])
        assert slow.__dict__["_kiln_tune_jit"].wrapper.choice.name == "jit-fast"
        grad_model = Slow()
        with torch.enable_grad():
            grad_model(x)  # gradients needed: eager, untuned
        assert grad_model.__dict__["_kiln_tune_jit"].wrapper.choice is None
        user_wrapped = kt.Module(Slow().eval(), "mine")  # a wrapper of the user's own: left to its own tuning
        with torch.no_grad():
            user_wrapped(x)
        assert user_wrapped.__dict__["_kiln_tune_jit"].wrapper is None
        assert "_kiln_tune_jit" not in user_wrapped.module.__dict__ and user_wrapped.choice is None
        assert pickle.loads(pickle.dumps(slow)).__dict__["_kiln_tune_jit"] == {}
        assert copy.deepcopy(slow).__dict__["_kiln_tune_jit"] == {}
    finally:
        kiln.tune.hook.uninstall()
    assert not kiln.tune.hook.installed() and nn.Module.__call__ is not kiln.tune.hook._call


def _env(**extra: str) -> dict[str, str]:
    """This process's environment with the kiln it imported first on the path and no KILN_TUNE_* set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(kiln.__file__).parent.parent),
                                                    env.get("PYTHONPATH", "")) if p)
    env["OMP_NUM_THREADS"] = "1"
    for key in ("KILN_TUNE", "KILN_TUNE_CONFIG", "KILN_TUNE_REPORT", "KILN_TUNE_CACHE_DIR", "KILN_TUNE_QUIET"):
        env.pop(key, None)
    env.update(extra)
    return env


JIT_SCRIPT = """
import sys, torch
sys.path.insert(0, {tests!r})
from test_tune import Net
torch.set_num_threads(1)
model = Net().eval()
model.load_state_dict(torch.load({weights!r}))
x = torch.load({x!r})
with torch.no_grad():
    outs = [model(x) for _ in range(3)]
torch.save(outs, sys.argv[1])
"""


def test_jit_tuning_by_environment_then_from_the_cache(tmp_path: Path) -> None:
    model = make_net()
    x = torch.randn(2, 3, 8, 8)
    torch.save(model.state_dict(), tmp_path / "w.pt")
    torch.save(x, tmp_path / "x.pt")
    script = tmp_path / "script.py"
    script.write_text(JIT_SCRIPT.format(tests=str(TESTS), weights=str(tmp_path / "w.pt"), x=str(tmp_path / "x.pt")))
    config = tmp_path / "tune.json"
    config.write_text(json.dumps({"strategy": {"kind": "one", "backend": {"kind": "kiln-aot", "options": {"min_block_size": 1}}},
                                  "runs": 2, "warmup": 1, "reject_slower_than_eager": False}))
    from kiln.tune.run import site_dir

    env = _env(KILN_TUNE_CONFIG=str(config), KILN_TUNE_CACHE_DIR=str(tmp_path / "cache"))
    first = subprocess.run([sys.executable, str(script), str(tmp_path / "out1.pt")], capture_output=True, text=True,
                           env={**env, "KILN_TUNE": "1", "KILN_TUNE_REPORT": str(tmp_path / "r1.json"),
                                "PYTHONPATH": site_dir() + os.pathsep + env["PYTHONPATH"]}, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "kiln.tune: Net (tuned; 1 sample(s): float32[2, 3, 8, 8]; strategy one)" in first.stderr
    second = subprocess.run([sys.executable, "-m", "kiln.tune.run", "--report", str(tmp_path / "r2.json"), "--quiet",
                             str(script), str(tmp_path / "out2.pt")], capture_output=True, text=True, env=env,
                            timeout=300)
    assert second.returncode == 0, second.stderr
    assert "kiln.tune [" not in second.stderr  # --quiet
    reports = [json.loads((tmp_path / f"r{i}.json").read_text())["modules"] for i in (1, 2)]
    assert [(m["name"], m["source"], m["winner"]) for m in reports[0]] == [("Net", "tuned", "kiln-aot")]
    assert [(m["name"], m["source"], m["winner"]) for m in reports[1]] == [("Net", "cache", "kiln-aot")]
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1
    with torch.no_grad():
        expected = model(x)
    for name in ("out1.pt", "out2.pt"):
        for out in torch.load(tmp_path / name):
            torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


# ---- config ------------------------------------------------------------------------------------

def test_config_file_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({
        "backends": ["eager", {"kind": "kiln-jit", "name": "kiln-fp16", "options": {"enabled_precisions": ["float16"]}}],
        "strategy": {"kind": "latency_budget", "ms": 5}, "tolerances": {"float16": 0.02}, "runs": 7}))
    config = kt.load_config(path, env={"KILN_TUNE_QUIET": "1", "KILN_TUNE_REPORT": "r.json"})
    assert [b.name for b in config.backend_list] == ["eager", "kiln-fp16"]
    assert config.backend_list[1].precisions() == {torch.float16}
    assert config.strategy == kt.LatencyBudget(5) and config.runs == 7 and config.tolerances["float16"] == 0.02
    assert (config.progress, config.report, config.report_path, config.cache) == (False, False, "r.json", False)
    assert kt.load_config(path, jit=True, env={}).cache is True
    assert kt.TuneConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    with pytest.raises(ValueError, match="unknown setting 'run' \\(did you mean 'runs'\\?\\)"):
        kt.TuneConfig.from_json({"run": 3})
    with pytest.raises(ValueError, match="tolerance for 'fp8': not a precision"):
        kt.TuneConfig(tolerances={"fp8": 1.0})
    with pytest.raises(ValueError, match="'runs' must be an int >= 1"):
        kt.TuneConfig(runs=0)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        kt.load_config(path, env={})
