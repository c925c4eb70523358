"""Instances: one engine per block serves every size in a dynamic program's range.

A block of a dynamic program (kiln.dynamic) is built once, at the opt shape. Its plan is then
optimized again (no kernels) at a few more bindings of its symbols: the corners of a grid around
the opt values and check points near the ends of the ranges. ``_C.SizeProgram.fit`` finds whether
these plans differ only in integers that are multilinear functions of the symbols, plus a square
term per symbol where one is needed (kiln/size_program.h). If they do, a new size is served by an
*instance* of the opt engine (``Engine.instance``): the opt plan with the fitted sizes evaluated,
its kernels made for those sizes without timing, on the opt engine's constants (no copy, no
upload). That takes no export,
lowering, description, passes or tactic timing; generated kernels whose source is the same at
every size come from the process's compile cache. On a GPU, an instance whose tactics are timed
(at the program's optimization level) is then made on a background thread (:class:`Tuning`) and
replaces the untimed one: the first call at a size does not wait for timing, later calls run the
timed kernels. A block's instances share one activation arena, sized for the range's largest
binding, and run one at a time.

A symbol that a size uses other than as such a polynomial (``s**3``, ``floor(s/2)``, ``Max``: a
conv's output size of a dynamic height) is held at the engine's value: instances serve the bindings
that keep it, other values of it build an engine. Not fitted (the block keeps an engine built per
size): a block none of whose symbols is left to fit, one whose plans differ between
samples in anything else (a constant that depends on the size, a pass that chose differently), a
range too narrow for the samples, and every block when the ``dynamic_instances`` setting is off.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import operator
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch
import torch.fx as fx

from kiln import _C
from kiln._logging import get_logger
from kiln.runtime import KilnEngineModule, builder_config
from kiln.settings import CompilationSettings
from kiln.translate import SharedConstants, describe_block_parts

log = get_logger("instances")

__all__ = ["SizeRange", "Tuning", "RowPadded", "pinned_symbols", "fit_problem", "row_symbol",
           "sample_bindings", "fit_pool", "PendingFit", "start_fit", "finish_fit", "make_instance"]

Binding = dict[sympy.Symbol, int]


# The most activation memory one range's instances share; a range whose largest size needs
# more (an unbounded dim served up to dynamic_max_size) gives each instance its own arena.
_MAX_SHARED_ARENA = 4 << 30
# Fit samples optimized at once: a few where the host has cores to spare (the passes fold and
# cast weights with threads of their own), else one, beside the describing and building thread.
_FIT_THREADS = max(1, min(4, (os.cpu_count() or 1) // 4))


@dataclasses.dataclass
class SizeRange:
    """A block served by instances: the engine built at the opt shape, its fitted sizes, and the
    activation memory its instances share (sized for the range's largest binding, allocated with
    the first instance), with the lock that runs one of them at a time."""

    parent: KilnEngineModule
    program: Any  # _C.SizeProgram
    symbols: tuple[sympy.Symbol, ...]  # those the program fits
    largest: dict[str, int]
    pinned: dict[sympy.Symbol, int]  # the block's other symbols, at the values instances serve
    built_at: dict[str, int]  # the fitted symbols' values the parent engine was built at
    # The fitted symbol that only counts rows (row_symbol), and the row dims of the inputs and outputs.
    rows: tuple[sympy.Symbol, dict[int, int], dict[int, int]] | None = None
    # Symbols fitted as equal to another (tie_symbols): instances serve bindings that keep them so.
    tied: dict[sympy.Symbol, sympy.Symbol] = dataclasses.field(default_factory=dict)
    # The least value of each fitted symbol that instances serve (sizes below build their engines).
    lowest: dict[sympy.Symbol, int] = dataclasses.field(default_factory=dict)
    arena: Any = None  # _C.SharedArena
    shares: bool = True  # False once the arena was found too large or could not be allocated
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def _exprs(val: Any) -> Iterable[Any]:
    if isinstance(val, torch.Tensor):  # its sizes; strides are no IR integers (a strided read's are attributes)
        for s in val.shape:
            if isinstance(s, torch.SymInt):
                yield s.node.expr
    elif isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        yield val.node.expr
    elif isinstance(val, (tuple, list)):
        for v in val:
            yield from _exprs(v)


def _sizes(nodes: Iterable[fx.Node]) -> list[tuple[str, Any]]:
    """(node name, sympy expression) of every symbolic size the nodes have or read, once each."""
    seen: set[Any] = set()
    out = []
    for node in nodes:
        for n in (node, *node.all_input_nodes):
            for e in _exprs(n.meta.get("val")):
                if e not in seen:
                    seen.add(e)
                    out.append((n.name, sympy.sympify(e)))
    return out


def _linear_term(e: Any) -> bool:
    return isinstance(e, (sympy.Add, sympy.Mul, sympy.Symbol, sympy.Number)) or (
        isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp > 0)


def pinned_symbols(sizes: Sequence[tuple[str, Any]], symbols: Sequence[sympy.Symbol]) -> set[sympy.Symbol]:
    """The symbols that a size uses other than as a polynomial of degree at most 2 (what a
    SizeProgram fits): inside a floor division, a modulo, a min or max (a conv's output size of a
    dynamic input size), or cubed. Instances of the block
    serve only bindings that keep them at the engine's values (Dynamo's ``dynamic=True`` makes an
    image's height and width symbols too, while only its batch varies)."""
    allowed = set(symbols)
    pinned: set[sympy.Symbol] = set()
    for _, expr in sizes:
        for term in sympy.preorder_traversal(expr):
            if not _linear_term(term):
                pinned |= term.free_symbols & allowed
        for s in expr.free_symbols & allowed:
            if expr.is_polynomial(s) and sympy.degree(expr, s) > 2:
                pinned.add(s)
    return pinned


