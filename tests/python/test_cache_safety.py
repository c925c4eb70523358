"""The engine cache trusts no file: forged, foreign, rewritten, special and damaged entries.

Every test compiles a small conv net into a cache directory of its own (tmp_path) and compares
the compiled outputs with eager PyTorch on random inputs. A forged entry is a valid engine of the
same block whose weights are another model's but whose weights label (``source_weights_id``) is
the model's own, with a correct engine checksum: trusted, it would skip the refit and compute
wrong outputs. Cases that could hang (FIFOs) run in a child process with a timeout.
"""

from __future__ import annotations

import json
import os
import stat
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
from kiln.cache import DiskEngineCache, EngineCache
from kiln.cache_auth import TAG_MAGIC, TRAILER_SIZE, default_key_path, tag_of
from kiln.cached_build import cache_stats, reset_cache_stats
from kiln.testing import randomize_weights


class SmallNet(nn.Module):
    def __init__(self, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=stride, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def net(seed: int, stride: int = 1) -> nn.Module:
    torch.manual_seed(seed)  # randomize_weights keeps the scale of the initial weights
    return randomize_weights(SmallNet(stride).eval(), seed=seed)


def compile_cached(model: nn.Module, x: torch.Tensor, cache_dir: Path, **options: Any) -> Any:
    opts: dict[str, Any] = dict(min_block_size=1, cache_built_engines=True, reuse_cached_engines=True,
                                immutable_weights=False, engine_cache_dir=str(cache_dir))
    opts.update(options)
    return kiln.compile(model, arg_inputs=[x], **opts)


def assert_matches_eager(compiled: Any, model: nn.Module) -> None:
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-4, rtol=1e-4)


def only_entry(cache_dir: Path) -> Path:
    (entry,) = [p for p in cache_dir.iterdir() if p.name.endswith(".kiln")]
    return entry


def entry_engine(path: Path) -> bytes:
    data = path.read_bytes()
    assert data[-TRAILER_SIZE:-TRAILER_SIZE + len(TAG_MAGIC)] == TAG_MAGIC
    return data[:-TRAILER_SIZE]


def forged_engine(cache_dir: Path, x: torch.Tensor, label_of: bytes) -> bytes:
    """A valid engine of the same block with zeroed weights, labelled with the weights label of
    the engine in ``label_of`` and re-serialized (so its engine checksum is correct)."""
    zeroed = net(0)
    with torch.no_grad():
        for p in zeroed.parameters():
            p.zero_()
    other = compile_cached(zeroed, x, cache_dir / "forge", reuse_cached_engines=False)
    engine = _C.Engine.deserialize(other.engines()[0].engine_bytes())
    engine.source_weights_id = _C.Engine.deserialize(label_of).source_weights_id
    return bytes(engine.serialize())


@pytest.fixture(autouse=True)
def fresh_stats() -> None:
    reset_cache_stats()


# ---- authentication ---------------------------------------------------------------------------

@pytest.mark.parametrize("trailer", ["none", "the original tag", "a tag made with another key"])
def test_forged_entry_with_a_valid_checksum_is_a_miss(tmp_path: Path, trailer: str) -> None:
    x = torch.randn(2, 3, 16, 16)
    compile_cached(net(0), x, tmp_path)
    path = only_entry(tmp_path)
    original = path.read_bytes()
    forged = forged_engine(tmp_path, x, entry_engine(path))
    # The forgery is a real threat: a checksum-valid engine that carries the model's label but
    # computes something else.
    assert _C.Engine.deserialize(forged).source_weights_id == _C.Engine.deserialize(entry_engine(path)).source_weights_id
    suffix = {"none": b"", "the original tag": original[-TRAILER_SIZE:],
              "a tag made with another key": TAG_MAGIC + tag_of(os.urandom(32), path.stem, forged)}[trailer]
    path.write_bytes(forged + suffix)
    reset_cache_stats()
    model = net(0)
    assert_matches_eager(compile_cached(model, x, tmp_path), model)
    stats = cache_stats()
    assert stats["hits"] == 0 and stats["rejected"] == 1 and stats["builds"] == 1 and stats["stored"] == 1
    assert DiskEngineCache(tmp_path).get(path.stem) is not None  # replaced by an entry that verifies


def test_a_hit_verifies_and_skips_the_refit_only_for_the_same_weights(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 16, 16)
    compile_cached(net(0), x, tmp_path)
    for seed, skipped in ((0, 1), (1, 0)):
        reset_cache_stats()
        model = net(seed)
        assert_matches_eager(compile_cached(model, x, tmp_path), model)
        stats = cache_stats()
        assert stats["hits"] == 1 and stats["builds"] == 0 and stats["refits_skipped"] == skipped


