"""Rule-based autocast: a float32 lowered graph -> a mixed-precision graph with explicit casts.

With ``enable_autocast=True``, :func:`apply_autocast` runs on the lowered Core ATen graph before
partitioning (kiln.pipeline.compile_lowered). It decides, node by node, whether the node computes
in ``autocast_low_precision_type`` (float16 or bfloat16) or stays in float32, and inserts
``aten._to_copy(x, dtype=...)`` casts so that every node reads its inputs in its own precision.
The semantics follow Torch-TensorRT's rule-based autocast (after NVIDIA ModelOpt AutoCast):
the engine is built exactly as the graph is typed, and the differences are noted below.

Which nodes take part: calls of ATen overloads whose floating inputs and outputs are all float32
and that read at least one floating tensor. Nodes on other dtypes (a float16 or float64 part of
the model), factories (``full``, ``arange``: no floating input) and nodes with an explicit
``dtype`` argument (``_to_copy``, ``sum(dtype=...)``) keep their types; a factory's float32
output is cast where a low-precision node reads it.

Each node taking part is of one of three kinds:

* compute ops (:data:`LOW_PRECISION_OPS`: convolution, the matmul family, attention, embedding,
  layer / group / RMS norm, softmax): low precision unless a rule below keeps them in float32.
  Kiln's kernels accumulate these in float32 (norm statistics and softmax sums included), so
  half precision costs the rounding of their inputs and outputs, not of their sums;
* fragile ops (:data:`FP32_OPS`), float32 by default (rule 3): ops whose result leaves or loses
  half precision's range even when computed in float32 (``exp``, ``pow``, ``rsqrt``,
  ``reciprocal``, ``log`` of tiny inputs, ``sum``, ``var``, norms, cumulative sums). This is
  torch.autocast's float32 list for the ops of an inference graph, less ``softmax``,
  ``log_softmax``, ``layer_norm`` and ``group_norm``: Kiln runs those as single ops with float32
  statistics and bounded outputs. A decomposed norm (``var`` -> ``add(eps)`` -> ``rsqrt``) keeps
  its statistics in float32 through the fragile ops;
* every other op (views, copies, elementwise arithmetic and activations, selections,
  comparisons, means, pools, inference batch norm) follows its inputs: float32 when a floating
  input comes from a node in float32, low precision when one comes from a low-precision node
  (and none from a float32 one), float32 when it reads only graph inputs and constants. So a
  value kept in float32 stays float32 through elementwise ops up to the next compute op instead
  of being rounded at the first one, and views between two low-precision ops add no casts.

Rules that keep a node in float32, in this order (the first match is the reason reported):

1. name: a regex of ``autocast_excluded_nodes`` is found (``re.search``; anchor it with ``^...$``
   for an exact name) in the node's FX name (``linear_2``, as the dry-run report and the engine's
   plan name nodes) or in the path of the module that created it (``encoder.layer.0.output.dense``);
2. op: the node's overload (``aten.softmax.int``) or op (``aten.softmax``) is in
   ``autocast_excluded_ops``; names are those of the lowered graph (``aten._softmax``, not
   ``torch.softmax``);
3. fragile op: the op is in :data:`FP32_OPS`;
4. range: a Scalar argument (``masked_fill(x, m, -1e9)``) or a constant the node reads (a weight,
   a folded constant, a ``full`` fill value) lies outside the low type's finite range, where its
   cast would give inf (ModelOpt's ``init_max``);
5. calibration (only with ``autocast_calibration_dataloader``): an input or output of the node
   reached ``|x| > autocast_max_output_threshold`` (default 512) on the calibration data. The
   lowered graph runs on every batch in an FX interpreter that records each value's max |x|;
   constants are left to rule 4. No value above the threshold is ever cast to low precision:
   its producer and all its readers stay float32;
6. reduction depth: the node sums more than ``autocast_max_depth_of_reduction`` terms (None: no
   limit). Convolution: input channels per group x kernel volume; mm / bmm / addmm / baddbmm /
   linear / matmul: K; attention: max(head dim, key length) (QK^T sums over the head dim, the
   softmax denominator and PV over the keys); softmax: the softmax dim; layer norm: the
   normalized size; group norm: channels per group x spatial size; sum / mean / var / std /
   prod / norms / logsumexp / cumsum: the reduced size; average pools: the window.

Follow ops obey rules 1, 2 and 4-6 as well (a follow op they match is float32); rule 3 names
only the fragile ops.

Casts: a low-precision node reads each float32 input through ``aten._to_copy(x, dtype=low)``;
any other node, and the graph's outputs, read a low-precision value through a cast back to its
original dtype, so the graph's outputs keep the model's dtypes. One cast per value and dtype is
shared by its readers. A cast of a weight is folded by the engine builder (recorded for refit,
so a refit casts new weights the same way) and the engine stores low-precision weights; with
``immutable_weights`` the cast is folded here, as lowering folds other weight computations.

Building: the engine runs the graph as typed, so autocast needs ``enabled_precisions`` to be
``{torch.float32}`` (Torch-TensorRT needs ``use_explicit_typing=True``): a reduced precision
there makes the builder lower every float32 value of the engine, the nodes kept in float32
included. :func:`apply_autocast` raises ``ValueError`` otherwise.

Differences from Torch-TensorRT: it classifies every node on its own, where here elementwise
ops and views follow their inputs (see above); its name rule ``re.match``-es the module name
only; its range rule checks a node's inputs and its readers' outputs, here a node's inputs and
its own outputs (as ModelOpt does); it has no default float32 ops; its depth rule covers
convolutions, matmuls and attention only.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import operator
import re
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from kiln._logging import get_logger
from kiln.lowering import cleanup

log = get_logger("autocast")

__all__ = ["AutocastReport", "Decision", "FP32_OPS", "LOW_PRECISION_OPS", "apply_autocast"]

_LOW_TYPES = (torch.float16, torch.bfloat16)

_CONV = frozenset({"aten.convolution", "aten._convolution", "aten.conv1d", "aten.conv2d", "aten.conv3d"})
_MATMUL_SELF = frozenset({"aten.mm", "aten.bmm", "aten.matmul", "aten.dot", "aten.mv", "aten.linear"})
_MATMUL_SECOND = frozenset({"aten.addmm", "aten.baddbmm", "aten.addbmm", "aten.addmv"})  # (bias, a, b)
_ATTENTION = frozenset({"aten.scaled_dot_product_attention", "aten._scaled_dot_product_flash_attention",
                        "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_cudnn_attention",
                        "aten._scaled_dot_product_flash_attention_for_cpu"})
_SOFTMAX = frozenset({"aten._softmax", "aten.softmax", "aten._log_softmax", "aten.log_softmax"})
_LAYER_NORM = frozenset({"aten.native_layer_norm", "aten.layer_norm", "aten.rms_norm", "aten._fused_rms_norm"})
_GROUP_NORM = frozenset({"aten.native_group_norm", "aten.group_norm"})

#: Compute ops: low precision unless a rule keeps them in float32.
LOW_PRECISION_OPS: frozenset[str] = (_CONV | _MATMUL_SELF | _MATMUL_SECOND | _ATTENTION | _SOFTMAX | _LAYER_NORM
                                     | _GROUP_NORM | frozenset({"aten.embedding"}))

_REDUCTIONS = frozenset({"aten.sum", "aten.mean", "aten.var", "aten.std", "aten.var_mean", "aten.std_mean",
                         "aten.prod", "aten.logsumexp", "aten.linalg_vector_norm", "aten.norm"})
_CUMULATIVE = frozenset({"aten.cumsum", "aten.cumprod", "aten.logcumsumexp"})

#: Fragile ops: float32 by default (rule 3).
FP32_OPS: frozenset[str] = frozenset({
    "aten.exp", "aten.exp2", "aten.expm1", "aten.log", "aten.log1p", "aten.log2", "aten.log10", "aten.pow",
    "aten.reciprocal", "aten.rsqrt", "aten.sinh", "aten.cosh", "aten.tan", "aten.asin", "aten.acos",
    "aten.erfinv", "aten.sum", "aten.prod", "aten.var", "aten.std", "aten.var_mean", "aten.std_mean",
    "aten.logsumexp", "aten.linalg_vector_norm", "aten.norm", "aten.dist", "aten.cdist", "aten._cdist_forward",
}) | _CUMULATIVE

_AVG_POOL = frozenset({"aten.avg_pool1d", "aten.avg_pool2d", "aten.avg_pool3d"})
_ADAPTIVE_AVG_POOL = frozenset({"aten.adaptive_avg_pool1d", "aten.adaptive_avg_pool2d", "aten._adaptive_avg_pool2d",
                                "aten.adaptive_avg_pool3d", "aten._adaptive_avg_pool3d"})
# Schema types of arguments that may hold a Python number used as a value (a Tensor argument
# too: the lowered graph passes x + 1e-5 as add.Tensor(x, 1e-5)).
_VALUE_TYPES = frozenset({"number", "Optional[number]", "float", "Optional[float]", "Scalar", "Scalar?", "float?",
                          "Tensor", "Optional[Tensor]", "Tensor?"})


@dataclasses.dataclass(frozen=True)
class Decision:
    """Where one node computes and why."""

    node: str          # the FX node's name
    op: str            # its overload, e.g. "aten.linear.default"
    low: bool          # True: it computes in the low type
    rule: str          # low: "compute op" or "follows low precision"; float32: "follows float32" or the rule
                       # that kept it ("excluded node", "excluded op", "fragile op", "out of range",
                       # "calibration", "reduction depth")
    detail: str = ""   # the rule's particulars (the regex, the value, the depth, the input followed)

    def __str__(self) -> str:
        where = "low precision" if self.low else "float32"
        return f"{self.node} ({self.op}): {where}, {self.rule}" + (f": {self.detail}" if self.detail else "")


@dataclasses.dataclass
class AutocastReport:
    """What :func:`apply_autocast` did to one graph (kept as ``gm.meta["kiln_autocast"]``)."""

    low_precision_type: torch.dtype
    decisions: dict[str, Decision]            # by node name, every node that took part
    casts: int = 0                            # casts inserted
    constant_casts: int = 0                   # of which casts of constants (folded when the engine is built)
    calibration_batches: int = 0              # batches the threshold rule saw (0: rule 5 off)
    calibration_error: str | None = None      # why the calibration data could not be used
    max_abs: dict[str, float] = dataclasses.field(default_factory=dict)  # calibration: node -> max |x|

    @property
    def lowered(self) -> list[str]:
        """The nodes that compute in the low type."""
        return [n for n, d in self.decisions.items() if d.low]

    @property
    def kept(self) -> dict[str, str]:
        """The nodes kept in float32, with why."""
        return {n: d.rule + (f": {d.detail}" if d.detail else "") for n, d in self.decisions.items() if not d.low}

    def ops(self, low: bool) -> collections.Counter[str]:
        """Op histogram of the nodes in the low type (``low=True``) or kept in float32."""
        return collections.Counter(d.op for d in self.decisions.values() if d.low == low)

    def summary(self) -> str:
        name = str(self.low_precision_type).removeprefix("torch.")
        kept = collections.Counter(d.rule for d in self.decisions.values() if not d.low)
        why = ", ".join(f"{rule} x{k}" for rule, k in kept.most_common())
        calib = (f"; calibrated on {self.calibration_batches} batch(es)" if self.calibration_batches
                 else f"; calibration skipped: {self.calibration_error}" if self.calibration_error else "")
        return (f"autocast to {name}: {len(self.lowered)} node(s) in {name}, {sum(kept.values())} kept in "
                f"float32{' (' + why + ')' if why else ''}, {self.casts} cast(s) ({self.constant_casts} of "
                f"constants){calib}")


class _CalibrationMismatch(Exception):
    pass


# ---- settings --------------------------------------------------------------------------------

def _low_type(settings: Any) -> torch.dtype:
    low = getattr(settings, "autocast_low_precision_type", torch.float16)
    if low not in _LOW_TYPES:
        raise ValueError(f"autocast_low_precision_type must be torch.float16 or torch.bfloat16, got {low!r}")
    return low


def _check_precisions(settings: Any) -> None:
    reduced = sorted(str(t) for t in getattr(settings, "enabled_precisions", ()) if t in _LOW_TYPES)
    if reduced:
        raise ValueError(
            f"enable_autocast=True builds the graph as autocast types it, but enabled_precisions also names "
            f"{', '.join(reduced)}, which would make the builder lower every float32 value, the nodes autocast "
            "keeps in float32 included: leave enabled_precisions at {torch.float32}")


def _op_names(items: Iterable[Any]) -> frozenset[str]:
    names = set()
    for item in items or ():
        name = str(item).strip()
        names.add(name[len("torch.ops."):] if name.startswith("torch.ops.") else name)
    return frozenset(names)


def _regexes(patterns: Iterable[str]) -> list[re.Pattern[str]]:
    out = []
    for p in patterns or ():
        try:
            out.append(re.compile(p))
        except re.error as err:
            raise ValueError(f"autocast_excluded_nodes: {p!r} is not a valid regular expression ({err})") from None
    return out


# ---- node facts ------------------------------------------------------------------------------

def _tensors(val: Any) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)):
        return [v for v in val if isinstance(v, torch.Tensor)]
    return []


def _floating(node: fx.Node) -> list[torch.Tensor]:
    return [t for t in _tensors(node.meta.get("val")) if t.is_floating_point()]


def _max_abs(t: torch.Tensor) -> float:
    """max |t| without a temporary the size of t (NaN when t holds one)."""
    lo, hi = torch.aminmax(t.detach())
    return max(-float(lo), float(hi))


def _packet(node: fx.Node) -> str:
    return str(node.target.overloadpacket)


def _schema_arg(node: fx.Node, name: str) -> Any:
    """The value of the argument ``name`` of an overload call (its default when not given)."""
    for i, a in enumerate(node.target._schema.arguments):
        if a.name != name:
            continue
        if not a.kwarg_only and i < len(node.args):
            return node.args[i]
        if a.name in node.kwargs:
            return node.kwargs[a.name]
        return a.default_value if a.has_default_value() else None
    return None


def _shape(value: Any) -> list[int] | None:
    val = value.meta.get("val") if isinstance(value, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return [int(s) for s in val.shape]
    except (TypeError, RuntimeError):  # a symbolic dimension
        return None


def _prod(xs: Iterable[int]) -> int:
    return math.prod(int(x) for x in xs)


def _reduced_size(shape: list[int], dims: Any) -> int:
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return _prod(shape)
    dims = [dims] if isinstance(dims, int) else list(dims)
    return _prod(shape[d % len(shape)] for d in dims) if shape else 1


def _reduction_depth(node: fx.Node) -> int | None:
    """How many terms one output element of the node sums (None: not a reduction, or unknown)."""
    p = _packet(node)
    args = node.args
    try:
        if p in _CONV:
            w = _shape(args[1])
            if w is None or len(w) < 3:
                return None
            transposed = bool(_schema_arg(node, "transposed"))
            groups = int(_schema_arg(node, "groups") or 1)
            return (w[0] // groups if transposed else w[1]) * _prod(w[2:])
        if p in _MATMUL_SELF or p in _MATMUL_SECOND:
            a = _shape(args[1] if p in _MATMUL_SECOND else args[0])
            return a[-1] if a else None
        if p in _ATTENTION:
            q, k = _shape(args[0]), _shape(args[1])
            return max(q[-1], k[-2]) if q and k and len(k) >= 2 else None
        x = _shape(args[0])
        if x is None:
            return None
        if p in _SOFTMAX or p in _CUMULATIVE:
            return x[int(args[1]) % len(x)] if x else 1
        if p in _LAYER_NORM:
            return _prod(args[1])
        if p == "aten.native_group_norm":  # (input, weight, bias, N, C, HxW, group, eps)
            return int(args[4]) // int(args[6]) * int(args[5])
        if p == "aten.group_norm":  # (input, num_groups, ...)
            return x[1] // int(args[1]) * _prod(x[2:])
        if p in _REDUCTIONS:
            return _reduced_size(x, _schema_arg(node, "dim"))
        if p in _AVG_POOL:
            return _prod(args[1])
        if p in _ADAPTIVE_AVG_POOL:
            out = list(args[1])
            return _prod(-(-i // max(int(o), 1)) for i, o in zip(x[-len(out):], out))
    except (TypeError, ValueError, IndexError, ZeroDivisionError):
        return None
    return None


def _numbers(node: fx.Node) -> list[float]:
    """The Python numbers the node uses as values (not dims, sizes or flags)."""
    out = []
    for i, a in enumerate(node.target._schema.arguments):
        if str(a.type) not in _VALUE_TYPES:
            continue
        v = node.args[i] if not a.kwarg_only and i < len(node.args) else node.kwargs.get(a.name)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))
    return out


def _out_of_range_scalar(node: fx.Node, fmax: float) -> float | None:
    """A finite number argument of the node beyond ``fmax`` (its cast would be inf)."""
    return next((v for v in _numbers(node) if math.isfinite(v) and abs(v) > fmax), None)


class _ConstantRange:
    """Max |x| of the graph's constants and factory outputs (computed once each)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.cache: dict[fx.Node, float | None] = {}

    def __call__(self, node: fx.Node) -> float | None:
        if node not in self.cache:
            self.cache[node] = self._compute(node)
        return self.cache[node]

    def _compute(self, node: fx.Node) -> float | None:
        if node.op == "get_attr":
            t = getattr(self.gm, str(node.target), None)
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                m = _max_abs(t)
                return m if not math.isnan(m) else None
            return None
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
                and _floating(node) and not any(_floating(i) for i in node.all_input_nodes):
            values = [abs(v) for v in _numbers(node)]
            return max(values) if values else None
        return None


