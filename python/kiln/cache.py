"""Engine stores: where built engines are kept between processes.

:class:`EngineCache` is the interface the compiler talks to: bytes in and out under a key
(a hex SHA-256, see kiln/cached_build.py). Subclass it to keep engines elsewhere, e.g. on
shared storage, and hand an instance to Kiln with :func:`set_engine_cache` (or the
``custom_engine_cache`` setting where it exists). :class:`DiskEngineCache` is the default: one
file per entry in a directory, with a byte budget.

Entry lifecycle in a DiskEngineCache::

    absent --put--> written to a temp file --os.replace--> present (use time = now)
    present --get--> mapped; header checked --ok--> returned (use time = now)
                                          --damaged/foreign--> removed, a miss
    present --put of another entry, budget exceeded--> evicted, least recently used first

The use time is the entry file's mtime, set explicitly with nanoseconds by both put and get,
so a read counts as a use. Writes are atomic (a reader sees a whole old file, a whole new
file or none), and eviction runs under an exclusive ``fcntl.flock`` on ``<dir>/.lock`` so two
processes never evict at once. A cache never raises into a compilation: I/O problems are
logged and read as misses.
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import logging
import mmap
import os
import re
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

log = logging.getLogger("kiln.cache")

__all__ = ["EngineCache", "DiskEngineCache", "CacheEntry", "default_cache_dir", "set_engine_cache",
           "get_engine_cache", "using_engine_cache", "engine_cache_for", "looks_like_engine"]

_ENGINE_MAGIC = b"KILNENG\0"
_HEADER = struct.Struct("<8sIQ")  # magic, format version, file size (src/serialize/engine_file.h)
_KEY = re.compile(r"^[0-9A-Za-z_\-]{1,128}$")
_STALE_TEMP_NS = 3600 * 10**9


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


class EngineCache(abc.ABC):
    """A store of serialized engines by key. ``get`` returns None for a miss."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes | bytearray | memoryview | None: ...

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    def remove(self, key: str) -> None:
        """Drops an entry (a damaged one is removed through this); stores may ignore it."""

    def path(self, key: str) -> Path | None:
        """A local file that holds the entry, for a store that has one (else None, the default:
        the entry is read with ``get``). The engine is then mapped from the file, so its weights
        are not copied; the store must replace such a file only by rename, never rewrite it in
        place, while engines may use it. Finding a file counts as a use of the entry."""
        return None


def _map(path: Path) -> bytes | memoryview:
    """The file's bytes as a read-only memoryview of a mapping (unmapped once the view is
    released and dropped)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""  # mmap cannot map an empty file
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


class CacheEntry(NamedTuple):
    key: str
    size: int
    used_ns: int  # last put or get


class DiskEngineCache(EngineCache):
    """Engines as ``<directory>/<key>.kiln`` files under a byte budget (LRU eviction)."""

    SUFFIX = ".kiln"

    def __init__(self, directory: str | os.PathLike[str] | None = None, size_bytes: int = 5 << 30) -> None:
        if size_bytes < 0:
            raise ValueError(f"DiskEngineCache size_bytes must be >= 0, got {size_bytes}")
        self.directory = Path(directory if directory is not None else default_cache_dir())
        self.size_bytes = int(size_bytes)
        self._last_ns = 0
        self._clock = threading.Lock()

    def __repr__(self) -> str:
        return f"DiskEngineCache({str(self.directory)!r}, size_bytes={self.size_bytes})"

    # -- the interface --
    def get(self, key: str) -> bytes | bytearray | memoryview | None:
        """The entry's file mapped read-only, as a memoryview (no copy: pages come from the page
        cache as they are read), or None. Entries are replaced by rename, never rewritten, so a mapping stays whole."""
        path = self._path(key)
        try:
            data = _map(path)
        except FileNotFoundError:
            return None
        except OSError as err:
            log.warning("engine cache: cannot read %s: %s", path, err)
            return None
        if not looks_like_engine(data):
            log.warning("engine cache: entry %s is damaged or not an engine file; removing it", key)
            if isinstance(data, memoryview):
                data.release()
            self.remove(key)
            return None
        self._touch(path)
        return data

    def path(self, key: str) -> Path | None:
        """The entry's file, or None. Entries are replaced by rename and removed by unlink, so an
        engine mapped from one keeps its pages."""
        path = self._path(key)
        if not path.is_file():
            return None
        self._touch(path)
        return path

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if len(data) > self.size_bytes:
            log.info("engine cache: %s (%d bytes) exceeds the budget of %d bytes; not stored",
                     key, len(data), self.size_bytes)
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".tmp-{os.getpid()}-{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        self._touch(path)
        self.evict()

    def remove(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    # -- inspection and maintenance --
    def entries(self) -> list[CacheEntry]:
        """Every entry, least recently used first."""
        found: list[CacheEntry] = []
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        for name in names:
            if not name.endswith(self.SUFFIX) or name.startswith("."):
                continue
            try:
                st = os.stat(self.directory / name)
            except FileNotFoundError:
                continue  # removed by another process meanwhile
            found.append(CacheEntry(name[: -len(self.SUFFIX)], st.st_size, st.st_mtime_ns))
        return sorted(found, key=lambda e: (e.used_ns, e.key))

    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries())

    def evict(self) -> list[str]:
        """Removes least recently used entries until the budget holds; returns their keys."""
        evicted: list[str] = []
        with self._locked():
            entries = self.entries()
            total = sum(e.size for e in entries)
            for entry in entries:
                if total <= self.size_bytes:
                    break
                self.remove(entry.key)
                total -= entry.size
                evicted.append(entry.key)
                log.info("engine cache: evicted %s (%d bytes, least recently used)", entry.key, entry.size)
            self._remove_stale_temps()
        return evicted

    def clear(self) -> None:
        with self._locked():
            for entry in self.entries():
                self.remove(entry.key)

    # -- helpers --
    def _path(self, key: str) -> Path:
        if not isinstance(key, str) or not _KEY.match(key):
            raise ValueError(f"engine cache key {key!r} must be 1-128 letters, digits, '_' or '-'")
        return self.directory / f"{key}{self.SUFFIX}"

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

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / ".lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _remove_stale_temps(self) -> None:
        now = time.time_ns()
        for name in os.listdir(self.directory):
            if name.startswith(".tmp-"):
                with contextlib.suppress(OSError):
                    if now - os.stat(self.directory / name).st_mtime_ns > _STALE_TEMP_NS:
                        os.unlink(self.directory / name)  # left by a process that died mid-write


# ---- which store a compilation uses ---------------------------------------------------------

_override: EngineCache | None = None
_disk_caches: dict[tuple[str, int], DiskEngineCache] = {}
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
    :func:`set_engine_cache`, else a DiskEngineCache on ``engine_cache_dir`` / ``engine_cache_size``."""
    custom = getattr(settings, "custom_engine_cache", None)
    if custom is not None:
        return custom
    if _override is not None:
        return _override
    key = (os.path.abspath(settings.engine_cache_dir), int(settings.engine_cache_size))
    with _registry_lock:
        cache = _disk_caches.get(key)
        if cache is None:
            cache = _disk_caches[key] = DiskEngineCache(*key)
        return cache
