"""The runtime side of the front end: building an engine, the engine module, the custom op.

:class:`KilnEngineModule` is what a block of a compiled graph becomes: an ``nn.Module`` that
runs one engine. Its hot path checks each input (dtype, shape, device, contiguity), allocates
the outputs with PyTorch's allocator on the engine's device (so on CUDA they belong to the
current stream) and hands raw addresses to ``ExecutionContext.execute_ptrs``: no numpy, no
copies, a few microseconds of Python.

Lifecycle: constructed from a built Engine (or from engine bytes) -> forward()* -> pickled or
exported (the engine travels as its serialized bytes) -> destroyed. One context per module;
a lock keeps concurrent callers of one module one at a time, as ExecutionContext requires.

For torch.export (kiln.save) the module calls the custom op ``kiln::execute_engine(inputs,
engine, spec)`` instead: ``engine`` is a uint8 buffer holding the engine file, ``spec`` a
JSON string with the I/O dtypes, shapes and device, so the op's fake implementation can give
output metadata without the engine. The eager implementation deserializes each distinct
engine buffer once and keeps the runner while the buffer lives.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kiln import _C
from kiln._logging import get_logger
from kiln.settings import CompilationSettings
from kiln.translate import kiln_dtype, torch_dtype

log = get_logger("runtime")

__all__ = ["KilnEngineModule", "adopt_engine", "build_engine", "build_policy", "builder_config", "execute_engine",
           "spec_error", "warm_up"]

_DTYPE_NAMES = {dt: str(dt).removeprefix("torch.") for dt in
                (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
                 torch.int8, torch.uint8, torch.bool)}
_NAME_DTYPES = {v: k for k, v in _DTYPE_NAMES.items()}


_warming: set[str] = set()
_warming_lock = threading.Lock()


def warm_up(device: str) -> None:
    """Starts setting up ``device``'s libraries (CUDA: cuBLASLt's handle and first algorithm
    queries, 0.1-0.15 s in a fresh process; the upload lanes and Kiln's support kernels: the
    weights' checksum, the launch fence and the graph fill) on a thread of its own, once per
    process and device, so that the setup overlaps with tracing and partitioning instead of
    delaying the first engine build or cache load. Nothing happens for the CPU or when Kiln has
    no CUDA backend. A plain (non-daemon) thread: the interpreter waits for it at exit rather
    than tearing the CUDA runtime down under it."""
    if not device.startswith("cuda") or not _C.cuda_available():
        return
    with _warming_lock:
        if device in _warming:
            return
        _warming.add(device)

    def run() -> None:
        try:
            report = _C.warm_up(device)
            if report:
                log.debug("libraries for %s set up ahead: %s", device, report)
        except Exception as err:  # noqa: BLE001 - the first kernel that needs the library reports it
            log.debug("setting up the libraries for %s failed: %s", device, err)

    threading.Thread(target=run, name=f"kiln-warm-up-{device}").start()


def build_policy(settings: CompilationSettings) -> Any:
    """The builder's policy (numerics and tactic choices) that ``settings`` ask for."""
    return _C.BuildPolicy(allow_tf32=settings.allow_tf32, exact_gelu=settings.exact_gelu,
                          attention_tactic=settings.attention_tactic)


def builder_config(settings: CompilationSettings, device: str) -> Any:
    precisions = [kiln_dtype(dt) for dt in sorted(settings.enabled_precisions, key=str)]
    return _C.BuilderConfig(enabled_precisions=precisions, workspace_limit=settings.workspace_size,
                            optimization_level=settings.optimization_level, device=device,
                            refittable=not settings.immutable_weights, policy=build_policy(settings))


def borrowable_weights(constants: Sequence[Any], device: str) -> dict[str, tuple[int, int, torch.Tensor]]:
    """The weights an engine on ``device`` may read where the model keeps them instead of copying
    them (``Builder.build``'s ``borrowed``): dense tensors already on that device, in the dtype
    the engine takes. ``constants`` are a block description's (``kiln.translate.ConstantInfo``)."""
    dev = torch.device(device)
    out: dict[str, tuple[int, int, torch.Tensor]] = {}
    for c in constants:
        t = c.source
        if (c.weight and type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == dev.type
                and (dev.index is None or t.device.index == dev.index) and t.dtype == c.dtype
                and t.is_contiguous() and t.numel() * t.element_size() == c.nbytes):
            out[c.name] = (t.data_ptr(), c.nbytes, t.detach())
    return out