def fit_problem(sizes: Sequence[tuple[str, Any]], symbols: Sequence[sympy.Symbol],
                constants: Iterable[sympy.Symbol] = ()) -> str | None:
    """None when every size of ``sizes`` (:func:`_sizes`) is a polynomial of degree at most 2 in
    each of ``symbols`` (a SizeProgram fits those that are multilinear but for a square per
    symbol, and refuses the others when it samples them), ``constants`` taken as fixed; else the
    first size that is not."""
    allowed = set(symbols) | set(constants)
    for name, expr in sizes:
        if expr.is_number:
            continue
        if not expr.free_symbols <= allowed:
            return f"{name}: size {expr} reads other symbols"
        if not expr.free_symbols & set(symbols):
            continue
        try:
            poly = sympy.Poly(expr, *symbols)
        except sympy.PolynomialError:
            return f"{name}: size {expr} is not a polynomial of {', '.join(map(str, symbols))}"
        if any(poly.degree(s) > 2 for s in symbols):
            return f"{name}: size {expr} is of degree above 2 in a symbol"
    return None


# ---- rows: a symbol that only counts independent rows --------------------------------------

# How ops treat a dim of independent rows (a tensor's row dim: its one dim whose size is the row
# symbol). Pointwise ops (torch.Tag.pointwise) and these keep rows apart wherever the row dim is,
# the shapes deciding the rest (a concat or a slice along it changes its size; a permute moves it).
_ROW_FREE = frozenset({
    "_to_copy", "_unsafe_view", "alias", "cat", "chunk", "clone", "constant_pad_nd", "contiguous", "detach", "dropout",
    "embedding", "empty", "empty_like", "expand", "flatten", "full", "full_like", "ones_like", "permute", "repeat",
    "reshape", "select", "slice", "split", "split_with_sizes", "squeeze", "t", "transpose", "unbind", "unflatten",
    "unsqueeze", "view", "zeros", "zeros_like", "_native_batch_norm_legit_no_training",
    # Products: a contracted row dim leaves the output without one, which the shapes refuse.
    "addmm", "baddbmm", "bmm", "linear", "matmul", "mm",
})
# x[i0, i1, ...] (_unsafe_index: without bounds checks, as a bilinear upsample decomposes).
_INDEX = frozenset({"index", "_unsafe_index"})
# Elementwise ops (with broadcasting) whose overloads lack torch's pointwise tag.
_POINTWISE_UNTAGGED = frozenset({"hardswish", "where"})
# Ops that work along the dims their dim-like arguments name: rows stay apart where the row dim
# is not among them.
_ROW_ALONG = frozenset({
    "_log_softmax", "_softmax", "amax", "amin", "any", "argmax", "argmin", "cumsum", "flip", "gather",
    "index_select", "log_softmax", "max", "mean", "min", "prod", "softmax", "sort", "std", "sum", "topk",
    "var", "var_mean",
})
_DIM_ARGS = frozenset({"dim", "dims"})
# Ops that mix every dim but the first (convolutions, pooling, resampling, group norm): rows only at dim 0.
_ROW_FIRST = frozenset({
    "_adaptive_avg_pool2d", "_upsample_bilinear2d_aa", "adaptive_avg_pool2d", "avg_pool2d", "convolution",
    "max_pool2d", "max_pool2d_with_indices", "native_group_norm", "upsample_bilinear2d", "upsample_nearest2d",
})
# Attention mixes the sequence dims: rows only along batch or heads (dim 0 or 1) of each input.
_ATTENTION = frozenset({
    "scaled_dot_product_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
})
# Of all of those, the ops whose integer arguments are sizes and may hold the row count itself.
_SIZE_ARG_OPS = frozenset({"_unsafe_view", "empty", "expand", "full", "native_group_norm", "new_empty",
                           "new_empty_strided", "new_ones", "new_zeros", "repeat", "reshape", "view", "zeros"})
