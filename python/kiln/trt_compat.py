"""Torch-TensorRT's option names: what each one becomes in Kiln.

Code written for Torch-TensorRT passes its ``CompilationSettings`` fields (as ``options=`` of
``torch.compile`` or keywords of ``torch_tensorrt.compile``); Kiln accepts every one of them
under its Torch-TensorRT name. :func:`translate` turns an options mapping into Kiln's own names
before :class:`kiln.settings.CompilationSettings` sees it:

* a field Kiln has under the same name passes through (``min_block_size``, ``dryrun``, ...);
* an alias becomes Kiln's field (``truncate_long_and_double`` -> ``truncate_double``,
  ``disable_tf32`` -> ``allow_tf32`` negated, ``make_refittable`` -> ``immutable_weights``
  negated, ...); an alias and the field it names, both given with different values, are an error;
* ``use_explicit_typing`` (and its older names) is what Kiln does with its default precisions,
  so it is checked against ``enabled_precisions``, not stored;
* a TensorRT-only option (DLA, engine capability, weight streaming, ...) has no effect in Kiln:
  it is accepted and reported by :func:`log_ignored` in one log line per compilation, at INFO
  when every value given is one that loses nothing in Kiln (Torch-TensorRT's default, mostly),
  else at WARNING.

Keys that are neither Kiln's nor Torch-TensorRT's are left in the mapping, for the settings'
unknown-key error. docs/torch-tensorrt.md has the same table for readers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch

from kiln._logging import get_logger

log = get_logger("settings")

__all__ = ["ALIASES", "NO_EFFECT", "TYPING_NAMES", "translate", "log_ignored", "trt_option_names"]

Normalizer = Callable[[str, Any], Any]


class Alias(NamedTuple):
    """A Torch-TensorRT name for a Kiln field."""

    field: str
    negated: bool = False  # a bool meaning the opposite of the field
    one_value: bool = False  # one element of the field's set

    def convert(self, name: str, value: Any, normalizers: Mapping[str, Normalizer]) -> Any:
        """The field's value for ``value`` given as ``name`` (checked under that name)."""
        if self.one_value:
            if isinstance(value, (set, frozenset, list, tuple)):
                raise ValueError(f"Kiln option {name!r} is one dtype (Torch-TensorRT 1.x / 2.1); give a set as "
                                 f"{self.field!r}")
            value = {value}
        kiln_value = normalizers[self.field](name, value)
        return not kiln_value if self.negated else kiln_value


# Torch-TensorRT name -> the Kiln field it sets.
ALIASES: dict[str, Alias] = {
    "truncate_long_and_double": Alias("truncate_double"),
    "disable_tf32": Alias("allow_tf32", negated=True),
    "make_refittable": Alias("immutable_weights", negated=True),
    "make_refitable": Alias("immutable_weights", negated=True),  # Torch-TensorRT 2.5's spelling
    "refit": Alias("immutable_weights", negated=True),
    "precision": Alias("enabled_precisions", one_value=True),
}

# Explicit (strong) typing: every op computes in the dtype the model gives it, which is what a
# Kiln build does when enabled_precisions is {torch.float32} (no reduced-precision rewrite).
TYPING_NAMES = ("use_explicit_typing", "use_strong_typing", "use_strong_types")


def _is_standard(value: Any) -> bool:
    return str(getattr(value, "name", value)).upper().rsplit(".", 1)[-1] == "STANDARD"


class NoEffect(NamedTuple):
    """A TensorRT-only option: the values that lose nothing in Kiln, and why it has no effect."""

    harmless: Callable[[Any], bool]
    reason: str


def _values(*harmless: Any) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        return any(value is h or (type(value) is type(h) and value == h) for h in harmless)
    return check


def _any(value: Any) -> bool:
    return True


_ONE_RUNTIME = "Kiln has one runtime (C++ engines run from a torch.nn.Module); it always serializes"
_NO_DLA = "Kiln builds for CUDA GPUs and the CPU; there is no DLA"