def build_engine(description: Any, settings: CompilationSettings, device: str,
                 borrowed: dict[str, tuple[int, int, torch.Tensor]] | None = None,
                 meanwhile: Callable[[], None] | None = None) -> Any:
    """ImportGraph -> Engine (raises kiln.KilnError subclasses naming the cause). ``borrowed``:
    weights the engine may read in place (:func:`borrowable_weights`). ``meanwhile`` runs on this
    thread while the builder works on another (a build holds no GIL); the engine is returned once
    both are done."""
    network = _C.import_aten(description)
    if device != "cpu":  # one timing cache (default: beside the engine cache) is shared by every build
        _C.set_timing_cache_path(settings.timing_cache_path or os.path.join(settings.engine_cache_dir, "timing.cache"))
    builder = _C.Builder(builder_config(settings, device))
    if meanwhile is None:
        return builder.build(network, borrowed)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kiln-build") as pool:
        built = pool.submit(builder.build, network, borrowed)
        meanwhile()
        return built.result()


class KilnEngineModule(torch.nn.Module):
    """Runs one Kiln engine on PyTorch tensors.

    ``input_dtypes`` / ``output_dtypes`` are what the surrounding graph passes and expects; they
    differ from the engine's only with ``truncate_double`` (float64 outside, float32 inside),
    in which case the module casts.
    """

    _graph_checked: bool  # whether the first call on a context with CUDA graphs has run (_use_context)

    def __init__(self, engine: Any, device: str, input_dtypes: Sequence[torch.dtype] | None = None,
                 output_dtypes: Sequence[torch.dtype] | None = None, name: str = "engine",
                 use_cuda_graphs: bool = True, arena: Any = None, lock: Any = None) -> None:
        super().__init__()
        self.name = name
        self.use_cuda_graphs = use_cuda_graphs
        # A SharedArena (kiln/instances.py) and the lock of every module using it: one call at a time.
        self._arena = arena
        self._shared_lock = lock
        # Weights the model holds in float64 that the engine takes as float32 (truncate_double):
        # the only ones a refit converts.
        self.truncated_weights: frozenset[str] = frozenset()
        # Called after each refit of this engine (kiln.refit's _apply); not pickled.
        self.refit_hooks: list[Callable[[], None]] = []
        self._kernels: Any = None  # see run_kernels_of
        self._set_engine(engine, device, input_dtypes, output_dtypes)
        self._exporting = False

    @property
    def shares_arena(self) -> bool:
        """Whether its intermediates live in a SharedArena (kiln/instances.py), not its own."""
        return self._arena is not None

    def _set_engine(self, engine: Any, device: str, input_dtypes: Sequence[torch.dtype] | None,
                    output_dtypes: Sequence[torch.dtype] | None) -> None:
        self._engine = engine
        self._device = torch.device(device)
        self._cuda = self._device.type == "cuda"
        self._lock = getattr(self, "_shared_lock", None) or threading.Lock()
        self._use_context(engine.create_execution_context(use_graphs=getattr(self, "use_cuda_graphs", True),
                                                          arena=getattr(self, "_arena", None)))
        self.input_names = [io.name for io in engine.inputs]
        self.output_names = [io.name for io in engine.outputs]
        self._in = [(torch.Size(io.shape), torch_dtype(io.dtype)) for io in engine.inputs]
        self._out = [(tuple(io.shape), torch_dtype(io.dtype)) for io in engine.outputs]
        # What each call's outputs are made like: empty_like of a one-element view expanded to the
        # output's shape allocates without parsing a shape, dtype and device every call.
        self._out_like = [torch.empty((), dtype=dtype, device=self._device).expand(shape) for shape, dtype in self._out]
        self._in_cast = list(input_dtypes) if input_dtypes is not None else [dt for _, dt in self._in]
        self._out_cast = list(output_dtypes) if output_dtypes is not None else [dt for _, dt in self._out]
        self._casts = self._in_cast != [dt for _, dt in self._in] or self._out_cast != [dt for _, dt in self._out]

    # -- the hot path --
    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self._exporting:
            return tuple(torch.ops.kiln.execute_engine(list(inputs), self.engine_blob, self.spec))
        if len(inputs) != len(self._in):
            raise ValueError(f"Kiln {self.name} takes {len(self._in)} inputs, got {len(inputs)}")
        device = self._device
        held: list[Any] = []
        try:
            if self._casts:
                inputs = tuple(x.to(dt) for x, (_, dt) in zip(inputs, self._in))
            for x, (shape, dtype) in zip(inputs, self._in):
                if x.dtype != dtype or x.shape != shape or x.device != device:
                    self._bad_input(x, len(held))
                held.append(x if x.is_contiguous() else x.contiguous())
        except AttributeError:  # None, a Python number, ...: not a tensor at all
            for i, x in enumerate(inputs):
                if not isinstance(x, torch.Tensor):
                    self._bad_input(x, i)
            raise
        outs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in self._out_like]
        stream = torch._C._cuda_getCurrentRawStream(device.index) if self._cuda else 0
        with self._lock:
            self._context.execute_ptrs([x.data_ptr() for x in held], [o.data_ptr() for o in outs], stream)
        if not self._graph_checked:
            self._graph_checked = True
            if self._context.graph_refusal:
                log.warning("Kiln %s runs without CUDA graphs: %s", self.name, self._context.graph_refusal)
        if self._casts:
            return tuple(o.to(dt) for o, dt in zip(outs, self._out_cast))
        return tuple(outs)

    def prime(self) -> None:
        """Runs a CUDA engine on two sets of zero inputs (valid for every input, indices included),
        so that its CUDA graphs are captured now rather than in real calls: the first set's on its
        own buffers, the second's on the staging buffers that calls with new buffers run through.
        A capture takes the CUDA build turn, which a background build timing tactics (a dynamic
        program's instances) gives up between timing rounds only: this keeps that wait out of
        the first call at a new size."""
        if not self._cuda:
            return
        sets = [[torch.zeros(shape, dtype=dtype, device=self._device) for (shape, _), dtype in
                 zip(self._in, self._in_cast)] for _ in range(2)]
        for inputs in sets:
            self(*inputs)
        torch.cuda.synchronize(self._device)

    def run_kernels_of(self, instance: Any) -> None:
        """Runs the kernels of ``instance``, an instance of this module's engine at the same sizes
        (``Engine.instance``: e.g. with tactics timed where the engine was built untimed), in place
        of the engine's own. The engine stays the one the module saves and refits; a refit returns
        to its own kernels (an instance does not run on weights changed since it was made)."""
        def io(e: Any) -> list[tuple[tuple[int, ...], Any]]:
            return [(tuple(t.shape), t.dtype) for t in (*e.inputs, *e.outputs)]
        if io(instance) != io(self._engine):
            raise _C.InternalError(f"Kiln {self.name}: an engine of other inputs or outputs cannot run its kernels")
        context = instance.create_execution_context(use_graphs=self.use_cuda_graphs, arena=self._arena)
        with self._lock:
            self._use_context(context)
            self._kernels = instance

    def own_kernels(self) -> None:
        """Runs the engine's own kernels again (after run_kernels_of). The caller holds the
        module's lock (kiln.refit does, around the refit)."""
        if self._kernels is not None:
            self._use_context(self._engine.create_execution_context(use_graphs=self.use_cuda_graphs, arena=self._arena))
            self._kernels = None

    def _use_context(self, context: Any) -> None:
        """Runs calls on ``context`` from now on; the first of them with CUDA graphs warns if the
        context could not record one."""
        self._context = context
        self._graph_checked = not (self._cuda and context.uses_graphs)

    def _bad_input(self, x: Any, i: int) -> None:
        shape, dtype = self._in[i]
        want = f"Kiln {self.name} input {i} ('{self.input_names[i]}') must be {dtype} {list(shape)} on {self._device}"
        if not isinstance(x, torch.Tensor):
            module = type(x).__module__
            kind = type(x).__qualname__ if module == "builtins" else f"{module}.{type(x).__qualname__}"
            hint = " (convert it with torch.from_numpy)" if module == "numpy" else ""
            raise TypeError(f"{want}, got a {kind}, not a torch.Tensor{hint}")
        raise _C.ShapeMismatchError(
            f"{want}, got {x.dtype} {list(x.shape)} on {x.device} (engines are built for static shapes)")

    # -- description and serialization --
    @property
    def engine(self) -> Any:
        return self._engine

    @property
    def spec(self) -> str:
        def io(items: Sequence[tuple[Any, torch.dtype]]) -> list[Any]:
            return [[_DTYPE_NAMES[dt], list(shape)] for shape, dt in items]
        return json.dumps({"inputs": io(list(zip([s for s, _ in self._in], self._in_cast))),
                           "outputs": io(list(zip([s for s, _ in self._out], self._out_cast))),
                           "device": str(self._device)}, separators=(",", ":"))

    def engine_bytes(self) -> bytes:
        """The engine file, with the kernels the module runs (see run_kernels_of)."""
        return self._engine.serialize(self._kernels)

    def set_exporting(self, on: bool) -> None:
        """Route forward through kiln::execute_engine (for torch.export) with the engine as a buffer."""
        if on and not hasattr(self, "engine_blob"):
            blob = torch.frombuffer(bytearray(self.engine_bytes()), dtype=torch.uint8)
            self.register_buffer("engine_blob", blob, persistent=True)
        self._exporting = on

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("_engine", "_context", "_lock", "refit_hooks", "_arena", "_shared_lock", "_kernels",
                              "_out_like")}
        state["_engine_bytes"] = self.engine_bytes()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        data = state.pop("_engine_bytes")
        self.__dict__.update(state)
        self.refit_hooks = []
        self._kernels = None
        engine = _C.Engine.deserialize(data, str(self._device))
        self._set_engine(engine, str(self._device), self._in_cast, self._out_cast)

    def extra_repr(self) -> str:
        ins = ", ".join(f"{n}: {_DTYPE_NAMES[d]}{list(s)}" for n, (s, d) in zip(self.input_names, self._in))
        outs = ", ".join(f"{n}: {_DTYPE_NAMES[d]}{list(s)}" for n, (s, d) in zip(self.output_names, self._out))
        return f"name={self.name}, device={self._device}, inputs=[{ins}], outputs=[{outs}]"