# Ops that read only their first argument's dtype and device (Swin's shifted-window mask is
# x.new_zeros(H, W)): no row enters them.
_NEW_TENSORS = frozenset({"new_empty", "new_empty_strided", "new_full", "new_ones", "new_zeros"})


def _op_name(node: fx.Node) -> str:
    packet = getattr(node.target, "overloadpacket", None)
    return getattr(packet, "__name__", "") if packet is not None else ""


def _tensors(val: Any) -> list[Any]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)):
        return [t for v in val for t in _tensors(v)]
    return []


# A tensor's rows: its row dim and how many entries of that dim each row has in all (m: a batch
# merged with the dims after it, [b * heads, ...], or with those before it, [length * b]); (-1, 0)
# for none. Entry (i * s + r) * k + j of the dim belongs to row r, i < a and j < k, m = a * k;
# row_symbol keeps each value's a (how often the rows repeat along the dim, 1 unless a reshape
# merged dims before the rows into it).
Rows = tuple[int, int]
_NO_ROWS: Rows = (-1, 0)


def _row_dim(t: Any, s: sympy.Symbol) -> Rows | None:
    """The rows of tensor ``t``: the dim whose size is ``m * s`` (m a positive integer), and m;
    _NO_ROWS where no size reads ``s``; None where one does otherwise (``s + 1``, ``s * t``, or
    ``s`` in two dims)."""
    found = _NO_ROWS
    for d, size in enumerate(t.shape):
        e = sympy.sympify(size.node.expr) if isinstance(size, torch.SymInt) else None
        if e is None or s not in e.free_symbols:
            continue
        m = sympy.simplify(e / s)
        if not (m.is_Integer and m > 0) or found[0] >= 0:
            return None
        found = (d, int(m))
    return found


def _scalar_reads(arg: Any, s: sympy.Symbol) -> bool:
    """Whether an op argument holds an integer or float that depends on ``s`` (a size used as a value)."""
    if isinstance(arg, (tuple, list)):
        return any(_scalar_reads(a, s) for a in arg)
    val = arg.meta.get("val") if isinstance(arg, fx.Node) else arg
    return isinstance(val, (torch.SymInt, torch.SymFloat)) and s in sympy.sympify(val.node.expr).free_symbols


def _outer(t: Any, d: int) -> Any:
    """The product of ``t``'s sizes before dim ``d``, as an expression."""
    return sympy.Mul(*(sympy.sympify(x.node.expr) if isinstance(x, torch.SymInt) else x for x in t.shape[:d]))


_ROW_INDEX_KEPT = frozenset({"_to_copy", "_unsafe_view", "clone", "expand", "reshape", "unsqueeze", "view"})
# Ops that lay the same elements out in another shape (the training IR's composites among them).
_RESHAPES = frozenset({"_unsafe_view", "flatten", "reshape", "unflatten", "view"})


def _row_arange(node: fx.Node, s: sympy.Symbol) -> bool:
    """Whether ``node`` is arange(s): each row's own index, which only picks rows (see ``index``)."""
    if _op_name(node) != "arange":
        return False
    args = list(node.args)
    if len(args) == 1:
        args = [0, args[0], 1]
    if len(args) == 2:
        args.append(1)
    end = args[1].meta.get("val") if isinstance(args[1], fx.Node) else args[1]
    return args[0] == 0 and args[2] == 1 and isinstance(end, torch.SymInt) and sympy.sympify(end.node.expr) == s