def _module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    entry = list(stack.values())[-1]
    return str(entry[0]) if isinstance(entry, (tuple, list)) and entry else str(entry)


# ---- calibration -----------------------------------------------------------------------------

class _Recorder(fx.Interpreter):
    """Runs the graph and keeps each value's largest |x| over all runs (by node name)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.max_abs: dict[str, float] = {}

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.op != "get_attr":
            values = [_max_abs(t) for t in _tensors(out) if t.is_floating_point() and t.numel()]
            values = [v for v in values if not math.isnan(v)]
            if values:
                self.max_abs[n.name] = max(max(values), self.max_abs.get(n.name, 0.0))
        return out


def _batch_inputs(batch: Any, placeholders: Sequence[fx.Node], index: int) -> list[Any]:
    """One calibration batch (a tensor, a tuple / list of inputs, or a pytree of them) as the
    graph's placeholder values."""
    leaves = [batch] if isinstance(batch, torch.Tensor) else pytree.tree_leaves(batch)
    if len(leaves) != len(placeholders):
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        if len(tensors) != len(placeholders):
            raise _CalibrationMismatch(f"batch {index} has {len(leaves)} input(s), the graph takes "
                                       f"{len(placeholders)}")
        leaves = tensors
    out: list[Any] = []
    for i, (leaf, p) in enumerate(zip(leaves, placeholders)):
        val = p.meta.get("val")
        if isinstance(val, torch.Tensor):
            if not isinstance(leaf, torch.Tensor):
                raise _CalibrationMismatch(f"batch {index} input {i} is a {type(leaf).__name__}, the graph's "
                                           f"{p.name} a tensor")
            want = _shape(p)
            if want is not None and list(leaf.shape) != want:
                raise _CalibrationMismatch(f"batch {index} input {i} has shape {list(leaf.shape)}, the graph was "
                                           f"traced for {want} ({p.name})")
            leaf = leaf.to(device=val.device, dtype=val.dtype)
        out.append(leaf)
    return out


