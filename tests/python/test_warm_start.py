"""Warm start: the program cache (kiln/program_cache.py) beside the engine cache.

A compilation with ``cache_built_engines`` / ``reuse_cached_engines`` stores its compiled
program (the partitioned graph, engines named by their cache keys); a later process whose
capture (kiln.compile's ExportedProgram, torch.compile's Dynamo graph) has the same key loads it
and its engines and lowers nothing. kiln.compile also keys the module itself before tracing
(the module key): a hit there skips torch.export too, and any change of the module, its code,
its inputs or the settings misses it. The net below has two engines, PyTorch-side ops
(``torch_executed_ops``) that read a model weight and a constant made in ``forward``, so the
program holds every kind of node and constant.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.cache import DiskEngineCache, EngineCache
from kiln.cache_auth import TRAILER_SIZE
from kiln.cached_build import cache_stats, reset_cache_stats
from kiln.pipeline import supported_targets
from kiln.program_cache import module_key
from kiln.settings import settings_from_options
from kiln.testing import randomize_weights

PATHS = ["aot", "dynamo"]


class Net(nn.Module):
    def __init__(self, width: int = 8, flavor: str = "sin") -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width, 4)
        self.scale = nn.Parameter(torch.randn(4))
        self.flavor = flavor

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))      # engine 0
        w = getattr(torch, self.flavor)(z * self.scale)                       # PyTorch: a weight
        v = w * torch.tensor([1.0, -2.0, 3.0, 0.5], device=x.device)          # PyTorch: a constant
        return z, v + 1.0                                                     # engine 1


def net(seed: int, **kwargs: Any) -> nn.Module:
    torch.manual_seed(seed)
    return randomize_weights(Net(**kwargs).eval(), seed=seed)


def example() -> torch.Tensor:
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(7))


OPTIONS: dict[str, Any] = dict(min_block_size=1, torch_executed_ops={"aten.sin", "aten.cos", "aten.mul"},
                               cache_built_engines=True, reuse_cached_engines=True, immutable_weights=False)


def compile_cached(path: str, model: nn.Module, x: torch.Tensor, cache_dir: Path | str, **options: Any) -> Any:
    opts = dict(OPTIONS, engine_cache_dir=str(cache_dir))
    opts.update(options)
    if path == "aot":
        return kiln.compile(model, arg_inputs=[x], **opts)
    torch._dynamo.reset()
    return torch.compile(model, backend="kiln", options=opts, dynamic=False)


def run(path: str, model: nn.Module, cache_dir: Path | str, device: str = "cpu",
        **options: Any) -> tuple[torch.Tensor, ...]:
    x = example().to(device)
    with torch.no_grad():
        return tuple(o.cpu() for o in compile_cached(path, model.to(device), x, cache_dir, **options)(x))


def assert_eager(outputs: tuple[torch.Tensor, ...], model: nn.Module) -> None:
    with torch.no_grad():
        for got, want in zip(outputs, model(example()), strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.fixture(autouse=True)
def fresh_stats() -> None:
    reset_cache_stats()
    torch._dynamo.reset()


def python_env() -> dict[str, str]:
    env = dict(os.environ)
    package_root = str(Path(kiln.__file__).absolute().parent.parent)  # the kiln under test
    env["PYTHONPATH"] = os.pathsep.join([package_root, env.get("PYTHONPATH", "")])
    return env


# ---- a warm second process ---------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[1])
    from test_warm_start import net, run
    from kiln.cached_build import cache_stats
    calls = {"export": 0, "decompose": 0}
    export, decompose = torch.export.export, torch.export.ExportedProgram.run_decompositions
    def counted_export(*a, **k):
        calls["export"] += 1
        return export(*a, **k)
    def counted_decompose(*a, **k):
        calls["decompose"] += 1
        return decompose(*a, **k)
    torch.export.export, torch.export.ExportedProgram.run_decompositions = counted_export, counted_decompose
    outputs = run(sys.argv[2], net(0), sys.argv[3], sys.argv[4])
    print(json.dumps(dict(stats=cache_stats(), calls=calls, outputs=[o.tolist() for o in outputs])))
""")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("path", PATHS)
def test_a_warm_process_builds_nothing_and_lowers_nothing(tmp_path: Path, path: str, device: str) -> None:
    def child() -> dict[str, Any]:
        # Both processes plain ones: under pytest, this file's globals (assertion rewriting) are
        # part of its module key.
        run = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).parent), path, str(tmp_path), device],
                             capture_output=True, text=True, env=python_env(), timeout=600)
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout.strip().splitlines()[-1])

    first = child()
    stats = first["stats"]
    assert stats["builds"] == 2 and stats["lowerings"] == 1 and stats["programs_stored"] == 1
    assert first["calls"]["export"] == 1  # the model (aot) or the Dynamo graph (dynamo)
    # kiln.compile keeps a second, small entry: the module key naming the program.
    assert len(DiskEngineCache(tmp_path).program_entries()) == (2 if path == "aot" else 1)
    assert len(DiskEngineCache(tmp_path).entries()) == 2
    warm = child()
    s = warm["stats"]
    assert s["program_hits"] == 1 and s["program_misses"] == 0 and s["lowerings"] == 0
    assert s["builds"] == 0 and s["hits"] == 2 and s["misses"] == 0 and s["refits_skipped"] == 1 and s["refits"] == 0
    # kiln.compile finds the program by the module key, without torch.export; the Dynamo backend
    # does not export at all.
    assert warm["calls"] == {"export": 0, "decompose": 0}
    cold = tuple(torch.tensor(o) for o in first["outputs"])
    for got, want in zip(warm["outputs"], cold, strict=True):
        assert torch.equal(torch.tensor(got), want)  # the same engines and weights: identical outputs
    if device == "cpu":
        assert_eager(cold, net(0))
    else:  # TF32 may be used on the GPU
        with torch.no_grad():
            for got, want in zip(cold, net(0)(example()), strict=True):
                torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)