def _keeps_rows(node: fx.Node, s: sympy.Symbol, rows: dict[fx.Node, Rows], repeats: dict[fx.Node, int],
                index_of_row: set[fx.Node]) -> bool:
    """Whether op ``node`` computes each row of its outputs from the same row of its inputs alone;
    ``rows`` has the rows of every value before it and ``repeats`` their a (see Rows),
    ``index_of_row`` the values that hold each row's own index (arange(s)): they may only pick
    rows, through ``index``. Only a reshape regroups the entries of a row dim: it keeps rows apart
    where the same number of elements come before each row's block, and sets the output's a
    (in ``repeats``); other ops keep m and a."""
    name = _op_name(node)
    if any(a in index_of_row for a in node.all_input_nodes) and not (
            name in _INDEX or (name in _ROW_INDEX_KEPT and node.args[0] in index_of_row)):
        return False  # a row's index used as a value
    scalar = any(_scalar_reads(a, s) for a in (*node.args, *node.kwargs.values()))
    reads = [a for a in node.all_input_nodes if rows.get(a, _NO_ROWS)[0] >= 0]
    if not reads and not scalar:
        return True  # no row enters it
    overload = node.target if isinstance(node.target, torch._ops.OpOverload) else None
    if overload is None or (scalar and name not in _SIZE_ARG_OPS):
        return False  # a row count used as a value
    if name in _NEW_TENSORS:
        return True
    if not reads:
        return name in _SIZE_ARG_OPS
    out = node.meta.get("val")
    outs = [r for r in (_row_dim(t, s) for t in _tensors(out)) if r is not None and r[0] >= 0]
    if not outs:
        return False  # rows in, none out: reduced over them
    first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else reads[0]
    row = rows.get(first, _NO_ROWS)[0]
    if name in _RESHAPES:  # the same elements before the rows: a follows
        a = sympy.simplify(_outer(first.meta["val"], row) * repeats.get(first, 1) / _outer(out, outs[0][0]))
        if not (a.is_Integer and a > 0 and outs[0][1] % int(a) == 0):
            return False
        repeats[node] = int(a)
        return True
    if len({(rows[a][1], repeats.get(a, 1)) for a in reads}) != 1 or any(m != rows[reads[0]][1] for _, m in outs):
        return False  # rows regrouped (a concat or repeat along them)
    if torch.Tag.pointwise in overload.tags or name in _ROW_FREE or name in _POINTWISE_UNTAGGED:
        return True
    if name in _ROW_ALONG:
        rank = max(first.meta["val"].dim(), 1)
        for i, arg in enumerate(overload._schema.arguments):
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name, arg.default_value)
            if arg.name in _DIM_ARGS:
                dims = value if isinstance(value, (tuple, list)) else [value]
                if value is None or not dims or any(not isinstance(d, int) or d % rank == row for d in dims):
                    return False  # along the rows, or along every dim
        return True
    if name in _ROW_FIRST:
        return row == 0 and all(rows.get(a, _NO_ROWS)[0] <= 0 for a in reads)
    if name in _ATTENTION:
        return all(rows[a][0] in (0, 1) for a in reads)
    if name == "native_layer_norm":  # normalized over the last dims: not the rows'
        return len(reads) == 1 and row < first.meta["val"].dim() - len(node.args[1])
    if name in _INDEX:  # x[i0, i1, ...]: rows at dim 0 of x and of the result
        source, indices = node.args[0], list(node.args[1])
        x_rows = rows.get(source, _NO_ROWS)[0] if isinstance(source, fx.Node) else -1
        picks = [k for k, i in enumerate(indices) if isinstance(i, fx.Node) and rows.get(i, _NO_ROWS)[0] >= 0]
        if outs[0] != (0, 1) or x_rows > 0 or any(k != 0 or rows[indices[k]][0] != 0 for k in picks):
            return False
        # Rows of x kept (not indexed, or picked by their own index), or rows of a lookup's indices.
        return x_rows < 0 or not picks and (not indices or indices[0] is None) or (
            bool(picks) and indices[0] in index_of_row)
    return False


