"""The engine cache: the on-disk store, the key, reuse across processes with refit.

Store tests use small fake engine files (a valid fixed header and random bytes); the others
compile a small conv net with ``cache_built_engines`` / ``reuse_cached_engines`` into a cache
directory of the test's own and read kiln.cached_build.cache_stats() to see what happened.
A hit refits the cached engine with the block's weights (kiln.refit).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

import kiln
from kiln import _C
from kiln.cache import DiskEngineCache, EngineCache, default_cache_dir, looks_like_engine, using_engine_cache
from kiln.cached_build import cache_stats, reset_cache_stats
from kiln.testing import randomize_weights

REPO = Path(__file__).resolve().parents[2]


def fake_engine(nbytes: int, seed: int = 0) -> bytes:
    body = torch.randint(0, 256, (nbytes - 20,), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return b"KILNENG\0" + struct.pack("<IQ", 1, nbytes) + body.numpy().tobytes()


def python_env() -> dict[str, str]:
    env = dict(os.environ)
    package_root = str(Path(kiln.__file__).absolute().parent.parent)  # the kiln under test
    env["PYTHONPATH"] = os.pathsep.join([package_root, env.get("PYTHONPATH", "")])
    return env


# ---- the store ------------------------------------------------------------------------------

def test_put_get_and_miss(tmp_path: Path) -> None:
    cache = DiskEngineCache(tmp_path, 1 << 20)
    data = fake_engine(300)
    assert cache.get("a" * 64) is None
    cache.put("a" * 64, data)
    assert cache.get("a" * 64) == data
    assert [e.key for e in cache.entries()] == ["a" * 64]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]  # written atomically


def test_eviction_is_least_recently_used_and_reads_count(tmp_path: Path) -> None:
    cache = DiskEngineCache(tmp_path, 3 * 1000)  # room for three entries of 1000 bytes
    for i, key in enumerate("abc"):
        cache.put(key, fake_engine(1000, i))
    assert cache.get("a") is not None  # a read: "a" is now the most recently used
    cache.put("d", fake_engine(1000, 3))
    assert sorted(e.key for e in cache.entries()) == ["a", "c", "d"]  # "b" was least recently used
    assert cache.get("c") is not None
    cache.put("e", fake_engine(1000, 4))
    assert sorted(e.key for e in cache.entries()) == ["c", "d", "e"]
    assert cache.total_bytes() <= cache.size_bytes
    assert [e.key for e in cache.entries()] == ["d", "c", "e"]  # least recently used first ("c" was read)


def test_entry_larger_than_the_budget_is_not_stored(tmp_path: Path) -> None:
    cache = DiskEngineCache(tmp_path, 500)
    cache.put("small", fake_engine(400))
    cache.put("big", fake_engine(600))
    assert cache.get("big") is None and cache.get("small") is not None


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "foreign magic"])
def test_damaged_entry_is_a_miss_and_removed(tmp_path: Path, damage: str) -> None:
    cache = DiskEngineCache(tmp_path, 1 << 20)
    data = fake_engine(400)
    bad = {"garbage": os.urandom(400), "truncated": data[:300], "empty": b"",
           "foreign magic": b"NOTKILN\0" + data[8:]}[damage]
    (tmp_path / "k.kiln").write_bytes(bad)
    assert cache.get("k") is None
    assert not (tmp_path / "k.kiln").exists()


def test_bad_keys_are_refused(tmp_path: Path) -> None:
    cache = DiskEngineCache(tmp_path)
    for key in ("../escape", "", "a/b", "x" * 200):
        with pytest.raises(ValueError, match="key"):
            cache.put(key, fake_engine(100))


def test_default_directory_is_the_user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_dir() == str(tmp_path / "kiln" / "engines")
    assert DiskEngineCache().directory == tmp_path / "kiln" / "engines"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "kiln", "engines")


WRITER = textwrap.dedent("""
    import struct, sys
    from kiln.cache import DiskEngineCache
    cache = DiskEngineCache(sys.argv[1], int(sys.argv[2]))
    who = sys.argv[3]
    for i in range(60):
        n = 2000 + 37 * i
        data = b"KILNENG\\0" + struct.pack("<IQ", 1, n) + bytes([i % 251]) * (n - 20)
        cache.put(f"shared{i % 10}", data)            # both processes write these keys
        cache.put(f"{who}{i}", data)
        cache.get(f"shared{(i * 7) % 10}")
