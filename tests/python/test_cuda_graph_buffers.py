"""CUDA graph replay on the caller's own buffers.

An execution context captures its first call's graph on the caller's own buffers (replayed with
no copies when they come again), a graph on staging buffers for calls with other buffers (inputs
copied in, outputs copied out), and graphs of their own for buffers that come again within a few
calls. These tests check that every pattern of buffer reuse gives
eager's results: one input tensor called repeatedly and changed in place between calls, outputs
kept alive (so each call gets new output buffers), two inputs alternating, and an output that
the caller's allocator hands back at the address of an earlier one. Skipped, with the reason,
where Kiln has no CUDA device.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kiln
from kiln.runtime import KilnEngineModule
from kiln.testing import randomize_weights, relative_error

pytestmark = pytest.mark.cuda  # skipped without a GPU (conftest.py)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def _compiled(x: torch.Tensor) -> tuple[torch.nn.Module, torch.nn.Module, KilnEngineModule]:
    torch.manual_seed(0)
    net = _Net().eval()
    randomize_weights(net)
    net = net.cuda().half()
    compiled = kiln.compile(net, [x], enabled_precisions={torch.half}, min_block_size=1)
    engines = [m for m in compiled.modules() if isinstance(m, KilnEngineModule)]
    assert len(engines) == 1
    return net, compiled, engines[0]


def _inputs(n: int) -> list[torch.Tensor]:
    return [torch.randn(2, 8, 12, 12, device="cuda").half() for _ in range(n)]


def _check(out: torch.Tensor, net: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        ref = net(x).float()
    err = relative_error(out.float(), ref)
    assert err < 1e-2, f"relative error {err:.2e} against eager"


def _run(context: Any, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """One call of `context` (an execution context of its own, fresh per test) on exactly these buffers."""
    context.execute_ptrs([x.data_ptr()], [out.data_ptr()], torch.cuda.current_stream().cuda_stream)
    return out


def test_one_input_changed_in_place_between_calls() -> None:
    x, other = _inputs(2)
    net, compiled, engine = _compiled(x)
    context = engine.engine.create_execution_context()
    out = torch.empty(2, 10, device="cuda", dtype=torch.half)
    for _ in range(4):
        out.fill_(float("nan"))
        _check(_run(context, x, out), net, x)
    assert context.graph_captures == 1, "the first call's buffers, repeated, need no other graph"
    x.copy_(other)  # the graph on x's buffer must read what x holds now
    _check(_run(context, x, out), net, other)
    assert context.graph_captures == 1


def test_new_buffers_every_call() -> None:
    (x,) = _inputs(1)
    net, compiled, engine = _compiled(x)
    context = engine.engine.create_execution_context()
    outs = [_run(context, x.clone(), torch.empty(2, 10, device="cuda", dtype=torch.half)) for _ in range(5)]
    for out in outs:  # none was overwritten by a later call
        _check(out, net, x)
    assert context.graph_captures == 2, "the first call's graph, then only the staging graph"


def test_two_inputs_alternating_and_a_new_one() -> None:
    a, b, c = _inputs(3)
    net, compiled, engine = _compiled(a)
    context = engine.engine.create_execution_context()
    out = torch.empty(2, 10, device="cuda", dtype=torch.half)
    for _ in range(3):
        for x in (a, b):
            _check(_run(context, x, out), net, x)
    assert context.graph_captures == 3, "a graph for each alternating input, one for staging"
    _check(_run(context, c, out), net, c)  # new buffers: the staging graph
    for x in (a, b):
        _check(_run(context, x, out), net, x)
    assert context.graph_captures == 3


def test_output_overlapping_an_input_is_never_replayed_in_place() -> None:
    net, compiled, engine = _compiled(_inputs(1)[0])
    context = engine.engine.create_execution_context()
    buf = torch.randn(2 * 8 * 12 * 12, device="cuda").half()
    x = buf.view(2, 8, 12, 12)
    out = buf[:20].view(2, 10)  # the output's bytes are the input's first bytes
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        with torch.no_grad():
            want = net(x).float()  # before the call writes over x's first bytes
        got = _run(context, x, out).float()
        assert relative_error(got, want) < 1e-2
    assert context.graph_captures == 1


def test_model_calls_with_held_and_dropped_outputs() -> None:
    xs = _inputs(4)
    net, compiled, _ = _compiled(xs[0])
    with torch.no_grad():
        for x in xs[:2] * 3:  # each output dropped at once: the allocator hands its address back
            _check(compiled(x), net, x)
        last = None
        for i in range(12):  # the previous output held while the next is made
            x = xs[i % len(xs)]
            out = compiled(x)
            if last is not None:
                _check(*last)
            last = (out, net, x)
        assert last is not None
        _check(*last)
