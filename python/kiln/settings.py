"""Kiln's compilation settings: one validated, immutable object read by every entry point.

``torch.compile(m, backend="kiln", options={...})``, ``kiln.compile(m, arg_inputs, **kw)`` and
``kiln.save`` all turn their options into a :class:`CompilationSettings` through
:func:`settings_from_options`. Each field is declared once here with its type and default;
normalization and validation happen in ``__post_init__`` so that a settings object can only
exist in a valid state. An unknown key, a value of the wrong type or an impossible value raises
``ValueError`` naming the key (and, for unknown keys, listing the valid ones): an option is
never silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any, Union

import torch

from kiln.cache import EngineCache, default_cache_dir

__all__ = ["CompilationSettings", "settings_from_options", "option_names"]

# Compute precisions the builder understands (torch dtype -> canonical name).
_PRECISIONS: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}
_PRECISION_ALIASES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float": torch.float32, "fp32": torch.float32, "f32": torch.float32,
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16, "f16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}

MinBlockSize = Union[int, float]  # a positive int, or float("inf") to build nothing


def _default_cache_dir() -> str:
    return default_cache_dir()


@dataclasses.dataclass(frozen=True)
class CompilationSettings:
    """What Kiln builds and how. Every field is validated on construction.

    enabled_precisions: compute dtypes the builder may choose (float32, float16, bfloat16).
    min_block_size: a block of supported ops with fewer compute ops than this stays in PyTorch;
        ``float("inf")`` builds nothing (combined with ``debug`` it prints the dry-run report).
    torch_executed_ops: ATen ops ("aten.add", an overload "aten.add.Tensor", or the op objects)
        that are never put in an engine.
    require_full_compilation: raise instead of leaving any op in PyTorch.
    pass_through_build_failures: raise when an engine fails to build (default: warn and run
        that block in PyTorch).
    truncate_double: build float64 tensors as float32 where the importers allow it.
    optimization_level: 0 (fastest build) .. 5 (most tactic search).
    workspace_size: bytes of scratch memory an engine may use.
    allow_tf32: float32 matmuls, linears, attention and convolutions on CUDA may use TF32 tensor
        cores (10-bit mantissa products, float32 sums). False computes them in strict float32,
        at several times the cost. No effect on CPU.
    exact_gelu: keep exact (erf) GELU exact everywhere. False (the default) lets a float16 /
        bfloat16 linear's exact GELU run as cuBLASLt's tanh-form epilogue, at most 4.7e-4 away
        (below what half precision resolves). No effect on CPU or in float32.
    attention_tactic: which fused attention kernel serves a CUDA sdpa where both Kiln's generated
        flash kernel and cuDNN's serve it: "auto" (timed against each other; at
        optimization_level 0 the generated one), "generated" or "cudnn" (that one, untimed; a
        build fails when cuDNN offers no plan).
    device: "cpu", "cuda" or "cuda:N"; None builds for the device of the example inputs.
    debug: log every stage at DEBUG level.
    dryrun: True, or a file path: partition and report coverage, build nothing, run eagerly.
        The report is logged at INFO on the ``kiln.dryrun`` logger; a path receives it as a
        file; "-" prints it to stdout.
    cache_built_engines / reuse_cached_engines: store every engine Kiln builds in the engine
        cache / look each engine up there before building it. A hit is loaded and refitted with
        the current weights, so the cache needs mutable weights (docs/engine-cache.md).
    engine_cache_dir / engine_cache_size: the directory (default ``$XDG_CACHE_HOME/kiln/engines``,
        else ``~/.cache/kiln/engines``) and byte budget (least recently used entries are evicted)
        of the default on-disk store.
    engine_cache_key_file: the key that authenticates the on-disk store's entries; None (the
        default) uses the user's own key beside the cache. Name a key file to share a cache
        between users on purpose: whoever can read it may write entries (docs/safety.md).
    custom_engine_cache: a ``kiln.EngineCache`` to use instead of the on-disk store (e.g. one on
        shared storage); None uses the store set with ``kiln.cache.set_engine_cache``, else the
        on-disk one.
    immutable_weights: False (the default) builds refittable engines: each keeps the recipe that
        derives its folded constants from the model's weights, so ``kiln.refit`` can swap the
        weights without a rebuild (it costs no speed on the CPU backend). True builds engines
        whose weights cannot change (no refit program; ``kiln.refit`` raises on them, and so
        does a call after the model's weights changed in place), and is refused together with
        the engine cache, which reuses engines by refitting them.
    use_cuda_graphs: on a CUDA device, each engine call replays one captured CUDA graph (the
        engine is captured on its first call); False launches kernel by kernel. No effect on CPU.
    share_weights: True (the default): an engine reads the model's weights that it uses
        unchanged (dense, on its device, in its dtype) where the model keeps them, instead of
        holding a second copy; the weights it folds or converts are its own. The compiled model
        follows the model's weights: one changed in place (``load_state_dict``, ``copy_``) is
        refitted into the engines at the next call, and with
        ``immutable_weights=True`` that call raises instead (docs/safety.md). False copies every
        weight, the engines' and those the PyTorch parts read, so that the compiled model is a
        snapshot of the model when it was compiled (calls check no weights).
    """

    enabled_precisions: frozenset[torch.dtype] = frozenset({torch.float32})
    min_block_size: MinBlockSize = 5
    torch_executed_ops: frozenset[str] = frozenset()
    require_full_compilation: bool = False
    pass_through_build_failures: bool = False
    truncate_double: bool = False
    optimization_level: int = 3
    workspace_size: int = 1 << 30
    allow_tf32: bool = True
    exact_gelu: bool = False
    attention_tactic: str = "auto"
    device: str | None = None
    debug: bool = False
    dryrun: bool | str = False
    cache_built_engines: bool = False
    reuse_cached_engines: bool = False
    immutable_weights: bool = False
    engine_cache_dir: str = dataclasses.field(default_factory=_default_cache_dir)
    engine_cache_size: int = 5 << 30
    engine_cache_key_file: str | None = None
    custom_engine_cache: EngineCache | None = None
    use_cuda_graphs: bool = True
    share_weights: bool = True

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            normalize = _NORMALIZERS[f.name]
            object.__setattr__(self, f.name, normalize(f.name, value))
        self._check_combinations()

    def _check_combinations(self) -> None:
        if (self.cache_built_engines or self.reuse_cached_engines) and self.immutable_weights:
            raise ValueError(
                "cache_built_engines / reuse_cached_engines need immutable_weights=False: cached "
                "engines are reused by refitting their weights")
        if self.custom_engine_cache is not None and not (self.cache_built_engines or self.reuse_cached_engines):
            raise ValueError(
                "custom_engine_cache is set but neither cache_built_engines nor reuse_cached_engines is "
                "True: the store would never be used")
        if self.require_full_compilation and self.torch_executed_ops:
            raise ValueError(
                "require_full_compilation=True contradicts torch_executed_ops="
                f"{sorted(self.torch_executed_ops)}: those ops would stay in PyTorch")
        if self.require_full_compilation and math.isinf(self.min_block_size):
            raise ValueError("require_full_compilation=True contradicts min_block_size=inf "
                             "(which builds no engine)")

    @property
    def builds_nothing(self) -> bool:
        """A dry run: partition and report, build no engine."""
        return bool(self.dryrun) or math.isinf(self.min_block_size)

    def replace(self, **changes: Any) -> CompilationSettings:
        """A copy with some fields changed (validated like any construction)."""
        _check_keys(changes)
        return dataclasses.replace(self, **changes)


def option_names() -> list[str]:
    return [f.name for f in dataclasses.fields(CompilationSettings)]


def _check_keys(options: Mapping[str, Any]) -> None:
    valid = option_names()
    for key in options:
        if not isinstance(key, str) or key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ValueError(f"unknown Kiln option {key!r}{hint}; valid options: {', '.join(valid)}")


def settings_from_options(options: Mapping[str, Any] | CompilationSettings | None = None,
                          **kwargs: Any) -> CompilationSettings:
    """Merges an options mapping (or settings object) and keyword options into settings."""
    if isinstance(options, CompilationSettings):
        base = options
        merged: dict[str, Any] = dict(kwargs)
        return base.replace(**merged) if merged else base
    if options is not None and not isinstance(options, Mapping):
        raise ValueError(f"Kiln options must be a dict, got {type(options).__name__}; "
                         f"valid options: {', '.join(option_names())}")
    merged = dict(options or {})
    for key, value in kwargs.items():
        if key in merged:
            raise ValueError(f"Kiln option {key!r} was given twice")
        merged[key] = value
    _check_keys(merged)
    return CompilationSettings(**merged)


# ---- per-field normalization -------------------------------------------------------------

def _type_error(key: str, expected: str, value: Any) -> ValueError:
    return ValueError(f"Kiln option {key!r} must be {expected}, got {value!r} "
                      f"({type(value).__name__})")


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _type_error(key, "a bool", value)
    return value


def _int_in(lo: int, hi: int | None) -> Any:
    def check(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(key, "an int", value)
        if value < lo or (hi is not None and value > hi):
            bound = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
            raise ValueError(f"Kiln option {key!r} must be {bound}, got {value}")
        return int(value)
    return check


def _min_block_size(key: str, value: Any) -> MinBlockSize:
    if isinstance(value, float) and math.isinf(value) and value > 0:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(key, "a positive int or float('inf')", value)
    if value < 1:
        raise ValueError(f"Kiln option {key!r} must be >= 1 (or float('inf')), got {value}")
    return int(value)


def _precisions(key: str, value: Any) -> frozenset[torch.dtype]:
    if isinstance(value, (torch.dtype, str)):
        value = {value}
    if not isinstance(value, Iterable):
        raise _type_error(key, "a set of torch dtypes", value)
    out: set[torch.dtype] = set()
    for item in value:
        dt = _PRECISION_ALIASES.get(item.lower()) if isinstance(item, str) else item
        if not isinstance(dt, torch.dtype) or dt not in _PRECISIONS:
            valid = ", ".join(f"torch.{n}" for n in _PRECISIONS.values())
            raise ValueError(f"Kiln option {key!r}: {item!r} is not a precision Kiln builds in; "
                             f"valid: {valid}")
        out.add(dt)
    if not out:
        raise ValueError(f"Kiln option {key!r} must name at least one precision")
    return frozenset(out)


def _op_name(key: str, item: Any) -> str:
    if isinstance(item, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        name = str(item)
    elif isinstance(item, str):
        name = item.strip()
        name = name[len("torch.ops."):] if name.startswith("torch.ops.") else name
    else:
        raise ValueError(f"Kiln option {key!r}: {item!r} is not an op name "
                         "(use 'aten.add', 'aten.add.Tensor' or torch.ops.aten.add)")
    parts = name.split(".")
    if len(parts) not in (2, 3):
        raise ValueError(f"Kiln option {key!r}: {item!r} is not an op name like 'aten.add' or "
                         "'aten.add.Tensor'")
    try:
        packet = getattr(getattr(torch.ops, parts[0]), parts[1])
        if len(parts) == 3:
            getattr(packet, parts[2])
    except (AttributeError, RuntimeError):
        raise ValueError(f"Kiln option {key!r}: no PyTorch op named {name!r}") from None
    return name


def _ops(key: str, value: Any) -> frozenset[str]:
    if isinstance(value, (str, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        raise _type_error(key, "a set of op names (e.g. {'aten.add.Tensor'})", value)
    if not isinstance(value, Iterable):
        raise _type_error(key, "a set of op names", value)
    return frozenset(_op_name(key, item) for item in value)


def _one_of(*names: str) -> Any:
    def check(key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise _type_error(key, "a str", value)
        if value not in names:
            raise ValueError(f"Kiln option {key!r} must be one of {', '.join(map(repr, names))}, got {value!r}")
        return value
    return check


def _device(key: str, value: Any) -> str | None:
    if value is None:
        return None
    try:
        dev = torch.device(value) if isinstance(value, (str, torch.device)) else None
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"Kiln option {key!r} must be 'cpu', 'cuda' or 'cuda:N', got {value!r}")
    if dev.type == "cpu":
        if dev.index not in (None, 0):
            raise ValueError(f"Kiln option {key!r} is {value!r}, but the CPU is one device: use 'cpu'")
        return "cpu"
    return f"cuda:{dev.index if dev.index is not None else 0}"


def _dryrun(key: str, value: Any) -> bool | str:
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if not path:
            raise ValueError(f"Kiln option {key!r}: an empty path; use True, False or a file path")
        return path
    raise _type_error(key, "a bool or a file path", value)


def _engine_cache(key: str, value: Any) -> EngineCache | None:
    if value is not None and not isinstance(value, EngineCache):
        raise _type_error(key, "a kiln.EngineCache (or None)", value)
    return value


def _path(key: str, value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise _type_error(key, "a directory path", value)
    return os.fspath(value)


def _optional_file(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise _type_error(key, "a file path or None", value)
    return os.fspath(value)


_NORMALIZERS: dict[str, Any] = {
    "enabled_precisions": _precisions,
    "min_block_size": _min_block_size,
    "torch_executed_ops": _ops,
    "require_full_compilation": _bool,
    "pass_through_build_failures": _bool,
    "truncate_double": _bool,
    "optimization_level": _int_in(0, 5),
    "workspace_size": _int_in(0, None),
    "allow_tf32": _bool,
    "exact_gelu": _bool,
    "attention_tactic": _one_of("auto", "generated", "cudnn"),
    "device": _device,
    "debug": _bool,
    "dryrun": _dryrun,
    "cache_built_engines": _bool,
    "reuse_cached_engines": _bool,
    "immutable_weights": _bool,
    "engine_cache_dir": _path,
    "engine_cache_size": _int_in(0, None),
    "engine_cache_key_file": _optional_file,
    "custom_engine_cache": _engine_cache,
    "use_cuda_graphs": _bool,
    "share_weights": _bool,
}

assert set(_NORMALIZERS) == {f.name for f in dataclasses.fields(CompilationSettings)}