# ---- kiln::execute_engine ---------------------------------------------------------------

_RUNNERS: dict[int, tuple[weakref.ref[torch.Tensor], KilnEngineModule]] = {}
_RUNNERS_LOCK = threading.Lock()


def _runner(engine: torch.Tensor, spec: str) -> KilnEngineModule:
    key = id(engine)
    hit = _RUNNERS.get(key)
    if hit is not None and hit[0]() is engine:
        return hit[1]
    with _RUNNERS_LOCK:
        meta = json.loads(spec)
        data = engine.detach().to("cpu").contiguous().numpy()
        module = _keep_runner(engine, meta, _C.Engine.deserialize(data, meta["device"]))
        log.debug("deserialized an engine of %d bytes for kiln::execute_engine", engine.numel())
        return module


def _keep_runner(engine: torch.Tensor, meta: dict[str, Any], built: Any) -> KilnEngineModule:
    """A runner of the engine bytes ``engine``, kept until that buffer is freed; the caller holds
    _RUNNERS_LOCK."""
    module = KilnEngineModule(built, meta["device"], [_NAME_DTYPES[d] for d, _ in meta["inputs"]],
                              [_NAME_DTYPES[d] for d, _ in meta["outputs"]], name="execute_engine")
    key = id(engine)
    _RUNNERS[key] = (weakref.ref(engine, lambda _: _RUNNERS.pop(key, None)), module)
    return module