def _calibrate(gm: fx.GraphModule, loader: Iterable[Any]) -> tuple[dict[str, float], int]:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    recorder = _Recorder(gm)
    batches = 0
    with torch.no_grad():
        for i, batch in enumerate(loader):
            inputs = _batch_inputs(batch, placeholders, i)
            try:
                recorder.run(*inputs)
            except Exception as err:  # noqa: BLE001 - any failure means the data does not fit the graph
                raise _CalibrationMismatch(f"running batch {i} failed: {type(err).__name__}: {err}") from err
            batches += 1
    if not batches:
        raise _CalibrationMismatch("the calibration data loader gave no batch")
    return recorder.max_abs, batches


# ---- classification --------------------------------------------------------------------------

def _explicit_dtype(node: fx.Node) -> bool:
    return any(a.name == "dtype" for a in node.target._schema.arguments) and _schema_arg(node, "dtype") is not None


def _takes_part(node: fx.Node) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    ins = [t for i in node.all_input_nodes for t in _floating(i)]
    if not ins or _explicit_dtype(node):
        return False
    return all(t.dtype == torch.float32 for t in ins + _floating(node))


class _Classifier:
    def __init__(self, gm: fx.GraphModule, settings: Any, low: torch.dtype, max_abs: dict[str, float]) -> None:
        self.low = low
        self.fmax = float(torch.finfo(low).max)
        self.low_name = str(low).removeprefix("torch.")
        self.regexes = _regexes(getattr(settings, "autocast_excluded_nodes", ()))
        self.ops = _op_names(getattr(settings, "autocast_excluded_ops", ()))
        threshold = getattr(settings, "autocast_max_output_threshold", 512.0)
        self.threshold = math.inf if threshold is None else float(threshold)
        self.max_depth = getattr(settings, "autocast_max_depth_of_reduction", None)
        self.max_abs = max_abs
        self.constant_range = _ConstantRange(gm)

    def forced_fp32(self, node: fx.Node, fragile: bool) -> tuple[str, str] | None:
        """The rule keeping the node in float32 and its particulars, or None."""
        names = [node.name, _module_path(node)]
        for rx in self.regexes:
            if any(n and rx.search(n) for n in names):
                return "excluded node", f"{rx.pattern!r} matches {' / '.join(n for n in names if n)}"
        overload, packet = str(node.target), _packet(node)
        if overload in self.ops or packet in self.ops:
            return "excluded op", overload if overload in self.ops else packet
        if fragile:
            return "fragile op", f"{packet} is float32 by default"
        if (v := _out_of_range_scalar(node, self.fmax)) is not None:
            return "out of range", f"argument {v:g} is beyond {self.low_name}'s range"
        for i in node.all_input_nodes:
            m = self.constant_range(i)
            if m is not None and m > self.fmax:
                return "out of range", f"constant {i.name} holds |x| up to {m:g}, beyond {self.low_name}'s range"
        if self.max_abs:
            seen = [(self.max_abs.get(i.name), f"input {i.name}") for i in node.all_input_nodes
                    if i.op != "get_attr" and _floating(i)]
            seen.append((self.max_abs.get(node.name), "output"))
            for m, what in seen:
                if m is not None and m > self.threshold:
                    return "calibration", f"{what} reached |x| = {m:g} > {self.threshold:g}"
        if self.max_depth is not None:
            depth = _reduction_depth(node)
            if depth is not None and depth > self.max_depth:
                return "reduction depth", f"{depth} > {self.max_depth}"
        return None

    def run(self, graph: fx.Graph) -> dict[fx.Node, Decision]:
        decisions: dict[fx.Node, Decision] = {}
        for node in graph.nodes:
            if not _takes_part(node):
                continue
            packet, op = _packet(node), str(node.target)
            fragile = packet in FP32_OPS
            compute = packet in LOW_PRECISION_OPS and bool(_floating(node))
            forced = self.forced_fp32(node, fragile)
            if forced is not None:
                decisions[node] = Decision(node.name, op, False, *forced)
            elif compute:
                decisions[node] = Decision(node.name, op, True, "compute op")
            else:
                decisions[node] = self._follow(node, op, decisions)
        return decisions

    @staticmethod
    def _follow(node: fx.Node, op: str, decisions: dict[fx.Node, Decision]) -> Decision:
        low_from = None
        for i in node.all_input_nodes:
            if not _floating(i):
                continue
            producer = i.args[0] if i.op == "call_function" and i.target is operator.getitem else i
            d = decisions.get(producer)  # type: ignore[arg-type]
            if d is None:
                continue
            if not d.low:
                return Decision(node.name, op, False, "follows float32", f"reads {i.name}")
            low_from = low_from or i.name
        if low_from is not None:
            return Decision(node.name, op, True, "follows low precision", f"reads {low_from}")
        return Decision(node.name, op, False, "follows float32",
                        "reads only graph inputs, constants or values autocast leaves alone")