def row_symbol(inputs: Sequence[fx.Node], nodes: Sequence[fx.Node], outputs: Sequence[fx.Node],
               symbols: Sequence[sympy.Symbol]) -> tuple[sympy.Symbol, dict[int, int], dict[int, int]] | None:
    """The symbol among ``symbols`` that only counts rows of a block: each tensor it sizes has it as
    the size of one dim (its row dim), no value depends on it, and every op computes each row from
    the same row of its inputs. The block's engine built for S rows then serves any count, run on
    rows padded to S (or in chunks of S): what a new size runs on before its instance is made.
    Returns the symbol and, per input and output with rows (by position), its row dim."""
    sources = set(inputs)
    for s in symbols:
        rows: dict[fx.Node, Rows] = {}
        repeats: dict[fx.Node, int] = {}  # a (see Rows) of each reshape's output and of values where it is not 1
        index_of_row: set[fx.Node] = set()
        ok = True
        for n in (*inputs, *nodes):
            val = n.meta.get("val")
            if isinstance(val, (torch.SymInt, torch.SymFloat)):
                continue  # a size computation: the ops that read it are checked
            dims = [_row_dim(t, s) for t in _tensors(val)]
            if n not in sources and _row_arange(n, s):
                index_of_row.add(n)
            elif any(d is None for d in dims) or (n not in sources and (
                    n.op != "call_function" or (n.target is not operator.getitem
                                                and not _keeps_rows(n, s, rows, repeats, index_of_row)))):
                ok = False
                break
            elif n.args and n.args[0] in index_of_row and _op_name(n) in _ROW_INDEX_KEPT:
                index_of_row.add(n)
            if n not in sources and n not in repeats:  # kept from what it reads (a getitem: its tuple's)
                a = next((repeats[r] for r in n.all_input_nodes if r in repeats), 1)
                if a != 1:
                    repeats[n] = a
            # A tuple's elements: its getitems have their own.
            rows[n] = dims[0] if len(dims) == 1 and dims[0] is not None else _NO_ROWS
        ends = [rows[n] for n in (*inputs, *outputs) if rows.get(n, _NO_ROWS)[0] >= 0]
        if any(m != 1 for _, m in ends):
            continue  # RowPadded pads and cuts whole rows of one entry each
        rows_in = {i: rows[n][0] for i, n in enumerate(inputs) if rows.get(n, _NO_ROWS)[0] >= 0}
        rows_out = {i: rows[n][0] for i, n in enumerate(outputs) if rows.get(n, _NO_ROWS)[0] >= 0}
        if ok and rows_in and all(n in rows for n in outputs):
            return s, rows_in, rows_out
    return None


class RowPadded(torch.nn.Module):
    """Serves a row count of a block with the engine module ``runner`` built for ``built_rows``:
    the inputs with rows are padded to ``built_rows`` along their row dim with copies of their last
    row (or cut in chunks of it), and the outputs with rows cut back. Valid for a block whose row
    symbol :func:`row_symbol` found (``rows_in`` / ``rows_out``: position -> row dim)."""

    def __init__(self, runner: KilnEngineModule, built_rows: int, rows_in: dict[int, int],
                 rows_out: dict[int, int]) -> None:
        super().__init__()
        self.runner = runner
        self.built_rows = built_rows
        self.rows_in = rows_in
        self.rows_out = rows_out

    def _run(self, inputs: Sequence[torch.Tensor], start: int) -> tuple[torch.Tensor, ...]:
        n = self.built_rows
        args = list(inputs)
        for i, d in self.rows_in.items():
            x = args[i].narrow(d, start, min(n, args[i].shape[d] - start))
            if x.shape[d] < n:
                last = x.narrow(d, x.shape[d] - 1, 1)
                x = torch.cat([x, last.expand(*x.shape[:d], n - x.shape[d], *x.shape[d + 1:])], d)
            args[i] = x
        return tuple(self.runner(*args))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        i, d = next(iter(self.rows_in.items()))
        rows = inputs[i].shape[d]
        parts = [self._run(inputs, start) for start in range(0, rows, self.built_rows)]
        out = []
        for j, first in enumerate(parts[0]):
            dim = self.rows_out.get(j)
            if dim is None:
                out.append(first)  # no rows: the same in every part
            else:
                whole = torch.cat([p[j] for p in parts], dim) if len(parts) > 1 else first
                out.append(whole.narrow(dim, 0, rows))
        return tuple(out)


