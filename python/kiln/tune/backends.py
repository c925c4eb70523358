"""Candidate backends: what a tuned module may run with.

A backend is one class: a ``kind`` (its registry name), a ``compile(module, samples)`` that
returns a callable with the module's call signature, and a ``config()`` of JSON values from which
``cls(**config)`` rebuilds it (saved tunings and the tuning cache store backends that way).
Defining a subclass with a ``kind`` registers it. A backend whose compiled form is a file (Kiln
AOT) sets ``saves_artifacts`` and implements ``save_artifacts`` / ``load_artifacts``.

Built in: ``eager`` (the module itself, also the reference every candidate is checked against),
``kiln-jit`` (``torch.compile(backend="kiln")``), ``kiln-aot`` (``kiln.compile``, artifacts
saved with ``kiln.save``) and ``inductor`` (``torch.compile``, default or reduce-overhead mode).
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.utils._pytree as pytree

from kiln.tune.inputs import Inputs, describe, fast_key, signature

if TYPE_CHECKING:
    from kiln.settings import CompilationSettings

log = logging.getLogger("kiln.tune")

__all__ = ["Backend", "Eager", "KilnJit", "KilnAot", "Inductor", "backend_from_spec", "backend_from_json",
           "registered_kinds", "dtype_name", "dtype_from_name"]

_REGISTRY: dict[str, type[Backend]] = {}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"kiln.tune: {name!r} is not a torch dtype")
    return dtype


class Backend(abc.ABC):
    """One way to run a module. Subclasses set ``kind`` and implement ``compile`` and ``config``."""

    kind: ClassVar[str] = ""
    saves_artifacts: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if kind:
            _REGISTRY[kind] = cls

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.kind

    @abc.abstractmethod
    def compile(self, module: torch.nn.Module, samples: Sequence[Inputs]) -> Callable[..., Any]:
        """A callable that runs ``module`` (same arguments, same outputs), ready for ``samples``."""

    def config(self) -> dict[str, Any]:
        """Constructor arguments (JSON values) that rebuild this backend, ``name`` excluded."""
        return {}

    def precisions(self) -> frozenset[torch.dtype]:
        """Float dtypes the backend may compute in besides the module's own (for the tolerance)."""
        return frozenset()

    def unavailable(self, device: torch.device) -> str | None:
        """Why this backend cannot run on ``device`` here, or None."""
        return None

    def save_artifacts(self, compiled: Callable[..., Any], directory: Path, stem: str) -> list[dict[str, Any]]:
        """Writes the compiled form under ``directory`` (file names starting with ``stem``); one
        record per file, each with its ``file`` name (relative to ``directory``)."""
        raise NotImplementedError(f"backend {self.kind!r} saves no artifacts")

    def load_artifacts(self, module: torch.nn.Module, directory: Path,
                       records: Sequence[Mapping[str, Any]]) -> Callable[..., Any]:
        """The compiled form back from the files of ``save_artifacts``."""
        raise NotImplementedError(f"backend {self.kind!r} saves no artifacts")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "config": self.config()}

    def __repr__(self) -> str:
        config = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({config}{', ' if config else ''}name={self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Backend) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash((self.kind, self.name))


def registered_kinds() -> list[str]:
    return sorted(_REGISTRY)


def backend_from_json(data: Mapping[str, Any]) -> Backend:
    kind = data.get("kind")
    cls = _REGISTRY.get(str(kind))
    if cls is None:
        raise ValueError(f"kiln.tune: unknown backend kind {kind!r} (registered: {', '.join(registered_kinds())}); "
                         "a custom backend's class must be defined (its module imported) before loading")
    try:
        return cls(**dict(data.get("config") or {}), name=data.get("name"))
    except TypeError as err:  # a setting the class does not take
        params = [p for p in inspect.signature(cls).parameters if p != "name"]
        raise ValueError(f"kiln.tune: backend {kind!r}: {err}; its settings: {', '.join(params) or 'none'}"
                         + (" (Kiln options go in 'options')" if "options" in params else "")) from None


_BY_NAME: dict[str, Callable[[], Backend]] = {}


def backend_from_spec(spec: Backend | str | Mapping[str, Any]) -> Backend:
    """A backend from an instance, a built-in name (eager, kiln-jit, kiln-aot, inductor,
    inductor-reduce-overhead) or a mapping ``{"kind": ..., "name": ..., **config}``."""
    if isinstance(spec, Backend):
        return spec
    if isinstance(spec, str):
        make = _BY_NAME.get(spec) or (lambda: backend_from_json({"kind": spec}))
        return make()
    if isinstance(spec, Mapping):
        data = dict(spec)
        kind, name = data.pop("kind", None), data.pop("name", None)
        config = data.pop("config", None)
        if config is not None and data:
            raise ValueError(f"kiln.tune: backend spec {dict(spec)!r} has both 'config' and other keys")
        return backend_from_json({"kind": kind, "name": name, "config": config if config is not None else data})
    raise TypeError(f"kiln.tune: a backend is a kiln.tune.Backend, a name or a dict, got {type(spec).__name__}")


# ---- the built-in backends ---------------------------------------------------------------------

class Eager(Backend):
    """The module as it is: the reference, and the fallback when no candidate is accepted."""

    kind = "eager"

    def compile(self, module: torch.nn.Module, samples: Sequence[Inputs]) -> Callable[..., Any]:
        return module


def _encode_option(key: str, value: Any) -> Any:
    """A Kiln option as a JSON value that ``settings_from_options`` accepts back."""
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, (set, frozenset, list, tuple)):
        return sorted(_encode_option(key, v) for v in value)
    if isinstance(value, torch._ops.OpOverload) or isinstance(value, torch._ops.OpOverloadPacket):
        return str(value)
    if value is None or isinstance(value, (bool, int, str)) or (isinstance(value, float) and not math.isnan(value)):
        return value
    raise TypeError(f"kiln.tune: Kiln option {key!r}={value!r} cannot be stored in a tuning file or cache "
                    "(only dtypes, op names, numbers, strings and booleans can)")