# ---- rewriting -------------------------------------------------------------------------------

def _fake_mode(values: Sequence[Any]) -> Any:
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])
    return mode if mode is not None else FakeTensorMode(allow_non_fake_inputs=True)


def _propagate(node: fx.Node, low: torch.dtype) -> None:
    """Gives a node whose inputs changed dtype the output dtypes PyTorch computes for it (on
    FakeTensors), keeping the shapes and strides its metadata had: the rest of the pipeline
    planned with those."""
    old = node.meta["val"]
    args, kwargs = pytree.tree_map_only(fx.Node, lambda n: n.meta["val"], (node.args, node.kwargs))
    mode = _fake_mode(pytree.tree_leaves((args, kwargs)) + _tensors(old))
    try:
        with mode:
            new = node.target(*args, **kwargs)
        dtypes = [t.dtype for t in _tensors(new)]
    except Exception:  # noqa: BLE001 - type promotion: float32 inputs cast to low give low outputs
        dtypes = [low if t.dtype == torch.float32 else t.dtype for t in _tensors(old)]
    with mode:
        vals = [torch.empty_strided(t.shape, t.stride(), dtype=dt, device=t.device)
                for t, dt in zip(_tensors(old), dtypes)]
    if isinstance(old, torch.Tensor):
        node.meta["val"] = vals[0]
    else:
        it = iter(vals)
        node.meta["val"] = type(old)(next(it) if isinstance(v, torch.Tensor) else v for v in old)
    node.meta.pop("tensor_meta", None)


