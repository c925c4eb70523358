"""kiln.refit: compiled modules take new weights without a rebuild.

For torch.compile(backend="kiln") and kiln.compile, on a conv+bn+linear net (batch norms folded
into convs and a linear by the builder, a per-channel scale after the last linear folded into its
weights) and a 2-layer BERT: after kiln.refit with another
model's weights (a module or a state dict) the compiled module gives that model's eager outputs,
no engine is built (the builder is patched to fail) and the engine objects are the same. Also
the errors: wrong shape or dtype, unknown names, missing weights, immutable engines.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import kiln
from kiln import _C
from kiln.runtime import KilnEngineModule

# kiln.refit is the function; the module behind it (refit_engine_module, engine_weights_from).
refit_module = importlib.import_module("kiln.refit")
torch.manual_seed(0)


class ConvBnNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)
        self.bn3 = torch.nn.BatchNorm1d(10)
        self.head = torch.nn.Linear(10, 4)
        self.gamma = torch.nn.Parameter(torch.ones(4))  # a layer scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        x = torch.relu(self.bn3(self.fc(x.flatten(1))))
        return self.head(x) * self.gamma


def randomized(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The model with every parameter and buffer (running statistics too) random."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if not t.is_floating_point():
                continue
            values = torch.rand(t.shape, generator=g) * 0.5 + 0.5 if "running_var" in name else \
                torch.randn(t.shape, generator=g) * 0.3
            t.copy_(values)
    return model.eval()


def conv_pair() -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    return randomized(ConvBnNet(), 1), randomized(ConvBnNet(), 2), torch.randn(2, 3, 8, 8)


def bert_pair() -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=32)

    class Bert(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = transformers.BertModel(config, add_pooling_layer=False)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids).last_hidden_state

    return randomized(Bert(), 3), randomized(Bert(), 4), torch.randint(0, 100, (2, 16))


@pytest.fixture
def no_builds(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Makes any engine build fail, from the moment it is entered."""
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an engine was built")

    def start() -> None:
        monkeypatch.setattr(kiln.runtime, "build_engine", fail)
        monkeypatch.setattr(kiln.pipeline, "build_engine", fail)
    yield start  # type: ignore[misc]


def engines_of(compiled: torch.nn.Module) -> list[KilnEngineModule]:
    return [m for m, _ in refit_module._targets_of(compiled).engines]


def compile_both(model: torch.nn.Module, x: torch.Tensor, how: str) -> torch.nn.Module:
    if how == "dynamo":
        # Dynamo would reuse the graph compiled for another instance of the same class (its guards
        # do not check parameter identity), with that instance's weights in its engines.
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="kiln", options={"min_block_size": 1}, dynamic=False)
    else:
        compiled = kiln.compile(model, [x], min_block_size=1)
    with torch.no_grad():
        compiled(x)
    return compiled


@pytest.mark.parametrize("how", ["dynamo", "aot"])
@pytest.mark.parametrize("pair,as_state_dict", [(conv_pair, True), (conv_pair, False), (bert_pair, False)])
def test_refit_gives_the_new_weights_outputs_without_a_build(how: str, pair: Any, as_state_dict: bool,
                                                             no_builds: Any) -> None:
    old, new, x = pair()
    compiled = compile_both(old, x, how)
    engines = engines_of(compiled)
    assert engines, "nothing was compiled into an engine"
    before = [(m, m.engine, m.engine.weights_version) for m in engines]
    with torch.no_grad():
        want_old, want_new = old(x), new(x)
        torch.testing.assert_close(compiled(x), want_old, atol=1e-4, rtol=1e-4)
        assert (want_old - want_new).abs().max() > 1e-2
        no_builds()
        kiln.refit(compiled, new.state_dict() if as_state_dict else new)
        got = compiled(x)
    torch.testing.assert_close(got, want_new, atol=1e-4, rtol=1e-4)
    for m, engine, version in before:
        assert m.engine is engine and m.engine.weights_version == version + 1
    assert engines_of(compiled) == engines


def test_refit_matches_a_fresh_compile_exactly() -> None:
    old, new, x = conv_pair()
    compiled = compile_both(old, x, "aot")
    fresh = compile_both(new, x, "aot")
    kiln.refit(compiled, new)
    with torch.no_grad():
        assert torch.equal(compiled(x), fresh(x))


