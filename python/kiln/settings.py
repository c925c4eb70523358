"""Kiln's compilation settings: one validated, immutable object read by every entry point.

``torch.compile(m, backend="kiln", options={...})``, ``kiln.compile(m, arg_inputs, **kw)`` and
``kiln.save`` all turn their options into a :class:`CompilationSettings` through
:func:`settings_from_options`. Each field is declared once here with its type and default;
normalization and validation happen in ``__post_init__`` so that a settings object can only
exist in a valid state. An unknown key, a value of the wrong type or an impossible value raises
``ValueError`` naming the key (and, for unknown keys, listing the valid ones): an option is
never silently ignored.

Every Torch-TensorRT option is accepted under its Torch-TensorRT name too (kiln/trt_compat.py):
aliases become these fields, and options that only mean something to TensorRT are named in one
log line saying they have no effect. A torch.compile ``mode`` sets the fields listed in
:data:`MODES`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, Union

import torch

from kiln import trt_compat
from kiln.cache import EngineCache, default_cache_dir

__all__ = ["CompilationSettings", "settings_from_options", "option_names", "MODES"]

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

_REDUCED_PRECISIONS = (torch.float16, torch.bfloat16)

MinBlockSize = Union[int, float]  # a positive int, or float("inf") to build nothing

_DEFAULT_WORKSPACE = 1 << 30
_DEFAULT_OPTIMIZATION_LEVEL = 3

# torch.compile's mode strings -> the Kiln settings each one sets. Kiln's defaults already replay
# one CUDA graph per engine call, so "reduce-overhead" only insists on it; "lite" (Inductor with
# its optional passes off, for a quick compile) is the quickest build: no tactic timing.
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "lite": {"optimization_level": 0},
    "reduce-overhead": {"use_cuda_graphs": True},
    "max-autotune": {"optimization_level": 5, "use_cuda_graphs": True},
    "max-autotune-no-cudagraphs": {"optimization_level": 5, "use_cuda_graphs": False},
}


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
    optimization_level: 0 (fastest build) .. 5 (most tactic search); None means 3. On CUDA it
        sets how many candidates each tactic search tries (include/kiln/build_policy.h):
        level 0 times nothing and takes each search's first candidate (cuBLASLt's heuristic
        choice, cuDNN's first plan, the generated attention kernel), levels 1..4 time 2, 4, 8
        and 16 candidates (cuBLASLt algorithms, cuDNN convolution and attention plans), level 5
        times every candidate, runtime-compiled cuDNN plans included. The CPU backend has one
        kernel per op and searches nothing: there the level is recorded in the engine and
        changes nothing else. The passes (folding, fusion, layout, memory planning) run at
        every level.
    workspace_size: bytes of scratch memory one execution context of an engine may use (0, as
        in Torch-TensorRT, means the default, 1 GiB). The builder keeps every kernel within it:
        cuBLASLt GEMMs are planned for at most this much, cuDNN convolution and attention plans
        that need more are skipped, the unfused attention fallback splits it between its GEMMs
        and its score buffer; a plan whose kernels still need more fails to build with an error
        naming both sizes (that block then runs in PyTorch, or the build error is raised with
        ``pass_through_build_failures``).
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
    device: "cpu", "cuda", "cuda:N" or a GPU index; None builds for the device of the example inputs.
    debug: log every stage at DEBUG level.
    dryrun: True, or a file path: partition and report coverage, build nothing, run eagerly.
        True (or "-") prints the report to stdout; a path receives it as a file (the first
        report of a process replaces the file, later ones are appended). It is also logged on
        the ``kiln.dryrun`` logger: at INFO when written to a file, at DEBUG when printed.
    mode: the torch.compile mode these settings follow (torch.compile(..., mode=...), or this
        option where torch.compile takes options): "default" (Kiln's defaults), "lite"
        (optimization_level=0), "reduce-overhead" (CUDA graphs on, which is Kiln's default),
        "max-autotune" (optimization_level=5, CUDA graphs on), "max-autotune-no-cudagraphs"
        (optimization_level=5, CUDA graphs off). An option given that contradicts the mode is an
        error; the dry-run report says what the mode set.
    timing_cache_path: the file of tactic timings shared by every CUDA build (None: beside the
        engine cache, ``<engine_cache_dir>/timing.cache``). No effect on CPU, which times nothing.
    cache_built_engines / reuse_cached_engines: store every engine Kiln builds in the engine
        cache / look each engine up there before building it. A hit is loaded and refitted with
        the current weights, so the cache needs mutable weights (docs/engine-cache.md).
    module_key: with reuse_cached_engines, a warm ``kiln.compile`` looks its program up by a key
        of the module itself (its classes' source, attributes, weights' metadata, inputs and
        settings) before running torch.export, and skips the export on a hit (True, the default).
        False always exports; the exact key of the exported program still applies
        (docs/engine-cache.md says what the module key covers).
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
    enable_autocast: rewrite the graph before partitioning so that the ops it judges safe run in
        ``autocast_low_precision_type`` and the rest in float32 (kiln/autocast.py). With a low
        precision type, ``enabled_precisions`` must stay {torch.float32}: the autocast pass, not
        the builder, chooses each op's precision. Without one (None) it changes nothing.
    autocast_low_precision_type: torch.float16 or torch.bfloat16 (or "fp16", "bf16", ...), or None.
    autocast_excluded_nodes: regular expressions; a node whose name matches one (re.search)
        stays in float32. Kept as a sorted tuple of the patterns.
    autocast_excluded_ops: ATen ops (named as in ``torch_executed_ops``) that stay in float32.
    autocast_max_output_threshold: a node whose output reaches this magnitude stays in float32.
    autocast_max_depth_of_reduction: a node fed by more chained reductions than this stays in
        float32; None means no limit.
    autocast_calibration_dataloader: an iterable of example inputs whose run measures each
        node's output range for the threshold; None judges from the example inputs.
    specialization_cache_size: how many concrete shapes of a dynamic program (kiln.dynamic) keep
        engines built for them at once; the least recently used beyond it is dropped (built again
        if its shape comes back). Shapes served by instances of a range engine on its shared arena
        (kiln/instances.py) hold no weights or arena of their own and are kept apart, up to 1024.
        An int >= 1, default 8.
    dynamic_max_size: the largest size served for a dynamic dim whose range has no upper bound
        (a torch.export Dim without max, Dynamo's automatic dynamic shapes). An int >= 2,
        default 4096; a larger size is outside the program's range (kiln.compile raises,
        torch.compile builds that shape statically).
    dynamic_instances: whether a block of a dynamic program whose plan is the same at every size
        in its range but for its sizes (polynomials of the symbols, kiln/size_program.h) serves new
        sizes by instances of the engine built at the opt shape (kiln/instances.py: no build per
        size, the weights shared). False builds an engine per size. Default True.
    """

    enabled_precisions: frozenset[torch.dtype] = frozenset({torch.float32})
    min_block_size: MinBlockSize = 5
    torch_executed_ops: frozenset[str] = frozenset()
    require_full_compilation: bool = False
    pass_through_build_failures: bool = False
    truncate_double: bool = False
    optimization_level: int = _DEFAULT_OPTIMIZATION_LEVEL
    workspace_size: int = _DEFAULT_WORKSPACE
    allow_tf32: bool = True
    exact_gelu: bool = False
    attention_tactic: str = "auto"
    device: str | None = None
    debug: bool = False
    dryrun: bool | str = False
    cache_built_engines: bool = False
    reuse_cached_engines: bool = False
    module_key: bool = True
    immutable_weights: bool = False
    engine_cache_dir: str = dataclasses.field(default_factory=_default_cache_dir)
    engine_cache_size: int = 5 << 30
    engine_cache_key_file: str | None = None
    custom_engine_cache: EngineCache | None = None
    use_cuda_graphs: bool = True
    share_weights: bool = True
    mode: str | None = None
    timing_cache_path: str | None = None
    enable_autocast: bool = False
    autocast_low_precision_type: torch.dtype | None = None
    autocast_excluded_nodes: tuple[str, ...] = ()
    autocast_excluded_ops: frozenset[str] = frozenset()
    autocast_max_output_threshold: float = 512.0
    autocast_max_depth_of_reduction: int | None = None
    autocast_calibration_dataloader: Any | None = None
    specialization_cache_size: int = 8
    dynamic_max_size: int = 4096
    dynamic_instances: bool = True

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            normalize = _NORMALIZERS[f.name]
            object.__setattr__(self, f.name, normalize(f.name, value))
        self._apply_mode()
        self._check_combinations()

    def _apply_mode(self) -> None:
        """The mode's values go into fields left at their defaults; another value is an error."""
        if self.mode is None:
            return
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, value in MODES[self.mode].items():
            current = getattr(self, name)
            if current != value:
                if current != defaults[name]:
                    raise _mode_conflict(self.mode, name, current)
                object.__setattr__(self, name, value)

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
        if self.enable_autocast and self.autocast_low_precision_type is not None and \
                self.enabled_precisions != frozenset({torch.float32}):
            raise ValueError(
                "enable_autocast=True chooses each op's precision itself, so enabled_precisions must be "
                f"{{torch.float32}}, got {sorted(_PRECISIONS[p] for p in self.enabled_precisions)}")

    @property
    def builds_nothing(self) -> bool:
        """A dry run: partition and report, build no engine."""
        return bool(self.dryrun) or math.isinf(self.min_block_size)

    def replace(self, **changes: Any) -> CompilationSettings:
        """A copy with some fields changed (validated like any construction); Torch-TensorRT's
        names are accepted as in :func:`settings_from_options`."""
        kiln_changes, ignored = trt_compat.translate(changes, _NORMALIZERS)
        _check_keys(kiln_changes)
        mode = kiln_changes.get("mode", self.mode)
        _check_mode(mode, kiln_changes)
        settings = dataclasses.replace(self, **kiln_changes)
        trt_compat.log_ignored(ignored)
        return settings


