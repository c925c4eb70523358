"""Engine stores: where built engines are kept between processes.

:class:`EngineCache` is the interface the compiler talks to: bytes in and out under a key
(a hex SHA-256, see kiln/cached_build.py). Subclass it to keep engines elsewhere, e.g. on
shared storage, and hand an instance to Kiln with :func:`set_engine_cache` (or the
``custom_engine_cache`` setting where it exists). :class:`DiskEngineCache` is the default: one
file per entry in a directory, with a byte budget, each entry authenticated (kiln/cache_auth.py).

A store may also keep compiled programs (kiln/program_cache.py: the partitioned graph of a
compilation, naming its engines by their keys) with ``read_program`` / ``put_program``; the base
class keeps none. :class:`DiskEngineCache` keeps them as ``<key>.prog`` files beside the engines,
tagged like them (under the name ``program:<key>``, so neither kind of entry verifies as the other).

Entry lifecycle in a DiskEngineCache::

    absent --put--> engine + tag written to a temp file --os.replace--> present (use time = now)
    present --read_entry/get--> read into memory; tag checked --ok--> returned (use time = now)
                                 --no tag, bad tag, not a regular file--> UnusableEntry (get: removed, a miss)
    present --put of another entry, budget exceeded--> evicted, least recently used first

The use time is the entry file's mtime, set explicitly with nanoseconds by both put and get,
so a read counts as a use. Writes are atomic (a reader sees a whole old file, a whole new
file or none), and eviction runs under an exclusive ``fcntl.flock`` on ``<dir>/.lock`` so two
processes never evict at once. A hit's bytes are read once into memory of the process's own:
nothing another process does to the file afterwards reaches an engine loaded from them. A
cache never raises into a compilation: I/O problems are logged and read as misses.
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import logging
import os
import re
import stat
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from kiln.cache_auth import (
    TAG_MAGIC,
    TRAILER_SIZE,
    KeyProblem,
    TagHasher,
    UnusableEntry,
    load_key,
    read_regular_file,
    read_sealed,
)

log = logging.getLogger("kiln.cache")

__all__ = ["EngineCache", "DiskEngineCache", "CacheEntry", "EntryBytes", "UnusableEntry", "default_cache_dir",
           "set_engine_cache", "get_engine_cache", "using_engine_cache", "engine_cache_for", "looks_like_engine"]

_ENGINE_MAGIC = b"KILNENG\0"
_HEADER = struct.Struct("<8sIQ")  # magic, format version, file size (src/serialize/engine_file.h)
_KEY = re.compile(r"^[0-9A-Za-z_\-]{1,128}$")
_STALE_TEMP_NS = 3600 * 10**9
_LOCK_WAIT_S = 10.0


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/kiln/engines``, else ``~/.cache/kiln/engines``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kiln", "engines")


def looks_like_engine(data: bytes | bytearray | memoryview) -> bool:
    """A cheap check of an engine file's fixed header: magic and recorded size."""
    if len(data) < _HEADER.size + 8:
        return False
    magic, _, size = _HEADER.unpack_from(data, 0)
    return magic == _ENGINE_MAGIC and size == len(data)


class EntryBytes(NamedTuple):
    """A hit's engine bytes, owned by the reader. ``authenticated``: the store proved that it
    wrote them (then the engine's own label of its weights is trusted); ``source`` names where
    they came from, for messages."""
    data: bytes | bytearray | memoryview
    authenticated: bool
    source: str