NO_EFFECT: dict[str, NoEffect] = {
    "max_aux_streams": NoEffect(_values(None), "an engine runs on the caller's stream"),
    "version_compatible": NoEffect(_values(False), "an engine file is read by the Kiln version that wrote it"),
    "use_python_runtime": NoEffect(_values(None, False), _ONE_RUNTIME),
    "use_fast_partitioner": NoEffect(_any, "Kiln has one partitioner (torch's capability-based one)"),
    "enable_experimental_decompositions": NoEffect(
        _values(False), "Kiln lowers with its own table: Core ATen minus the ops its importers take whole"),
    "assume_dynamic_shape_support": NoEffect(_values(False), "Kiln's importers check every shape themselves"),
    "sparse_weights": NoEffect(_values(False), "Kiln has no 2:4 sparse kernels"),
    "engine_capability": NoEffect(_is_standard, "Kiln has no safety or DLA kernel sets"),
    "num_avg_timing_iters": NoEffect(_values(1), "Kiln's tactic timing repeats a fixed number of times"),
    "dla_sram_size": NoEffect(_values(1 << 20), _NO_DLA),
    "dla_local_dram_size": NoEffect(_values(1 << 30), _NO_DLA),
    "dla_global_dram_size": NoEffect(_values(512 << 20), _NO_DLA),
    "hardware_compatible": NoEffect(_values(False), "an engine runs on the GPU model it was built for"),
    "lazy_engine_init": NoEffect(_values(False), "Kiln sets an engine up when it is built"),
    "refit_identical_engine_weights": NoEffect(_values(False), "kiln.refit finds weights by name in every engine"),
    "strip_engine_weights": NoEffect(_values(False), "Kiln's engine files keep their weights"),
    "enable_weight_streaming": NoEffect(_values(False), "Kiln keeps every weight on the device"),
    "enable_cross_compile_for_windows": NoEffect(_values(False), "Kiln builds for the machine it runs on"),
    "tiling_optimization_level": NoEffect(_values("none"), "TensorRT's tiling search; Kiln has none"),
    "l2_limit_for_tiling": NoEffect(_values(-1), "TensorRT's tiling search; Kiln has none"),
    "use_distributed_mode_trace": NoEffect(_values(False), "Kiln lowers with torch.export, not aot_autograd"),
    "offload_module_to_cpu": NoEffect(_values(False), "Kiln does not move the model's weights"),
    "enable_resource_partitioning": NoEffect(_values(False), "Kiln does not split engines by host memory"),
    "cpu_memory_budget": NoEffect(_values(None), "Kiln does not split engines by host memory"),
    "dynamically_allocate_resources": NoEffect(
        _values(False), "an execution context keeps its memory between calls"),
    "decompose_attention": NoEffect(_values(False), "Kiln keeps attention whole where its importer takes it"),
    "attn_bias_is_causal": NoEffect(_any, "Kiln reads an attention mask as given and assumes nothing"),
    "use_fp32_acc": NoEffect(_any, "Kiln's float16 / bfloat16 matmuls always accumulate in float32"),
    "use_complex_decomposition": NoEffect(_any, "complex ops stay in PyTorch"),
    "fallback_data_dependent_ops": NoEffect(_any, "ops Kiln cannot build always stay in PyTorch"),
}


def trt_option_names() -> list[str]:
    """Every Torch-TensorRT name Kiln translates or ignores (not those it shares with Kiln)."""
    return sorted([*ALIASES, *TYPING_NAMES, *NO_EFFECT])


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"Kiln option {name!r} must be a bool, got {value!r} ({type(value).__name__})")
    return value


def translate(options: Mapping[str, Any], normalizers: Mapping[str, Normalizer]
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(options under Kiln's names, the TensorRT-only options given). Unknown keys stay."""
    given: dict[str, list[tuple[str, Any, bool]]] = {}  # field -> (name given, value, is it Kiln's value)
    ignored: dict[str, Any] = {}
    typing: list[str] = []
    for key, value in options.items():
        if key in NO_EFFECT:
            ignored[key] = value
        elif key in TYPING_NAMES:
            if _bool(key, value):
                typing.append(key)
        elif isinstance(key, str) and key in ALIASES:
            alias = ALIASES[key]
            given.setdefault(alias.field, []).append((key, alias.convert(key, value, normalizers), True))
        else:
            given.setdefault(key, []).append((key, value, False))
    out: dict[str, Any] = {}
    for field, entries in given.items():
        if len(entries) > 1:  # a field and its alias, or two aliases: the same value or an error
            values = [v if converted else normalizers[field](name, v) for name, v, converted in entries]
            if any(v != values[0] for v in values[1:]):
                (a, _, _), (b, _, _) = entries[0], entries[1]
                raise ValueError(f"Kiln option {field!r} was given twice with different values: as "
                                 f"{a}={options[a]!r} and as {b}={options[b]!r}")
        out[field] = entries[0][1]
    if typing and "enabled_precisions" in out:
        precisions = normalizers["enabled_precisions"]("enabled_precisions", out["enabled_precisions"])
        if precisions != frozenset({torch.float32}):
            raise ValueError(f"Kiln option {typing[0]!r}=True computes every op in the dtype the model gives it, "
                             f"so 'enabled_precisions' must be {{torch.float32}}, got "
                             f"{sorted(str(p) for p in precisions)}")
    return out, ignored


def log_ignored(ignored: Mapping[str, Any]) -> None:
    """One log line naming every TensorRT-only option given and why it has no effect in Kiln."""
    if not ignored:
        return
    parts = [f"{key}={value!r} ({NO_EFFECT[key].reason})" for key, value in ignored.items()]
    lossy = any(not NO_EFFECT[key].harmless(value) for key, value in ignored.items())
    log.log(logging.WARNING if lossy else logging.INFO, "Torch-TensorRT options with no effect in Kiln, ignored: %s",
            "; ".join(parts))