def _cast_value(value: fx.Node, dtype: torch.dtype) -> Any:
    """The metadata of ``_to_copy(value, dtype=dtype)``."""
    val = value.meta["val"]
    with _fake_mode([val]):
        return torch.ops.aten._to_copy.default(val, dtype=dtype)


def _rewrite(gm: fx.GraphModule, low_nodes: set[fx.Node], low: torch.dtype) -> tuple[int, int]:
    """Inserts the casts; returns how many, and how many of them cast constants."""
    graph = gm.graph
    original = {n: v.dtype for n in graph.nodes if isinstance(v := n.meta.get("val"), torch.Tensor)}
    casts: dict[tuple[fx.Node, torch.dtype], fx.Node] = {}

    def cast(value: fx.Node, dtype: torch.dtype, reader: fx.Node) -> fx.Node:
        key = (value, dtype)
        if key not in casts:
            with graph.inserting_before(reader):
                c = graph.call_function(torch.ops.aten._to_copy.default, (value,), {"dtype": dtype})
            if "nn_module_stack" in value.meta:
                c.meta["nn_module_stack"] = value.meta["nn_module_stack"]
            c.meta["val"] = _cast_value(value, dtype)
            casts[key] = c
        return casts[key]

    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is operator.getitem:
            if node.args[0] in low_nodes:
                node.meta["val"] = node.args[0].meta["val"][node.args[1]]
                node.meta.pop("tensor_meta", None)
            continue
        if node.op not in ("call_function", "output"):
            continue
        to_low = node in low_nodes

        def fix(a: fx.Node, reader: fx.Node = node, to_low: bool = to_low) -> fx.Node:
            val = a.meta.get("val")
            if not isinstance(val, torch.Tensor) or not val.is_floating_point():
                return a
            if to_low:
                return cast(a, low, reader) if original.get(a) == torch.float32 and val.dtype != low else a
            want = original.get(a)
            return cast(a, want, reader) if want is not None and val.dtype != want else a

        node.args = pytree.tree_map_only(fx.Node, fix, node.args)
        node.kwargs = pytree.tree_map_only(fx.Node, fix, node.kwargs)
        if to_low:
            _propagate(node, low)
    return len(casts), sum(1 for value, _ in casts if value.op == "get_attr")


