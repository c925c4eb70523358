"""Code written for Torch-TensorRT runs on Kiln unchanged: every Torch-TensorRT option name is
accepted (implemented, an alias of Kiln's own, or named in one log line as having no effect),
torch.compile's mode strings map to Kiln settings, and the dry run prints its report.

The option dictionaries below are copied from Torch-TensorRT's documentation and its
``_defaults.py`` as data; every compiled result is compared with eager PyTorch on the CPU.
"""

from __future__ import annotations

import enum
import logging
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

import kiln
import kiln.dynamo
from harness import compile_and_compare
from kiln import trt_compat
from kiln.settings import MODES, CompilationSettings, option_names, settings_from_options

torch.manual_seed(0)

REPO = Path(__file__).resolve().parents[2]


class EngineCapability(enum.Enum):
    """Stands in for torch_tensorrt.EngineCapability (Kiln reads the member's name)."""

    STANDARD = 0
    SAFETY = 1
    DLA_STANDALONE = 2


def trt_defaults(tmp_path: Path) -> dict[str, Any]:
    """Every field of Torch-TensorRT's current ``CompilationSettings`` with its default
    (torch_tensorrt/dynamo/_defaults.py); the CUDA device and /tmp paths are replaced by the CPU
    and a test directory."""
    return {
        "enabled_precisions": {torch.float32},
        "debug": False,
        "workspace_size": 0,
        "min_block_size": 5,
        "torch_executed_ops": set(),
        "pass_through_build_failures": False,
        "max_aux_streams": None,
        "version_compatible": False,
        "optimization_level": None,
        "use_python_runtime": False,
        "truncate_double": False,
        "use_fast_partitioner": True,
        "enable_experimental_decompositions": False,
        "device": "cpu",
        "require_full_compilation": False,
        "disable_tf32": False,
        "assume_dynamic_shape_support": False,
        "sparse_weights": False,
        "engine_capability": EngineCapability.STANDARD,
        "num_avg_timing_iters": 1,
        "dla_sram_size": 1048576,
        "dla_local_dram_size": 1073741824,
        "dla_global_dram_size": 536870912,
        "dryrun": False,
        "hardware_compatible": False,
        "timing_cache_path": str(tmp_path / "timing_cache.bin"),
        "lazy_engine_init": False,
        "cache_built_engines": False,
        "reuse_cached_engines": False,
        "engine_cache_dir": str(tmp_path / "engines"),
        "engine_cache_size": 5368709120,
        "custom_engine_cache": None,
        "use_explicit_typing": True,
        "use_fp32_acc": False,
        "refit_identical_engine_weights": False,
        "strip_engine_weights": False,
        "immutable_weights": True,
        "enable_weight_streaming": False,
        "enable_cross_compile_for_windows": False,
        "tiling_optimization_level": "none",
        "l2_limit_for_tiling": -1,
        "use_distributed_mode_trace": False,
        "offload_module_to_cpu": False,
        "enable_autocast": False,
        "autocast_low_precision_type": None,
        "autocast_excluded_nodes": set(),
        "autocast_excluded_ops": set(),
        "autocast_max_output_threshold": 512,
        "autocast_max_depth_of_reduction": None,
        "autocast_calibration_dataloader": None,
        "enable_resource_partitioning": False,
        "cpu_memory_budget": None,
        "dynamically_allocate_resources": False,
        "decompose_attention": False,
        "attn_bias_is_causal": True,
        "use_complex_decomposition": False,
        "fallback_data_dependent_ops": False,
    }


# Names earlier Torch-TensorRT releases used, still found in code written for them.
OLDER_NAMES = {"truncate_long_and_double": True, "make_refittable": True, "make_refitable": True, "refit": True,
               "precision": torch.float32, "use_strong_types": True, "use_strong_typing": True}

# The torch.compile guide's "Custom Setting Usage" options, as written there.
TORCH_COMPILE_GUIDE_OPTIONS: dict[str, Any] = {
    "truncate_long_and_double": True,
    "enabled_precisions": {torch.float, torch.half},
    "debug": True,
    "min_block_size": 2,
    "torch_executed_ops": {"torch.ops.aten.sub.Tensor"},
    "optimization_level": 4,
    "use_python_runtime": False,
}

