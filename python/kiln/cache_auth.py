"""What the on-disk engine cache trusts: its key, its entries' tags, and the files it reads.

An entry written by :class:`kiln.DiskEngineCache` is the engine file followed by a trailer,
``TAG_MAGIC`` and a 32-byte tag::

    tag = HMAC-SHA256(key, DOMAIN || cache key || 0 || len(engine) as u64 || SHA-256 of each
                      CHUNK-byte piece of the engine, in order)

Hashing the pieces first lets several threads share the work (hashlib releases the GIL) and
lets a reader hash what it has read while it reads the rest. The cache key is part of the tag,
so an entry moved to another key's file does not verify.

The key is 32 random bytes, one per user and cache directory, in
``<cache dir>/.key-<uid>/key``: the folder 0700 and the file 0600, both the user's own. A key
file that others could read or write, or that another user owns, is refused (the cache then
has no hits). An explicit key file (``key_path``), for a cache shared on purpose, may belong to
another user and be readable by its group, but nobody else may read it and only its owner may
write it.

Files are opened without blocking and must be regular files, so a FIFO, a device or a symbolic
link in the cache directory is refused instead of waited on or followed.
"""

from __future__ import annotations

import contextlib
import hmac
import mmap
import os
import secrets
import stat
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from hashlib import sha256
from pathlib import Path

__all__ = ["TAG_MAGIC", "TRAILER_SIZE", "UnusableEntry", "KeyProblem", "load_key", "default_key_path",
           "TagHasher", "tag_of", "read_regular_file", "read_sealed"]

TAG_MAGIC = b"KILNTAG1"
TAG_SIZE = 32
TRAILER_SIZE = len(TAG_MAGIC) + TAG_SIZE
CHUNK = 4 << 20
KEY_SIZE = 32
_DOMAIN = b"kiln-engine-cache-entry-1\0"
_MAX_KEY_FILE = 4096


class UnusableEntry(Exception):
    """An entry that exists but must not be used (damaged, forged, not a regular file, ...)."""


class KeyProblem(Exception):
    """The cache's key cannot be trusted or made; the message names the file and the cause."""


def default_key_path(directory: Path) -> Path:
    return directory / f".key-{os.getuid()}" / "key"


def _open_nonblocking(path: Path, follow_symlinks: bool) -> int:
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    return os.open(path, flags)


def _check_key_file(fd: int, path: Path, explicit: bool) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise KeyProblem(f"engine cache key {path} is not a regular file")
    if explicit:
        if st.st_mode & 0o027:
            raise KeyProblem(f"engine cache key {path} has mode {stat.S_IMODE(st.st_mode):o}: others may read it "
                             f"or its group may write it (allowed: owner read/write, group read)")
    else:
        if st.st_uid != os.getuid():
            raise KeyProblem(f"engine cache key {path} belongs to uid {st.st_uid}, not to this user ({os.getuid()})")
        if st.st_mode & 0o077:
            raise KeyProblem(f"engine cache key {path} has mode {stat.S_IMODE(st.st_mode):o}: group or others "
                             f"may access it (it must be 600)")
    if not KEY_SIZE <= st.st_size <= _MAX_KEY_FILE:
        raise KeyProblem(f"engine cache key {path} holds {st.st_size} bytes (needs {KEY_SIZE} to {_MAX_KEY_FILE})")


def _read_key(path: Path, explicit: bool) -> bytes:
    """The key in ``path`` after the ownership and permission checks; FileNotFoundError if absent."""
    try:
        fd = _open_nonblocking(path, follow_symlinks=explicit)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise KeyProblem(f"cannot open engine cache key {path}: {err.strerror or err}") from err
    try:
        _check_key_file(fd, path, explicit)
        key = os.read(fd, _MAX_KEY_FILE + 1)
    finally:
        os.close(fd)
    if len(key) < KEY_SIZE:
        raise KeyProblem(f"engine cache key {path} is shorter than {KEY_SIZE} bytes")
    return key


def _private_folder(folder: Path) -> None:
    """Makes ``folder`` (mode 0700) if absent; refuses one that is not the user's own and private."""
    try:
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a cache directory made here is private
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError as err:
        raise KeyProblem(f"cannot make the engine cache key folder {folder}: {err}") from err
    if not stat.S_ISDIR(st.st_mode):
        raise KeyProblem(f"engine cache key folder {folder} is not a directory")
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise KeyProblem(f"engine cache key folder {folder} (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}) "
                         f"is not private to this user (uid {os.getuid()}, mode 700)")


def _create_key(path: Path) -> None:
    """Writes a fresh key to a temporary file and links it into place, so a concurrent reader sees
    no key or a whole one; a key another process made meanwhile wins."""
    tmp = path.parent / f".tmp-{os.getpid()}-{uuid.uuid4().hex}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(KEY_SIZE))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: rename (a concurrent key may be replaced)
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def load_key(directory: Path, key_path: Path | None = None) -> bytes:
    """The key of the cache in ``directory``: ``key_path`` when given (it must exist), else the
    user's own key of that directory, made on first use. Raises KeyProblem naming the cause."""
    if key_path is not None:
        try:
            return _read_key(Path(key_path), explicit=True)
        except FileNotFoundError as err:
            raise KeyProblem(f"engine cache key {key_path} does not exist") from err
    path = default_key_path(directory)
    _private_folder(path.parent)
    try:
        return _read_key(path, explicit=False)
    except FileNotFoundError:
        pass
    try:
        _create_key(path)
        return _read_key(path, explicit=False)
    except OSError as err:
        raise KeyProblem(f"cannot make the engine cache key {path}: {err}") from err


