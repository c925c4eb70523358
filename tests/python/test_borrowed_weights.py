"""Weights an engine reads where the model keeps them instead of copying them.

A weight that reaches the plan unchanged (same bytes, dtype and device as the model's tensor,
dense) is borrowed: ``Engine.borrowed_bytes`` counts it and the build log says so. Checked on
the CPU engines, and on CUDA where there is a GPU: both compile paths borrow every such weight
and compute what eager does; weights that need converting or are not dense are copied; the
engine keeps borrowed weights alive after the model is gone; a refit never writes into the
model's tensors (the refitted weights become the engine's own); a saved and loaded engine owns
its weights; ``share_weights=False`` copies every weight; a malformed ``borrowed`` argument of
``Builder.build`` is an error naming the weight.
"""

from __future__ import annotations

import gc

import pytest
import torch

import kiln
from kiln import Builder, BuilderConfig, DType, Engine, Graph
from kiln.pipeline import LIVE_GRAPHS
from kiln.runtime import KilnEngineModule


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.ln = torch.nn.LayerNorm(32)
        self.l2 = torch.nn.Linear(32, 8)
        self.scale = torch.nn.Parameter(torch.randn(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The scale sits between the norm and l2 (after l2 the passes would fold it into l2's weights).
        return self.l2(torch.relu(self.ln(self.l1(x))) * self.scale)


def _net(seed: int) -> Net:
    torch.manual_seed(seed)
    net = Net().eval()
    with torch.no_grad():
        for p in net.parameters():  # LayerNorm starts at ones / zeros
            p.copy_(torch.randn_like(p))
    return net


def _weight_bytes(m: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in m.parameters())


def _engines(compiled: torch.nn.Module) -> list:
    return [m.engine for m in compiled.engines()]


X = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
# On CUDA the engines run on the model's device memory; FP32 GEMMs there may use TF32.
CUDA = pytest.param("cuda", marks=pytest.mark.cuda)
DEVICES = ["cpu", CUDA]
TOL = {"cpu": {}, "cuda": {"rtol": 2e-2, "atol": 2e-2}}


def _borrowed_enough(net: Net, compiled: torch.nn.Module, device: str) -> None:
    borrowed = sum(e.borrowed_bytes for e in _engines(compiled))
    if device == "cpu":
        assert borrowed == _weight_bytes(net)
    else:  # at least the GEMMs' weight matrices, whatever the device's passes fold into kernels
        assert borrowed >= (net.l1.weight.numel() + net.l2.weight.numel()) * 4


@pytest.mark.parametrize("device", DEVICES)
def test_kiln_compile_reads_the_model_weights_in_place(device: str) -> None:
    net, x = _net(0).to(device), X.to(device)
    with torch.no_grad():
        compiled = kiln.compile(net, [x], min_block_size=1)
        _borrowed_enough(net, compiled, device)
        assert "weights read in place" in _engines(compiled)[0].build_log
        torch.testing.assert_close(compiled(x), net(x), **TOL[device])


def test_torch_compile_reads_the_model_weights_in_place() -> None:
    net = _net(1)
    torch._dynamo.reset()
    earlier = set(LIVE_GRAPHS)  # graphs other tests keep alive
    with torch.no_grad():
        fn = torch.compile(net, backend="kiln", options={"min_block_size": 1})
        torch.testing.assert_close(fn(X), net(X))
    engines = [mod.engine for g in list(LIVE_GRAPHS) if g not in earlier for gm in g.graph_modules
               for mod in gm.modules() if isinstance(mod, KilnEngineModule)]
    assert engines and sum(e.borrowed_bytes for e in engines) == _weight_bytes(net)
    torch._dynamo.reset()


def test_weights_that_need_converting_or_are_not_dense_are_copied() -> None:
    net = _net(2).double()
    with torch.no_grad():
        compiled = kiln.compile(net, [X.double()], min_block_size=1, truncate_double=True)
        assert sum(e.borrowed_bytes for e in _engines(compiled)) == 0  # f64 weights built as f32
        torch.testing.assert_close(compiled(X.double()), net(X.double()), rtol=1e-5, atol=1e-5)

    class Strided(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("w", torch.randn(8, 16).t())  # [16, 8], not dense in row order
            self.b = torch.nn.Parameter(torch.randn(8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.w + self.b

    s = Strided().eval()
    with torch.no_grad():
        compiled = kiln.compile(s, [X], min_block_size=1)
        assert sum(e.borrowed_bytes for e in _engines(compiled)) == s.b.numel() * 4
        torch.testing.assert_close(compiled(X), s(X))


def test_share_weights_false_copies_every_weight() -> None:
    net = _net(7)
    with torch.no_grad():
        want = net(X)
        compiled = kiln.compile(net, [X], min_block_size=1, share_weights=False)
        assert sum(e.borrowed_bytes for e in _engines(compiled)) == 0
        for p in net.parameters():  # a snapshot: the model's later changes never reach it
            p.add_(1.0)
        torch.testing.assert_close(compiled(X), want)


@pytest.mark.parametrize("device", DEVICES)
def test_the_engine_keeps_borrowed_weights_alive(device: str) -> None:
    net, x = _net(3).to(device), X.to(device)
    with torch.no_grad():
        want = net(x)
        compiled = kiln.compile(net, [x], min_block_size=1)
        assert sum(e.borrowed_bytes for e in _engines(compiled)) > 0
        del net  # the model goes; the storage the engine borrowed must stay
        gc.collect()
        torch.randn(1 << 16, device=device).add_(1.0)  # reuse freed memory, if any was freed
        torch.testing.assert_close(compiled(x), want, **TOL[device])


@pytest.mark.parametrize("device", DEVICES)
def test_refit_never_writes_into_the_model(device: str) -> None:
    net, other, x = _net(4).to(device), _net(5).to(device), X.to(device)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with torch.no_grad():
        compiled = kiln.compile(net, [x], min_block_size=1)
        kiln.refit(compiled, other)
        for k, v in net.state_dict().items():
            assert torch.equal(v, before[k]), f"refit wrote into the model's {k}"
        assert sum(e.borrowed_bytes for e in _engines(compiled)) == 0
        torch.testing.assert_close(compiled(x), other(x), **TOL[device])
        for p in net.parameters():  # a change in place: the next call follows the model again
            p.add_(1.0)
        torch.testing.assert_close(compiled(x), net(x), **TOL[device])


def test_a_saved_engine_owns_its_weights(tmp_path: pytest.TempPathFactory) -> None:
    net = _net(6)
    with torch.no_grad():
        want = net(X)
        compiled = kiln.compile(net, [X], min_block_size=1)
        engine = _engines(compiled)[0]
        assert engine.borrowed_bytes > 0
        assert Engine.deserialize(engine.serialize()).borrowed_bytes == 0
        path = tmp_path / "net.kiln"
        kiln.save(compiled, str(path), [X])
        for p in net.parameters():
            p.add_(1.0)
        torch.testing.assert_close(kiln.load(str(path)).module()(X), want)


def test_builder_borrowed_argument_is_checked() -> None:
    w = torch.randn(8)
    g = Graph()
    x = g.add_input("x", DType.f32, [8])
    wid = g.add_constant_from_ptr("w", DType.f32, [8], w.data_ptr(), 32, True)
    g.mark_output(g.add_node("add", [x, wid])[0], "y")
    builder = Builder(BuilderConfig(device="cpu", fuse_pointwise=False))
    with pytest.raises(kiln.InvalidArgumentError, match="borrowed weight 'w'.*address, bytes, owner"):
        builder.build(g, {"w": (w.data_ptr(), 32)})
    engine = builder.build(g, {"w": (w.data_ptr(), 32, w)})
    assert engine.borrowed_bytes == 32
    x_in = torch.randn(8)
    (y,) = engine.create_execution_context().execute([x_in.numpy()])
    torch.testing.assert_close(torch.from_numpy(y), x_in + w)