# The guide's operator-coverage options (a dry run through debug).
COVERAGE_OPTIONS: dict[str, Any] = {"debug": True, "min_block_size": float("inf")}


class Net(nn.Module):
    """Two linear blocks around a subtraction (the op the guide keeps in PyTorch)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = h - torch.sigmoid(h)
        return self.fc3(torch.tanh(self.fc2(h)) * h)


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "kiln.settings" and "no effect in Kiln" in r.getMessage()]


# ---- every option name is accepted ---------------------------------------------------------------

def test_every_torch_tensorrt_default_is_accepted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="kiln.settings"):
        s = settings_from_options(trt_defaults(tmp_path))
    assert s.optimization_level == 3 and s.workspace_size == 1 << 30  # None / 0: the builder's default
    assert s.immutable_weights and s.allow_tf32 and not s.truncate_double and s.device == "cpu"
    assert s.autocast_max_output_threshold == 512.0 and s.autocast_excluded_nodes == ()
    assert s.timing_cache_path == str(tmp_path / "timing_cache.bin")
    records = _records(caplog)
    assert len(records) == 1 and records[0].levelno == logging.INFO  # defaults lose nothing
    message = records[0].getMessage()
    for name in trt_compat.NO_EFFECT:
        if name in trt_defaults(tmp_path):
            assert f"{name}=" in message


def test_every_name_is_kiln_or_torch_tensorrt() -> None:
    known = set(option_names()) | set(trt_compat.trt_option_names())
    assert set(trt_defaults(Path("/x"))) | set(OLDER_NAMES) <= known
    # A Kiln name never doubles as a Torch-TensorRT alias or a no-effect name.
    assert not set(option_names()) & set(trt_compat.trt_option_names())


def test_older_names_are_accepted() -> None:
    s = settings_from_options(OLDER_NAMES)
    assert s.truncate_double and not s.immutable_weights and s.enabled_precisions == frozenset({torch.float32})


def test_defaults_compile_unchanged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    options = trt_defaults(tmp_path) | {"min_block_size": 1}
    with caplog.at_level(logging.INFO, logger="kiln.settings"):
        result = compile_and_compare(Net().eval(), [torch.randn(4, 16)], options=options, via="aot")
    assert result.engines == 1 and result.coverage == 100.0
    assert len(_records(caplog)) == 1  # one line per compilation


# ---- the documentation's option dictionaries -----------------------------------------------------

def test_torch_compile_guide_options(caplog: pytest.LogCaptureFixture) -> None:
    x = torch.randn(4, 16)
    with caplog.at_level(logging.INFO, logger="kiln"):
        result = compile_and_compare(Net().eval(), [x], options=TORCH_COMPILE_GUIDE_OPTIONS)
    assert result.engines == 2  # the subtraction splits the graph
    assert result.ops_in_pytorch == {"aten.sub.Tensor": 1}
    settings = result.graphs[0].settings
    assert settings.truncate_double and settings.optimization_level == 4
    assert settings.enabled_precisions == frozenset({torch.float32, torch.float16})
    assert settings.torch_executed_ops == frozenset({"aten.sub.Tensor"})
    records = _records(caplog)
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert "use_python_runtime=False" in records[0].getMessage()
    assert any("Kiln dry run" in r.getMessage() for r in caplog.records)  # debug=True reports the partition


def test_torch_compile_guide_options_with_the_string_backend() -> None:
    m, x = Net().eval(), torch.randn(4, 16)
    torch._dynamo.reset()
    with torch.no_grad():
        fast = torch.compile(m, backend="kiln", dynamic=False, options=dict(TORCH_COMPILE_GUIDE_OPTIONS))
        torch.testing.assert_close(fast(x), m(x), atol=1e-4, rtol=1e-4)


def test_kiln_compile_takes_the_guide_options_as_keywords() -> None:
    result = compile_and_compare(Net().eval(), [torch.randn(4, 16)], options=TORCH_COMPILE_GUIDE_OPTIONS, via="aot")
    assert result.engines == 2 and result.ops_in_pytorch == {"aten.sub.Tensor": 1}


def test_coverage_options_build_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="kiln.dryrun"):
        result = compile_and_compare(Net().eval(), [torch.randn(4, 16)], options=COVERAGE_OPTIONS)
    assert result.engines == 0
    assert any("coverage:" in r.getMessage() for r in caplog.records if r.name == "kiln.dryrun")


def test_autocast_example_options_are_settings() -> None:
    """The autocast example's keywords (torch_tensorrt.compile(..., enable_autocast=True, ...))."""
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 16)), batch_size=2)
    s = settings_from_options(min_block_size=1, use_python_runtime=True, use_explicit_typing=True,
                              enable_autocast=True, autocast_low_precision_type=torch.bfloat16,
                              autocast_excluded_nodes={"^conv1$", "relu"},
                              autocast_excluded_ops={"torch.ops.aten.flatten.using_ints"},
                              autocast_max_output_threshold=512, autocast_max_depth_of_reduction=None,
                              autocast_calibration_dataloader=loader)
    assert s.enable_autocast and s.autocast_low_precision_type is torch.bfloat16
    assert s.autocast_excluded_nodes == ("^conv1$", "relu")
    assert s.autocast_excluded_ops == frozenset({"aten.flatten.using_ints"})
    assert s.autocast_max_output_threshold == 512.0 and isinstance(s.autocast_max_output_threshold, float)
    assert s.autocast_max_depth_of_reduction is None and s.autocast_calibration_dataloader is loader
    assert settings_from_options(autocast_low_precision_type="fp16").autocast_low_precision_type is torch.float16
    assert settings_from_options(autocast_excluded_ops={torch.ops.aten.softmax.int},
                                 autocast_max_depth_of_reduction=3).autocast_excluded_ops == {"aten.softmax.int"}