def _workers() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 8))


class TagHasher:
    """Computes an entry's tag from pieces fed in order (each CHUNK bytes but the last), hashing
    them on worker threads while the caller reads or writes the next ones. Use as a context
    manager: leaving it stops the workers."""

    def __init__(self, total: int) -> None:
        workers = _workers() if total > CHUNK else 1
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="kiln-cache-tag") if workers > 1 else None
        self._digests: list[Future[bytes] | bytes] = []
        self._total = total
        self._fed = 0

    def __enter__(self) -> TagHasher:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def feed(self, piece: memoryview) -> None:
        self._fed += len(piece)
        if self._pool is None:
            self._digests.append(sha256(piece).digest())
        else:
            self._digests.append(self._pool.submit(lambda: sha256(piece).digest()))

    def feed_all(self, data: memoryview) -> None:
        for start in range(0, len(data), CHUNK):
            self.feed(data[start:start + CHUNK])

    def tag(self, key: bytes, name: str) -> bytes:
        if self._fed != self._total:
            raise ValueError(f"tag of {self._total} bytes computed over {self._fed}")
        mac = hmac.new(key, _DOMAIN + name.encode() + b"\0" + self._total.to_bytes(8, "little"), sha256)
        for d in self._digests:
            mac.update(d if isinstance(d, bytes) else d.result())
        return mac.digest()


def tag_of(key: bytes, name: str, data: bytes | bytearray | memoryview) -> bytes:
    """The tag of a whole engine's bytes (the writer's side)."""
    view = memoryview(data).cast("B")
    with TagHasher(len(view)) as hasher:
        hasher.feed_all(view)
        return hasher.tag(key, name)


def _buffer(size: int) -> bytearray | mmap.mmap:
    """Memory for ``size`` bytes: for a large file, anonymous memory faulted in by the kernel in
    one pass (MAP_POPULATE), cheaper than taking a page fault per page while reading into it."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if size < CHUNK or not populate:
        return bytearray(size)
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)


def read_regular_file(path: Path, max_bytes: int | None, follow_symlinks: bool = False,
                      on_read: Callable[[memoryview, int], None] | None = None) -> bytearray | mmap.mmap:
    """The bytes of a regular file, read once into memory the caller owns. The file is opened
    without blocking and checked before anything is read: anything but a regular file, or one
    larger than ``max_bytes``, raises UnusableEntry; so does a file that shrinks while being
    read. ``on_read(buffer, filled)`` is called after each read with the count filled so far.
    A missing file raises FileNotFoundError."""
    try:
        fd = _open_nonblocking(path, follow_symlinks)
    except FileNotFoundError:
        raise
    except OSError as err:  # ELOOP: a symbolic link; EACCES: another user's file
        raise UnusableEntry(f"cannot open {path}: {err.strerror or err}") from err
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnusableEntry(f"{path} is not a regular file ({stat.filemode(st.st_mode)})")
        if max_bytes is not None and st.st_size > max_bytes:
            raise UnusableEntry(f"{path} holds {st.st_size} bytes, more than the cache's budget of {max_bytes}")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb", buffering=0) as f:
        buf = _buffer(st.st_size)
        view = memoryview(buf)
        filled = 0
        while filled < len(buf):
            n = f.readinto(view[filled:filled + CHUNK])
            if not n:
                raise UnusableEntry(f"{path} shrank while being read ({filled} of {len(buf)} bytes)")
            filled += n
            if on_read is not None:
                on_read(view, filled)
    return buf


def read_sealed(path: Path, name: str, key: bytes, max_bytes: int | None) -> memoryview:
    """The engine bytes of the entry file ``path`` (stored under cache key ``name``), read once
    into memory of the caller's and returned only once its tag verifies with ``key``: the bytes
    verified are the bytes returned. Raises UnusableEntry naming the file and what failed."""
    with contextlib.ExitStack() as stack:
        hasher: TagHasher | None = None
        hashed = 0

        def on_read(view: memoryview, filled: int) -> None:
            nonlocal hasher, hashed
            engine_size = len(view) - TRAILER_SIZE
            if engine_size < 0:
                return
            if hasher is None:
                hasher = stack.enter_context(TagHasher(engine_size))
            end = min(filled, engine_size)
            while hashed < end and (hashed + CHUNK <= end or end == engine_size):
                piece_end = min(hashed + CHUNK, engine_size)
                hasher.feed(view[hashed:piece_end])
                hashed = piece_end

        buf = read_regular_file(path, max_bytes, on_read=on_read)
        engine_size = len(buf) - TRAILER_SIZE
        if engine_size < 0 or buf[engine_size:engine_size + len(TAG_MAGIC)] != TAG_MAGIC:
            raise UnusableEntry(f"{path} has no tag ({len(buf)} bytes): it was not written by this cache")
        if hasher is None:  # an empty engine: nothing was read before the trailer
            hasher = stack.enter_context(TagHasher(0))
        expected = hasher.tag(key, name)
    if not hmac.compare_digest(expected, bytes(buf[engine_size + len(TAG_MAGIC):])):
        raise UnusableEntry(f"{path}'s tag does not verify: it was written with another key or changed since")
    return memoryview(buf)[:engine_size]
