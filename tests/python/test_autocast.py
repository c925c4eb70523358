"""Rule-based autocast (kiln/autocast.py): a float32 model built in mixed precision on the CPU.

Each test checks what the engine computes in (the dtypes of its plan's nodes and constants),
what the report says and why, and the results against eager float32 PyTorch.
"""

from __future__ import annotations

import copy
import types
from typing import Any

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

import kiln
from kiln import _C
from kiln.aot import KilnModule
from kiln.autocast import AutocastReport, apply_autocast
from kiln.lowering import lower_module
from kiln.pipeline import compile_lowered, supported_targets
from kiln.settings import option_names, settings_from_options
from kiln.testing import relative_error

HALF_TOL = {torch.float16: 5e-3, torch.bfloat16: 3e-2}  # relative error of a small model in that type


# ---- models ------------------------------------------------------------------------------------

class TransformerBlock(torch.nn.Module):
    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class HandWrittenBlock(torch.nn.Module):
    """Attention written out (one qkv linear, unbind, sdpa) and an MLP; its lowered graph runs in
    PyTorch as well (nn.MultiheadAttention's does not: lowering drops a contiguous clone its
    views need)."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(32)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Overflowing(torch.nn.Module):
    """fc1's outputs reach ~1e5, past float16's 65504; the layer norm brings them back."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.ln = torch.nn.LayerNorm(64)
        self.fc2 = torch.nn.Linear(64, 16)
        with torch.no_grad():
            self.fc1.weight.normal_(0.0, 4000.0)  # representable in float16; the products are not

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.ln(self.fc1(x)))


# ---- helpers -----------------------------------------------------------------------------------

def autocast_options(**changes: Any) -> dict[str, Any]:
    options: dict[str, Any] = dict(
        enable_autocast=True, autocast_low_precision_type=torch.float16, autocast_excluded_nodes=set(),
        autocast_excluded_ops=set(), autocast_max_output_threshold=512.0, autocast_max_depth_of_reduction=None,
        autocast_calibration_dataloader=None)
    options.update(changes)
    return options


class _StandIn:
    """CompilationSettings plus the autocast fields, until settings.py declares them."""

    def __init__(self, base: Any, fields: dict[str, Any]) -> None:
        self._base = base
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def compile_autocast(model: torch.nn.Module, inputs: list[Any], **changes: Any) -> KilnModule:
    """kiln.compile on the CPU with autocast (through compile_lowered and a stand-in for the
    settings when kiln.settings does not know the autocast options yet)."""
    options = autocast_options(**changes)
    if "enable_autocast" in option_names():
        return kiln.compile(model, inputs, device="cpu", min_block_size=1, **options)
    settings = _StandIn(settings_from_options(None, device="cpu", min_block_size=1), options)
    with torch.no_grad():
        lowered = lower_module(model, inputs, keep=supported_targets())
        gm = compile_lowered(lowered, settings, "cpu", graph_name=type(model).__name__)  # type: ignore[arg-type]
    return KilnModule(gm, lowered.in_spec, lowered.out_spec)


def report_of(compiled: KilnModule) -> AutocastReport:
    return compiled.gm.meta["kiln_autocast"]


def engine_nodes(compiled: KilnModule) -> dict[str, list[Any]]:
    """FX node name -> output dtypes of the engine nodes built from it (fused nodes are named
    'a+b', and stand for each)."""
    out: dict[str, list[Any]] = {}
    for engine in compiled.engines():
        g = engine.engine.graph()
        for n in g.nodes:
            for name in n.name.split("+"):
                out.setdefault(name, []).extend(g.type(v).dtype for v in n.outputs)
    return out


def engine_constant_dtypes(compiled: KilnModule) -> list[Any]:
    dtypes = []
    for engine in compiled.engines():
        g = engine.engine.graph()
        dtypes += [g.type(v).dtype for v in g.constants()]
    return dtypes


def node_of(report: AutocastReport, op: str, nth: int = 0) -> str:
    """The name of the nth node of ``op`` (an overload) in graph order."""
    names = [d.node for d in report.decisions.values() if d.op == op]
    return names[nth]