def option_names() -> list[str]:
    return [f.name for f in dataclasses.fields(CompilationSettings)]


def _check_keys(options: Mapping[str, Any]) -> None:
    valid = option_names()
    for key in options:
        if not isinstance(key, str) or key not in valid:
            close = difflib.get_close_matches(str(key), valid + trt_compat.trt_option_names(), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ValueError(f"unknown Kiln option {key!r}{hint}; valid options: {', '.join(valid)} "
                             "(and Torch-TensorRT's names for them: docs/torch-tensorrt.md)")


def _mode_conflict(mode: str, name: str, value: Any) -> ValueError:
    return ValueError(f"torch.compile mode {mode!r} sets {name}={MODES[mode][name]!r}, but {name}={value!r} "
                      "was given; drop one of them")


def _check_mode(mode: Any, options: Mapping[str, Any]) -> None:
    """Options given explicitly must agree with the mode (a value equal to the field's default
    is indistinguishable from none once the settings exist, so it is checked here)."""
    if not isinstance(mode, str) or mode not in MODES:
        return  # not a mode: the field's own check reports it
    for name, value in MODES[mode].items():
        if name in options and _NORMALIZERS[name](name, options[name]) != value:
            raise _mode_conflict(mode, name, options[name])


def settings_from_options(options: Mapping[str, Any] | CompilationSettings | None = None,
                          **kwargs: Any) -> CompilationSettings:
    """Merges an options mapping (or settings object) and keyword options into settings.

    Keys are Kiln's field names or Torch-TensorRT's (kiln/trt_compat.py): aliases become
    Kiln's fields, TensorRT-only options are accepted and named in one log line."""
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
    kiln_options, ignored = trt_compat.translate(merged, _NORMALIZERS)
    _check_keys(kiln_options)
    _check_mode(kiln_options.get("mode"), kiln_options)
    settings = CompilationSettings(**kiln_options)
    trt_compat.log_ignored(ignored)
    return settings


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


def _as_dtype(item: Any) -> Any:
    """A torch dtype from a dtype, a name ("fp16", "bfloat16", ...) or an object that converts
    itself with ``.to(torch.dtype)`` (torch_tensorrt.dtype); anything else is returned as is."""
    if isinstance(item, str):
        return _PRECISION_ALIASES.get(item.lower(), item)
    if not isinstance(item, (torch.dtype, torch.Tensor)) and callable(getattr(item, "to", None)):
        try:
            converted = item.to(torch.dtype)
        except Exception:  # noqa: BLE001 - not a dtype-like object: reported by the caller
            return item
        return converted if isinstance(converted, torch.dtype) else item
    return item


def _precisions(key: str, value: Any) -> frozenset[torch.dtype]:
    dtype_like = not isinstance(value, Iterable) and callable(getattr(value, "to", None))
    if isinstance(value, (torch.dtype, str)) or dtype_like:
        value = {value}  # one precision
    if not isinstance(value, Iterable):
        raise _type_error(key, "a set of torch dtypes", value)
    out: set[torch.dtype] = set()
    for item in value:
        dt = _as_dtype(item)
        if not isinstance(dt, torch.dtype) or dt not in _PRECISIONS:
            valid = ", ".join(f"torch.{n}" for n in _PRECISIONS.values())
            raise ValueError(f"Kiln option {key!r}: {item!r} is not a precision Kiln builds in; "
                             f"valid: {valid} (Kiln has no int8 / float8 / float4 kernels)")
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
    if not isinstance(value, (str, torch.device, int)) and isinstance(getattr(value, "gpu_id", None), int):
        # a torch_tensorrt.Device: its GPU, unless it names a DLA core
        if "DLA" in str(getattr(value, "device_type", "")).upper():
            raise ValueError(f"Kiln option {key!r} is {value!r}: Kiln builds for CUDA GPUs and the CPU, not DLA")
        value = f"cuda:{value.gpu_id}"
    dev: torch.device | None = None
    try:
        if isinstance(value, int) and not isinstance(value, bool):
            dev = torch.device("cuda", value)  # a GPU index, as torch_tensorrt.Device(gpu_id=N)
        elif isinstance(value, (str, torch.device)):
            dev = torch.device(value)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"Kiln option {key!r} must be 'cpu', 'cuda', 'cuda:N' or a GPU index, got {value!r}")
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


