"""Outputs torch.export cannot flatten (objects of unregistered types) come back from kiln.compile
as the model returns them (kiln/outputs.py): a transformers GPT-2's ModelOutput with its
DynamicCache, and plain Python objects holding tensors."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn

import kiln


def _gpt2() -> tuple[nn.Module, torch.Tensor]:
    transformers = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    return model, torch.randint(0, 100, (2, 8))


def test_gpt2_with_cache() -> None:
    from transformers.cache_utils import DynamicCache
    model, ids = _gpt2()
    compiled = kiln.compile(model, [ids])
    assert compiled.summary.engines >= 1
    other = torch.randint(0, 100, ids.shape)
    with torch.no_grad():
        want, got = model(other), compiled(other)
    assert type(got) is type(want)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)
    assert isinstance(got.past_key_values, DynamicCache)
    assert len(got.past_key_values.layers) == len(want.past_key_values.layers) == 2
    for mine, theirs in zip(got.past_key_values.layers, want.past_key_values.layers):
        assert type(mine) is type(theirs)
        torch.testing.assert_close(mine.keys, theirs.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(mine.values, theirs.values, atol=1e-5, rtol=1e-5)
    # The cache works as eager's for the next token, and each call returns a cache of its own.
    step = torch.randint(0, 100, (2, 1))
    with torch.no_grad():
        torch.testing.assert_close(model(step, past_key_values=got.past_key_values).logits,
                                   model(step, past_key_values=want.past_key_values).logits, atol=1e-5, rtol=1e-5)
        again = compiled(other)
    assert again.past_key_values is not got.past_key_values
    assert again.past_key_values.layers[0].keys.shape == (2, 2, 8, 16)  # not grown by the step above


def test_gpt2_without_cache() -> None:
    model, ids = _gpt2()
    compiled = kiln.compile(model, [ids], {"use_cache": False})
    with torch.no_grad():
        got, want = compiled(ids, use_cache=False), model(ids, use_cache=False)
    assert got.past_key_values is None
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)


def test_saving_an_unregistered_output_names_it(tmp_path) -> None:
    model, ids = _gpt2()
    compiled = kiln.compile(model, [ids])
    with pytest.raises(TypeError, match=r"^kiln\.save: the module returns a transformers\.cache_utils\.DynamicCache, "
                                        r"which torch\.export cannot save .*use_cache=False$"):
        kiln.save(compiled, tmp_path / "gpt2.ep", [ids])


class Pair:
    def __init__(self, first: torch.Tensor, rest: list[object]) -> None:
        self.first = first
        self.rest = rest
        self.tag = "pair"


class Slotted:
    __slots__ = ("tensor", "count")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.count = 3


class Loop:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.me = self


class Returns(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.kind = kind

    def forward(self, x: torch.Tensor) -> object:
        y = self.fc(x)
        if self.kind == "pair":
            return {"y": y, "pair": Pair(torch.relu(y), [torch.sigmoid(y), 7])}
        if self.kind == "slots":
            return Slotted(y * 2)
        return Loop(y)


def test_plain_objects_come_back_rebuilt() -> None:
    torch.manual_seed(1)
    x = torch.randn(3, 4)
    model = Returns("pair").eval()
    got = kiln.compile(model, [x], min_block_size=1)(x)
    with torch.no_grad():
        want = model(x)
    assert type(got["pair"]) is Pair and got["pair"].tag == "pair" and got["pair"].rest[1] == 7
    for mine, theirs in ((got["y"], want["y"]), (got["pair"].first, want["pair"].first),
                         (got["pair"].rest[0], want["pair"].rest[0])):
        torch.testing.assert_close(mine, theirs)
    model = Returns("slots").eval()
    got = kiln.compile(model, [x], min_block_size=1)(x)
    with torch.no_grad():
        torch.testing.assert_close(got.tensor, model(x).tensor)
    assert type(got) is Slotted and got.count == 3 and not isinstance(got.tensor, torch._subclasses.FakeTensor)


def test_an_output_that_cannot_be_taken_apart_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match=r"^kiln\.compile: the module returns a test_hf_outputs\.Loop, which "
                                        r"torch\.export cannot trace as an output and Kiln cannot take apart: "
                                        r"output\.me is a test_hf_outputs\.Loop that refers back to itself; "
                                        r"register it as a pytree node"):
        kiln.compile(Returns("loop").eval(), [torch.randn(3, 4)])