def stand_in(**changes: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(enabled_precisions=frozenset({torch.float32}), **autocast_options(**changes))


KILN_DTYPE = {torch.float16: _C.DType.f16, torch.bfloat16: _C.DType.bf16}


# ---- whole models ------------------------------------------------------------------------------

@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_transformer_block_runs_in_low_precision(low: torch.dtype) -> None:
    torch.manual_seed(0)
    model = TransformerBlock().eval()
    x = torch.randn(2, 16, 64)
    compiled = compile_autocast(model, [x], autocast_low_precision_type=low)
    report = report_of(compiled)
    assert report.low_precision_type == low
    lowered_ops = report.ops(low=True)
    assert lowered_ops["aten.linear.default"] == 4
    assert lowered_ops["aten.native_layer_norm.default"] == 2
    assert lowered_ops["aten.scaled_dot_product_attention.default"] == 1
    assert not report.kept, report.kept

    nodes = engine_nodes(compiled)
    for op in ("aten.linear.default", "aten.native_layer_norm.default", "aten.scaled_dot_product_attention.default"):
        for name in (d.node for d in report.decisions.values() if d.op == op):
            assert nodes[name] and set(nodes[name]) == {KILN_DTYPE[low]}, (name, nodes[name])
    assert set(engine_constant_dtypes(compiled)) == {KILN_DTYPE[low]}  # the weights, cast when built
    assert compiled.summary.engines == 1 and not compiled.summary.ops_in_pytorch

    with torch.no_grad():
        got, want = compiled(x), model(x)
    assert got.dtype == torch.float32 and got.shape == want.shape
    err = relative_error(got, want)
    assert 1e-6 < err <= HALF_TOL[low], err  # rounded in the low type, within its precision


def test_cnn_runs_in_float16() -> None:
    torch.manual_seed(0)
    model = SmallCNN().eval()
    with torch.no_grad():
        for bn in (model.bn1, model.bn2):
            bn.running_mean.normal_(0.0, 0.1)
            bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 32, 32)
    compiled = compile_autocast(model, [x])
    report = report_of(compiled)
    assert report.ops(low=True)["aten.convolution.default"] == 2
    assert report.ops(low=True)["aten.linear.default"] == 1
    assert not report.kept, report.kept
    nodes = engine_nodes(compiled)
    convs = [d.node for d in report.decisions.values() if d.op == "aten.convolution.default"]
    assert all(set(nodes[c]) == {_C.DType.f16} for c in convs), {c: nodes.get(c) for c in convs}
    assert set(engine_constant_dtypes(compiled)) == {_C.DType.f16}
    with torch.no_grad():
        got, want = compiled(x), model(x)
    assert got.dtype == torch.float32
    assert 1e-6 < relative_error(got, want) <= HALF_TOL[torch.float16]


def test_without_autocast_the_engine_stays_float32() -> None:
    torch.manual_seed(0)
    model = SmallCNN().eval()
    x = torch.randn(1, 3, 16, 16)
    compiled = kiln.compile(model, [x], device="cpu", min_block_size=1)
    assert "kiln_autocast" not in compiled.gm.meta
    assert set(engine_constant_dtypes(compiled)) == {_C.DType.f32}
    assert {dt for dts in engine_nodes(compiled).values() for dt in dts} == {_C.DType.f32}


def test_excluded_nodes_and_ops_stay_float32() -> None:
    torch.manual_seed(0)
    model = TransformerBlock().eval()
    x = torch.randn(2, 16, 64)
    compiled = compile_autocast(model, [x], autocast_excluded_nodes={"^ln2$", "^fc2$"},
                                autocast_excluded_ops={"aten.scaled_dot_product_attention"})
    report = report_of(compiled)
    ln2 = node_of(report, "aten.native_layer_norm.default", 1)
    fc2 = node_of(report, "aten.linear.default", 3)
    sdpa = node_of(report, "aten.scaled_dot_product_attention.default")
    decisions = report.decisions
    assert not decisions[ln2].low and decisions[ln2].rule == "excluded node" and "ln2" in decisions[ln2].detail
    assert not decisions[fc2].low and decisions[fc2].rule == "excluded node"
    assert not decisions[sdpa].low and decisions[sdpa].rule == "excluded op"
    fc1 = node_of(report, "aten.linear.default", 2)
    ln1 = node_of(report, "aten.native_layer_norm.default", 0)
    assert decisions[fc1].low and decisions[ln1].low

    nodes = engine_nodes(compiled)
    for name in (ln2, fc2, sdpa):
        assert nodes[name] and set(nodes[name]) == {_C.DType.f32}, (name, nodes[name])
    for name in (fc1, ln1):
        assert set(nodes[name]) == {_C.DType.f16}, (name, nodes[name])
    with torch.no_grad():
        got, want = compiled(x), model(x)
    assert got.dtype == torch.float32
    assert relative_error(got, want) <= HALF_TOL[torch.float16]


