"""Building an engine through the engine cache: the key, the hit path (load + refit), the store.

With ``reuse_cached_engines`` a block's engine is first looked up by its key; with
``cache_built_engines`` a freshly built engine is stored under it. The key is a SHA-256 over

* the block's import description without weight bytes (kiln.translate.canonical_description):
  every op's target and arguments, every tensor's dtype, shape, strides and shape ranges, the
  inputs, outputs and the constants' names, shapes and dtypes;
* the bytes of the constants that are not model weights (lifted constants and values folded at
  lowering): the engine bakes them in and refit does not replace them, so they must match;
* every build-affecting setting (all settings except those listed in ``_NOT_BUILD_SETTINGS``,
  so a setting added later is part of the key unless declared otherwise), among them the build
  policy (``allow_tf32``, ``exact_gelu``, ``attention_tactic``): no environment variable
  changes what a build computes, so none is part of the key;
* the Kiln version, the key format and the device: its kind and name (on CUDA the GPU's name and
  compute capability, not its index, so one GPU's engines serve every GPU of the same model).

A hit reads the entry once into memory (the default store verifies its tag there: see
kiln/cache_auth.py), deserializes the engine from those bytes, checks its I/O against the block and
refits the block's current weights into it, so the same architecture with other weights reuses it.
A stored engine carries a fingerprint of the weights it was built from (``Engine.source_weights_id``:
per weight its name, dtype and shape, and checksums of the bytes, computed where the weights
live); when the entry is authenticated and the block's weights have the same fingerprint (the
same model in a new process) the refit would change nothing and is skipped. An unauthenticated
entry (a custom store's) is always refitted: its label could be forged. The fingerprint is
computed on a worker thread while the entry is read and the engine deserialized (both release
the GIL); for a store that only hands out unauthenticated entries, once the entry is read. An entry
that cannot be read, verified, deserialized, checked or refitted is removed and counts as a
miss; the compilation then builds.
Nothing here raises into a compilation because of the cache: failures are logged.

A program cache hit (kiln/program_cache.py) knows its engines' keys without a description:
:meth:`CachedBuild.for_key` loads one from its key and the weights' names, dtypes and shapes.
While a :func:`recording` is active (the program cache compiling a graph), every engine loaded
from or stored into the cache is noted with its key, and the counters of that compilation are
kept apart, so that the program can name its engines and knows when a block failed to build.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import platform
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from kiln import _C
from kiln.cache import EngineCache, UnusableEntry, engine_cache_for, log
from kiln.settings import CompilationSettings
from kiln.translate import BlockDescription, canonical_description

__all__ = ["CachedBuild", "EngineRecord", "WeightSpec", "engine_cache_key", "cache_stats", "reset_cache_stats",
           "count", "recording"]

_KEY_FORMAT = "kiln-engine-cache-2"  # 2: the build policy is in the settings, no environment
# Settings that change which blocks exist (already in the description), where engines are
# kept, or how they are run, but never the engine built for a given block.
_NOT_BUILD_SETTINGS = frozenset({
    "min_block_size", "torch_executed_ops", "require_full_compilation", "pass_through_build_failures",
    "debug", "dryrun", "cache_built_engines", "reuse_cached_engines", "engine_cache_dir",
    "engine_cache_size", "engine_cache_key_file", "custom_engine_cache", "use_cuda_graphs", "share_weights",
    "device",  # the key has the device's kind and name instead: cuda:1 reuses cuda:0's engines
    "mode",  # what a mode sets is in the fields it set
    "timing_cache_path",  # a location, like engine_cache_dir
    "autocast_calibration_dataloader",  # its effect is in the graph (the casts), which is keyed
    "module_key",  # how a warm kiln.compile finds its program, not what it builds
    # Which shapes get engines, not what one holds:
    "specialization_cache_size", "dynamic_max_size", "dynamic_instances",
})

_stats: dict[str, int] = {}
_stats_lock = threading.Lock()
_STAT_NAMES = ("builds", "build_failures", "hits", "misses", "stored", "refits", "refits_skipped", "rejected",
               "lowerings", "program_hits", "program_misses", "programs_stored", "programs_rejected")


@dataclasses.dataclass(frozen=True)
class WeightSpec:
    """A model weight an engine takes: its name, the dtype the engine takes it in, the dtype the
    model holds it in (float64 with truncate_double) and its shape."""

    name: str
    dtype: torch.dtype
    source_dtype: torch.dtype
    shape: tuple[int, ...]


@dataclasses.dataclass
class EngineRecord:
    """An engine that is in the cache, as a recording saw it: the engine object, its key and weights."""

    engine: Any
    key: str
    weights: list[WeightSpec]


@dataclasses.dataclass
class _Recording:
    engines: list[EngineRecord] = dataclasses.field(default_factory=list)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    unusable: frozenset[str] = frozenset()  # keys already found missing or unusable: misses without a look


_recording: contextvars.ContextVar[_Recording | None] = contextvars.ContextVar("kiln_cache_recording", default=None)


@contextlib.contextmanager
def recording(unusable: frozenset[str] = frozenset()) -> Iterator[_Recording]:
    """Notes, in this context, every engine loaded from or stored into the cache (``engines``)
    and the counters (``counts``) of what happens meanwhile. Lookups of the keys ``unusable``
    (found missing or unusable a moment ago) are misses without reading the store again."""
    rec = _Recording(unusable=unusable)
    token = _recording.set(rec)
    try:
        yield rec
    finally:
        _recording.reset(token)


def count(name: str, n: int = 1) -> None:
    with _stats_lock:
        _stats[name] = _stats.get(name, 0) + n
    rec = _recording.get()
    if rec is not None:
        rec.counts[name] = rec.counts.get(name, 0) + n


def _record(engine: Any, key: str, weights: list[WeightSpec]) -> None:
    rec = _recording.get()
    if rec is not None:
        rec.engines.append(EngineRecord(engine, key, weights))


def cache_stats() -> dict[str, int]:
    """Process-wide counters: engines built (and blocks whose build failed), cache hits / misses /
    stores, refits on a hit, entries rejected as damaged or foreign; and for the program cache
    (kiln/program_cache.py) the graphs lowered by compilations that use it, its hits, misses,
    stores and rejected entries."""
    with _stats_lock:
        return {name: _stats.get(name, 0) for name in _STAT_NAMES}


def reset_cache_stats() -> None:
    with _stats_lock:
        _stats.clear()


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        props = torch.cuda.get_device_properties(index)
        return f"{props.name} sm_{props.major}{props.minor}"
    return f"cpu {platform.machine()}"


def settings_text(settings: CompilationSettings, skip: frozenset[str] = _NOT_BUILD_SETTINGS) -> str:
    """The settings as key text: every field but those in ``skip``, sets sorted."""
    parts = []
    for f in dataclasses.fields(settings):
        if f.name in skip:
            continue
        value = getattr(settings, f.name)
        if isinstance(value, (frozenset, set)):
            value = sorted(str(v) for v in value)
        parts.append(f"{f.name}={value!r}")
    return ";".join(parts)


def engine_cache_key(description: BlockDescription | Any, settings: CompilationSettings, device: str) -> str:
    """The hex SHA-256 naming the engine of this import description (a BlockDescription, with or
    without weight bytes, or an ImportGraph with them) under these settings."""
    h = hashlib.sha256()
    kind = device.partition(":")[0]
    for text in (_KEY_FORMAT, _C.__version__, kind, device_name(device), settings_text(settings)):
        h.update(text.encode())
        h.update(b"\0")
    if isinstance(description, BlockDescription):
        graph, constants = description.graph, description.constants
    else:
        graph, constants = description, None
    h.update(canonical_description(graph, constants).encode())
    for constant in graph.constants:
        if not constant.weight:
            h.update(f"{constant.name}\0".encode())
            h.update(hashlib.sha256(constant.data).digest())
    return h.hexdigest()


def weight_specs(description: BlockDescription) -> list[WeightSpec]:
    """The model weights of a block's description."""
    return [WeightSpec(c.name, c.dtype, c.source.dtype, tuple(c.shape)) for c in description.constants if c.weight]