def _generic_near(opt: int, lo: int, hi: int, avoid: set[int]) -> int | None:
    """A value in [lo, hi] near ``opt``, odd and not a multiple of 3 where the range has one, so
    that a plan decision that holds only for multiples (a vector width, a split) shows up as a
    difference between samples instead of being fitted."""
    for step in range(1, hi - lo + 1):
        for v in (opt + step, opt - step):
            if lo <= v <= hi and v not in avoid and v % 2 == 1 and v % 3 != 0:
                return v
    for v in range(lo, hi + 1):
        if v not in avoid:
            return v
    return None


def sample_bindings(symbols: Sequence[sympy.Symbol], ranges: dict[sympy.Symbol, Any],
                    base: Binding) -> list[Binding] | None:
    """The bindings a SizeProgram is fitted from: the grid corners {base, a value near it}^n (base,
    the binding of the engine the instances share, first), then checks near each range's ends and
    a third value. None when a range is too narrow (a size of 1 is left out: broadcasting treats it
    apart). Bit i of a corner's index is the i-th symbol by name, the order SizeProgram::fit reads
    the bindings' keys in."""
    symbols = sorted(symbols, key=str)
    lows, highs = [], []
    checks: list[list[int]] = []
    for s in symbols:
        r, at = ranges[s], base[s]
        lo, hi = max(r.min, 2), r.max
        if not lo <= at <= hi or hi - lo < 2:
            return None
        other = _generic_near(at, lo, hi, {at})
        third = _generic_near((lo + hi) // 2, lo, hi, {at, other}) if other is not None else None
        if other is None or third is None:
            return None
        lows.append(at)
        highs.append(other)
        # Not the max itself: a slice of a whole table there (positions[:, :max]) is elided, and the
        # plan differs from the others only by that; the instance at the max slices all of it.
        checks.append([v for v in dict.fromkeys((hi - 1, lo, third)) if v not in (at, other)])
    corners = [{s: (highs[i] if k >> i & 1 else lows[i]) for i, s in enumerate(symbols)}
               for k in range(1 << len(symbols))]
    # Checks: each symbol's own check values with the others at opt, then all at their first check.
    extra: list[Binding] = []
    for i, s in enumerate(symbols):
        for v in checks[i]:
            extra.append({t: (v if t is s else lows[j]) for j, t in enumerate(symbols)})
    if len(symbols) > 1:
        extra.append({t: checks[j][0] for j, t in enumerate(symbols)})
    return corners + extra


def fit_pool() -> concurrent.futures.ThreadPoolExecutor:
    """Threads for the passes of range fits' samples (C++, without the GIL)."""
    return concurrent.futures.ThreadPoolExecutor(_FIT_THREADS, thread_name_prefix="kiln-fit")


@dataclasses.dataclass
class PendingFit:
    """A block's range fit whose samples are being optimized, waiting for the engine built at its
    first binding (:func:`start_fit`, :func:`finish_fit`)."""

    name: str
    ranges: dict[sympy.Symbol, Any]
    base: Binding
    symbols: tuple[sympy.Symbol, ...]
    pinned: dict[sympy.Symbol, int]  # the block's other symbols, held at their base values
    first: dict[str, int]  # the binding the engine is built at (sample 0)
    plans: list[tuple[dict[str, int], concurrent.futures.Future[Any]]]
    seconds: float  # spent describing the samples
    # When the plans do not fit: the fit again with the symbols of equal base values tied
    # (tie_symbols) and the sizes below _RETRY_FLOOR left out.
    retry: Callable[[], PendingFit | None] | None = None
    tied: dict[sympy.Symbol, sympy.Symbol] = dataclasses.field(default_factory=dict)


_RETRY_FLOOR = 3  # the least size a second fit samples and its instances serve


def tie_symbols(base: Binding, symbols: Sequence[sympy.Symbol]) -> dict[sympy.Symbol, sympy.Symbol]:
    """Each symbol whose base value an earlier symbol (by name) has -> that symbol. Dynamo gives
    each input's dims symbols of their own (``dynamic=True``, or dims it saw change), so a model's
    ids and attention mask have a batch and a length each, equal in every real call; fitted apart,
    their plans differ where they differ (a mask broadcast over another batch) and do not fit."""
    first: dict[int, sympy.Symbol] = {}
    tied: dict[sympy.Symbol, sympy.Symbol] = {}
    for s in sorted(symbols, key=str):
        held = first.setdefault(base[s], s)
        if held is not s:
            tied[s] = held
    return tied


def start_fit(base: Binding, ranges: dict[sympy.Symbol, Any], nodes: Sequence[fx.Node],
              concrete: Callable[[Binding], tuple[fx.GraphModule, Any]], settings: CompilationSettings, device: str,
              name: str, pool: concurrent.futures.Executor, shared: SharedConstants | None = None) -> PendingFit | None:
    """Starts the range fit of a block whose engine is (to be) built at ``base`` (its symbols'
    values): describes the block at the other sample bindings (``concrete(binding)`` gives its
    concrete copy, graph module and Block; the constants' host copies come from ``shared`` where
    they are there) and optimizes them on ``pool``. None (logged) when its sizes cannot be fitted.
    Should the plans not fit, finish_fit tries once more with the symbols of equal base values
    tied (tie_symbols) and sizes from _RETRY_FLOOR up (a plan at a size of 2 may differ)."""
    start = time.perf_counter()
    sizes = _sizes(nodes)
    pinned = pinned_symbols(sizes, tuple(base))
    symbols = tuple(s for s in base if s not in pinned)
    problem = fit_problem(sizes, symbols, pinned) if symbols else "no symbol's sizes are polynomials to fit"
    if problem is not None:
        log.info("%s: an engine per size (%s)", name, problem)
        return None
    builder = _C.Builder(builder_config(settings, device))
    tied = tie_symbols(base, symbols)
    low = any(ranges[s].min < min(_RETRY_FLOOR, base[s]) for s in symbols)

    def describe(ties: dict[sympy.Symbol, sympy.Symbol], floor: int,
                 at_pool: concurrent.futures.Executor) -> PendingFit | None:
        """The samples over the symbols not in ``ties`` (those in it follow theirs, the ranges
        intersected) from ``floor`` up, described and submitted to ``at_pool``."""
        began = time.perf_counter()
        free = tuple(s for s in symbols if s not in ties)
        narrowed = dict(ranges)
        for m, r in ties.items():
            narrowed[r] = dataclasses.replace(narrowed[r], min=max(narrowed[r].min, ranges[m].min),
                                              max=min(narrowed[r].max, ranges[m].max))
        for s in free:  # (not past the base: sample 0 is the engine built there)
            narrowed[s] = dataclasses.replace(narrowed[s], min=max(narrowed[s].min, min(floor, base[s])))
        bindings = sample_bindings(free, narrowed, base)
        if bindings is None:
            log.info("%s: an engine per size (its ranges are too narrow to sample)", name)
            return None
        plans = []
        try:
            for binding in bindings[1:]:
                gm, block = concrete({**binding, **{m: binding[r] for m, r in ties.items()}})
                network = _C.import_aten(describe_block_parts(gm, block, settings, shared=shared).graph)
                plans.append(({str(s): v for s, v in binding.items()}, at_pool.submit(builder.optimize, network)))
        except _C.KilnError as err:
            log.info("%s: an engine per size (its plans do not fit one: %s)", name, err)
            return None
        return PendingFit(name, narrowed, base, free, {s: base[s] for s in pinned},
                          {str(s): v for s, v in bindings[0].items()}, plans,
                          time.perf_counter() - (start if not ties else began),
                          again if floor < _RETRY_FLOOR and (tied or low) else None, ties)

    def again() -> PendingFit | None:
        with fit_pool() as own:
            fit = describe(tied, _RETRY_FLOOR, own)
        return fit
    return describe({}, 1, pool)


def finish_fit(fit: PendingFit, parent: KilnEngineModule) -> SizeRange | None:
    """The SizeRange of the block whose engine ``parent`` was built at ``fit``'s base, or None
    (logged) when its plans do not fit one (apart, nor with the symbols of equal base values tied)."""
    start = time.perf_counter()
    try:
        samples = [(fit.first, parent.engine.graph())] + [(binding, plan.result()) for binding, plan in fit.plans]
        program = _C.SizeProgram.fit(samples)
    except _C.KilnError as err:
        again = fit.retry() if fit.retry is not None else None
        if again is None:
            log.info("%s: an engine per size (its plans do not fit one: %s)", fit.name, err)
            return None
        log.info("%s: its plans do not fit one (%s); fitting again from %d up%s", fit.name, err, _RETRY_FLOOR,
                 "".join(f", {m} = {r}" for m, r in again.tied.items()))
        return finish_fit(again, parent)
    held = "".join(f", {s}={fit.base[s]} held" for s in fit.pinned)
    ties = "".join(f", {m} = {r}" for m, r in fit.tied.items())
    # The samples' passes ran beside the build: the time counted is what the fit added to it.
    log.info("%s: one engine for %s%s%s (%d sizes fitted from %d plans in %.3f s besides the build)", fit.name,
             ", ".join(fit.ranges[s].text() for s in fit.symbols), held, ties, program.fitted, len(samples),
             fit.seconds + time.perf_counter() - start)
    return SizeRange(parent, program, fit.symbols, {str(s): fit.ranges[s].max for s in fit.symbols},
                     fit.pinned, {str(s): fit.base[s] for s in fit.symbols}, tied=dict(fit.tied),
                     lowest={s: fit.ranges[s].min for s in fit.symbols})


def make_instance(r: SizeRange, binding: Binding, name: str, level: int = 0,
                  background: bool = False) -> KilnEngineModule:
    """The engine module of ``r``'s block at ``binding``: an instance of its opt engine, its
    kernels made at optimization ``level`` (0: untimed); ``background``: made while calls are
    served, its device work yielding to theirs. Raises kiln.KilnError when the fitted plan does
    not hold there or a kernel cannot be made."""
    parent = r.parent
    for s, v in r.pinned.items():
        if binding[s] != v:
            raise _C.UnsupportedError(f"{s}={binding[s]}: the fitted sizes hold at {s}={v} only")
    for s, least in r.lowest.items():
        if binding[s] < least:
            raise _C.UnsupportedError(f"{s}={binding[s]}: the fitted sizes hold from {s}={least} up")
    for m, t in r.tied.items():
        if binding[m] != binding[t]:
            raise _C.UnsupportedError(f"{m}={binding[m]}, {t}={binding[t]}: the fitted sizes hold where {m} = {t} only")
    plan = r.program.evaluate(parent.engine.graph(), {str(s): binding[s] for s in r.symbols})
    # The untimed instance serves at once: no cuDNN engine compiled for its shape (the timed one may).
    engine = parent.engine.instance(plan, level, level == 0, background)
    arena = _shared_arena(r, name)
    if arena is not None and arena.bytes < engine.arena_bytes:
        arena = None
    module = KilnEngineModule(engine, str(parent._device), parent._in_cast, parent._out_cast, name=name,
                              use_cuda_graphs=parent.use_cuda_graphs, arena=arena,
                              lock=r.lock if arena is not None else None)
    module.truncated_weights = parent.truncated_weights
    return module


def _shared_arena(r: SizeRange, name: str) -> Any:
    """The range's shared arena, allocated on first use for its largest binding (None where it
    would exceed _MAX_SHARED_ARENA or cannot be allocated: each instance then has its own)."""
    if r.arena is None and r.shares:
        r.shares = False
        try:
            bound = r.parent.engine.arena_bound(r.program.evaluate(r.parent.engine.graph(), r.largest))
            if bound > _MAX_SHARED_ARENA:
                log.info("%s: instances keep arenas of their own (the largest size needs %d bytes)", name, bound)
            else:
                r.arena, r.shares = r.parent.engine.allocate_arena(bound), True
                log.info("%s: one arena of %d bytes for the range's instances", name, bound)
        except _C.KilnError as err:
            log.info("%s: instances keep arenas of their own (%s)", name, err)
    return r.arena


class Tuning:
    """Jobs run one after another on a worker thread of their own, started when a job comes and
    ending when none is left: the timed instances that replace untimed ones (kiln.dynamic), so
    that no call waits for tactic timing; their device work also yields to the calls' (the CUDA
    build turn's background priority). The thread is not a daemon: an exiting interpreter waits
    for the job at hand instead of stopping it inside a build."""

    def __init__(self) -> None:
        self._jobs: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._worker: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._jobs.append(job)
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="kiln-tuning")
                self._worker.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    self._worker = None
                    self._idle.notify_all()
                    return
                job = self._jobs.pop(0)
            try:
                job()
            except Exception:  # a job logs its own failures; one that raises must not stop the others
                log.exception("a tuning job failed")

    def wait(self) -> None:
        """Returns once every job submitted so far has run."""
        with self._lock:
            while self._worker is not None:
                self._idle.wait()