class _KilnOptions:
    """Kiln options validated at once (an unknown key or bad value raises here, not when tuning)."""

    def __init__(self, options: Mapping[str, Any] | CompilationSettings | None) -> None:
        from kiln.settings import CompilationSettings, settings_from_options

        if isinstance(options, CompilationSettings):  # kept as the fields that differ from the defaults
            default = CompilationSettings()
            options = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)
                       if getattr(options, f.name) != getattr(default, f.name)}
        self.options = dict(options or {})
        self.settings = settings_from_options(self.options)

    def encoded(self) -> dict[str, Any]:
        return {k: _encode_option(k, v) for k, v in sorted(self.options.items())}


class KilnJit(Backend):
    """``torch.compile(module, backend="kiln", options=options, fullgraph=..., dynamic=...)``,
    called under ``torch.autocast(dtype=autocast_dtype)`` when ``autocast_enabled``."""

    kind = "kiln-jit"

    def __init__(self, options: Mapping[str, Any] | CompilationSettings | None = None, *, fullgraph: bool = False,
                 dynamic: bool | None = False, autocast_enabled: bool = False,
                 autocast_dtype: torch.dtype | str = torch.float16, name: str | None = None) -> None:
        super().__init__(name)
        self.options = _KilnOptions(options)
        self.fullgraph, self.dynamic = bool(fullgraph), dynamic
        self.autocast_enabled, self.autocast_dtype = bool(autocast_enabled), dtype_from_name(autocast_dtype)

    def compile(self, module: torch.nn.Module, samples: Sequence[Inputs]) -> Callable[..., Any]:
        import kiln  # noqa: F401 - registers the "kiln" Dynamo backend

        fn = torch.compile(module, backend="kiln", options=dict(self.options.options), fullgraph=self.fullgraph,
                           dynamic=self.dynamic)
        return _autocast(fn, self.autocast_dtype) if self.autocast_enabled else fn

    def config(self) -> dict[str, Any]:
        return {"options": self.options.encoded(), "fullgraph": self.fullgraph, "dynamic": self.dynamic,
                "autocast_enabled": self.autocast_enabled, "autocast_dtype": dtype_name(self.autocast_dtype)}

    def precisions(self) -> frozenset[torch.dtype]:
        extra = {self.autocast_dtype} if self.autocast_enabled else set()
        return frozenset(self.options.settings.enabled_precisions) | extra


def _autocast(fn: Callable[..., Any], dtype: torch.dtype) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        with torch.autocast(device_type=device, dtype=dtype):
            return fn(*args, **kwargs)
    return run


class _AotPrograms:
    """Kiln AOT programs of one module, one per input signature; a call with a signature not seen
    yet compiles one then (torch.export and Kiln build static shapes)."""

    def __init__(self, module: torch.nn.Module, options: Mapping[str, Any]) -> None:
        self.module, self.options = module, dict(options)
        self.by_signature: dict[str, tuple[Callable[..., Any], Inputs | None, Any]] = {}
        self.by_key: dict[Any, Callable[..., Any]] = {}

    def add(self, sample: Inputs) -> Callable[..., Any]:
        import kiln

        compiled = kiln.compile(self.module, list(sample.args), dict(sample.kwargs) or None, **self.options)
        self.by_signature[signature(sample)] = (compiled, sample, None)
        return compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = fast_key(args, kwargs)
        fn = self.by_key.get(key)
        if fn is None:
            sample = Inputs(tuple(args), dict(kwargs))
            entry = self.by_signature.get(signature(sample))
            if entry is None:
                log.info("kiln.tune: compiling a Kiln AOT program for the new input signature (%s)", describe(sample))
                fn = self.add(sample)
            else:
                fn = entry[0]
            self.by_key[key] = fn
        return fn(*args, **kwargs)