def test_missing_or_other_key_is_a_miss(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 16, 16)
    compile_cached(net(0), x, tmp_path)
    key_file = default_key_path(tmp_path)
    first_key = key_file.read_bytes()
    key_file.unlink()
    model = net(0)
    reset_cache_stats()
    assert_matches_eager(compile_cached(model, x, tmp_path), model)
    assert cache_stats()["hits"] == 0 and cache_stats()["rejected"] == 1 and cache_stats()["builds"] == 1
    assert key_file.read_bytes() != first_key and len(first_key) == 32  # a fresh key, made on first use
    other_key = tmp_path / "other.key"
    other_key.write_bytes(os.urandom(32))
    other_key.chmod(0o600)
    reset_cache_stats()
    other = DiskEngineCache(tmp_path, key_path=other_key)
    assert_matches_eager(compile_cached(model, x, tmp_path, custom_engine_cache=other), model)
    assert cache_stats()["hits"] == 0 and cache_stats()["rejected"] == 1


def test_key_is_per_directory_private_and_made_once(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 16, 16)
    compile_cached(net(0), x, tmp_path / "a")
    compile_cached(net(0), x, tmp_path / "b")
    keys = [default_key_path(tmp_path / d) for d in ("a", "b")]
    for key in keys:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_uid == os.getuid()
        assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
        assert key.stat().st_size == 32
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700  # a cache directory Kiln made
    assert keys[0].read_bytes() != keys[1].read_bytes()
    # The same block's entry from another directory does not verify here (another key).
    entry = only_entry(tmp_path / "a")
    (tmp_path / "b" / entry.name).write_bytes(entry.read_bytes())
    reset_cache_stats()
    model = net(0)
    assert_matches_eager(compile_cached(model, x, tmp_path / "b"), model)
    assert cache_stats()["rejected"] == 1 and cache_stats()["builds"] == 1
    before = keys[1].read_bytes()
    compile_cached(net(0), x, tmp_path / "b")
    assert keys[1].read_bytes() == before  # kept, not remade