def test_batch_norm_folds_are_in_the_refit_program() -> None:
    old, _, x = conv_pair()
    (engine_module,) = engines_of(compile_both(old, x, "aot"))
    engine = engine_module.engine
    assert engine.refittable
    assert "batch_norm" not in engine.graph_text and "mul" not in engine.graph_text
    names = set(_C.Refitter(engine).weight_names)
    assert {"conv1.weight", "bn1.running_var", "bn3.weight", "fc.weight", "head.bias", "gamma"} <= names
    weights = refit_module.engine_weights_from(old, engine_module)
    assert set(weights) == names and weights["bn2.bias"] is old.bn2.bias


def test_refitter_reports_what_it_did() -> None:
    old, new, x = conv_pair()
    (engine_module,) = engines_of(compile_both(old, x, "aot"))
    refitter = _C.Refitter(engine_module.engine)
    assert refitter.report == ""
    weights = refit_module.engine_weights_from(new, engine_module)
    for name, t in weights.items():
        refitter.set_weight(name, t.detach().contiguous().numpy())
    refitter.refit()
    assert refitter.report.startswith(f"refit: {len(weights)} weights, program "), refitter.report
    assert re.search(r"host writes [0-9.]+ ms, \d+ kernels remade in [0-9.]+ ms$", refitter.report), refitter.report


def test_errors_name_the_weight_and_change_nothing() -> None:
    old, new, x = conv_pair()
    compiled = compile_both(old, x, "aot")
    (module,) = engines_of(compiled)
    with torch.no_grad():
        want_old = old(x)
    state = new.state_dict()
    bad_shape = dict(state, **{"conv1.weight": torch.randn(8, 3, 5, 5)})
    with pytest.raises(kiln.InvalidArgumentError, match=r"'conv1.weight' must have shape f32\[8,3,3,3\]"):
        kiln.refit(compiled, bad_shape)
    bad_dtype = dict(state, **{"head.bias": state["head.bias"].half()})
    with pytest.raises(kiln.InvalidArgumentError, match="'head.bias' must be f32"):
        kiln.refit(compiled, bad_dtype)
    with pytest.raises(kiln.InvalidArgumentError, match="no weight named 'nope'"):
        refit_module.refit_engine_module(module, {"nope": torch.zeros(3)})
    missing = {k: v for k, v in state.items() if k != "bn1.running_mean"}
    with pytest.raises(KeyError, match="bn1.running_mean"):
        kiln.refit(compiled, missing)
    # Without strict, a weight folded together with others must still come with them.
    with pytest.raises(kiln.InvalidArgumentError, match="'bn1.running_mean'"):
        kiln.refit(compiled, missing, strict=False)
    with pytest.raises(ValueError, match="holds no Kiln engine"):
        kiln.refit(torch.nn.Linear(2, 2), state)
    assert module.engine.weights_version == 0
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), want_old, atol=1e-4, rtol=1e-4)


def test_immutable_engines_refuse_a_refit() -> None:
    old, new, x = conv_pair()
    compiled = kiln.compile(old, [x], min_block_size=1, immutable_weights=True)
    (module,) = engines_of(compiled)
    assert not module.engine.refittable
    with pytest.raises(kiln.UnsupportedError, match="immutable weights"):
        kiln.refit(compiled, new)


def test_refit_of_one_plan_weight_and_a_pickled_module(tmp_path: Any) -> None:
    old, new, x = conv_pair()
    compiled = compile_both(old, x, "aot")
    (module,) = engines_of(compiled)
    # The plan's head is head.weight * gamma and head.bias * gamma: a refit of one needs the others.
    refit_module.refit_engine_module(module, {"head.bias": new.head.bias, "head.weight": old.head.weight,
                                              "gamma": old.gamma})
    with torch.no_grad():
        old.head.bias.copy_(new.head.bias)
        torch.testing.assert_close(compiled(x), old(x), atol=1e-4, rtol=1e-4)
    # The engine bytes carry the refitted weights (and the refit program).
    path = tmp_path / "m.pt"
    torch.save(compiled, path)
    loaded = torch.load(path, weights_only=False)
    (lm,) = engines_of(loaded)
    assert lm.engine.refittable
    kiln.refit(loaded, new)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), new(x), atol=1e-4, rtol=1e-4)


def test_source_weights_id_is_saved_and_cleared_by_a_refit() -> None:
    old, new, x = conv_pair()
    compiled = kiln.compile(old, [x], min_block_size=1)
    (module,) = engines_of(compiled)
    engine = module.engine
    assert engine.source_weights_id == ""
    engine.source_weights_id = "weights-a"
    loaded = _C.Engine.deserialize(engine.serialize())
    assert loaded.source_weights_id == "weights-a"
    kiln.refit(compiled, new)  # other weights: the label no longer holds
    assert engine.source_weights_id == "" and engine.weights_version == 1
    assert _C.Engine.deserialize(engine.serialize()).source_weights_id == ""