class KilnAot(Backend):
    """``kiln.compile(module, sample_inputs, **options)`` per input signature; saved with
    ``kiln.save`` and restored with ``kiln.load`` (which checks every engine)."""

    kind = "kiln-aot"
    saves_artifacts = True

    def __init__(self, options: Mapping[str, Any] | CompilationSettings | None = None, *,
                 name: str | None = None) -> None:
        super().__init__(name)
        self.options = _KilnOptions(options)

    def compile(self, module: torch.nn.Module, samples: Sequence[Inputs]) -> Callable[..., Any]:
        programs = _AotPrograms(module, self.options.options)
        for sample in samples:
            if signature(sample) not in programs.by_signature:
                programs.add(sample)
        return programs

    def config(self) -> dict[str, Any]:
        return {"options": self.options.encoded()}

    def precisions(self) -> frozenset[torch.dtype]:
        return frozenset(self.options.settings.enabled_precisions)

    def save_artifacts(self, compiled: Callable[..., Any], directory: Path, stem: str) -> list[dict[str, Any]]:
        import kiln

        assert isinstance(compiled, _AotPrograms)
        records = []
        for i, (sig, (fn, sample, program)) in enumerate(sorted(compiled.by_signature.items())):
            name = f"{stem}.{i}.pt2"
            if program is not None:  # loaded from a file: saved as it was read
                with open(directory / name, "wb") as f:
                    torch.export.save(program, f)
            else:
                assert sample is not None
                kiln.save(fn, directory / name, list(sample.args), dict(sample.kwargs) or None)
            records.append({"file": name, "signature": sig})
        return records

    def load_artifacts(self, module: torch.nn.Module, directory: Path,
                       records: Sequence[Mapping[str, Any]]) -> Callable[..., Any]:
        import kiln

        programs = _AotPrograms(module, self.options.options)
        for record in records:
            program = kiln.load(directory / str(record["file"]))
            programs.by_signature[str(record["signature"])] = (program.module(), None, program)
        return programs


class Inductor(Backend):
    """``torch.compile(module, mode=mode, fullgraph=..., dynamic=..., options=options)``
    (TorchInductor); mode None is its default mode, "reduce-overhead" adds CUDA graphs."""

    kind = "inductor"

    def __init__(self, mode: str | None = None, *, fullgraph: bool = False, dynamic: bool | None = None,
                 options: Mapping[str, Any] | None = None, name: str | None = None) -> None:
        if mode not in (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
            raise ValueError(f"kiln.tune: Inductor mode {mode!r} is not one of default, reduce-overhead, "
                             "max-autotune, max-autotune-no-cudagraphs")
        if mode is not None and options:
            raise ValueError("kiln.tune: torch.compile takes either an Inductor mode or options, not both")
        mode = None if mode == "default" else mode
        super().__init__(name or (f"inductor-{mode}" if mode else "inductor"))
        self.mode, self.fullgraph, self.dynamic = mode, bool(fullgraph), dynamic
        self.options = dict(options or {})

    def compile(self, module: torch.nn.Module, samples: Sequence[Inputs]) -> Callable[..., Any]:
        compiled = torch.compile(module, backend="inductor", mode=self.mode, fullgraph=self.fullgraph,
                                 dynamic=self.dynamic, options=dict(self.options) or None)
        if self.mode not in ("reduce-overhead", "max-autotune"):
            return compiled

        # CUDA-graph modes return buffers that the next replay overwrites; a tuned module's output
        # may outlive that (a skip connection, a module called twice), so each call returns copies.
        def call(*args: Any, **kwargs: Any) -> Any:
            torch.compiler.cudagraph_mark_step_begin()
            return pytree.tree_map_only(torch.Tensor, torch.clone, compiled(*args, **kwargs))

        return call

    def config(self) -> dict[str, Any]:
        return {"mode": self.mode, "fullgraph": self.fullgraph, "dynamic": self.dynamic,
                "options": {k: _encode_option(k, v) for k, v in sorted(self.options.items())}}


_BY_NAME.update({
    "eager": Eager,
    "kiln": KilnJit,
    "kiln-jit": KilnJit,
    "kiln-aot": KilnAot,
    "inductor": Inductor,
    "inductor-reduce-overhead": lambda: Inductor("reduce-overhead"),
})