# ---- hits in one process: other weights, followed weights ---------------------------------------

@pytest.mark.parametrize("path", PATHS)
def test_a_hit_takes_the_models_weights(tmp_path: Path, path: str) -> None:
    run(path, net(0), tmp_path)
    reset_cache_stats()
    other = net(1)
    assert_eager(run(path, other, tmp_path), other)  # the engines refitted, the PyTorch side's weight taken
    stats = cache_stats()
    # Engine 0 refitted with the new weights (engine 1 has none).
    assert stats["program_hits"] == 1 and stats["lowerings"] == 0 and stats["builds"] == 0 and stats["refits"] == 1


def test_a_hit_follows_the_models_weights_refits_and_saves(tmp_path: Path) -> None:
    run("aot", net(0), tmp_path)
    model = net(0)
    x = example()
    with torch.no_grad():
        compiled = compile_cached("aot", model, x, tmp_path)
        assert cache_stats()["program_hits"] == 1
        model.load_state_dict(net(2).state_dict())  # in place: the compiled model follows
        for got, want in zip(compiled(x), model(x), strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        other = net(3)
        kiln.refit(compiled, other)  # the engines and the PyTorch side's weight
        for got, want in zip(compiled(x), other(x), strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        kiln.save(compiled, tmp_path / "saved.ep", arg_inputs=[x])
        for got, want in zip(kiln.load(tmp_path / "saved.ep").module()(x), compiled(x), strict=True):
            torch.testing.assert_close(got, want, atol=0, rtol=0)


# ---- what misses --------------------------------------------------------------------------------

@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("change", ["code", "weight shape"])
def test_a_changed_model_misses(tmp_path: Path, path: str, change: str) -> None:
    run(path, net(0), tmp_path)
    reset_cache_stats()
    changed = net(0, flavor="cos") if change == "code" else net(0, width=16)
    assert_eager(run(path, changed, tmp_path), changed)
    stats = cache_stats()
    assert stats["program_hits"] == 0 and stats["program_misses"] == 1 and stats["lowerings"] == 1
    assert stats["programs_stored"] == 1
    # The code change is outside the engines (both hit); a new width changes engine 0.
    assert stats["builds"] == (0 if change == "code" else 1)
    assert len(DiskEngineCache(tmp_path).program_entries()) == (4 if path == "aot" else 2)  # with module keys


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("setting", [dict(min_block_size=2), dict(torch_executed_ops={"aten.sin", "aten.cos"}),
                                     dict(optimization_level=1), dict(share_weights=False)])
def test_changed_settings_miss(tmp_path: Path, path: str, setting: dict[str, Any]) -> None:
    run(path, net(0), tmp_path)
    reset_cache_stats()
    assert_eager(run(path, net(0), tmp_path, **setting), net(0))
    stats = cache_stats()
    assert stats["program_hits"] == 0 and stats["program_misses"] == 1 and stats["lowerings"] == 1


def test_where_the_cache_lives_is_not_part_of_the_key(tmp_path: Path) -> None:
    run("aot", net(0), tmp_path, engine_cache_size=1 << 30)
    reset_cache_stats()
    run("aot", net(0), tmp_path, engine_cache_size=2 << 30, debug=False)
    assert cache_stats()["program_hits"] == 1


def test_a_missing_engine_compiles_again(tmp_path: Path) -> None:
    run("aot", net(0), tmp_path)
    cache = DiskEngineCache(tmp_path)
    cache.remove(cache.entries()[0].key)
    reset_cache_stats()
    assert_eager(run("aot", net(0), tmp_path), net(0))
    stats = cache_stats()
    assert stats["program_misses"] == 1 and stats["lowerings"] == 1 and stats["builds"] == 1
    assert stats["programs_stored"] == 1


# ---- warm start without torch.export: the module key ------------------------------------------

class Scaled(nn.Module):
    """Reads a plain attribute, a configuration object and a LayerNorm's eps in forward."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.norm = nn.LayerNorm(8, eps=config.eps)
        self.fc = nn.Linear(8, 8)
        self.offset = 0.5

    def forward(self, x: torch.Tensor, *, shift: torch.Tensor | None = None) -> torch.Tensor:
        y = self.fc(self.norm(x)) * self.config.scale + self.offset
        return y if shift is None else y + shift


class Config:
    def __init__(self, scale: float = 2.0, eps: float = 1e-5) -> None:
        self.scale = scale
        self.eps = eps


def scaled(config: Config | None = None) -> nn.Module:
    torch.manual_seed(0)
    return randomize_weights(Scaled(config or Config()).eval(), seed=0)


def scaled_input(shape: tuple[int, ...] = (2, 8), dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(3)).to(dtype)


@pytest.fixture
def exports(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts torch.export.export calls."""
    calls = [0]
    export = torch.export.export

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return export(*args, **kwargs)
    monkeypatch.setattr(torch.export, "export", counted)
    return calls


def compile_scaled(model: nn.Module, x: torch.Tensor, cache_dir: Path, kwargs: dict[str, Any] | None = None,
                   **options: Any) -> torch.Tensor:
    opts = dict(min_block_size=1, cache_built_engines=True, reuse_cached_engines=True, immutable_weights=False,
                engine_cache_dir=str(cache_dir))
    opts.update(options)
    with torch.no_grad():
        out = kiln.compile(model, arg_inputs=[x], kwarg_inputs=kwargs, **opts)(x, **(kwargs or {}))
        torch.testing.assert_close(out, model(x, **(kwargs or {})), atol=1e-4, rtol=1e-4)
    return out


def mutate(model: nn.Module, change: str) -> nn.Module:
    if change == "an attribute":
        model.offset = 0.25
    elif change == "an eps":
        model.norm.eps = 1e-2
    elif change == "a config field":
        model.config.scale = 3.0
    elif change == "a forward hook":
        model.fc.register_forward_hook(lambda module, args, out: out * 2)
    elif change == "a forward pre-hook":
        model.register_forward_pre_hook(lambda module, args: (args[0] + 1,))
    elif change == "the training flag of a submodule":
        model.fc.train()  # (a Linear computes the same; the key still differs)
    elif change == "a patched forward":
        model.forward = types.MethodType(doubled_forward, model)
    return model


def doubled_forward(self: Scaled, x: torch.Tensor, *, shift: torch.Tensor | None = None) -> torch.Tensor:
    return Scaled.forward(self, x, shift=shift) * 2


CHANGES = ["an attribute", "an eps", "a config field", "a forward hook", "a forward pre-hook",
           "the training flag of a submodule", "a patched forward"]


def test_the_module_key_skips_torch_export(tmp_path: Path, exports: list[int]) -> None:
    x = scaled_input()
    cold = compile_scaled(scaled(), x, tmp_path)
    assert exports[0] == 1
    reset_cache_stats()
    warm = compile_scaled(scaled(), x, tmp_path)
    assert exports[0] == 1  # not again
    assert torch.equal(warm, cold)
    stats = cache_stats()
    assert stats["program_hits"] == 1 and stats["lowerings"] == 0 and stats["builds"] == 0


@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_module_misses_the_module_key(tmp_path: Path, exports: list[int], change: str) -> None:
    x = scaled_input()
    compile_scaled(scaled(), x, tmp_path)
    assert exports[0] == 1
    compile_scaled(mutate(scaled(), change), x, tmp_path)  # matches eager: never the first program
    assert exports[0] == 2
    if not change.startswith("a forward"):  # a module with hooks has no module key: it exports every time
        compile_scaled(mutate(scaled(), change), x, tmp_path)
        assert exports[0] == 2  # the changed module's own entry


@pytest.mark.parametrize("inputs", ["shape", "dtype", "kwargs"])
def test_other_inputs_miss_the_module_key(tmp_path: Path, exports: list[int], inputs: str) -> None:
    compile_scaled(scaled(), scaled_input(), tmp_path)
    if inputs == "shape":
        compile_scaled(scaled(), scaled_input((3, 8)), tmp_path)
    elif inputs == "dtype":
        compile_scaled(scaled().double(), scaled_input(dtype=torch.float64), tmp_path)
    else:
        compile_scaled(scaled(), scaled_input(), tmp_path, kwargs=dict(shift=scaled_input()))
        assert exports[0] == 2
        compile_scaled(scaled(), scaled_input(), tmp_path, kwargs=dict(shift=scaled_input() + 1))
    assert exports[0] == 2


@pytest.mark.parametrize("setting", [dict(min_block_size=2), dict(optimization_level=1), dict(share_weights=False)])
def test_other_settings_miss_the_module_key(tmp_path: Path, exports: list[int], setting: dict[str, Any]) -> None:
    compile_scaled(scaled(), scaled_input(), tmp_path)
    compile_scaled(scaled(), scaled_input(), tmp_path, **setting)
    assert exports[0] == 2


def test_the_module_key_can_be_turned_off(tmp_path: Path, exports: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    compile_scaled(scaled(), scaled_input(), tmp_path)
    reset_cache_stats()
    compile_scaled(scaled(), scaled_input(), tmp_path, module_key=False)
    assert exports[0] == 2 and cache_stats()["program_hits"] == 1  # the program key still hits


class Level(int):
    pass


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b


@pytest.mark.parametrize("same,other", [
    (Level(1), Level(2)), (3, Level(3)), ({"a": [1, 2]}, {"a": [1, 3]}), ({1, 2}, {1, 3}), (Config(2.0), Config(3.0)),
    (Slotted(1, "x"), Slotted(1, "y")), (functools.partial(doubled_forward, shift=None), functools.partial(doubled_forward)),
    (torch.float16, torch.bfloat16), (torch.ones(3), torch.tensor([1.0, 1.0, 2.0])), (1e-5, 1e-6)],
    ids=["int subclass", "int or subclass", "dict", "set", "object", "slots", "partial", "dtype", "tensor", "float"])
def test_the_module_key_covers_attribute_values(same: Any, other: Any) -> None:
    settings = settings_from_options(None, cache_built_engines=True, reuse_cached_engines=True)

    def key(value: Any) -> str:
        model = scaled()
        model.extra = value
        return module_key(model, [scaled_input()], None, supported_targets(), settings, "cpu")
    assert key(same) == key(copy.deepcopy(same))  # the same value in another object: the same key
    assert key(same) != key(other)


def test_a_patched_forward_that_closes_over_a_value_is_keyed_by_it(tmp_path: Path, exports: list[int]) -> None:
    def patched(factor: float) -> nn.Module:
        model = scaled()
        model.forward = lambda x, *, shift=None: Scaled.forward(model, x, shift=shift) * factor
        return model
    compile_scaled(patched(2.0), scaled_input(), tmp_path)
    compile_scaled(patched(3.0), scaled_input(), tmp_path)  # the value it closes over differs
    assert exports[0] == 2
    compile_scaled(patched(3.0), scaled_input(), tmp_path)
    assert exports[0] == 2


def test_a_damaged_module_entry_is_removed_and_exports(tmp_path: Path, exports: list[int],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    x = scaled_input()
    cold = compile_scaled(scaled(), x, tmp_path)
    path = module_entry_file(tmp_path)
    DiskEngineCache(tmp_path).put_program(path.stem, b"KILNMOD1{not json")  # sealed, but garbage
    reset_cache_stats()
    with caplog.at_level(logging.WARNING, logger="kiln.cache"):
        assert torch.equal(compile_scaled(scaled(), x, tmp_path), cold)
    assert exports[0] == 2 and cache_stats()["program_hits"] == 1  # found by the program key
    assert any("module entry" in r.getMessage() and "removing it" in r.getMessage() for r in caplog.records)
    assert module_entry_file(tmp_path).read_bytes().startswith(b"KILNMOD1{\"")  # stored again
    compile_scaled(scaled(), x, tmp_path)
    assert exports[0] == 2


def test_a_module_entry_whose_program_is_gone_compiles_once(tmp_path: Path, exports: list[int]) -> None:
    x = scaled_input()
    compile_scaled(scaled(), x, tmp_path)
    program_file(tmp_path).unlink()
    reset_cache_stats()
    compile_scaled(scaled(), x, tmp_path)
    stats = cache_stats()
    assert exports[0] == 2 and stats["program_misses"] == 1 and stats["lowerings"] == 1
    assert stats["programs_stored"] == 1 and stats["builds"] == 0
    compile_scaled(scaled(), x, tmp_path)
    assert exports[0] == 2


MODEL_SOURCE = """
import torch
from test_warm_start import Scaled


class Edited(Scaled):
    def forward(self, x, *, shift=None):
        return super().forward(x, shift=shift) {op}
"""

EDITED_CHILD = textwrap.dedent("""
    import json, sys, torch
    sys.path[:0] = [sys.argv[1], sys.argv[2]]
    from test_warm_start import Config, compile_scaled, scaled_input
    from kiln.cached_build import cache_stats
    from kiln.testing import randomize_weights
    from edited_model import Edited
    calls = [0]
    export = torch.export.export
    def counted(*a, **k):
        calls[0] += 1
        return export(*a, **k)
    torch.export.export = counted
    torch.manual_seed(0)
    model = randomize_weights(Edited(Config()).eval(), seed=0)
    compile_scaled(model, scaled_input(), sys.argv[3])  # checks the output against eager
    print(json.dumps(dict(exports=calls[0], stats=cache_stats())))
""")


def test_edited_source_in_another_file_misses(tmp_path: Path) -> None:
    """A subclass in another file, edited between two processes (same class, same module name)."""
    source, cache = tmp_path / "src", tmp_path / "cache"
    source.mkdir()

    def child(op: str) -> dict[str, Any]:
        (source / "edited_model.py").write_text(MODEL_SOURCE.format(op=op))
        # No bytecode cache: a file rewritten within the same second with the same size would
        # otherwise run its stale bytecode.
        run = subprocess.run([sys.executable, "-c", EDITED_CHILD, str(Path(__file__).parent), str(source), str(cache)],
                             capture_output=True, text=True, env=dict(python_env(), PYTHONDONTWRITEBYTECODE="1"),
                             timeout=600)
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout.strip().splitlines()[-1])

    assert child("* 2")["exports"] == 1
    warm = child("* 2")
    assert warm["exports"] == 0 and warm["stats"]["program_hits"] == 1
    edited = child("* 3")  # the same length: only the contents differ
    assert edited["exports"] == 1 and edited["stats"]["program_hits"] == 0 and edited["stats"]["lowerings"] == 1


# ---- damaged and forged entries -----------------------------------------------------------------

def program_file(cache_dir: Path) -> Path:
    """The program entry (not the module key's entry, which starts with its own magic)."""
    paths = [cache_dir / f"{e.key}{DiskEngineCache.PROGRAM_SUFFIX}" for e in DiskEngineCache(cache_dir).program_entries()]
    (path,) = [p for p in paths if not p.read_bytes().startswith(b"KILNMOD1")]
    return path


def module_entry_file(cache_dir: Path) -> Path:
    paths = [cache_dir / f"{e.key}{DiskEngineCache.PROGRAM_SUFFIX}" for e in DiskEngineCache(cache_dir).program_entries()]
    (path,) = [p for p in paths if p.read_bytes().startswith(b"KILNMOD1")]
    return path


def rewrite_sealed(cache_dir: Path, edit: Any) -> None:
    """Edits a program entry's JSON and stores it again with a valid tag (as only the key's
    holder can): what a bug, not an attacker, could leave behind."""
    path = program_file(cache_dir)
    body = path.read_bytes()[:-TRAILER_SIZE]
    length = int.from_bytes(body[8:16], "little")
    doc = json.loads(body[16:16 + length])
    edit(doc)
    text = json.dumps(doc).encode()
    DiskEngineCache(cache_dir).put_program(path.stem, body[:8] + len(text).to_bytes(8, "little") + text
                                           + body[16 + length:])


def sin_to(target: str) -> Any:
    def edit(doc: dict[str, Any]) -> None:
        for node in doc["nodes"]:
            if node[2] == "aten.sin.default":
                node[2] = target
    return edit


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "no tag", "malformed JSON",
                                    "a Python function as target", "a dangling node"])
def test_a_damaged_program_is_rebuilt_with_a_warning(tmp_path: Path, damage: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    run("aot", net(0), tmp_path)
    path = program_file(tmp_path)
    data = path.read_bytes()
    if damage == "flipped byte":
        path.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "no tag":
        path.write_bytes(data[:-TRAILER_SIZE])
    elif damage == "malformed JSON":
        DiskEngineCache(tmp_path).put_program(path.stem, data[:20] + b"{" + data[21:-TRAILER_SIZE])
    elif damage == "a Python function as target":
        rewrite_sealed(tmp_path, sin_to("builtins.eval"))
    else:
        rewrite_sealed(tmp_path, lambda doc: doc["nodes"].insert(1, doc["nodes"].pop()))
    reset_cache_stats()
    with caplog.at_level(logging.WARNING, logger="kiln.cache"):
        outputs = run("aot", net(0), tmp_path)
    stats = cache_stats()
    assert_eager(outputs, net(0))
    assert stats["programs_rejected"] == 1 and stats["program_hits"] == 0 and stats["lowerings"] == 1
    assert stats["builds"] == 0 and stats["hits"] == 2 and stats["programs_stored"] == 1  # the engines were fine
    assert any("program cache: entry" in r.getMessage() and "removing it" in r.getMessage() for r in caplog.records)
    reset_cache_stats()
    run("aot", net(0), tmp_path)
    assert cache_stats()["program_hits"] == 1  # stored again, whole


def test_a_store_that_keeps_no_programs_still_caches_engines(tmp_path: Path) -> None:
    class DictStore(EngineCache):
        def __init__(self) -> None:
            self.data: dict[str, bytes] = {}

        def get(self, key: str) -> bytes | None:
            return self.data.get(key)

        def put(self, key: str, data: bytes) -> None:
            self.data[key] = data

    store = DictStore()
    run("aot", net(0), tmp_path, custom_engine_cache=store)
    reset_cache_stats()
    assert_eager(run("aot", net(0), tmp_path, custom_engine_cache=store), net(0))
    stats = cache_stats()
    assert stats["program_misses"] == 1 and stats["lowerings"] == 1 and stats["hits"] == 2 and stats["builds"] == 0
    assert len(store.data) == 2 and not list(tmp_path.iterdir())


def test_program_entries_share_the_budget_and_eviction(tmp_path: Path) -> None:
    cache = DiskEngineCache(tmp_path, 3000)
    cache.put_program("p", b"x" * 1000)
    cache.put("e", b"y" * 1000)
    assert cache.read_program("p") is not None and cache.get("e") is not None
    assert cache.read_program("e") is None and cache.get("p") is None  # kinds apart
    assert cache.total_bytes() == 2000
    cache.put("f", b"z" * 1500)  # over budget: the least recently used (the program) goes
    assert cache.read_program("p") is None and [e.key for e in cache.program_entries()] == []
    assert sorted(e.key for e in cache.entries()) == ["e", "f"]


class Flagged(nn.Module):
    """A forward that reads a class-level setting."""

    gain = 2.0

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.gain


def test_a_changed_class_attribute_misses_the_module_key(tmp_path: Path, exports: list[int]) -> None:
    torch.manual_seed(0)
    model, x = Flagged().eval(), torch.randn(2, 8)
    compile_scaled(model, x, tmp_path)
    try:
        Flagged.gain = 3.0
        compile_scaled(model, x, tmp_path)  # compares with eager at the new gain
    finally:
        Flagged.gain = 2.0
    assert exports[0] == 2
