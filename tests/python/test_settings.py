"""CompilationSettings: defaults, normalization and validation (every error names the key)."""

from __future__ import annotations

import math

import pytest
import torch

from kiln.cache import DiskEngineCache, default_cache_dir
from kiln.settings import CompilationSettings, option_names, settings_from_options


def test_defaults_are_documented_values() -> None:
    s = CompilationSettings()
    assert s.enabled_precisions == frozenset({torch.float32})
    assert s.min_block_size == 5
    assert s.torch_executed_ops == frozenset()
    assert not s.require_full_compilation and not s.pass_through_build_failures
    assert s.optimization_level == 3 and s.device is None and s.dryrun is False
    assert not s.immutable_weights and not s.cache_built_engines and s.use_cuda_graphs and s.share_weights
    assert not s.builds_nothing


def test_every_issue_option_exists() -> None:
    required = {"enabled_precisions", "min_block_size", "torch_executed_ops", "require_full_compilation",
                "pass_through_build_failures", "truncate_double", "optimization_level", "workspace_size",
                "device", "debug", "dryrun", "cache_built_engines", "reuse_cached_engines", "immutable_weights",
                "engine_cache_dir", "engine_cache_size", "use_cuda_graphs"}
    assert required <= set(option_names())


def test_unknown_key_names_it_and_lists_valid_ones() -> None:
    with pytest.raises(ValueError) as info:
        settings_from_options({"min_blok_size": 3})
    msg = str(info.value)
    assert "'min_blok_size'" in msg and "did you mean 'min_block_size'" in msg
    for name in option_names():
        assert name in msg


def test_keyword_options_and_mapping_merge() -> None:
    s = settings_from_options({"min_block_size": 2}, debug=True)
    assert s.min_block_size == 2 and s.debug
    with pytest.raises(ValueError, match="given twice"):
        settings_from_options({"debug": True}, debug=False)
    with pytest.raises(ValueError, match="must be a dict"):
        settings_from_options([("debug", True)])  # type: ignore[arg-type]


@pytest.mark.parametrize("key,value,fragment", [
    ("min_block_size", 0, "'min_block_size' must be >= 1"),
    ("min_block_size", 2.5, "'min_block_size' must be a positive int"),
    ("min_block_size", True, "'min_block_size' must be a positive int"),
    ("optimization_level", 6, "'optimization_level' must be between 0 and 5"),
    ("optimization_level", "3", "'optimization_level' must be an int"),
    ("workspace_size", -1, "'workspace_size' must be >= 0"),
    ("debug", 1, "'debug' must be a bool"),
    ("require_full_compilation", "yes", "'require_full_compilation' must be a bool"),
    ("enabled_precisions", {torch.int8}, "'enabled_precisions'"),
    ("enabled_precisions", set(), "at least one precision"),
    ("enabled_precisions", 3, "'enabled_precisions' must be a set"),
    ("torch_executed_ops", "aten.add.Tensor", "'torch_executed_ops' must be a set"),
    ("torch_executed_ops", {"aten.not_an_op"}, "no PyTorch op named 'aten.not_an_op'"),
    ("torch_executed_ops", {"aten.add.NoSuchOverload"}, "no PyTorch op named"),
    ("torch_executed_ops", {"add"}, "not an op name"),
    ("torch_executed_ops", {3}, "not an op name"),
    ("device", "mps", "'device' must be 'cpu', 'cuda', 'cuda:N' or a GPU index"),
    ("device", "gpu0", "'device' must be"),
    ("dryrun", 1, "'dryrun' must be a bool or a file path"),
    ("dryrun", "", "empty path"),
    ("engine_cache_dir", None, "'engine_cache_dir' must be a directory path"),
    ("engine_cache_size", -5, "'engine_cache_size' must be >= 0"),
    ("custom_engine_cache", {}, "'custom_engine_cache' must be a kiln.EngineCache"),
    ("custom_engine_cache", "/tmp/store", "'custom_engine_cache' must be a kiln.EngineCache"),
])
def test_bad_values_raise_naming_the_key(key: str, value: object, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        settings_from_options({key: value})
    assert fragment in str(info.value)


@pytest.mark.parametrize("changes,fragment", [
    ({"cache_built_engines": True, "immutable_weights": True}, "immutable_weights=False"),
    ({"reuse_cached_engines": True, "immutable_weights": True}, "immutable_weights=False"),
    ({"custom_engine_cache": DiskEngineCache("/nonexistent")}, "custom_engine_cache"),
    ({"require_full_compilation": True, "torch_executed_ops": {"aten.add"}}, "torch_executed_ops"),
    ({"require_full_compilation": True, "min_block_size": math.inf}, "min_block_size=inf"),
])
def test_impossible_combinations(changes: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        CompilationSettings(**changes)  # type: ignore[arg-type]


def test_cache_options_accepted_with_mutable_weights(tmp_path: object) -> None:
    s = CompilationSettings(cache_built_engines=True, reuse_cached_engines=True, immutable_weights=False,
                            engine_cache_dir=str(tmp_path), engine_cache_size=1 << 20)
    assert s.cache_built_engines and s.engine_cache_size == 1 << 20
    store = DiskEngineCache(str(tmp_path))
    assert CompilationSettings(reuse_cached_engines=True, custom_engine_cache=store).custom_engine_cache is store


def test_default_engine_cache_dir_is_the_user_cache() -> None:
    assert CompilationSettings().engine_cache_dir == default_cache_dir()


def test_normalization() -> None:
    s = CompilationSettings(enabled_precisions={"fp16", torch.float32}, device="cuda",
                            torch_executed_ops={torch.ops.aten.add.Tensor, "torch.ops.aten.mul", torch.ops.aten.relu})
    assert s.enabled_precisions == frozenset({torch.float16, torch.float32})
    assert s.device == "cuda:0"
    assert s.torch_executed_ops == frozenset({"aten.add.Tensor", "aten.mul", "aten.relu"})
    assert CompilationSettings(enabled_precisions=torch.half).enabled_precisions == frozenset({torch.float16})
    assert CompilationSettings(device=torch.device("cpu")).device == "cpu"
    assert CompilationSettings(min_block_size=float("inf")).builds_nothing
    assert CompilationSettings(dryrun="report.txt").builds_nothing


def test_settings_are_immutable_and_replace_validates() -> None:
    s = CompilationSettings()
    with pytest.raises(AttributeError):
        s.min_block_size = 3  # type: ignore[misc]
    assert s.replace(min_block_size=3).min_block_size == 3
    with pytest.raises(ValueError, match="unknown Kiln option 'nope'"):
        s.replace(nope=1)
    with pytest.raises(ValueError, match="'min_block_size'"):
        s.replace(min_block_size=-1)
    assert settings_from_options(s, debug=True).debug and settings_from_options(s) is s


def test_torch_compile_rejects_unknown_option() -> None:
    import kiln.dynamo  # noqa: F401

    fn = torch.compile(torch.nn.ReLU(), backend=kiln.dynamo.kiln_backend, options={"bogus_option": 1})
    with pytest.raises(Exception, match="unknown Kiln option 'bogus_option'"):
        fn(torch.randn(2))