def test_calibration_keeps_overflowing_nodes_float32_and_beats_plain_float16() -> None:
    torch.manual_seed(0)
    model = Overflowing().eval()
    x = torch.randn(4, 32) * 3
    with torch.no_grad():
        want = model(x)
        assert model.fc1(x).abs().max() > 65504  # the case is what it claims
    assert torch.isfinite(want).all()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(12, 32) * 3), batch_size=4)

    compiled = compile_autocast(model, [x], autocast_calibration_dataloader=loader)
    report = report_of(compiled)
    assert report.calibration_batches == 3 and report.calibration_error is None
    fc1, fc2 = node_of(report, "aten.linear.default", 0), node_of(report, "aten.linear.default", 1)
    ln = node_of(report, "aten.native_layer_norm.default")
    assert report.decisions[fc1].rule == "calibration" and "output" in report.decisions[fc1].detail
    assert report.decisions[ln].rule == "calibration" and f"input {fc1}" in report.decisions[ln].detail
    assert report.decisions[fc2].low
    assert report.max_abs[fc1] > 65504
    nodes = engine_nodes(compiled)
    assert set(nodes[fc1]) == {_C.DType.f32} and set(nodes[fc2]) == {_C.DType.f16}
    with torch.no_grad():
        got = compiled(x)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    autocast_err = relative_error(got, want)
    assert autocast_err <= HALF_TOL[torch.float16], autocast_err

    # Plain float16 (the model in .half()) overflows in fc1.
    plain = kiln.compile(copy.deepcopy(model).half(), [x.half()], device="cpu", min_block_size=1)
    with torch.no_grad():
        plain_out = plain(x.half())
    assert not torch.isfinite(plain_out).all()
    plain_err = relative_error(plain_out.float(), want) if torch.isfinite(plain_out).all() else float("inf")
    assert autocast_err <= plain_err

    # Without calibration data nothing tells autocast about the range: fc1 overflows as well.
    blind = compile_autocast(model, [x])
    assert report_of(blind).decisions[fc1].low
    with torch.no_grad():
        assert not torch.isfinite(blind(x)).all()


def test_engine_follows_weights_changed_in_place() -> None:
    """A weight's cast is folded at build time and recorded: a refit casts the new weights."""
    torch.manual_seed(0)
    model = TransformerBlock().eval()
    x = torch.randn(2, 16, 64)
    compiled = compile_autocast(model, [x])
    with torch.no_grad():
        model.fc1.weight.mul_(-0.5)
        model.ln1.bias.add_(0.3)
        want = model(x)
        got = compiled(x)
    assert relative_error(got, want) <= HALF_TOL[torch.float16]


# ---- rules on a lowered graph ------------------------------------------------------------------

def lowered_graph(model: torch.nn.Module, inputs: list[Any], fold_weights: bool = False) -> fx.GraphModule:
    with torch.no_grad():
        return lower_module(model.eval(), inputs, keep=supported_targets(), fold_weights=fold_weights).gm