def spec_error(meta: Any) -> str:
    """What is wrong with a decoded ``kiln::execute_engine`` spec ('' when nothing is)."""
    if not isinstance(meta, dict) or not isinstance(meta.get("device"), str):
        return "its spec names no device"
    for kind in ("inputs", "outputs"):
        items = meta.get(kind)
        if not isinstance(items, list):
            return f"its spec has no {kind} list"
        for item in items:
            ok = (isinstance(item, list) and len(item) == 2 and item[0] in _NAME_DTYPES and isinstance(item[1], list)
                  and all(type(d) is int and d >= 0 for d in item[1]))
            if not ok:
                return f"its spec has a malformed {kind[:-1]} {str(item)[:60]}"
    return ""


def adopt_engine(engine: torch.Tensor, spec: str, built: Any) -> str:
    """Checks that ``built`` (deserialized from the bytes ``engine``) has the I/O that ``spec``
    says (the module casts float64 to float32 and back, with truncate_double) and keeps it as the
    runner of that buffer. Returns what does not match ('' when all does)."""
    meta = json.loads(spec)
    for kind, ios in (("inputs", built.inputs), ("outputs", built.outputs)):
        want = meta[kind]
        if len(want) != len(ios):
            return f"the engine has {len(ios)} {kind}, its spec {len(want)}"
        for io, (dtype, shape) in zip(ios, want):
            inside = torch_dtype(io.dtype)
            if list(io.shape) != shape or not (inside == _NAME_DTYPES[dtype] or
                                              (inside == torch.float32 and dtype == "float64")):
                return (f"engine {kind[:-1]} '{io.name}' is {_DTYPE_NAMES[inside]} {list(io.shape)}, its spec "
                        f"says {dtype} {shape}")
    with _RUNNERS_LOCK:
        _keep_runner(engine, meta, built)
    return ""


@torch.library.custom_op("kiln::execute_engine", mutates_args=())
def execute_engine(inputs: list[torch.Tensor], engine: torch.Tensor, spec: str) -> list[torch.Tensor]:
    """Runs the engine whose file bytes are ``engine`` (uint8) on ``inputs``."""
    return list(_runner(engine, spec)(*inputs))


@execute_engine.register_fake
def _execute_engine_fake(inputs: list[torch.Tensor], engine: torch.Tensor, spec: str) -> list[torch.Tensor]:
    meta = json.loads(spec)
    device = inputs[0].device if inputs else torch.device(meta["device"])
    return [torch.empty(shape, dtype=_NAME_DTYPES[dt], device=device) for dt, shape in meta["outputs"]]