@pytest.mark.parametrize("damage", ["file mode 644", "file mode 660", "folder mode 755", "another owner"])
def test_key_with_bad_permissions_makes_every_lookup_a_miss(tmp_path: Path, damage: str,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    if damage == "another owner" and os.getuid() != 0:
        pytest.skip("changing a file's owner needs root")
    x = torch.randn(2, 3, 16, 16)
    compile_cached(net(0), x, tmp_path)
    entry = only_entry(tmp_path)
    stored = entry.read_bytes()
    key = default_key_path(tmp_path)
    if damage.startswith("file mode"):
        key.chmod(int(damage.split()[-1], 8))
    elif damage.startswith("folder mode"):
        key.parent.chmod(0o755)
    else:
        os.chown(key, 12345, -1)
    reset_cache_stats()
    model = net(0)
    cache = DiskEngineCache(tmp_path)  # a store of its own: no key remembered from earlier lookups
    with caplog.at_level("WARNING", logger="kiln.cache"):
        assert_matches_eager(compile_cached(model, x, tmp_path, custom_engine_cache=cache), model)
        compile_cached(model, x, tmp_path, custom_engine_cache=cache)
    stats = cache_stats()
    assert stats["hits"] == 0 and stats["builds"] == 2 and stats["stored"] == 0 and stats["rejected"] == 0
    assert entry.read_bytes() == stored  # neither removed nor replaced: only unusable to this process
    warnings = [r.getMessage() for r in caplog.records if "unauthenticated" in r.getMessage()]
    assert len(warnings) == 1 and str(key.parent) in warnings[0], warnings  # said once, naming the key


def test_an_explicit_key_shares_a_cache_and_must_not_be_readable_by_others(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    shared = tmp_path / "team.key"
    shared.write_bytes(os.urandom(32))
    shared.chmod(0o640)  # group-readable: the group shares the cache on purpose
    x = torch.randn(2, 3, 16, 16)
    compile_cached(net(0), x, tmp_path / "c", custom_engine_cache=DiskEngineCache(tmp_path / "c", key_path=shared))
    reset_cache_stats()
    model = net(1)
    reader = DiskEngineCache(tmp_path / "c", key_path=shared)  # e.g. another user's process
    assert_matches_eager(compile_cached(model, x, tmp_path / "c", custom_engine_cache=reader), model)
    assert cache_stats()["hits"] == 1 and cache_stats()["refits"] == 1
    assert not default_key_path(tmp_path / "c").exists()
    shared.chmod(0o644)
    with caplog.at_level("WARNING", logger="kiln.cache"):
        assert DiskEngineCache(tmp_path / "c", key_path=shared).get(only_entry(tmp_path / "c").stem) is None
    assert any(str(shared) in r.getMessage() and "644" in r.getMessage() for r in caplog.records)


# ---- entries that change under a reader ---------------------------------------------------------

def test_entry_rewritten_after_a_hit_leaves_the_loaded_engine_alone(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 16, 16)
    compile_cached(net(0, stride=2), x, tmp_path / "other")
    other_entry = only_entry(tmp_path / "other").read_bytes()
    compile_cached(net(0), x, tmp_path)
    model = net(0)
    hit = compile_cached(model, x, tmp_path)
    assert cache_stats()["hits"] == 1
    path = only_entry(tmp_path)
    inode = path.stat().st_ino
    os.truncate(path, 0)
    assert_matches_eager(hit, model)
    with open(path, "r+b") as f:  # what `cp other.kiln entry` does: the same inode, new bytes
        f.write(other_entry)
    assert path.stat().st_ino == inode
    assert_matches_eager(hit, model)
    path.unlink()
    assert_matches_eager(hit, model)


def test_a_custom_stores_file_is_read_once(tmp_path: Path) -> None:
    """A store that hands out files: the file is read into memory, so rewriting it in place
    afterwards changes nothing, and the entry (unauthenticated) is always refitted."""

    class FileStore(EngineCache):
        def get(self, key: str) -> bytes | None:
            return None

        def put(self, key: str, data: bytes) -> None:
            (tmp_path / key).write_bytes(data)

        def path(self, key: str) -> Path | None:
            return tmp_path / key if (tmp_path / key).exists() else None

    store = FileStore()
    x = torch.randn(2, 3, 16, 16)
    compile_cached(net(0), x, tmp_path / "unused", custom_engine_cache=store)
    model = net(0)
    hit = compile_cached(model, x, tmp_path / "unused", custom_engine_cache=store)
    assert cache_stats()["hits"] == 1 and cache_stats()["refits"] == 1 and cache_stats()["refits_skipped"] == 0
    (entry,) = [p for p in tmp_path.iterdir() if p.is_file()]
    os.truncate(entry, 100)
    assert_matches_eager(hit, model)


# ---- entries that are not engines ---------------------------------------------------------------

FIFO_CHILD = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[2])
    from test_cache_safety import compile_cached, net
    from kiln.cached_build import cache_stats
    x = torch.randn(2, 3, 16, 16)
    model = net(0)
    with torch.no_grad():
        error = (compile_cached(model, x, sys.argv[1])(x) - model(x)).abs().max().item()
    print(json.dumps(dict(cache_stats(), error=error)))
""")


def test_fifo_entry_and_lock_do_not_block_a_compile(tmp_path: Path) -> None:
    x = torch.randn(2, 3, 16, 16)
    compile_cached(net(0), x, tmp_path, reuse_cached_engines=False)
    entry = only_entry(tmp_path)
    entry.unlink()
    os.mkfifo(entry)
    os.unlink(tmp_path / ".lock")
    os.mkfifo(tmp_path / ".lock")
    package_root = str(Path(kiln.__file__).absolute().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", FIFO_CHILD, str(tmp_path), str(Path(__file__).parent)],
                         capture_output=True, text=True, env=env, timeout=240)
    assert run.returncode == 0, run.stderr
    stats = json.loads(run.stdout.strip().splitlines()[-1])
    assert stats["rejected"] == 1 and stats["builds"] == 1 and stats["stored"] == 1, stats
    assert stats["error"] < 1e-4
    assert entry.is_file() and DiskEngineCache(tmp_path).get(entry.stem) is not None  # the FIFO was replaced


def non_utf8_engine(engine_bytes: bytes) -> bytes:
    """The engine with its input's name made invalid UTF-8, the engine checksum recomputed."""
    engine = _C.Engine.deserialize(engine_bytes)
    name = engine.inputs[0].name.encode()
    field = len(name).to_bytes(4, "little") + name
    assert field in engine_bytes
    body = bytearray(engine_bytes[:-8].replace(field, len(name).to_bytes(4, "little") + b"\xff" * len(name)))
    checksum = _C.checksum64(torch.frombuffer(body, dtype=torch.uint8).data_ptr(), len(body))
    return bytes(body) + checksum.to_bytes(8, "little")


@pytest.mark.parametrize("content", ["garbage", "non-UTF-8 names", "empty", "a directory"])
def test_authenticated_entry_that_is_no_engine_is_a_miss(tmp_path: Path, content: str) -> None:
    """Even an entry that verifies (written through the store, so its tag is right) must be a
    miss, never a failed compile, when the engine reader rejects it or its strings."""
    x = torch.randn(2, 3, 16, 16)
    compile_cached(net(0), x, tmp_path, reuse_cached_engines=False)
    path = only_entry(tmp_path)
    cache = DiskEngineCache(tmp_path)
    if content == "a directory":
        path.unlink()
        path.mkdir()
    else:
        data = {"garbage": os.urandom(5000), "empty": b"",
                "non-UTF-8 names": non_utf8_engine(entry_engine(path))}[content]
        cache.put(path.stem, data)
        assert cache.get(path.stem) == data
    model = net(0)
    reset_cache_stats()
    assert_matches_eager(compile_cached(model, x, tmp_path), model)
    stats = cache_stats()
    assert stats["rejected"] == 1 and stats["builds"] == 1 and stats["hits"] == 0
    assert_matches_eager(compile_cached(model, x, tmp_path), model)  # later compiles are not failed either
    if content != "a directory":  # a directory can be neither removed nor replaced by a file
        assert cache_stats()["hits"] == 1 and cache_stats()["builds"] == 1