def current_streams(weights: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The calling thread's current stream of each CUDA device holding a weight: the fingerprint
    reads the weights after the work queued there (e.g. a load_state_dict), from any thread."""
    devices = {w.device for w in weights.values() if w.device.type == "cuda"}
    return {str(d): torch.cuda.current_stream(d) for d in devices}


def weights_fingerprint(weights: Mapping[str, torch.Tensor], streams: Mapping[str, Any] | None = None) -> str:
    """A hex SHA-256 over each weight's name, dtype and shape and a checksum of the bytes:
    checksum64 per host tensor; per device, one word checksum (``_C.word_checksum``) over all
    its tensors, computed on the device by Kiln's backend after the work queued on ``streams``
    (default: the calling thread's current streams). Copying device weights to the host took
    most of a warm cache hit on the GPU (0.13 s of BERT-base's 0.22 s), torch operations over
    them still ~35 ms. The checksum's kind is part of each record, so the same weights on
    another kind of device make another fingerprint (a refit instead of a skipped one: never a
    stale engine)."""
    names = sorted(weights)
    streams = current_streams(weights) if streams is None else streams
    h = hashlib.sha256(b"kiln-weights-3\0")
    on_device: dict[str, list[torch.Tensor]] = {}
    for name in names:
        t = weights[name].detach()
        kind = "host" if t.device.type == "cpu" else "device"
        h.update(f"{name}\0{t.dtype}\0{list(t.shape)}\0{kind}\0".encode())
        if kind == "host":
            t = t.contiguous()
            nbytes = t.numel() * t.element_size()
            h.update((_C.checksum64(t.data_ptr(), nbytes) if nbytes else 0).to_bytes(8, "little"))
        else:
            on_device.setdefault(str(t.device), []).append(t)
    for device in sorted(on_device):
        stream = streams.get(device)
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            tensors = [t.contiguous() for t in on_device[device]]
            buffers = [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors]
            checksum = _C.word_checksum(device, buffers, stream.cuda_stream if stream is not None else None)
        h.update(f"{device}\0".encode() + checksum.to_bytes(8, "little"))
    return h.hexdigest()


class CachedBuild:
    """One block's dealings with the cache: ``load`` on reuse, ``store`` after a build."""

    def __init__(self, description: BlockDescription, settings: CompilationSettings, device: str, name: str) -> None:
        self._setup(engine_cache_for(settings), engine_cache_key(description, settings, device), device, name,
                    weight_specs(description), {c.name: c.source for c in description.constants if c.weight})

    @classmethod
    def for_key(cls, store: EngineCache, key: str, device: str, name: str, specs: list[WeightSpec],
                sources: Mapping[str, torch.Tensor]) -> CachedBuild:
        """The engine cached under ``key`` whose weights ``specs`` are the tensors ``sources``
        (by name, as the model holds them)."""
        cached = cls.__new__(cls)
        cached._setup(store, key, device, name, specs, sources)
        return cached

    def _setup(self, store: EngineCache, key: str, device: str, name: str, specs: list[WeightSpec],
               sources: Mapping[str, torch.Tensor]) -> None:
        self.device = device
        self.name = name
        self.store_ = store
        self.key = key
        self.specs = specs
        self._sources = sources
        self._weights: dict[str, torch.Tensor] | None = None
        self._fingerprint: str | None = None
        self._pending: Future[str] | None = None  # the fingerprint, being computed

    def weights(self) -> dict[str, torch.Tensor]:
        """The block's current model weights by name (the refit's input): the model's own tensors,
        converted only where the description truncates float64 (computed once)."""
        if self._weights is None:
            self._weights = {s.name: self._sources[s.name].detach().to(s.dtype) for s in self.specs}
        return self._weights

    def fingerprint(self) -> str:
        if self._fingerprint is None:
            pending, self._pending = self._pending, None
            self._fingerprint = pending.result() if pending else weights_fingerprint(self.weights())
        return self._fingerprint

    def _start_fingerprint(self) -> None:
        """Starts computing the fingerprint on a thread of its own (its errors surface in
        fingerprint()). A pool per call, not one per process: a forked child must not wait on
        a worker that only its parent has."""
        if self._fingerprint is None and self._pending is None and self.weights():
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-fingerprint")
            self._pending = pool.submit(weights_fingerprint, self.weights(), current_streams(self.weights()))
            pool.shutdown(wait=False)  # the thread ends once the fingerprint is done

    @classmethod
    def create(cls, description: BlockDescription, settings: CompilationSettings, device: str,
               name: str) -> CachedBuild | None:
        """A CachedBuild when the settings ask for the cache and the key can be made, else None
        (logged: the cache never fails a compilation)."""
        if not (settings.reuse_cached_engines or settings.cache_built_engines):
            return None
        try:
            return cls(description, settings, device, name)
        except Exception as err:  # noqa: BLE001
            log.warning("engine cache: no key for %s (%s: %s); building without the cache",
                        name, type(err).__name__, err)
            return None

    def load(self, make_module: Callable[[Any], Any], check: Callable[[Any], None]) -> Any | None:
        """The engine module of a hit, refitted with the current weights; None on a miss. The
        entry is read once into memory of this process's (the engine owns its bytes: whatever
        happens to the file later changes nothing here); any failure to read, verify,
        deserialize or refit it is a logged miss."""
        start = time.perf_counter()
        rec = _recording.get()
        if rec is not None and self.key in rec.unusable:
            count("misses")
            log.info("engine cache miss for %s (key %s, unusable a moment ago)", self.name, self.key[:16])
            return None
        if type(self.store_).read_entry is not EngineCache.read_entry:
            self._start_fingerprint()  # a store that may authenticate: the label is likely compared
        try:
            entry = self.store_.read_entry(self.key)
        except UnusableEntry as err:
            self._reject(str(err))
            entry = None
        except Exception as err:  # noqa: BLE001 - a user store must not break compilation
            log.warning("engine cache: %r failed to read %s: %s: %s", self.store_, self.key, type(err).__name__, err)
            entry = None
        if entry is None:
            count("misses")
            log.info("engine cache miss for %s (key %s)", self.name, self.key[:16])
            return None
        read = time.perf_counter()
        if entry.authenticated:  # only an authenticated entry's weights label is compared (_refit)
            self._start_fingerprint()
        try:
            engine = _C.Engine.deserialize(entry.data, self.device)
            check(engine)
            module = make_module(engine)
            loaded = time.perf_counter()
            refitted = self._refit(module, entry.authenticated)
        except Exception as err:  # noqa: BLE001 - damaged, foreign, or unreadable: never a failed compile
            self._reject(f"{entry.source} cannot be used ({type(err).__name__}: {err})")
            count("misses")
            return None
        if not refitted:
            count("misses")
            return None
        count("hits")
        _record(module.engine, self.key, self.specs)
        log.info("engine cache hit for %s (key %s, %d bytes%s): read %.3f s, load %.3f s, refit %.3f s",
                 self.name, self.key[:16], len(entry.data), ", authenticated" if entry.authenticated else "",
                 read - start, loaded - read, time.perf_counter() - loaded)
        return module

    def _refit(self, module: Any, authenticated: bool) -> bool:
        """Refits the block's weights into a loaded engine. The refit is skipped only when the
        store proved the entry its own and the engine's label of its weights matches the
        block's: an unauthenticated entry's label could be forged. Raises when the refit fails."""
        weights = self.weights()
        if not weights:
            return True  # nothing to refit: the engine is the block's as it is
        same = False
        if authenticated:
            stored = module.engine.source_weights_id
            try:
                same = bool(stored) and stored == self.fingerprint()
            except (RuntimeError, TypeError, ValueError) as err:  # weights torch cannot view as bytes
                log.info("engine cache: no fingerprint of %s's weights (%s); refitting", self.name, err)
        if same:
            count("refits_skipped")  # built from these very weights: a refit would change nothing
            return True
        try:
            from kiln.refit import engine_weights_from, refit_engine_module
        except ImportError as err:
            log.warning("engine cache: cannot refit the cached engine of %s (%s); building it", self.name, err)
            return False
        # Only the weights the engine takes (a block weight it folded away is not one).
        refit_engine_module(module, engine_weights_from(weights, module))
        count("refits")
        return True

    def _reject(self, why: str) -> None:
        count("rejected")
        log.warning("engine cache: entry %s for %s: %s; removing it", self.key[:16], self.name, why)
        try:
            self.store_.remove(self.key)
        except Exception as err:  # noqa: BLE001
            log.warning("engine cache: %r failed to remove %s: %s", self.store_, self.key, err)

    def store(self, engine: Any) -> None:
        try:
            engine.source_weights_id = self.fingerprint()  # the weights it was just built from
            data = engine.serialize()
            self.store_.put(self.key, bytes(data))
        except Exception as err:  # noqa: BLE001 - a full disk must not fail the compilation
            log.warning("engine cache: could not store the engine of %s: %s", self.name, err)
            return
        count("stored")
        _record(engine, self.key, self.specs)
        log.info("engine cache: stored %s (key %s, %d bytes)", self.name, self.key[:16], len(data))