class EngineCache(abc.ABC):
    """A store of serialized engines by key. ``get`` returns None for a miss."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes | bytearray | memoryview | None:
        """The entry's bytes, or None. They must stay unchanged while Kiln reads them: return
        bytes of the store's own (not a mapping of a file others may change)."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    def remove(self, key: str) -> None:  # noqa: B027 (optional: the default keeps the entry)
        """Drops an entry (a damaged one is removed through this); stores may ignore it."""

    def path(self, key: str) -> Path | None:
        """A local file that holds exactly the engine's bytes, for a store that has one (else None,
        the default: the entry is read with ``get``). Kiln reads it once into memory (a regular
        file only, opened without blocking). Finding a file counts as a use of the entry."""
        return None

    def read_entry(self, key: str) -> EntryBytes | None:
        """A hit's bytes in memory of the caller's, or None for a miss; raises UnusableEntry for
        an entry that is present but must not be used. The default reads ``path``'s file, else
        ``get``'s bytes, unauthenticated."""
        path = self.path(key)
        if path is not None:
            try:
                entry = read_regular_file(Path(path), None, follow_symlinks=True)  # an mmap is a buffer too
                return EntryBytes(entry, False, str(path))  # type: ignore[arg-type]
            except FileNotFoundError:
                return None
        data = self.get(key)
        return None if data is None else EntryBytes(data, False, f"{self!r} entry {key}")

    def read_program(self, key: str) -> EntryBytes | None:
        """A cached program's bytes (kiln/program_cache.py), or None; raises UnusableEntry for an
        entry that is present but must not be used. The default store keeps no programs."""
        return None

    def put_program(self, key: str, data: bytes) -> None:  # noqa: B027 (optional: the default keeps none)
        """Stores a compiled program under ``key``; stores that keep none ignore it."""

    def remove_program(self, key: str) -> None:  # noqa: B027 (optional)
        """Drops a program entry (a damaged one is removed through this)."""


class CacheEntry(NamedTuple):
    key: str
    size: int
    used_ns: int  # last put or get