# ---- entry point -----------------------------------------------------------------------------

def apply_autocast(gm: fx.GraphModule, settings: Any) -> AutocastReport:
    """Rewrites the lowered graph ``gm`` in place into mixed precision (see the module docstring)
    and returns what it decided; the report is also ``gm.meta["kiln_autocast"]`` and is logged
    at INFO on ``kiln.autocast`` (each node's decision at DEBUG).

    ``settings`` needs ``autocast_low_precision_type``, ``autocast_excluded_nodes``,
    ``autocast_excluded_ops``, ``autocast_max_output_threshold``,
    ``autocast_max_depth_of_reduction``, ``autocast_calibration_dataloader`` and
    ``enabled_precisions``. Calibration data that does not fit the graph (another number or
    shape of inputs, e.g. a Dynamo graph after a graph break) turns rule 5 off for this graph
    with a warning naming the mismatch."""
    low = _low_type(settings)
    _check_precisions(settings)
    max_abs: dict[str, float] = {}
    batches, error = 0, None
    loader = getattr(settings, "autocast_calibration_dataloader", None)
    if loader is not None:
        try:
            max_abs, batches = _calibrate(gm, loader)
        except _CalibrationMismatch as err:
            error = str(err)
            msg = f"autocast: the calibration data does not fit this graph ({error}); the output-threshold rule is off"
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            log.warning("%s", msg)
    decisions = _Classifier(gm, settings, low, max_abs).run(gm.graph)
    casts, constant_casts = _rewrite(gm, {n for n, d in decisions.items() if d.low}, low)
    cleanup(gm, fold_weights=bool(getattr(settings, "immutable_weights", False)))
    report = AutocastReport(low, {d.node: d for d in decisions.values()}, casts, constant_casts, batches, error,
                            max_abs)
    gm.meta["kiln_autocast"] = report
    log.info("%s", report.summary())
    for d in decisions.values():
        log.debug("%s", d)
    return report
