"""Every Kiln op against PyTorch, one op per engine, on the CPU backend.

How to add an op: after its line in KILN_OP_LIST, its shape rule and its CPU kernel, append
cases to CASES below (section of its family): the inputs (random tensors from the helpers; None
for an absent optional input), the attributes exactly as Graph.add_node takes them, and the
PyTorch function that computes the same thing. ``test_every_op_has_a_case`` fails until you do.

Each case builds a one-node Graph whose tensor inputs are all runtime inputs (so the op's own
kernel runs; nothing is constant-folded), builds an engine with pointwise fusion off, runs it
on the case's random data and compares with PyTorch:
  f32: rtol 1e-5 (atol 1e-6; 1e-5 for ops that accumulate: matmul, conv, reductions, norms),
  f16 / bf16: against PyTorch computing in f32 on the same rounded inputs, rounded once
      (Kiln's CPU backend loads and stores 16-bit floats through f32),
  integers and bools: exactly.
``test_op_fused`` reruns every pointwise case as a two-op chain through the fusion pass, and
``test_fusion_*`` check that chains really become fused_pointwise nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Optional

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import Builder, BuilderConfig, DType, Graph

f32, f16, bf16, f64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
i64, i32, i8, u8, tbool = torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool

TORCH_TO_KILN = {
    f32: DType.f32, f16: DType.f16, bf16: DType.bf16, f64: DType.f64, i64: DType.i64,
    i32: DType.i32, i8: DType.i8, u8: DType.u8, tbool: DType.bool,
}
KILN_TO_TORCH = {v: k for k, v in TORCH_TO_KILN.items()}

# Ops whose result sums many products or terms: f32 differences of a few ulps of the sum.
ACCUMULATING = {
    "matmul", "linear", "conv", "conv_transpose", "sdpa", "reduce_sum", "reduce_mean", "reduce_var",
    "batch_norm", "layer_norm", "group_norm", "softmax", "log_softmax", "avg_pool", "adaptive_avg_pool",
}

_gen = torch.Generator().manual_seed(1234)


def r(*shape: int, scale: float = 1.0) -> torch.Tensor:
    """Standard normal values (times scale)."""
    return torch.randn(shape, generator=_gen) * scale


def pos(*shape: int, lo: float = 0.5, hi: float = 2.0) -> torch.Tensor:
    """Uniform in [lo, hi): for log, sqrt, pow bases, variances."""
    return torch.rand(shape, generator=_gen) * (hi - lo) + lo


def nz(*shape: int) -> torch.Tensor:
    """Magnitudes in [0.5, 2) with random signs: divisors away from zero."""
    sign = torch.where(torch.rand(shape, generator=_gen) < 0.5, -1.0, 1.0)
    return pos(*shape) * sign


def ints(*shape: int, lo: int = -5, hi: int = 6, dtype: torch.dtype = i64) -> torch.Tensor:
    return torch.randint(lo, hi, shape, generator=_gen).to(dtype)


def small(*shape: int) -> torch.Tensor:
    """Small integers as f32: comparisons see ties."""
    return ints(*shape, lo=-2, hi=3).to(f32)


def bools(*shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=_gen) < 0.5


@dataclasses.dataclass
class Case:
    op: str
    inputs: list[Optional[torch.Tensor]]
    attrs: dict[str, Any]
    ref: Callable[..., Any]
    note: str = ""

    def astype(self, dtype: torch.dtype) -> Case:
        """The same case on floating inputs converted to dtype; the reference computes in f32."""
        ins = [t.to(dtype) if t is not None and t.is_floating_point() else t for t in self.inputs]
        ref = self.ref

        def low_ref(*xs: Optional[torch.Tensor]) -> Any:
            up = [x.float() if x is not None and x.is_floating_point() else x for x in xs]
            out = ref(*up)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            res = tuple(o.to(dtype) if o.is_floating_point() else o for o in outs)
            return res if isinstance(out, (tuple, list)) else res[0]

        return Case(self.op, ins, dict(self.attrs), low_ref, f"{self.note}-{str(dtype).split('.')[-1]}")


CASES: list[Case] = []


def case(op: str, inputs: list[Optional[torch.Tensor]], attrs: dict[str, Any], ref: Callable[..., Any],
         note: str = "") -> Case:
    c = Case(op, inputs, attrs, ref, note)
    CASES.append(c)
    return c


def all_dims(x: torch.Tensor, axes: list[int]) -> list[int]:
    return axes if axes else list(range(x.dim()))


# ---- unary --------------------------------------------------------------------------------
_UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu, "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp,
    "neg": torch.neg, "abs": torch.abs, "erf": torch.erf, "sin": torch.sin, "cos": torch.cos,
}
for _name, _fn in _UNARY.items():
    for _shape in [(7,), (2, 3, 5), (4, 33)]:
        case(_name, [r(*_shape, scale=2.0)], {}, _fn)
for _name, _fn in {"hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid}.items():
    case(_name, [r(5, 9, scale=3.0)], {}, _fn)  # reaches both saturated regions
    case(_name, [r(64, scale=4.0)], {}, _fn)
for _name, _fn in {"log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt}.items():
    case(_name, [pos(3, 11, lo=0.01, hi=10.0)], {}, _fn)
    case(_name, [pos(5, lo=0.5, hi=2.0)], {}, _fn)
case("reciprocal", [nz(4, 7)], {}, torch.reciprocal)
case("reciprocal", [nz(13)], {}, torch.reciprocal)
case("relu", [r()], {}, F.relu, "rank0")
case("gelu", [r(3, 17, scale=2.0)], {"approximate": "none"}, lambda x: F.gelu(x, approximate="none"))
case("gelu", [r(2, 4, 6, scale=2.0)], {"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh"))
case("clamp", [r(4, 9)], {"min": -0.5, "max": 0.75}, lambda x: torch.clamp(x, -0.5, 0.75))
case("clamp", [r(4, 9)], {"min": 0.1}, lambda x: torch.clamp(x, min=0.1), "min-only")
case("clamp", [r(4, 9)], {"max": -0.2}, lambda x: torch.clamp(x, max=-0.2), "max-only")
case("clamp", [r(30)], {"min": -1, "max": 1}, lambda x: torch.clamp(x, -1, 1), "int-bounds")
case("leaky_relu", [r(6, 7)], {"negative_slope": 0.01}, lambda x: F.leaky_relu(x, 0.01))
case("leaky_relu", [r(2, 3, 4)], {"negative_slope": 0.2}, lambda x: F.leaky_relu(x, 0.2))
case("logical_not", [bools(3, 8)], {}, torch.logical_not)
case("neg", [ints(4, 5)], {}, torch.neg, "i64")
case("abs", [ints(4, 5, dtype=i32)], {}, torch.abs, "i32")
case("relu", [ints(10, dtype=i32)], {}, torch.relu, "i32")

# ---- binary -------------------------------------------------------------------------------
_BROADCASTS = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (5, 2)), ((2, 3), ())]
for _name, _fn in {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum,
                   "minimum": torch.minimum}.items():
    for _a, _b in _BROADCASTS:
        case(_name, [r(*_a), r(*_b)], {}, _fn)
    case(_name, [ints(3, 4), ints(4)], {}, _fn, "i64")
    case(_name, [ints(2, 5, dtype=i32), ints(2, 5, dtype=i32)], {}, _fn, "i32")
for _a, _b in _BROADCASTS:
    case("div", [r(*_a), nz(*_b)], {}, torch.div)
case("div", [ints(4, 6, lo=-20, hi=21), torch.tensor([3, -3, 7, -7, 1, 2])], {},
     lambda a, b: torch.div(a, b, rounding_mode="trunc"), "i64-trunc")
case("div", [ints(3, 5, lo=-50, hi=51, dtype=i32), torch.tensor([4, -4, 9, -2, 5], dtype=i32)], {},
     lambda a, b: torch.div(a, b, rounding_mode="trunc"), "i32-trunc")
case("pow", [pos(3, 4), r(3, 4)], {}, torch.pow)
case("pow", [pos(2, 3, 4), torch.tensor([2.0, 0.5, -1.0, 3.0])], {}, torch.pow, "broadcast")
for _name, _fn in {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt,
                   "ge": torch.ge}.items():
    case(_name, [small(4, 6), small(4, 6)], {}, _fn)
    case(_name, [small(2, 3, 4), small(3, 1)], {}, _fn, "broadcast")
    case(_name, [ints(5, 3, lo=-2, hi=3), ints(3, lo=-2, hi=3)], {}, _fn, "i64")
for _name, _fn in {"logical_and": torch.logical_and, "logical_or": torch.logical_or}.items():
    case(_name, [bools(4, 5), bools(4, 5)], {}, _fn)
    case(_name, [bools(2, 1, 5), bools(3, 1)], {}, _fn, "broadcast")

# ---- where, cast --------------------------------------------------------------------------
case("where", [bools(3, 4), r(3, 4), r(3, 4)], {}, torch.where)
case("where", [bools(2, 1, 4), r(3, 4), r(2, 3, 1)], {}, torch.where, "broadcast")
case("where", [bools(5), ints(2, 5), ints(1)], {}, torch.where, "i64")
for _src, _dst, _x in [
    (f32, f16, r(4, 6, scale=3.0)), (f32, i32, r(4, 6, scale=10.0)), (f32, i64, r(7, scale=100.0)),
    (i64, f32, ints(3, 5, lo=-1000, hi=1000)), (f32, tbool, small(4, 5)), (tbool, f32, bools(3, 3)),
    (f16, f32, r(2, 8).to(f16)), (f32, f64, r(3, 3)), (u8, f32, ints(9, lo=0, hi=256, dtype=u8)),
    (i32, i64, ints(6, lo=-100, hi=100, dtype=i32)), (f32, bf16, r(5, 4)), (bf16, f32, r(3, 4).to(bf16)),
]:
    case("cast", [_x.to(_src)], {"dtype": TORCH_TO_KILN[_dst]}, lambda x, d=_dst: x.to(d),
         f"{str(_src).split('.')[-1]}-{str(_dst).split('.')[-1]}")

# ---- reductions ---------------------------------------------------------------------------
_REDUCE = {"reduce_sum": torch.sum, "reduce_mean": torch.mean, "reduce_max": torch.amax,
           "reduce_min": torch.amin}
for _name, _fn in _REDUCE.items():
    for _axes, _keep in [([1], False), ([0, 2], True), ([], False), ([2], True), ([0, 1, 2], True)]:
        case(_name, [r(3, 4, 5)], {"axes": _axes, "keepdim": _keep},
             lambda x, a=_axes, k=_keep, f=_fn: f(x, dim=all_dims(x, a), keepdim=k), f"{_axes}-{_keep}")
case("reduce_sum", [ints(4, 6)], {"axes": [1], "keepdim": False}, lambda x: torch.sum(x, dim=1), "i64")
case("reduce_max", [ints(4, 6, dtype=i32)], {"axes": [0], "keepdim": True},
     lambda x: torch.amax(x, dim=0, keepdim=True), "i32")
for _axes, _keep, _corr in [([1], False, 1.0), ([0, 2], True, 0.0), ([], False, 1.0), ([2], False, 2.0)]:
    case("reduce_var", [r(3, 4, 6)], {"axes": _axes, "keepdim": _keep, "correction": _corr},
         lambda x, a=_axes, k=_keep, c=_corr: torch.var(x, dim=all_dims(x, a), correction=c, keepdim=k),
         f"{_axes}-{_keep}-{_corr}")
# Kept runs of whole 16-byte words (in f32, f16 and bf16): the vector column kernel on CUDA. A
# channels-last global pool, a long reduction (several rounds of loads per thread), a short one.
case("reduce_mean", [r(2, 6, 6, 72)], {"axes": [1, 2], "keepdim": True},
     lambda x: torch.mean(x, dim=(1, 2), keepdim=True), "nhwc-pool")
case("reduce_sum", [r(1, 1500, 8)], {"axes": [1], "keepdim": False}, lambda x: torch.sum(x, dim=1), "long-cols")
case("reduce_max", [r(2, 7, 8)], {"axes": [1], "keepdim": False}, lambda x: torch.amax(x, dim=1), "short-cols")
case("reduce_var", [r(3, 50, 64)], {"axes": [1], "keepdim": False, "correction": 1.0},
     lambda x: torch.var(x, dim=1, correction=1.0), "cols")
case("reduce_sum", [ints(5, 33, 16, dtype=i32)], {"axes": [1], "keepdim": False},
     lambda x: torch.sum(x, dim=1, dtype=i32), "i32-cols")
for _axis, _keep in [(0, False), (1, True), (2, False)]:
    case("argmax", [r(3, 5, 7)], {"axis": _axis, "keepdim": _keep},
         lambda x, a=_axis, k=_keep: torch.argmax(x, dim=a, keepdim=k), f"{_axis}-{_keep}")
case("argmax", [ints(4, 9, lo=-1000, hi=1000)], {"axis": 1, "keepdim": False},
     lambda x: torch.argmax(x, dim=1), "i64")

# ---- softmax ------------------------------------------------------------------------------
for _name, _fn in {"softmax": torch.softmax, "log_softmax": torch.log_softmax}.items():
    for _shape, _axis in [((2, 5, 7), 2), ((2, 5, 7), 1), ((4, 3), 0), ((3, 130), 1)]:
        case(_name, [r(*_shape, scale=3.0)], {"axis": _axis}, lambda x, a=_axis, f=_fn: f(x, a), f"axis{_axis}")

# ---- normalization ------------------------------------------------------------------------
for _shape in [(2, 3, 4, 5), (4, 3), (2, 3, 7)]:
    case("batch_norm", [r(*_shape), r(3), pos(3), r(3), r(3)], {"eps": 1e-5},
         lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, False, 0.0, 1e-5), f"{len(_shape)}d")
case("batch_norm", [r(2, 3, 4, 4), r(3), pos(3), None, None], {"eps": 1e-3},
     lambda x, m, v, w, b: F.batch_norm(x, m, v, None, None, False, 0.0, 1e-3), "no-affine")
case("layer_norm", [r(2, 5, 8), r(8), r(8)], {"normalized_rank": 1, "eps": 1e-5},
     lambda x, w, b: F.layer_norm(x, (8,), w, b, 1e-5))
case("layer_norm", [r(3, 4, 6), r(4, 6), r(4, 6)], {"normalized_rank": 2, "eps": 1e-6},
     lambda x, w, b: F.layer_norm(x, (4, 6), w, b, 1e-6), "rank2")
case("layer_norm", [r(4, 16), None, None], {"normalized_rank": 1, "eps": 1e-5},
     lambda x, w, b: F.layer_norm(x, (16,), None, None, 1e-5), "no-affine")
case("layer_norm", [r(4, 10), r(10), None], {"normalized_rank": 1, "eps": 1e-5},
     lambda x, w, b: F.layer_norm(x, (10,), w, None, 1e-5), "weight-only")
case("group_norm", [r(2, 6, 3, 3), r(6), r(6)], {"groups": 2, "eps": 1e-5},
     lambda x, w, b: F.group_norm(x, 2, w, b, 1e-5))
case("group_norm", [r(3, 4, 5), None, None], {"groups": 4, "eps": 1e-5},
     lambda x, w, b: F.group_norm(x, 4, None, None, 1e-5), "per-channel")
case("group_norm", [r(2, 8, 2, 3), r(8), None], {"groups": 1, "eps": 1e-4},
     lambda x, w, b: F.group_norm(x, 1, w, None, 1e-4), "one-group")


def _gn_last(groups: int, eps: float = 1e-5) -> Callable[..., torch.Tensor]:
    """group_norm of a channels-last x [N, H, W, C] (layout "nhwc")."""
    return lambda x, w, b: F.group_norm(x.permute(0, 3, 1, 2), groups, w, b, eps).permute(0, 2, 3, 1)


case("group_norm", [r(2, 3, 5, 6), r(6), r(6)], {"groups": 2, "eps": 1e-5, "layout": "nhwc"}, _gn_last(2),
     "channels-last")
case("group_norm", [r(2, 4, 3, 12), None, None], {"groups": 4, "eps": 1e-5, "layout": "nhwc"}, _gn_last(4),
     "channels-last-no-affine")
# A UNet's at batch 32 (more groups than the CUDA split takes): four f16 channels per group.
case("group_norm", [r(32, 4, 4, 64).half(), r(64).half(), r(64).half()], {"groups": 16, "eps": 1e-5, "layout": "nhwc"},
     _gn_last(16), "channels-last-f16")

# ---- matmul, linear -----------------------------------------------------------------------
for _a, _b in [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 6)), ((2, 3, 4), (2, 4, 5)),
               ((1, 1), (1, 1)), ((17, 33), (33, 9))]:
    case("matmul", [r(*_a), r(*_b)], {}, torch.matmul, f"{_a}x{_b}")
case("linear", [r(4, 8), r(6, 8), r(6)], {}, F.linear)
case("linear", [r(2, 3, 8), r(6, 8), None], {}, lambda x, w, b: F.linear(x, w), "no-bias")
case("linear", [r(5, 40), r(3, 40), r(3)], {}, F.linear, "k40")

# The fused epilogue (src/ops/epilogue.h): act(x @ w^T + bias + residual), every activation.
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda t: t, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
}
for _act, _fn in _ACTIVATIONS.items():
    case("linear", [r(2, 3, 8), r(6, 8), r(6), r(2, 3, 6)], {"activation": _act},
         lambda x, w, b, res, fn=_fn: fn(F.linear(x, w, b) + res), f"residual-{_act}")
case("linear", [r(4, 8), r(6, 8), None, r(6)], {"activation": "silu"},
     lambda x, w, b, res: F.silu(F.linear(x, w) + res), "broadcast-residual-no-bias-silu")
case("linear", [r(5, 40), r(3, 40), r(3)], {"activation": "relu"}, lambda x, w, b: F.relu(F.linear(x, w, b)),
     "relu")
# Few output tiles and a long K (a batch-1 transformer's FFN shape, scaled down).
case("linear", [r(16, 1024, scale=0.1), r(96, 1024, scale=0.1), r(96), r(16, 96)], {"activation": "gelu"},
     lambda x, w, b, res: F.gelu(F.linear(x, w, b) + res), "long-k-residual-gelu")

# ---- convolution --------------------------------------------------------------------------
def _conv_case(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], stride: list[int],
               padding: list[int], dilation: list[int], groups: int, note: str) -> None:
    fn = F.conv1d if x.dim() == 3 else F.conv2d
    case("conv", [x, w, b], {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups},
         lambda x_, w_, b_: fn(x_, w_, b_, stride, padding, dilation, groups), note)


_conv_case(r(2, 4, 9, 9), r(6, 4, 3, 3), r(6), [1, 1], [1, 1], [1, 1], 1, "same")
# Fused epilogues cuDNN has no pointwise mode for (the CUDA conv adds a generated epilogue).
case("conv", [r(2, 4, 9, 9), r(6, 4, 3, 3), r(6)], {"padding": [1, 1], "activation": "hardswish"},
     lambda x, w, b: F.hardswish(F.conv2d(x, w, b, padding=1)), "bias-hardswish")
case("conv", [r(2, 4, 9, 9), r(6, 4, 1, 1), r(6), r(2, 6, 9, 9)], {"activation": "hardsigmoid"},
     lambda x, w, b, res: F.hardsigmoid(F.conv2d(x, w, b) + res), "residual-hardsigmoid")
_conv_case(r(2, 4, 9, 9), r(6, 4, 3, 3), None, [2, 2], [0, 0], [1, 1], 1, "stride2")
_conv_case(r(1, 3, 10, 8), r(4, 3, 3, 3), r(4), [1, 1], [2, 2], [2, 2], 1, "dilation2")
_conv_case(r(2, 4, 7, 7), r(6, 2, 3, 3), r(6), [1, 1], [1, 1], [1, 1], 2, "groups2")
_conv_case(r(2, 4, 6, 6), r(4, 1, 3, 3), r(4), [1, 1], [1, 1], [1, 1], 4, "depthwise")
_conv_case(r(1, 3, 8, 7), r(5, 3, 3, 1), r(5), [2, 1], [1, 0], [1, 1], 1, "asymmetric")
_conv_case(r(2, 3, 5, 5), r(8, 3, 1, 1), r(8), [1, 1], [0, 0], [1, 1], 1, "pointwise")
_conv_case(r(2, 3, 10), r(4, 3, 3), r(4), [2], [1], [1], 1, "1d")
_conv_case(r(1, 4, 12), r(4, 2, 5), None, [1], [4], [2], 2, "1d-dilated-groups")

# conv with the fused epilogue: a residual of the output's shape and every activation, on each
# CPU path (im2col, depthwise, 1x1, 1-D).
for _act, _fn in _ACTIVATIONS.items():
    case("conv", [r(2, 4, 7, 7), r(6, 2, 3, 3), r(6), r(2, 6, 7, 7)],
         {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 2, "activation": _act},
         lambda x, w, b, res, fn=_fn: fn(F.conv2d(x, w, b, 1, 1, 1, 2) + res), f"residual-{_act}")
case("conv", [r(1, 4, 9, 9), r(4, 1, 3, 3), None, r(1, 4, 5, 5)],
     {"stride": [2, 2], "padding": [1, 1], "dilation": [1, 1], "groups": 4, "activation": "gelu"},
     lambda x, w, b, res: F.gelu(F.conv2d(x, w, None, 2, 1, 1, 4) + res), "depthwise-residual-no-bias-gelu")
case("conv", [r(2, 3, 5, 5), r(8, 3, 1, 1), r(8)],
     {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1, "activation": "relu"},
     lambda x, w, b: F.relu(F.conv2d(x, w, b)), "1x1-relu")
case("conv", [r(2, 3, 10), r(4, 3, 3), r(4), r(2, 4, 5)],
     {"stride": [2], "padding": [1], "dilation": [1], "groups": 1, "activation": "tanh"},
     lambda x, w, b, res: torch.tanh(F.conv1d(x, w, b, 2, 1) + res), "1d-residual-tanh")


def _conv_t_case(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], stride: list[int],
                 padding: list[int], output_padding: list[int], dilation: list[int], groups: int, note: str) -> None:
    fn = F.conv_transpose1d if x.dim() == 3 else F.conv_transpose2d
    attrs = {"stride": stride, "padding": padding, "output_padding": output_padding, "dilation": dilation,
             "groups": groups}
    case("conv_transpose", [x, w, b], attrs,
         lambda x_, w_, b_: fn(x_, w_, b_, stride, padding, output_padding, groups, dilation), note)


_conv_t_case(r(2, 4, 5, 5), r(4, 3, 3, 3), r(3), [2, 2], [1, 1], [1, 1], [1, 1], 1, "stride2")
_conv_t_case(r(1, 4, 4, 6), r(4, 2, 3, 3), r(4), [1, 1], [0, 0], [0, 0], [1, 1], 2, "groups2")
_conv_t_case(r(2, 3, 4, 4), r(3, 2, 2, 3), None, [1, 2], [0, 1], [0, 1], [2, 1], 1, "dilated")
_conv_t_case(r(2, 4, 7), r(4, 2, 3), r(2), [2], [1], [0], [1], 1, "1d")

# ---- pooling ------------------------------------------------------------------------------
for _x, _k, _s, _p, _d, _ceil, _note in [
    (r(2, 3, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], False, "k2s2"),
    (r(1, 2, 9, 7), [3, 3], [2, 2], [1, 1], [1, 1], False, "k3s2p1"),
    (r(1, 2, 8, 8), [3, 3], [2, 2], [0, 0], [1, 1], True, "ceil"),
    (r(1, 2, 9, 9), [2, 3], [1, 2], [1, 1], [2, 1], False, "dilated"),
    (r(2, 3, 11), [3], [2], [1], [1], False, "1d"),
]:
    _fn = F.max_pool1d if _x.dim() == 3 else F.max_pool2d
    case("max_pool", [_x], {"kernel": _k, "stride": _s, "padding": _p, "dilation": _d, "ceil_mode": _ceil},
         lambda x, k=_k, s=_s, p=_p, d=_d, c=_ceil, f=_fn: f(x, k, s, p, d, ceil_mode=c), _note)
for _x, _k, _s, _p, _ceil, _cip, _div, _note in [
    (r(2, 3, 8, 8), [2, 2], [2, 2], [0, 0], False, True, 0, "k2s2"),
    (r(1, 2, 9, 7), [3, 3], [2, 2], [1, 1], False, True, 0, "pad-included"),
    (r(1, 2, 9, 7), [3, 3], [2, 2], [1, 1], False, False, 0, "pad-excluded"),
    (r(1, 2, 8, 8), [3, 3], [2, 2], [1, 1], True, True, 0, "ceil"),
    (r(1, 2, 8, 8), [3, 3], [2, 2], [1, 1], True, False, 0, "ceil-pad-excluded"),
    (r(1, 2, 6, 6), [2, 2], [2, 2], [0, 0], False, True, 5, "divisor"),
    (r(2, 3, 11), [3], [2], [1], False, True, 0, "1d"),
]:
    _attrs = {"kernel": _k, "stride": _s, "padding": _p, "ceil_mode": _ceil, "count_include_pad": _cip,
              "divisor": _div}
    if _x.dim() == 3:
        _ref = lambda x, k=_k, s=_s, p=_p, c=_ceil, i=_cip: F.avg_pool1d(x, k, s, p, c, i)  # noqa: E731
    else:
        _ref = lambda x, k=_k, s=_s, p=_p, c=_ceil, i=_cip, d=_div: F.avg_pool2d(  # noqa: E731
            x, k, s, p, c, i, d or None)
    case("avg_pool", [_x], _attrs, _ref, _note)
case("adaptive_avg_pool", [r(2, 3, 8, 8)], {"output_size": [1, 1]},
     lambda x: F.adaptive_avg_pool2d(x, (1, 1)), "global")
case("adaptive_avg_pool", [r(1, 2, 7, 5)], {"output_size": [3, 2]},
     lambda x: F.adaptive_avg_pool2d(x, (3, 2)), "uneven")
case("adaptive_avg_pool", [r(2, 3, 10)], {"output_size": [4]}, lambda x: F.adaptive_avg_pool1d(x, 4), "1d")

# ---- shape --------------------------------------------------------------------------------
case("reshape", [r(2, 3, 4)], {"shape": [6, 4]}, lambda x: x.reshape(6, 4))
case("reshape", [r(2, 3, 4)], {"shape": [4, 1, 6]}, lambda x: x.reshape(4, 1, 6), "unit-dim")
case("reshape", [ints(6)], {"shape": [2, 3]}, lambda x: x.reshape(2, 3), "i64")
case("permute", [r(2, 3, 4)], {"perm": [2, 0, 1]}, lambda x: x.permute(2, 0, 1))
case("permute", [r(2, 3, 4, 5)], {"perm": [0, 2, 3, 1]}, lambda x: x.permute(0, 2, 3, 1), "nhwc")
case("permute", [bools(3, 4)], {"perm": [1, 0]}, lambda x: x.permute(1, 0), "bool")
case("permute", [r(1, 6, 4)], {"perm": [1, 0, 2]}, lambda x: x.permute(1, 0, 2), "unit-dim")
case("expand", [r(3, 1, 4)], {"shape": [3, 1, 4]}, lambda x: x.expand(3, 1, 4), "identity")
case("expand", [r(3, 1, 4)], {"shape": [3, 5, 4]}, lambda x: x.expand(3, 5, 4))
case("expand", [r(1, 4)], {"shape": [3, 4]}, lambda x: x.expand(3, 4), "leading")
case("slice", [r(3, 7)], {"axis": 1, "start": 1, "end": 6, "step": 2}, lambda x: x[:, 1:6:2])
case("slice", [r(5, 2, 3)], {"axis": 0, "start": 0, "end": 2, "step": 1}, lambda x: x[0:2], "axis0")
case("slice", [r(2, 3, 10)], {"axis": 2, "start": 2, "end": 10, "step": 3}, lambda x: x[:, :, 2:10:3], "step3")
case("concat", [r(2, 3), r(2, 5), r(2, 1)], {"axis": 1}, lambda *xs: torch.cat(xs, 1))
case("concat", [r(1, 3, 2), r(4, 3, 2)], {"axis": 0}, lambda *xs: torch.cat(xs, 0), "axis0")
case("concat", [ints(3, 2)], {"axis": 1}, lambda x: torch.cat([x], 1), "single-i64")
# DenseNet's channels-last concat: more parts than one CUDA launch writes (8), of two widths.
case("concat", [r(2, 3, 3, 16).half()] + [r(2, 3, 3, 8).half() for _ in range(11)], {"axis": 3},
     lambda *xs: torch.cat(xs, 3), "12-parts-f16")
# Widths of an odd number of elements (no wide word fits), and an empty part.
case("concat", [r(3, 2, 3), r(3, 0, 3), r(3, 5, 3), r(3, 1, 3)], {"axis": 1}, lambda *xs: torch.cat(xs, 1),
     "odd-widths-empty-part")
case("split", [r(3, 6)], {"axis": 1, "sizes": [2, 3, 1]}, lambda x: torch.split(x, [2, 3, 1], 1))
case("split", [r(4, 2, 3)], {"axis": 0, "sizes": [1, 3]}, lambda x: torch.split(x, [1, 3], 0), "axis0")
case("pad", [r(3, 4)], {"pads": [0, 0, 1, 2], "mode": "constant", "value": 0.5},
     lambda x: F.pad(x, (1, 2), value=0.5))
case("pad", [r(2, 3, 4)], {"pads": [1, 0, 0, 2, 3, 1], "mode": "constant", "value": -1.0},
     lambda x: F.pad(x, (3, 1, 0, 2, 1, 0), value=-1.0), "every-dim")
case("pad", [r(1, 2, 6)], {"pads": [0, 0, 0, 0, 2, 1], "mode": "reflect", "value": 0.0},
     lambda x: F.pad(x, (2, 1), mode="reflect"), "reflect")
case("pad", [r(1, 2, 4, 5)], {"pads": [0, 0, 0, 0, 1, 2, 2, 0], "mode": "replicate", "value": 0.0},
     lambda x: F.pad(x, (2, 0, 1, 2), mode="replicate"), "replicate")
case("pad", [r(1, 2, 5, 5)], {"pads": [0, 0, 0, 0, 2, 1, 1, 3], "mode": "reflect", "value": 0.0},
     lambda x: F.pad(x, (1, 3, 2, 1), mode="reflect"), "reflect-2d")
case("pad", [r(2, 5, 7, 3)], {"pads": [0, 0, 0, 0, 0, 0, 0, 1], "mode": "constant", "value": 0.0},
     lambda x: F.pad(x, (0, 1)), "channels-last-image")
case("pad", [r(2, 3, 4, 5, 2)], {"pads": [0, 0, 0, 0, 2, 1, 0, 0, 0, 0], "mode": "reflect", "value": 0.0},
     lambda x: x.index_select(2, torch.tensor([2, 1, 0, 1, 2, 3, 2])), "reflect-middle-dim")
case("pad", [r(2, 3, 2)], {"pads": [0, 0, 1, 0, 1, 1], "mode": "reflect", "value": 0.0},
     lambda x: F.pad(x, (1, 1, 1, 0), mode="reflect"), "reflect-short-rows")
case("pad", [r(5, 3)], {"pads": [0, 0, 0, 1], "mode": "replicate", "value": 0.0},
     lambda x: F.pad(x, (0, 1), mode="replicate"), "replicate-short-rows")
case("copy", [r(3, 4)], {}, torch.clone)
case("copy", [ints(5, dtype=i32)], {}, torch.clone, "i32")

# ---- gather -------------------------------------------------------------------------------
case("gather", [r(3, 5), ints(3, 4, lo=0, hi=5)], {"axis": 1}, lambda x, i: torch.gather(x, 1, i))
case("gather", [r(4, 3), ints(2, 3, lo=0, hi=4)], {"axis": 0}, lambda x, i: torch.gather(x, 0, i), "axis0")
case("gather", [r(2, 3, 4), ints(2, 3, 2, lo=0, hi=4, dtype=i32)], {"axis": 2},
     lambda x, i: torch.gather(x, 2, i.long()), "i32-index")
case("gather", [r(4, 3, 5), ints(1, 3, 2, lo=-5, hi=5)], {"axis": 2, "broadcast": [0]},
     lambda x, i: torch.gather(x, 2, i.expand(4, 3, 2) % 5), "broadcast-index")
case("index_select", [r(5, 3), torch.tensor([4, 0, 2, 2])], {"axis": 0},
     lambda x, i: torch.index_select(x, 0, i))
case("index_select", [r(2, 6, 3), torch.tensor([5, 1], dtype=i32)], {"axis": 1},
     lambda x, i: torch.index_select(x, 1, i.long()), "i32-index")

# ---- attention ----------------------------------------------------------------------------
def _sdpa_ref(causal: bool = False, scale: Optional[float] = None) -> Callable[..., torch.Tensor]:
    def ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    return ref


case("sdpa", [r(2, 3, 5, 8), r(2, 3, 7, 8), r(2, 3, 7, 6)], {"causal": False}, _sdpa_ref(), "cross")
case("sdpa", [r(2, 2, 6, 4), r(2, 2, 6, 4), r(2, 2, 6, 4)], {"causal": True}, _sdpa_ref(True), "causal")
case("sdpa", [r(1, 2, 5, 8), r(1, 2, 7, 8), r(1, 2, 7, 8), bools(5, 7) | torch.eye(5, 7, dtype=tbool)],
     {"causal": False}, _sdpa_ref(), "bool-mask")
case("sdpa", [r(2, 1, 4, 8), r(2, 1, 6, 8), r(2, 1, 6, 8), r(2, 1, 4, 6)], {"causal": False}, _sdpa_ref(),
     "float-mask")
case("sdpa", [r(3, 5, 16), r(3, 5, 16), r(3, 5, 16)], {"causal": False, "scale": 0.3}, _sdpa_ref(scale=0.3),
     "scale-rank3")

# ---- generators ---------------------------------------------------------------------------
case("arange", [], {"start": 0.0, "end": 10.0, "step": 1.0, "dtype": DType.i64},
     lambda: torch.arange(0, 10, 1, dtype=i64), "i64")
case("arange", [], {"start": -1.5, "end": 2.0, "step": 0.25, "dtype": DType.f32},
     lambda: torch.arange(-1.5, 2.0, 0.25, dtype=f32), "f32")
case("arange", [], {"start": 10.0, "end": 0.0, "step": -3.0, "dtype": DType.i32},
     lambda: torch.arange(10, 0, -3, dtype=i32), "descending")
case("full", [], {"shape": [2, 3], "value": 1.5, "dtype": DType.f32}, lambda: torch.full((2, 3), 1.5))
case("full", [], {"shape": [4], "value": 7.0, "dtype": DType.i32}, lambda: torch.full((4,), 7, dtype=i32), "i32")
case("full", [], {"shape": [2, 2], "value": 1.0, "dtype": DType.bool},
     lambda: torch.full((2, 2), True), "bool")

# ---- sign and rounding (after the rest, so that the cases above keep their random data) ----
for _name, _fn in {"sign": torch.sign, "floor": torch.floor, "ceil": torch.ceil, "round": torch.round,
                   "trunc": torch.trunc}.items():
    case(_name, [r(4, 9, scale=4.0)], {}, _fn)
    case(_name, [ints(33, lo=-12, hi=13).to(f32) / 2], {}, _fn, "halves")  # round: ties to even
case("sign", [ints(4, 5)], {}, torch.sign, "i64")
case("sign", [ints(9, dtype=i8)], {}, torch.sign, "i8")

# ---- 16-bit floats: a subset of the table, re-run in f16 (and a few in bf16) ---------------
_F16_OPS = {"relu", "gelu", "silu", "sigmoid", "tanh", "exp", "add", "mul", "div", "maximum", "softmax",
            "layer_norm", "matmul", "linear", "conv", "reduce_sum", "reduce_mean", "where", "max_pool",
            "avg_pool", "concat", "permute", "batch_norm", "sdpa", "floor", "round"}
_BF16_OPS = {"relu", "add", "mul", "matmul", "softmax", "layer_norm"}
_f32_cases = [c for c in CASES if any(t is not None and t.dtype == f32 for t in c.inputs)]
for _op in sorted(_F16_OPS):
    for _c in [c for c in _f32_cases if c.op == _op][:2]:
        CASES.append(_c.astype(f16))
for _op in sorted(_BF16_OPS):
    for _c in [c for c in _f32_cases if c.op == _op][:1]:
        CASES.append(_c.astype(bf16))


# ---- running ------------------------------------------------------------------------------
def run_kiln(op: str, inputs: list[Optional[torch.Tensor]], attrs: dict[str, Any], *, then: Optional[str] = None,
             fuse: bool = False) -> tuple[list[torch.Tensor], kiln.Engine]:
    """Build a graph of `op` (optionally followed by the unary op `then` on every output), run it."""
    g = Graph()
    ids: list[Optional[int]] = []
    feeds: list[torch.Tensor] = []
    for i, t in enumerate(inputs):
        if t is None:
            ids.append(None)
            continue
        ids.append(g.add_input(f"x{i}", TORCH_TO_KILN[t.dtype], list(t.shape)))
        feeds.append(t.contiguous())
    outs = g.add_node(op, ids, attrs, name=f"{op}_under_test")
    if then is not None:
        outs = [g.add_node(then, [o])[0] for o in outs]
    for j, o in enumerate(outs):
        g.mark_output(o, f"y{j}")
    engine = Builder(BuilderConfig(fuse_pointwise=fuse)).build(g)
    ctx = engine.create_execution_context()
    if any(t.dtype == bf16 for t in feeds) or any(o.dtype == DType.bf16 for o in engine.outputs):
        results = [torch.empty(o.shape, dtype=KILN_TO_TORCH[o.dtype]) for o in engine.outputs]
        ctx.execute_ptrs([t.data_ptr() for t in feeds], [t.data_ptr() for t in results])
    else:
        results = [torch.from_numpy(a) for a in ctx.execute([t.numpy() for t in feeds])]
    return results, engine


def tolerance(op: str, dtype: torch.dtype) -> tuple[float, float]:
    if dtype == f32:
        return 1e-5, (1e-5 if op in ACCUMULATING else 1e-6)
    if dtype == f64:
        return 1e-12, 1e-12
    if dtype == f16:
        return 1e-3, 1e-3
    if dtype == bf16:
        return 8e-3, 8e-3
    return 0.0, 0.0


def compare(op: str, got: list[torch.Tensor], want: Any) -> None:
    wants = list(want) if isinstance(want, (tuple, list)) else [want]
    assert len(got) == len(wants), f"{op}: {len(got)} outputs, PyTorch gives {len(wants)}"
    for j, (g, w) in enumerate(zip(got, wants)):
        assert g.dtype == w.dtype, f"{op} output {j}: dtype {g.dtype}, PyTorch {w.dtype}"
        assert tuple(g.shape) == tuple(w.shape), f"{op} output {j}: shape {tuple(g.shape)}, PyTorch {tuple(w.shape)}"
        if w.is_floating_point():
            rtol, atol = tolerance(op, w.dtype)
            torch.testing.assert_close(g, w, rtol=rtol, atol=atol, msg=lambda m, j=j: f"{op} output {j}: {m}")
        else:
            assert torch.equal(g, w), f"{op} output {j}: {g} != {w}"


def case_id(c: Case) -> str:
    shapes = ",".join("_" if t is None else "x".join(map(str, t.shape)) or "()" for t in c.inputs)
    return f"{c.op}[{shapes}]{'-' + c.note if c.note else ''}"


@pytest.mark.parametrize("c", CASES, ids=[case_id(c) for c in CASES])
def test_op(c: Case) -> None:
    got, _ = run_kiln(c.op, c.inputs, c.attrs)
    compare(c.op, got, c.ref(*c.inputs))


def test_every_op_has_a_case() -> None:
    covered = {c.op for c in CASES}
    missing = [op for op in kiln.op_names() if op not in covered and op != "fused_pointwise"]
    assert not missing, f"ops without a case in tests/python/test_ops.py: {missing}"
    unknown = covered - set(kiln.op_names())
    assert not unknown, f"cases for ops Kiln does not have: {sorted(unknown)}"


def test_cases_use_random_nonconstant_data() -> None:
    for c in CASES:
        for t in c.inputs:
            if t is not None and t.is_floating_point() and t.numel() > 1:
                assert t.float().std() > 0, f"{case_id(c)} has constant input data"


# ---- fusion -------------------------------------------------------------------------------
_POINTWISE = [c for c in CASES if kiln.op_family(c.op) in ("unary", "binary", "where", "cast")]


def _then(c: Case) -> tuple[str, Callable[[torch.Tensor], torch.Tensor]]:
    probe = c.ref(*c.inputs)
    if probe.dtype == tbool:
        return "logical_not", torch.logical_not
    if probe.dtype == u8:
        return "copy", torch.clone
    return "neg", torch.neg


@pytest.mark.parametrize("c", _POINTWISE, ids=[case_id(c) for c in _POINTWISE])
def test_op_fused(c: Case) -> None:
    """The pointwise case followed by neg / logical_not, through the fusion pass."""
    then, then_ref = _then(c)
    got, engine = run_kiln(c.op, c.inputs, c.attrs, then=then, fuse=True)
    assert "fused_pointwise" in engine.graph_text, engine.graph_text
    compare(c.op, got, then_ref(c.ref(*c.inputs)))


def _chain_graph() -> tuple[Graph, list[torch.Tensor]]:
    # y = gelu(x * w + b) - sigmoid(x); z = where(y > 0, y, 0.1 * y)
    x, w, b = r(4, 16), r(16), r(4, 1)
    g = Graph()
    xi = g.add_input("x", DType.f32, [4, 16])
    wi = g.add_input("w", DType.f32, [16])
    bi = g.add_input("b", DType.f32, [4, 1])
    (m,) = g.add_node("mul", [xi, wi])
    (a,) = g.add_node("add", [m, bi])
    (ge,) = g.add_node("gelu", [a], {"approximate": "tanh"})
    (s,) = g.add_node("sigmoid", [xi])
    (y,) = g.add_node("sub", [ge, s])
    zero = g.add_constant("zero", np.zeros((), np.float32))
    tenth = g.add_constant("tenth", np.full((), 0.1, np.float32))
    (pos_,) = g.add_node("gt", [y, zero])
    (ys,) = g.add_node("mul", [y, tenth])
    (z,) = g.add_node("where", [pos_, y, ys])
    g.mark_output(y, "y")
    g.mark_output(z, "z")
    return g, [x, w, b]


def test_fusion_builds_fused_pointwise_and_matches_torch() -> None:
    g, (x, w, b) = _chain_graph()
    fused = Builder(BuilderConfig(fuse_pointwise=True)).build(g)
    plain = Builder(BuilderConfig(fuse_pointwise=False)).build(g)
    assert "fused_pointwise" in fused.graph_text, fused.graph_text
    assert "fused_pointwise" not in plain.graph_text
    assert fused.num_nodes < plain.num_nodes
    y_ref = F.gelu(x * w + b, approximate="tanh") - torch.sigmoid(x)
    z_ref = torch.where(y_ref > 0, y_ref, 0.1 * y_ref)
    for engine in (fused, plain):
        y, z = engine.create_execution_context().execute([x.numpy(), w.numpy(), b.numpy()])
        compare("fused_pointwise", [torch.from_numpy(y), torch.from_numpy(z)], (y_ref, z_ref))


def test_fusion_keeps_non_pointwise_ops_out() -> None:
    x = r(3, 8)
    g = Graph()
    xi = g.add_input("x", DType.f32, [3, 8])
    (e,) = g.add_node("exp", [xi])
    (sm,) = g.add_node("softmax", [e], {"axis": 1})
    (t,) = g.add_node("tanh", [sm])
    (n,) = g.add_node("neg", [t])
    g.mark_output(n, "y")
    engine = Builder(BuilderConfig(fuse_pointwise=True)).build(g)
    plan = engine.graph()
    assert [node.op for node in plan.nodes].count("softmax") == 1
    for node in plan.nodes:
        if node.op == "fused_pointwise":
            assert node.body is not None
            assert all(kiln.op_family(inner.op) in ("unary", "binary", "where", "cast") for inner in node.body.nodes)
    (y,) = engine.create_execution_context().execute([x.numpy()])
    compare("fused_pointwise", [torch.from_numpy(y)], -torch.tanh(torch.softmax(torch.exp(x), 1)))


# ---- f64 products compute in double --------------------------------------------------------
@pytest.mark.parametrize("op, inputs, fn", [
    ("linear", lambda: [r(37, 600, scale=3.0).double(), r(70, 600).double(), r(70).double()], F.linear),
    ("linear", lambda: [r(2, 9, 300).double(), r(530, 300).double(), None], lambda x, w, b: F.linear(x, w)),
    ("matmul", lambda: [r(45, 700).double(), r(700, 600).double()], torch.matmul),
    ("matmul", lambda: [r(3, 1, 20, 300).double(), r(2, 300, 40).double()], torch.matmul),
], ids=["linear-bias", "linear-batched", "matmul-large", "matmul-broadcast"])
def test_f64_products_match_a_double_reference(op: str, inputs: Callable[[], list[Optional[torch.Tensor]]],
                                               fn: Callable[..., torch.Tensor]) -> None:
    """f64 linear / matmul compute in double: within ~1e-12 of PyTorch's float64 result, at depths
    (300-700) where a product computed in f32 is off by about 1e-5 (checked on the same data)."""
    xs = inputs()
    (got,), _ = run_kiln(op, xs, {})
    want = fn(*xs)
    assert got.dtype == f64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    as_f32 = fn(*[None if t is None else t.float() for t in xs]).double()
    assert (as_f32 - want).abs().max().item() > 1e-7, "the case must tell f32 from f64 accumulation"