def run_checking_metadata(gm: fx.GraphModule, *inputs: torch.Tensor) -> Any:
    """Runs the graph in PyTorch; every node's result must have the dtype and shape its metadata says."""

    class Checker(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            val = n.meta.get("val")
            outs = out if isinstance(out, (tuple, list)) else [out]
            vals = val if isinstance(val, (tuple, list)) else [val]
            for o, v in zip(outs, vals):
                if isinstance(o, torch.Tensor) and isinstance(v, torch.Tensor):
                    assert (o.dtype, tuple(o.shape)) == (v.dtype, tuple(v.shape)), (n.name, o.dtype, v.dtype)
            return out

    with torch.no_grad():
        return Checker(gm).run(*inputs)


def test_rewritten_graph_metadata_matches_what_pytorch_computes() -> None:
    torch.manual_seed(0)
    model = HandWrittenBlock()
    x = torch.randn(2, 8, 64)
    gm = lowered_graph(model, [x])
    report = apply_autocast(gm, stand_in(autocast_excluded_nodes={"^ln2$"}))
    unbind = next(d for d in report.decisions.values() if d.op == "aten.unbind.int")
    assert unbind.low  # a tuple-valued node: its getitems carry float16 metadata
    casts = [n for n in gm.graph.nodes if n.target is torch.ops.aten._to_copy.default]
    assert len(casts) == report.casts
    assert report.constant_casts == 10  # each weight but ln2's (excluded) is read in float16
    (out,) = run_checking_metadata(gm, x)
    assert out.dtype == torch.float32
    assert relative_error(out, model(x).detach()) <= HALF_TOL[torch.float16]


def test_fragile_ops_stay_float32_up_to_the_next_compute_op() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(16, 16)
            self.b = torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.exp(torch.tanh(self.a(x)) * 3)  # fragile: float32
            y = (h * 0.5 + 1).view(4, 16)              # follows float32
            return self.b(y) + torch.rsqrt(y.var(-1, keepdim=True) + 1e-5)

    torch.manual_seed(0)
    model = M()
    x = torch.randn(4, 16)
    gm = lowered_graph(model, [x])
    report = apply_autocast(gm, stand_in())
    by_op = {d.op: d for d in report.decisions.values()}
    for op in ("aten.exp.default", "aten.var.correction", "aten.rsqrt.default"):
        assert not by_op[op].low and by_op[op].rule == "fragile op", by_op[op]
    muls = [d for d in report.decisions.values() if d.op == "aten.mul.Tensor"]
    assert muls[0].low and muls[0].rule == "follows low precision"  # tanh(a(x)) * 3
    after_exp = muls[1:] + [d for d in report.decisions.values() if d.op in ("aten.add.Tensor", "aten.view.default")]
    assert after_exp and all(not d.low and d.rule == "follows float32" for d in after_exp), after_exp
    a, b = node_of(report, "aten.linear.default", 0), node_of(report, "aten.linear.default", 1)
    assert report.decisions[a].low and report.decisions[b].low
    assert report.decisions[node_of(report, "aten.tanh.default")].low  # follows a
    # b reads y through one cast; y itself stays float32 for var.
    b_node = next(n for n in gm.graph.nodes if n.name == b)
    assert b_node.args[0].target is torch.ops.aten._to_copy.default
    assert b_node.args[0].args[0].meta["val"].dtype == torch.float32
    (out,) = run_checking_metadata(gm, x)
    assert relative_error(out, model(x).detach()) <= HALF_TOL[torch.float16]


def test_values_beyond_the_low_range_keep_their_readers_float32() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)
            self.register_buffer("offset", torch.full((8,), 1e6))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            z = y.masked_fill(y > 1.0, -1e9)  # the fill is -inf in float16
            scaled = (y * 1e5) * 1e-5  # 1e5 is inf in float16: x * 1e5 stays float32
            return (z + self.offset) - self.offset + self.fc(z.clamp(min=-1.0)) + scaled

    torch.manual_seed(0)
    model = M()
    x = torch.randn(4, 8)
    gm = lowered_graph(model, [x])
    report = apply_autocast(gm, stand_in())
    fill = next(d for d in report.decisions.values() if d.op == "aten.masked_fill.Scalar")
    assert not fill.low and fill.rule == "out of range" and "-1e+09" in fill.detail
    add = next(d for d in report.decisions.values() if d.op == "aten.add.Tensor" and "offset" in d.detail)
    assert not add.low and add.rule == "out of range"
    muls = [d for d in report.decisions.values() if d.op == "aten.mul.Tensor"]
    assert muls[0].rule == "out of range" and "100000" in muls[0].detail, muls[0]
    assert not muls[1].low and muls[1].rule == "follows float32"
    (out,) = run_checking_metadata(gm, x)
    want = model(x).detach()
    assert torch.isfinite(out).all()
    assert relative_error(out, want) <= HALF_TOL[torch.float16]


