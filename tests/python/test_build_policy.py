"""The build policy from the Python front end: ``allow_tf32``, ``exact_gelu`` and
``attention_tactic`` are CompilationSettings fields (validated, naming the field), reach the
builder through ``kiln.runtime.builder_config`` as a ``BuildPolicy``, end up in every engine (its
``policy``, its build log, its file), are part of the engine cache's key (no environment
variable is), and a cached engine with another policy than the settings ask for is not used. On
the CPU, where the policy changes nothing, a model compiled with a non-default policy matches
eager.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln import _C
from kiln.cache import EngineCache
from kiln.cached_build import cache_stats, engine_cache_key, reset_cache_stats
from kiln.runtime import build_policy, builder_config
from kiln.settings import CompilationSettings, settings_from_options
from kiln.testing import randomize_weights

STRICT = dict(allow_tf32=False, exact_gelu=True, attention_tactic="cudnn")


# ---- settings --------------------------------------------------------------------------------

def test_settings_defaults() -> None:
    s = CompilationSettings()
    assert s.allow_tf32 is True and s.exact_gelu is False and s.attention_tactic == "auto"
    assert build_policy(s) == _C.BuildPolicy()


@pytest.mark.parametrize("key,value,message", [
    ("allow_tf32", 1, "Kiln option 'allow_tf32' must be a bool, got 1 (int)"),
    ("allow_tf32", None, "Kiln option 'allow_tf32' must be a bool, got None (NoneType)"),
    ("exact_gelu", "yes", "Kiln option 'exact_gelu' must be a bool, got 'yes' (str)"),
    ("attention_tactic", 2, "Kiln option 'attention_tactic' must be a str, got 2 (int)"),
    ("attention_tactic", "fastest",
     "Kiln option 'attention_tactic' must be one of 'auto', 'generated', 'cudnn', got 'fastest'"),
    ("attention_tactic", "CUDNN",
     "Kiln option 'attention_tactic' must be one of 'auto', 'generated', 'cudnn', got 'CUDNN'"),
])
def test_settings_validation_names_the_field(key: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError) as info:
        settings_from_options({key: value})
    assert str(info.value) == message
    with pytest.raises(ValueError, match=key):
        CompilationSettings().replace(**{key: value})


@pytest.mark.parametrize("tactic", ["auto", "generated", "cudnn"])
def test_settings_reach_the_builder_config(tactic: str) -> None:
    s = settings_from_options(allow_tf32=False, exact_gelu=True, attention_tactic=tactic, optimization_level=1)
    config = builder_config(s, "cpu")
    assert config.policy == _C.BuildPolicy(allow_tf32=False, exact_gelu=True, attention_tactic=tactic)
    assert config.optimization_level == 1
    assert f"attention_tactic='{tactic}'" in repr(config)


# ---- the binding -----------------------------------------------------------------------------

def test_build_policy_binding() -> None:
    p = _C.BuildPolicy()
    assert (p.allow_tf32, p.exact_gelu, p.attention_tactic) == (True, False, "auto")
    assert repr(p) == "BuildPolicy(allow_tf32=True, exact_gelu=False, attention_tactic='auto')"
    q = _C.BuildPolicy(**STRICT)
    assert q != p and q == _C.BuildPolicy(**STRICT)
    assert q != "not a policy"
    q.attention_tactic = "generated"
    assert q.attention_tactic == "generated"
    with pytest.raises(kiln.InvalidArgumentError) as info:
        q.attention_tactic = "fastest"
    assert str(info.value) == ('[invalid argument] BuildPolicy.attention_tactic must be one of "auto", '
                               '"generated", "cudnn", got "fastest"')
    with pytest.raises(kiln.InvalidArgumentError, match="BuildPolicy.attention_tactic"):
        _C.BuildPolicy(attention_tactic="")
    with pytest.raises(TypeError):
        _C.BuildPolicy(allow_tf32="no")  # type: ignore[arg-type]
    config = kiln.BuilderConfig()
    assert config.policy == p
    config.policy.exact_gelu = True  # the config's own policy, changed in place
    assert config.policy == _C.BuildPolicy(exact_gelu=True)


# ---- engines ---------------------------------------------------------------------------------

class Block(nn.Module):
    """conv -> relu -> linear + exact GELU -> attention over the pixels (4 heads) -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.qkv = nn.Linear(8, 96)
        self.out = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv(x)).flatten(2).transpose(1, 2)  # [B, HW, 8]
        b, s, _ = h.shape
        q, k, v = (t.reshape(b, s, 4, 8).transpose(1, 2) for t in F.gelu(self.qkv(h)).chunk(3, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, 32)
        return self.out(a)


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return randomize_weights(Block().eval(), seed=seed)


def _engines(compiled: Any) -> list[Any]:
    return [m.engine for m in compiled.engines()]


def test_non_default_policy_reaches_the_engine_and_matches_eager_on_cpu() -> None:
    model, x = _model(), torch.randn(2, 3, 6, 5)
    with torch.no_grad():
        ref = model(x)
        compiled = kiln.compile(model, arg_inputs=[x], min_block_size=1, require_full_compilation=True,
                                optimization_level=1, **STRICT)
        got = compiled(x)
    assert float((got - ref).norm() / ref.norm()) < 1e-5
    (engine,) = _engines(compiled)
    assert engine.policy == _C.BuildPolicy(**STRICT) and engine.optimization_level == 1
    assert engine.build_log.startswith(
        "policy: allow_tf32=false, exact_gelu=true, attention_tactic=cudnn; optimization level 1: "
        "times up to 2 candidates;"), engine.build_log
    ops = [n.op for n in engine.graph().nodes]
    assert "sdpa" in ops and "conv" in ops and "linear" in ops, ops
    # The engine file keeps the policy; the default one stays out of it.
    loaded = _C.Engine.deserialize(engine.serialize())
    assert loaded.policy == engine.policy and loaded.optimization_level == 1
    default = kiln.compile(model, arg_inputs=[x], min_block_size=1, require_full_compilation=True)
    (plain,) = _engines(default)
    assert plain.policy == _C.BuildPolicy()
    assert _C.Engine.deserialize(plain.serialize()).policy == _C.BuildPolicy()
    with torch.no_grad():
        assert torch.equal(default(x), got)  # the CPU computes the same whatever the policy


# ---- the engine cache --------------------------------------------------------------------------

def _description() -> Any:
    g = _C.ImportGraph()
    x, y = g.add_tensor(_C.DType.f32, [2, 3]), g.add_tensor(_C.DType.f32, [2, 3])
    g.add_input(x, "x")
    g.add_node("aten.relu.default", [_C.ImportArg.of_tensor(x)], outputs=[y])
    g.add_output(y, "y")
    return g


def test_cache_key_covers_each_policy_field_and_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _description()
    base = CompilationSettings()
    key = engine_cache_key(g, base, "cpu")
    assert engine_cache_key(g, CompilationSettings(), "cpu") == key
    changed = [base.replace(allow_tf32=False), base.replace(exact_gelu=True),
               base.replace(attention_tactic="generated"), base.replace(attention_tactic="cudnn")]
    keys = {engine_cache_key(g, s, "cpu") for s in changed}
    assert len(keys) == len(changed) and key not in keys
    for name in ("KILN_DISABLE_TF32", "KILN_EXACT_GELU", "KILN_ATTENTION_TACTIC"):
        monkeypatch.setenv(name, "1")
    assert engine_cache_key(g, base, "cpu") == key


class OneEntry(EngineCache):
    """A store that answers every key with the same engine bytes (once it has some)."""

    def __init__(self) -> None:
        self.data: bytes | None = None

    def get(self, key: str) -> bytes | None:
        return self.data

    def put(self, key: str, data: bytes) -> None:
        self.data = data


def test_a_cached_engine_with_another_policy_is_not_used() -> None:
    store = OneEntry()
    model, x = _model(1), torch.randn(2, 3, 6, 5)
    options = dict(min_block_size=1, require_full_compilation=True, cache_built_engines=True,
                   reuse_cached_engines=True, custom_engine_cache=store)
    reset_cache_stats()
    kiln.compile(model, arg_inputs=[x], **options)
    assert store.data is not None and cache_stats()["builds"] == 1
    # Under another key the store hands out the default-policy engine: refused, built again.
    compiled = kiln.compile(model, arg_inputs=[x], allow_tf32=False, **options)
    assert cache_stats()["rejected"] == 1 and cache_stats()["hits"] == 0 and cache_stats()["builds"] == 2
    (engine,) = _engines(compiled)
    assert engine.policy == _C.BuildPolicy(allow_tf32=False)


# ---- on a GPU ----------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("allow_tf32", [True, False], ids=["tf32", "strict"])
def test_tf32_follows_the_policy_on_cuda_and_survives_a_load(allow_tf32: bool) -> None:
    """An f32 linear runs on TF32 tensor cores exactly when the policy allows it, at build and in
    a loaded engine (which makes its kernels with the policy of its file, so both give the same
    bits); strict f32 matches the CPU closely."""
    gen = torch.Generator().manual_seed(5)
    g = kiln.Graph()
    x = g.add_input("x", kiln.DType.f32, [64, 96])
    w = g.add_constant("w", (torch.randn(80, 96, generator=gen) / 10).numpy(), weight=True)
    g.mark_output(g.add_node("linear", [x, w], name="fc")[0], "y")
    policy = _C.BuildPolicy(allow_tf32=allow_tf32)
    engine = kiln.Builder(kiln.BuilderConfig(device="cuda", policy=policy)).build(g)
    assert ("(TF32)" in engine.build_log) == allow_tf32, engine.build_log
    loaded = _C.Engine.deserialize(engine.serialize(), "cuda")
    assert loaded.policy == policy
    feed = torch.randn(64, 96, generator=gen)
    outs = []
    for e in (engine, loaded):
        y = torch.empty(64, 80, device="cuda")
        xd = feed.cuda()
        e.create_execution_context().execute_ptrs([xd.data_ptr()], [y.data_ptr()], 0)
        torch.cuda.synchronize()
        outs.append(y.cpu())
    assert torch.equal(outs[0], outs[1])
    (cpu,) = kiln.Builder(kiln.BuilderConfig()).build(g).create_execution_context().execute([feed.numpy()])
    err = float((outs[0] - torch.from_numpy(cpu)).norm() / torch.from_numpy(cpu).norm())
    assert err < (2e-3 if allow_tf32 else 1e-5), err