def _or_default(check: Any, default: Any, *defaulted: Any) -> Any:
    """``check`` after mapping the values in ``defaulted`` to ``default`` (Torch-TensorRT's
    "let the builder choose": optimization_level=None, workspace_size=0)."""
    def normalize(key: str, value: Any) -> Any:
        if any(value is d or (type(value) is type(d) and value == d) for d in defaulted):
            return default
        return check(key, value)
    return normalize


def _mode(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in MODES:
        raise ValueError(f"torch.compile mode {value!r} is not a mode Kiln knows; valid: "
                         f"{', '.join(map(repr, MODES))} (or None)")
    return value


def _low_precision(key: str, value: Any) -> torch.dtype | None:
    if value is None:
        return None
    dt = _as_dtype(value)
    if dt not in _REDUCED_PRECISIONS:
        raise ValueError(f"Kiln option {key!r} must be torch.float16 or torch.bfloat16 (or None), got {value!r}")
    return dt


def _patterns(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise _type_error(key, "a set of regular expressions (e.g. {'^conv1$', 'relu'})", value)
    out: set[str] = set()
    for item in value:
        if not isinstance(item, str):
            raise ValueError(f"Kiln option {key!r}: {item!r} is not a regular expression (a str)")
        try:
            re.compile(item)
        except re.error as err:
            raise ValueError(f"Kiln option {key!r}: {item!r} is not a valid regular expression ({err})") from None
        out.add(item)
    return tuple(sorted(out))


def _positive_float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error(key, "a number", value)
    if not value > 0:  # also rejects nan
        raise ValueError(f"Kiln option {key!r} must be > 0, got {value}")
    return float(value)


def _optional_depth(key: str, value: Any) -> int | None:
    return None if value is None else _int_in(0, None)(key, value)


def _optional_iterable(key: str, value: Any) -> Any | None:
    if value is not None and not isinstance(value, Iterable):
        raise _type_error(key, "an iterable of example inputs (e.g. a DataLoader) or None", value)
    return value


_NORMALIZERS: dict[str, Any] = {
    "enabled_precisions": _precisions,
    "min_block_size": _min_block_size,
    "torch_executed_ops": _ops,
    "require_full_compilation": _bool,
    "pass_through_build_failures": _bool,
    "truncate_double": _bool,
    "optimization_level": _or_default(_int_in(0, 5), _DEFAULT_OPTIMIZATION_LEVEL, None),
    "workspace_size": _or_default(_int_in(0, None), _DEFAULT_WORKSPACE, 0),
    "allow_tf32": _bool,
    "exact_gelu": _bool,
    "attention_tactic": _one_of("auto", "generated", "cudnn"),
    "device": _device,
    "debug": _bool,
    "dryrun": _dryrun,
    "cache_built_engines": _bool,
    "reuse_cached_engines": _bool,
    "module_key": _bool,
    "immutable_weights": _bool,
    "engine_cache_dir": _path,
    "engine_cache_size": _int_in(0, None),
    "engine_cache_key_file": _optional_file,
    "custom_engine_cache": _engine_cache,
    "use_cuda_graphs": _bool,
    "share_weights": _bool,
    "mode": _mode,
    "timing_cache_path": _optional_file,
    "enable_autocast": _bool,
    "autocast_low_precision_type": _low_precision,
    "autocast_excluded_nodes": _patterns,
    "autocast_excluded_ops": _ops,
    "autocast_max_output_threshold": _positive_float,
    "autocast_max_depth_of_reduction": _optional_depth,
    "autocast_calibration_dataloader": _optional_iterable,
    "specialization_cache_size": _int_in(1, None),
    "dynamic_max_size": _int_in(2, None),
    "dynamic_instances": _bool,
}

assert set(_NORMALIZERS) == {f.name for f in dataclasses.fields(CompilationSettings)}