class DiskEngineCache(EngineCache):
    """Engines as ``<directory>/<key>.kiln`` files under a byte budget (LRU eviction), each one
    the engine followed by its tag (kiln/cache_auth.py). The tag's key is ``key_path`` when given
    (a key shared on purpose), else this user's own key of the directory, made on first use. An
    entry whose tag does not verify is unusable; with no usable key, every lookup is a miss and
    nothing is stored."""

    SUFFIX = ".kiln"
    PROGRAM_SUFFIX = ".prog"

    def __init__(self, directory: str | os.PathLike[str] | None = None, size_bytes: int = 5 << 30,
                 key_path: str | os.PathLike[str] | None = None) -> None:
        if size_bytes < 0:
            raise ValueError(f"DiskEngineCache size_bytes must be >= 0, got {size_bytes}")
        self.directory = Path(directory if directory is not None else default_cache_dir())
        self.size_bytes = int(size_bytes)
        self.key_path = Path(key_path) if key_path is not None else None
        self._last_ns = 0
        self._clock = threading.Lock()
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        key = f", key_path={str(self.key_path)!r}" if self.key_path is not None else ""
        return f"DiskEngineCache({str(self.directory)!r}, size_bytes={self.size_bytes}{key})"

    # -- the interface --
    def read_entry(self, key: str) -> EntryBytes | None:
        """The entry's engine bytes, read once into memory and returned only when its tag
        verifies; None when absent or when this cache has no usable key."""
        return self._read_sealed(self._path(key), key)

    def read_program(self, key: str) -> EntryBytes | None:
        """A program entry's bytes, verified like an engine's (its tag names ``program:<key>``)."""
        return self._read_sealed(self._path(key, self.PROGRAM_SUFFIX), f"program:{key}")

    def _read_sealed(self, path: Path, name: str) -> EntryBytes | None:
        if not os.path.lexists(path):
            return None
        secret = self._secret()
        if secret is None:
            return None
        try:
            data = read_sealed(path, name, secret, self.size_bytes + TRAILER_SIZE)
        except FileNotFoundError:
            return None  # removed by another process in between
        self._touch(path)
        return EntryBytes(data, True, str(path))

    def get(self, key: str) -> bytes | bytearray | memoryview | None:
        """The entry's engine bytes (authenticated, see read_entry), or None; an unusable entry is
        removed."""
        try:
            entry = self.read_entry(key)
        except UnusableEntry as err:
            log.warning("engine cache: %s; removing it", err)
            self.remove(key)
            return None
        return None if entry is None else entry.data

    def put(self, key: str, data: bytes) -> None:
        self._put_sealed(self._path(key), key, data)

    def put_program(self, key: str, data: bytes) -> None:
        self._put_sealed(self._path(key, self.PROGRAM_SUFFIX), f"program:{key}", data)

    def _put_sealed(self, path: Path, name: str, data: bytes) -> None:
        """Writes ``data`` and its tag (over ``name``) to a temporary file renamed to ``path``."""
        if len(data) > self.size_bytes:
            log.info("engine cache: %s (%d bytes) exceeds the budget of %d bytes; not stored",
                     name, len(data), self.size_bytes)
            return
        secret = self._secret()
        if secret is None:
            raise KeyProblem(f"no usable key for the engine cache in {self.directory}; {name} not stored")
        view = memoryview(data).cast("B")
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.directory / f".tmp-{os.getpid()}-{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            with os.fdopen(fd, "wb") as f, TagHasher(len(view)) as hasher:
                hasher.feed_all(view)  # hashed on worker threads while the file is written
                f.write(view)
                f.write(TAG_MAGIC + hasher.tag(secret, name))
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        self._touch(path)
        self.evict()

    def remove(self, key: str) -> None:
        self._unlink(self._path(key))

    def remove_program(self, key: str) -> None:
        self._unlink(self._path(key, self.PROGRAM_SUFFIX))

    def _unlink(self, path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as err:  # a directory, another user's entry in a sticky directory, ...
            log.warning("engine cache: cannot remove %s: %s", path, err)

    # -- inspection and maintenance --
    def entries(self) -> list[CacheEntry]:
        """Every engine entry, least recently used first."""
        return [e for e, suffix in self._scan() if suffix == self.SUFFIX]

    def program_entries(self) -> list[CacheEntry]:
        """Every program entry, least recently used first."""
        return [e for e, suffix in self._scan() if suffix == self.PROGRAM_SUFFIX]

    def _scan(self) -> list[tuple[CacheEntry, str]]:
        """Engine and program entries with their suffixes, least recently used first."""
        found: list[tuple[CacheEntry, str]] = []
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        for name in names:
            suffix = next((s for s in (self.SUFFIX, self.PROGRAM_SUFFIX) if name.endswith(s)), None)
            if suffix is None or name.startswith("."):
                continue
            try:
                st = os.stat(self.directory / name)
            except FileNotFoundError:
                continue  # removed by another process meanwhile
            size = max(0, st.st_size - TRAILER_SIZE)  # the entry's bytes, without its tag
            found.append((CacheEntry(name[: -len(suffix)], size, st.st_mtime_ns), suffix))
        return sorted(found, key=lambda f: (f[0].used_ns, f[0].key, f[1]))

    def total_bytes(self) -> int:
        """The bytes the budget counts: every engine and program entry, without their tags."""
        return sum(e.size for e, _ in self._scan())

    def evict(self) -> list[str]:
        """Removes least recently used entries (engines and programs) until the budget holds;
        returns their keys."""
        evicted: list[str] = []
        with self._locked() as held:
            if not held:
                return evicted
            entries = self._scan()
            total = sum(e.size for e, _ in entries)
            for entry, suffix in entries:
                if total <= self.size_bytes:
                    break
                self._unlink(self._path(entry.key, suffix))
                total -= entry.size
                evicted.append(entry.key)
                log.info("engine cache: evicted %s%s (%d bytes, least recently used)", entry.key, suffix, entry.size)
            self._remove_stale_temps()
        return evicted

    def clear(self) -> None:
        with self._locked():
            for entry, suffix in self._scan():
                self._unlink(self._path(entry.key, suffix))

    # -- helpers --
    def _path(self, key: str, suffix: str = SUFFIX) -> Path:
        if not isinstance(key, str) or not _KEY.match(key):
            raise ValueError(f"engine cache key {key!r} must be 1-128 letters, digits, '_' or '-'")
        return self.directory / f"{key}{suffix}"

    def _now_ns(self) -> int:
        # Strictly increasing within a process: two uses in one clock tick still order.
        with self._clock:
            self._last_ns = max(time.time_ns(), self._last_ns + 1)
            return self._last_ns

    def _touch(self, path: Path) -> None:
        now = self._now_ns()
        try:
            os.utime(path, ns=(now, now))
        except FileNotFoundError:
            pass  # evicted by another process in between: nothing to record
        except OSError as err:
            log.warning("engine cache: cannot record the use of %s: %s", path, err)

    def _secret(self) -> bytes | None:
        """The key of the entries' tags, or None (warned once) when there is no usable one."""
        try:
            return load_key(self.directory, self.key_path)
        except KeyProblem as err:
            self._warn_once(f"engine cache: {err}; the cache in {self.directory} is treated as unauthenticated: "
                            f"every lookup is a miss and nothing is stored")
            return None

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("%s", message)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[bool]:
        """Holds the exclusive lock on ``<dir>/.lock``; yields False, holding nothing, when that is
        not a regular file or stays locked for _LOCK_WAIT_S (eviction then waits for a later put)."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock_path = self.directory / ".lock"
        flags = os.O_RDONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(lock_path, flags, 0o644)
        except OSError as err:
            self._warn_once(f"engine cache: cannot open the lock {lock_path}: {err}")
            yield False
            return
        try:
            held = stat.S_ISREG(os.fstat(fd).st_mode)
            if not held:
                self._warn_once(f"engine cache: the lock {lock_path} is not a regular file")
            deadline = time.monotonic() + _LOCK_WAIT_S
            while held:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        log.warning("engine cache: %s stayed locked for %.0f s; not evicting now", lock_path,
                                    _LOCK_WAIT_S)
                        held = False
                    time.sleep(0.01)
            try:
                yield held
            finally:
                if held:
                    fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _remove_stale_temps(self) -> None:
        now = time.time_ns()
        for name in os.listdir(self.directory):
            if name.startswith(".tmp-"):
                with contextlib.suppress(OSError):
                    if now - os.stat(self.directory / name).st_mtime_ns > _STALE_TEMP_NS:
                        os.unlink(self.directory / name)  # left by a process that died mid-write


# ---- which store a compilation uses ---------------------------------------------------------

_override: EngineCache | None = None
_disk_caches: dict[tuple[str, int, str | None], DiskEngineCache] = {}
_registry_lock = threading.Lock()


def set_engine_cache(cache: EngineCache | None) -> None:
    """Makes ``cache`` the store of every later compilation in this process (None: the default)."""
    global _override
    if cache is not None and not isinstance(cache, EngineCache):
        raise TypeError(f"set_engine_cache needs a kiln.EngineCache, got {type(cache).__name__}")
    _override = cache


def get_engine_cache() -> EngineCache | None:
    return _override


@contextlib.contextmanager
def using_engine_cache(cache: EngineCache) -> Iterator[EngineCache]:
    """``with kiln.cache.using_engine_cache(MyStore()): kiln.compile(...)``"""
    previous = _override
    set_engine_cache(cache)
    try:
        yield cache
    finally:
        set_engine_cache(previous)


def engine_cache_for(settings: Any) -> EngineCache:
    """The store for these settings: ``custom_engine_cache``, else the process-wide one set with
    :func:`set_engine_cache`, else a DiskEngineCache on ``engine_cache_dir`` / ``engine_cache_size``
    with the key file ``engine_cache_key_file`` (None: the user's own key)."""
    custom = getattr(settings, "custom_engine_cache", None)
    if custom is not None:
        return custom
    if _override is not None:
        return _override
    key_path = settings.engine_cache_key_file
    key = (os.path.abspath(settings.engine_cache_dir), int(settings.engine_cache_size),
           os.path.abspath(key_path) if key_path else None)
    with _registry_lock:
        cache = _disk_caches.get(key)
        if cache is None:
            cache = _disk_caches[key] = DiskEngineCache(*key)
        return cache