def test_reduction_depth_limit() -> None:
    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)     # depth 4 * 3 * 3 = 36
            self.narrow = torch.nn.Linear(8, 64)                 # K = 8
            self.wide = torch.nn.Linear(64, 8)                   # K = 64

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.conv(x).mean((2, 3))                        # mean over 16 terms
            return self.wide(self.narrow(h)).softmax(-1)        # softmax over 8

    torch.manual_seed(0)
    model = M()
    x = torch.randn(2, 4, 4, 4)
    gm = lowered_graph(model, [x])
    report = apply_autocast(gm, stand_in(autocast_max_depth_of_reduction=32))
    d = report.decisions
    conv = d[node_of(report, "aten.convolution.default")]
    assert not conv.low and conv.rule == "reduction depth" and conv.detail == "36 > 32"
    wide = d[node_of(report, "aten.linear.default", 1)]
    assert not wide.low and wide.detail == "64 > 32"
    narrow = d[node_of(report, "aten.linear.default", 0)]
    assert narrow.low, narrow  # K = 8; its input, the float32 mean, is cast
    softmax = next(v for v in d.values() if "softmax" in v.op)
    assert softmax.low, softmax
    (out,) = run_checking_metadata(gm, x)
    assert relative_error(out, model(x).detach()) <= HALF_TOL[torch.float16]

    unlimited = apply_autocast(lowered_graph(model, [x]), stand_in())
    assert not unlimited.kept or all(r.startswith("follows") for r in unlimited.kept.values()), unlimited.kept


def test_immutable_weights_fold_the_weight_casts_here() -> None:
    torch.manual_seed(0)
    model = SmallCNN()
    x = torch.randn(1, 3, 8, 8)
    gm = lowered_graph(model, [x], fold_weights=True)
    apply_autocast(gm, stand_in(immutable_weights=True))
    for n in gm.graph.nodes:
        if n.target is torch.ops.aten._to_copy.default:
            assert n.args[0].op != "get_attr", f"{n.name} casts constant {n.args[0].name}"
    assert {b.dtype for _, b in gm.named_buffers()} == {torch.float16}
    (out,) = run_checking_metadata(gm, x)
    assert relative_error(out, model.eval()(x).detach()) <= HALF_TOL[torch.float16]


# ---- settings and calibration data -------------------------------------------------------------

def test_enabled_precisions_with_a_low_type_is_refused() -> None:
    gm = lowered_graph(SmallCNN(), [torch.randn(1, 3, 8, 8)])
    settings = stand_in()
    settings.enabled_precisions = frozenset({torch.float32, torch.float16})
    with pytest.raises(ValueError, match=r"enabled_precisions also names torch.float16.*leave enabled_precisions"):
        apply_autocast(gm, settings)


@pytest.mark.parametrize("changes, message", [
    ({"autocast_low_precision_type": torch.float64}, "must be torch.float16 or torch.bfloat16, got torch.float64"),
    ({"autocast_excluded_nodes": {"conv("}}, "'conv\\(' is not a valid regular expression"),
])
def test_bad_autocast_settings_name_the_cause(changes: dict[str, Any], message: str) -> None:
    gm = lowered_graph(SmallCNN(), [torch.randn(1, 3, 8, 8)])
    with pytest.raises(ValueError, match=message):
        apply_autocast(gm, stand_in(**changes))


def test_calibration_data_that_does_not_fit_turns_the_threshold_rule_off() -> None:
    gm = lowered_graph(Overflowing(), [torch.randn(4, 32)])
    with pytest.warns(RuntimeWarning, match=r"batch 0 input 0 has shape \[2, 32\], the graph was traced for \[4, 32\]"):
        report = apply_autocast(gm, stand_in(autocast_calibration_dataloader=[torch.randn(2, 32)]))
    assert report.calibration_batches == 0 and "traced for [4, 32]" in (report.calibration_error or "")
    assert not report.kept  # no range known: every node is lowered


def test_calibration_batch_forms() -> None:
    """A tensor, a tuple and a list (a DataLoader's batch) each feed the graph's one input."""
    torch.manual_seed(0)
    x = torch.randn(4, 32) * 3
    for batch in (x, (x,), [x]):
        gm = lowered_graph(Overflowing(), [x])
        report = apply_autocast(gm, stand_in(autocast_calibration_dataloader=[batch]))
        assert report.calibration_batches == 1
        assert report.decisions[node_of(report, "aten.linear.default", 0)].rule == "calibration"