""")


def test_two_concurrent_writer_processes(tmp_path: Path) -> None:
    budget = 60_000
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(budget), who],
                              env=python_env(), stderr=subprocess.PIPE, text=True) for who in ("p", "q")]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    cache = DiskEngineCache(tmp_path, budget)
    entries = cache.entries()
    assert entries and sum(e.size for e in entries) <= budget
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]
    for e in entries:  # every surviving entry is whole
        data = cache.get(e.key)
        assert data is not None and looks_like_engine(data) and len(data) == e.size


# ---- the cache in compilations --------------------------------------------------------------

class ConvNet(nn.Module):
    def __init__(self, stride: int = 1, padding: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=stride, padding=padding)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def net(seed: int, **kw: Any) -> nn.Module:
    torch.manual_seed(seed)
    return randomize_weights(ConvNet(**kw).eval(), seed=seed)


def cached_compile(model: nn.Module, x: torch.Tensor, cache_dir: Path, **options: Any) -> Any:
    opts = dict(min_block_size=1, cache_built_engines=True, reuse_cached_engines=True,
                immutable_weights=False, engine_cache_dir=str(cache_dir))
    opts.update(options)
    return kiln.compile(model, arg_inputs=[x], **opts)


@pytest.fixture(autouse=True)
def fresh_stats() -> None:
    reset_cache_stats()


def run_in_process(cache_dir: Path, seed: int, out: Path) -> dict[str, int]:
    script = textwrap.dedent(f"""
        import json, sys, torch
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_cache import cached_compile, net
        from kiln.cached_build import cache_stats
        torch.manual_seed(123)
        x = torch.randn(2, 3, 16, 16)
        with torch.no_grad():
            y = cached_compile(net({seed}), x, {str(cache_dir)!r})(x)
        torch.save((x, y), {str(out)!r})
        print(json.dumps(cache_stats()))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=python_env(),
                         timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_second_process_hits_and_builds_nothing(tmp_path: Path) -> None:
    first = run_in_process(tmp_path / "cache", 0, tmp_path / "a.pt")
    assert first["builds"] == 1 and first["stored"] == 1 and first["misses"] == 1 and first["hits"] == 0
    second = run_in_process(tmp_path / "cache", 0, tmp_path / "b.pt")
    assert second["builds"] == 0 and second["hits"] == 1 and second["stored"] == 0
    # The same weights as the stored engine's (its fingerprint matches): no refit needed.
    assert second["refits"] == 0 and second["refits_skipped"] == 1
    x, ya = torch.load(tmp_path / "a.pt")
    _, yb = torch.load(tmp_path / "b.pt")
    with torch.no_grad():
        torch.testing.assert_close(yb, net(0)(x), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(yb, ya, atol=0, rtol=0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_hits_after_its_parent_did(tmp_path: Path) -> None:
    """A hit computes the weights' fingerprint on a worker thread. A child forked after its
    parent had hits has none of the parent's threads: its own hit must still finish (and give
    the model's outputs), not wait for a worker that does not exist there."""
    script = textwrap.dedent(f"""
        import os, signal, sys, torch
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_cache import cached_compile, net
        from kiln.cached_build import cache_stats, reset_cache_stats
        x = torch.randn(2, 3, 16, 16)
        with torch.no_grad():
            cached_compile(net(0), x, {str(tmp_path)!r})      # builds and stores
            cached_compile(net(0), x, {str(tmp_path)!r})(x)   # a hit in the parent
            pid = os.fork()
            if pid == 0:
                signal.alarm(120)  # a hang ends the child instead of the test run
                reset_cache_stats()
                y = cached_compile(net(0), x, {str(tmp_path)!r})(x)
                ok = cache_stats()["hits"] == 1 and torch.allclose(y, net(0)(x), atol=1e-4, rtol=1e-4)
                os._exit(0 if ok else 3)
            _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=python_env(),
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "0", run.stdout + run.stderr


def test_same_architecture_other_weights_hits_with_the_new_weights(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 16, 16)
    a, b = net(0), net(1)
    with torch.no_grad():
        ya = cached_compile(a, x, tmp_path)(x)
        yb = cached_compile(b, x, tmp_path)(x)
        torch.testing.assert_close(ya, a(x), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(yb, b(x), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(ya, yb, atol=1e-2)
    assert cache_stats()["builds"] == 1 and cache_stats()["hits"] == 1
    assert cache_stats()["refits"] == 1 and cache_stats()["refits_skipped"] == 0  # other weights: refitted
    assert len(DiskEngineCache(tmp_path).entries()) == 1


def test_key_ignores_weight_values_but_not_settings(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 16, 16)
    cached_compile(net(0), x, tmp_path, reuse_cached_engines=False)
    cached_compile(net(1), x, tmp_path, reuse_cached_engines=False)
    assert len(DiskEngineCache(tmp_path).entries()) == 1  # same key: weights are not hashed
    cached_compile(net(0), x, tmp_path, reuse_cached_engines=False, optimization_level=1)
    cached_compile(net(0), torch.randn(1, 3, 16, 16), tmp_path, reuse_cached_engines=False)
    assert len(DiskEngineCache(tmp_path).entries()) == 3
    assert cache_stats()["builds"] == 4


def _word_checksum_reference(tensors: list[torch.Tensor]) -> int:
    """The word checksum as _C.word_checksum documents it, in Python integers."""
    total, index = 0, 0
    for t in tensors:
        raw = t.contiguous().view(torch.uint8).reshape(-1).tolist()
        raw += [0] * (-len(raw) % 8)
        for j in range(0, len(raw), 8):
            w = int.from_bytes(bytes(raw[j:j + 8]), "little")
            m = ((w ^ (index * 0x5851F42D4C957F2D)) * 0x2545F4914F6CDD1D) % 2**64
            total = (total + (m ^ (m >> 29))) % 2**64
            index += 1
    return total


def _word_checksum(tensors: list[torch.Tensor], device: str = "cpu") -> int:
    return _C.word_checksum(device, [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors])


def test_word_checksum_matches_its_description_and_sees_every_change() -> None:
    """The checksum weights_fingerprint computes where the weights live (_C.word_checksum, here
    the CPU backend's): it equals the documented formula; equal bytes give equal sums; one
    flipped bit, two swapped elements, two tensors in the other order, a byte past a multiple of
    8 change it; an unaligned address reads the same bytes."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(100, 37, generator=gen)
    b = torch.randn(37, generator=gen)
    odd = torch.randint(0, 256, (13,), generator=gen, dtype=torch.uint8)
    base = _word_checksum([w, b, odd])
    assert base == _word_checksum_reference([w, b, odd])
    assert _word_checksum([w.clone(), b.clone(), odd.clone()]) == base
    flipped = w.clone()
    flipped.view(torch.int32)[50, 3] ^= 1 << 7
    swapped = w.clone()
    swapped[0, 0], swapped[0, 1] = w[0, 1], w[0, 0]
    odd_changed = odd.clone()
    odd_changed[12] ^= 1
    others = [_word_checksum(ts) for ts in
              ([flipped, b, odd], [swapped, b, odd], [b, w, odd], [w, b, odd_changed])]
    assert len({base, *others}) == 5, others
    assert 0 <= base < 2**64
    shifted = torch.zeros(1 + odd.numel(), dtype=torch.uint8)
    shifted[1:] = odd
    assert _word_checksum([shifted[1:]]) == _word_checksum([odd]) == _word_checksum_reference([odd])
    assert _C.word_checksum("cpu", []) == 0


def test_word_checksum_names_a_bad_device() -> None:
    with pytest.raises(kiln.KilnError, match="unknown device 'gpu'"):
        _C.word_checksum("gpu", [])


def test_key_includes_the_build_policy(tmp_path: Path) -> None:
    """allow_tf32, exact_gelu and attention_tactic change what a build computes or chooses: a
    compilation with another value must not get an engine built under the first one."""
    x = torch.randn(2, 3, 16, 16)
    cached_compile(net(0), x, tmp_path)
    cached_compile(net(0), x, tmp_path, allow_tf32=False)
    cached_compile(net(0), x, tmp_path, allow_tf32=False, exact_gelu=True)
    cached_compile(net(0), x, tmp_path, attention_tactic="generated")
    assert cache_stats()["builds"] == 4 and cache_stats()["hits"] == 0
    assert len(DiskEngineCache(tmp_path).entries()) == 4
    cached_compile(net(0), x, tmp_path, allow_tf32=False)  # the same policy again: a hit
    assert cache_stats()["hits"] == 1


def test_timing_cache_path_is_settable(tmp_path: Path) -> None:
    """The binding the CUDA build path calls (a no-op without the CUDA backend)."""
    kiln._C.set_timing_cache_path(str(tmp_path / "timing.cache"))
    with pytest.raises(TypeError):
        kiln._C.set_timing_cache_path(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("changed", [{"stride": 2}, {"padding": 0}])
def test_changed_op_argument_misses(tmp_path: Path, changed: dict[str, int]) -> None:
    x = torch.randn(2, 3, 16, 16)
    cached_compile(net(0), x, tmp_path)
    other = net(0, **changed)
    with torch.no_grad():
        y = cached_compile(other, x, tmp_path)(x)
        torch.testing.assert_close(y, other(x), atol=1e-4, rtol=1e-4)
    stats = cache_stats()
    assert stats["builds"] == 2 and stats["hits"] == 0 and stats["misses"] == 2
    assert len(DiskEngineCache(tmp_path).entries()) == 2


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "foreign engine"])
def test_damaged_entry_is_removed_and_rebuilt(tmp_path: Path, damage: str) -> None:
    x = torch.randn(2, 3, 16, 16)
    cached_compile(net(0), x, tmp_path, reuse_cached_engines=False)
    (entry,) = DiskEngineCache(tmp_path).entries()
    path = tmp_path / f"{entry.key}.kiln"
    data = bytearray(path.read_bytes())
    if damage == "flipped byte":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:  # a valid engine of another block (other input shape), stored under this key
        other = cached_compile(net(0), x[:1], tmp_path / "other", reuse_cached_engines=False)
        data = bytearray(other.engines()[0].engine_bytes())
    path.write_bytes(bytes(data))
    reset_cache_stats()
    with torch.no_grad():
        y = cached_compile(net(0), x, tmp_path)(x)
        torch.testing.assert_close(y, net(0)(x), atol=1e-4, rtol=1e-4)
    stats = cache_stats()
    assert stats["hits"] == 0 and stats["builds"] == 1 and stats["stored"] == 1
    assert stats["rejected"] == 1  # the mapped entry fails the engine reader's checks and is removed
    assert path.read_bytes() != bytes(data)  # replaced by the fresh engine


class DictCache(EngineCache):
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.calls: list[tuple[str, str]] = []

    def get(self, key: str) -> bytes | None:
        self.calls.append(("get", key))
        return self.data.get(key)

    def put(self, key: str, data: bytes) -> None:
        self.calls.append(("put", key))
        self.data[key] = data


def test_custom_engine_cache_is_used(tmp_path: Path) -> None:
    store = DictCache()
    x = torch.randn(2, 3, 16, 16)
    with using_engine_cache(store):
        cached_compile(net(0), x, tmp_path)
        with torch.no_grad():
            y = cached_compile(net(1), x, tmp_path)(x)
            torch.testing.assert_close(y, net(1)(x), atol=1e-4, rtol=1e-4)
    (key,) = store.data
    assert [c[0] for c in store.calls] == ["get", "put", "get"] and {c[1] for c in store.calls} == {key}
    assert looks_like_engine(store.data[key])
    assert not list(tmp_path.iterdir())  # the disk cache was not touched
    assert cache_stats()["hits"] == 1 and cache_stats()["builds"] == 1


def test_custom_engine_cache_setting(tmp_path: Path) -> None:
    store = DictCache()
    x = torch.randn(2, 3, 16, 16)
    cached_compile(net(0), x, tmp_path, custom_engine_cache=store)
    with torch.no_grad():
        y = cached_compile(net(1), x, tmp_path, custom_engine_cache=store)(x)
        torch.testing.assert_close(y, net(1)(x), atol=1e-4, rtol=1e-4)
    assert [c[0] for c in store.calls] == ["get", "put", "get"]
    assert not list(tmp_path.iterdir())
    assert cache_stats()["hits"] == 1 and cache_stats()["builds"] == 1
    with pytest.raises(ValueError, match="custom_engine_cache"):
        cached_compile(net(0), x, tmp_path, custom_engine_cache=tmp_path)


class FileCache(DictCache):
    """A store that keeps its entries as files and hands them out by path (mapped by the loader)."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory

    def put(self, key: str, data: bytes) -> None:
        super().put(key, data)
        tmp = self.directory / f".{key}.tmp"
        tmp.write_bytes(data)
        tmp.replace(self.directory / key)  # replaced by rename, never rewritten in place

    def path(self, key: str) -> Path | None:
        self.calls.append(("path", key))
        found = self.directory / key
        return found if found.is_file() else None


def test_custom_engine_cache_with_files_is_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "store").mkdir()
    store = FileCache(tmp_path / "store")
    x = torch.randn(2, 3, 16, 16)
    cached_compile(net(0), x, tmp_path / "unused", custom_engine_cache=store)
    with caplog.at_level("INFO", logger="kiln.cache"), torch.no_grad():
        y = cached_compile(net(1), x, tmp_path / "unused", custom_engine_cache=store)(x)
        torch.testing.assert_close(y, net(1)(x), atol=1e-4, rtol=1e-4)  # the new weights, refitted
    (key,) = store.data
    # A store that has the file is asked for it and never for the bytes; the hit reads it once.
    assert [c[0] for c in store.calls] == ["path", "get", "put", "path"]
    assert any("hit" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "store" / key).read_bytes() == store.data[key]  # the refit left the file alone
    assert cache_stats()["hits"] == 1 and cache_stats()["refits"] == 1


def test_a_mapped_engine_runs_like_a_read_one_and_names_a_bad_file(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 16, 16)
    cached_compile(net(0), x, tmp_path)
    (entry,) = [p for p in tmp_path.iterdir() if p.suffix == ".kiln"]
    engine_file = tmp_path / "engine.kiln"  # the entry less its authentication trailer: an engine file
    engine_file.write_bytes(entry.read_bytes()[:-kiln.cache_auth.TRAILER_SIZE])
    entry = engine_file
    read, mapped = kiln._C.Engine.load(entry), kiln._C.Engine.load_mapped(entry)
    assert "mapped" in mapped.build_log and "mapped" not in read.build_log.splitlines()[-1]
    inputs = [torch.randn(2, 3, 16, 16)]
    outs = []
    for engine in (read, mapped):
        ctx = engine.create_execution_context()
        y = torch.empty([int(d) for d in engine.outputs[0].type.shape])
        ctx.execute_ptrs([t.data_ptr() for t in inputs], [y.data_ptr()], 0)
        outs.append(y)
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)
    damaged = tmp_path / "damaged.kiln"
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(kiln.CorruptedError, match="checksum mismatch.*damaged.kiln"):
        kiln._C.Engine.load_mapped(damaged)
    with pytest.raises(kiln.KilnError, match="missing.kiln"):
        kiln._C.Engine.load_mapped(tmp_path / "missing.kiln")


def test_cache_with_immutable_weights_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="immutable_weights"):
        cached_compile(net(0), torch.randn(1, 3, 8, 8), tmp_path, immutable_weights=True)


def test_torch_compile_reuses_cached_engines(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 16, 16)
    options = dict(min_block_size=1, cache_built_engines=True, reuse_cached_engines=True,
                   immutable_weights=False, engine_cache_dir=str(tmp_path))
    outputs = []
    with torch.no_grad():
        for seed in (0, 1):
            torch._dynamo.reset()
            model = net(seed)
            outputs.append(torch.compile(model, backend="kiln", options=options, dynamic=False)(x))
            torch.testing.assert_close(outputs[-1], model(x), atol=1e-4, rtol=1e-4)
    assert cache_stats()["builds"] == 1 and cache_stats()["hits"] == 1
    assert not torch.allclose(outputs[0], outputs[1], atol=1e-2)