@pytest.mark.parametrize("options,fragment", [
    ({"autocast_low_precision_type": torch.float32}, "'autocast_low_precision_type' must be torch.float16 or"),
    ({"autocast_low_precision_type": "int8"}, "'autocast_low_precision_type' must be torch.float16 or"),
    ({"autocast_excluded_nodes": "relu"}, "'autocast_excluded_nodes' must be a set of regular expressions"),
    ({"autocast_excluded_nodes": {"conv("}}, "'autocast_excluded_nodes': 'conv(' is not a valid regular expression"),
    ({"autocast_excluded_nodes": {3}}, "'autocast_excluded_nodes': 3 is not a regular expression"),
    ({"autocast_excluded_ops": {"aten.nope"}}, "'autocast_excluded_ops': no PyTorch op named 'aten.nope'"),
    ({"autocast_max_output_threshold": 0}, "'autocast_max_output_threshold' must be > 0"),
    ({"autocast_max_output_threshold": math.nan}, "'autocast_max_output_threshold' must be > 0"),
    ({"autocast_max_output_threshold": "512"}, "'autocast_max_output_threshold' must be a number"),
    ({"autocast_max_depth_of_reduction": -1}, "'autocast_max_depth_of_reduction' must be >= 0"),
    ({"autocast_max_depth_of_reduction": 2.0}, "'autocast_max_depth_of_reduction' must be an int"),
    ({"autocast_calibration_dataloader": 3}, "'autocast_calibration_dataloader' must be an iterable"),
    ({"enable_autocast": 1}, "'enable_autocast' must be a bool"),
    ({"enable_autocast": True, "autocast_low_precision_type": torch.float16, "enabled_precisions": {torch.half}},
     "enable_autocast=True chooses each op's precision itself"),
])
def test_autocast_values_are_checked(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        settings_from_options(options)
    assert fragment in str(info.value)


# ---- aliases ------------------------------------------------------------------------------------

@pytest.mark.parametrize("trt,kiln_options", [
    ({"truncate_long_and_double": True}, {"truncate_double": True}),
    ({"disable_tf32": True}, {"allow_tf32": False}),
    ({"disable_tf32": False}, {"allow_tf32": True}),
    ({"make_refittable": False}, {"immutable_weights": True}),
    ({"make_refitable": True}, {"immutable_weights": False}),
    ({"refit": False}, {"immutable_weights": True}),
    ({"precision": torch.half}, {"enabled_precisions": {torch.float16}}),
    ({"optimization_level": None}, {"optimization_level": 3}),
    ({"workspace_size": 0}, {"workspace_size": 1 << 30}),
    ({"device": 0}, {"device": "cuda:0"}),
    ({"use_explicit_typing": True, "enabled_precisions": {torch.float32}}, {}),
])
def test_aliases_equal_kiln_options(trt: dict[str, Any], kiln_options: dict[str, Any]) -> None:
    assert settings_from_options(trt) == settings_from_options(kiln_options)
    assert CompilationSettings().replace(**trt) == settings_from_options(kiln_options)


def test_truncate_long_and_double_builds_float32(caplog: pytest.LogCaptureFixture) -> None:
    m, x = Net().double().eval(), torch.randn(4, 16, dtype=torch.float64)
    results = [compile_and_compare(m, [x], options={key: True, "min_block_size": 1}, via="aot", atol=1e-5)
               for key in ("truncate_long_and_double", "truncate_double")]
    for result in results:
        (engine,) = result.compiled.engines()
        assert engine.engine.inputs[0].dtype == kiln.DType.f32  # built in float32, called with float64
    assert torch.equal(results[0].outputs[0], results[1].outputs[0])


def test_alias_given_twice() -> None:
    assert settings_from_options(truncate_double=True, truncate_long_and_double=True).truncate_double
    with pytest.raises(ValueError, match="'truncate_double' was given twice with different values: as "
                                         "truncate_double=False and as truncate_long_and_double=True"):
        settings_from_options(truncate_double=False, truncate_long_and_double=True)
    with pytest.raises(ValueError, match="'immutable_weights' was given twice"):
        settings_from_options(make_refittable=True, immutable_weights=True)
    with pytest.raises(ValueError, match="'allow_tf32' was given twice"):
        settings_from_options(disable_tf32=True, allow_tf32=True)


@pytest.mark.parametrize("options,fragment", [
    ({"disable_tf32": "yes"}, "'disable_tf32' must be a bool"),
    ({"truncate_long_and_double": 1}, "'truncate_long_and_double' must be a bool"),
    ({"make_refittable": None}, "'make_refittable' must be a bool"),
    ({"precision": {torch.half}}, "'precision' is one dtype"),
    ({"precision": torch.int8}, "'precision': torch.int8 is not a precision Kiln builds in"),
    ({"enabled_precisions": {torch.float, torch.int8}}, "no int8 / float8 / float4 kernels"),
    ({"use_explicit_typing": True, "enabled_precisions": {torch.float, torch.half}},
     "'use_explicit_typing'=True computes every op in the dtype the model gives it"),
    ({"use_strong_types": "true"}, "'use_strong_types' must be a bool"),
])
def test_alias_values_are_checked_under_their_name(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        settings_from_options(options)
    assert fragment in str(info.value)


# ---- options with no effect ---------------------------------------------------------------------

def test_no_effect_options_log_one_line(caplog: pytest.LogCaptureFixture) -> None:
    options = {"sparse_weights": True, "dla_sram_size": 1 << 20, "engine_capability": EngineCapability.SAFETY,
               "use_python_runtime": False, "min_block_size": 1}
    with caplog.at_level(logging.INFO, logger="kiln.settings"):
        result = compile_and_compare(Net().eval(), [torch.randn(4, 16)], options=options, via="aot")
    assert result.engines == 1
    (record,) = _records(caplog)
    assert record.levelno == logging.WARNING  # sparse_weights=True and SAFETY ask for something Kiln lacks
    message = record.getMessage()
    for fragment in ("sparse_weights=True (Kiln has no 2:4 sparse kernels)", "dla_sram_size=1048576",
                     "engine_capability=<EngineCapability.SAFETY: 1>", "use_python_runtime=False"):
        assert fragment in message
    assert "min_block_size" not in message


def test_no_effect_defaults_log_at_info(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="kiln.settings"):
        settings_from_options(max_aux_streams=None, engine_capability=EngineCapability.STANDARD, use_fp32_acc=True)
    (record,) = _records(caplog)
    assert record.levelno == logging.INFO
    with caplog.at_level(logging.INFO, logger="kiln.settings"):
        settings_from_options(min_block_size=3)
    assert len(_records(caplog)) == 1  # nothing ignored: no line


def test_no_effect_options_do_not_change_the_settings() -> None:
    plain = settings_from_options(min_block_size=2)
    assert settings_from_options(min_block_size=2, enable_weight_streaming=True, lazy_engine_init=True,
                                 hardware_compatible=True, max_aux_streams=4) == plain


# ---- unknown keys -------------------------------------------------------------------------------

def test_unknown_key_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError) as info:
        settings_from_options({"use_fast_partitoner": True})
    msg = str(info.value)
    assert "unknown Kiln option 'use_fast_partitoner' (did you mean 'use_fast_partitioner'?)" in msg
    assert "docs/torch-tensorrt.md" in msg
    with pytest.raises(ValueError, match="unknown Kiln option 'bogus'"):
        CompilationSettings().replace(bogus=1)


def test_unknown_key_through_torch_compile() -> None:
    torch._dynamo.reset()
    fn = torch.compile(nn.ReLU(), backend="kiln", options={"truncate_long_and_doubles": True})
    with pytest.raises(Exception, match="unknown Kiln option 'truncate_long_and_doubles'"), torch.no_grad():
        fn(torch.randn(3))


# ---- torch.compile mode strings -----------------------------------------------------------------

@pytest.mark.parametrize("mode,level,graphs", [
    ("default", 3, True),
    ("lite", 0, True),
    ("reduce-overhead", 3, True),
    ("max-autotune", 5, True),
    ("max-autotune-no-cudagraphs", 5, False),
])
def test_mode_maps_to_settings(mode: str, level: int, graphs: bool) -> None:
    s = settings_from_options(mode=mode)
    assert (s.mode, s.optimization_level, s.use_cuda_graphs) == (mode, level, graphs)
    assert CompilationSettings(mode=mode) == s


def test_modes_are_torch_compiles() -> None:
    from torch._inductor import list_mode_options

    assert set(MODES) == set(list_mode_options())  # every mode torch.compile knows has a meaning in Kiln


@pytest.mark.parametrize("mode", ["lite", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_torch_compile_mode_runs(mode: str) -> None:
    m, x = Net().eval(), torch.randn(4, 16)
    torch._dynamo.reset()
    seen: list[Any] = []
    original = kiln.dynamo.kiln_backend

    def backend(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        graph = original(gm, example_inputs, **kwargs)
        seen.append(graph.settings)
        return graph
    with torch.no_grad():
        fast = torch.compile(m, backend=backend, mode=mode, dynamic=False)
        torch.testing.assert_close(fast(x), m(x), atol=1e-4, rtol=1e-4)
    assert seen[0] == {"mode": mode}  # how torch hands a mode to a backend
    assert seen[1].mode == mode and seen[1].use_cuda_graphs == MODES[mode].get("use_cuda_graphs", True)


def test_torch_refuses_mode_with_options_so_options_carry_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError, match="Either mode or options"):
        torch.compile(nn.ReLU(), backend="kiln", mode="max-autotune", options={"dryrun": True})
    result = compile_and_compare(Net().eval(), [torch.randn(4, 16)],
                                 options={"mode": "max-autotune-no-cudagraphs", "dryrun": True})
    assert result.engines == 0
    out = capsys.readouterr().out
    assert ("build settings: optimization_level=5, use_cuda_graphs=False, enabled_precisions={float32}; "
            "torch.compile mode 'max-autotune-no-cudagraphs' -> optimization_level=5, use_cuda_graphs=False") in out


@pytest.mark.parametrize("options,fragment", [
    ({"mode": "max-autotune", "optimization_level": 2},
     "torch.compile mode 'max-autotune' sets optimization_level=5, but optimization_level=2 was given"),
    ({"mode": "max-autotune-no-cudagraphs", "use_cuda_graphs": True},
     "mode 'max-autotune-no-cudagraphs' sets use_cuda_graphs=False, but use_cuda_graphs=True was given"),
    ({"mode": "reduce-overhead", "use_cuda_graphs": False}, "sets use_cuda_graphs=True"),
    ({"mode": "fast"}, "torch.compile mode 'fast' is not a mode Kiln knows; valid: 'default', 'lite', 'reduce-overhead'"),
    ({"mode": 5}, "is not a mode Kiln knows"),
])
def test_mode_conflicts(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        settings_from_options(options)
    assert fragment in str(info.value)


def test_mode_stays_in_force_through_replace() -> None:
    s = settings_from_options(mode="max-autotune-no-cudagraphs")
    with pytest.raises(ValueError, match="sets use_cuda_graphs=False"):
        s.replace(use_cuda_graphs=True)
    assert s.replace(mode=None, use_cuda_graphs=True).use_cuda_graphs
    with pytest.raises(ValueError, match="sets optimization_level=5, but optimization_level=2"):
        settings_from_options(optimization_level=2).replace(mode="max-autotune")
    assert settings_from_options(mode="max-autotune", optimization_level=5).optimization_level == 5


# ---- the dry run --------------------------------------------------------------------------------

def test_dryrun_true_prints_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    result = compile_and_compare(Net().eval(), [torch.randn(4, 16)], options={"dryrun": True, "min_block_size": 1})
    assert result.engines == 0
    out = capsys.readouterr().out
    assert out.count("Kiln dry run: graph") == 1 and "coverage: 100.0%" in out
    assert "build settings: optimization_level=3, use_cuda_graphs=True" in out and "mode" not in out


def test_dryrun_through_kiln_compile_prints(capsys: pytest.CaptureFixture[str]) -> None:
    compile_and_compare(Net().eval(), [torch.randn(4, 16)], options={"dryrun": True}, via="aot")
    assert "Kiln dry run: Net" in capsys.readouterr().out


def test_dryrun_path_writes_a_file_and_dash_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "report.txt"
    compile_and_compare(Net().eval(), [torch.randn(4, 16)], options={"dryrun": str(path)})
    assert "Kiln dry run" in path.read_text() and "Kiln dry run" not in capsys.readouterr().out
    compile_and_compare(Net().eval(), [torch.randn(4, 16)], options={"dryrun": "-"})
    assert "Kiln dry run" in capsys.readouterr().out


# ---- the documentation --------------------------------------------------------------------------

def test_docs_table_names_every_option() -> None:
    text = (REPO / "docs" / "torch-tensorrt.md").read_text()
    rows = {m.group(1) for m in re.finditer(r"^\| `([a-z0-9_]+)`", text, re.MULTILINE)}
    missing = (set(trt_defaults(Path("/x"))) | set(OLDER_NAMES)) - rows
    assert not missing, f"docs/torch-tensorrt.md has no row for {sorted(missing)}"
    assert set(trt_compat.trt_option_names()) <= rows
    for mode in MODES:
        assert f"`{mode}`" in text
    assert "torch-tensorrt.md" in (REPO / "README.md").read_text()


@pytest.mark.parametrize("refittable", [True, False])
def test_mutable_module_takes_the_refit_alias(refittable: bool) -> None:
    module = kiln.MutableModule(torch.nn.Linear(3, 3), make_refittable=refittable)
    assert module.settings.immutable_weights is (not refittable)


def test_kiln_compile_takes_torch_tensorrt_compile_keywords() -> None:
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(6, 5), nn.ReLU()).eval(), torch.randn(3, 6)
    compiled = kiln.compile(model, ir="dynamo", inputs=[x], min_block_size=1)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    with pytest.raises(ValueError, match="ir='ts' is not supported"):
        kiln.compile(model, ir="ts", inputs=[x])
    with pytest.raises(ValueError, match="once, as arg_inputs or as inputs"):
        kiln.compile(model, [x], inputs=[x])
