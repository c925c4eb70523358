"""Instances: one engine per block serves every size in a dynamic program's range.

A block of a dynamic program (kiln.dynamic) is built once, at the opt shape. Its plan is then
optimized again (no kernels) at a few more bindings of its symbols: the corners of a grid around
the opt values and check points near the ends of the ranges. ``_C.SizeProgram.fit`` finds whether
these plans differ only in integers that are multilinear functions of the symbols (kiln/
size_program.h). If they do, a new size is served by an *instance* of the opt engine
(``Engine.instance``): the opt plan with the fitted sizes evaluated, its kernels made for those
sizes without timing, on the opt engine's constants (no copy, no upload). That takes no export,
lowering, description, passes or tactic timing; generated kernels whose source is the same at
every size come from the process's compile cache. On a GPU, an instance whose tactics are timed
(at the program's optimization level) is then made on a background thread (:class:`Tuning`) and
replaces the untimed one: the first call at a size does not wait for timing, later calls run the
timed kernels. A block's instances share one activation arena, sized for the range's largest
binding, and run one at a time.

A symbol that a size uses other than multilinearly (``s**2``, ``floor(s/2)``, ``Max``: a conv's
output size of a dynamic height) is held at the engine's value: instances serve the bindings
that keep it, other values of it build an engine. Not fitted (the block keeps an engine built per
size): a block none of whose symbols is left to fit, one whose plans differ between
samples in anything else (a constant that depends on the size, a pass that chose differently), a
range too narrow for the samples, and every block when the ``dynamic_instances`` setting is off.
"""

from __future__ import annotations

import dataclasses
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
from kiln.translate import describe_block_parts

log = get_logger("instances")

__all__ = ["SizeRange", "Tuning", "pinned_symbols", "multilinear_problem", "sample_bindings", "fit_range",
           "make_instance"]

Binding = dict[sympy.Symbol, int]


# The most activation memory one range's instances share; a range whose largest size needs
# more (an unbounded dim served up to dynamic_max_size) gives each instance its own arena.
_MAX_SHARED_ARENA = 4 << 30


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
    """The symbols that a size uses other than multilinearly: inside a floor division, a modulo,
    a min or max (a conv's output size of a dynamic input size), or squared. Instances of the block
    serve only bindings that keep them at the engine's values (Dynamo's ``dynamic=True`` makes an
    image's height and width symbols too, while only its batch varies)."""
    allowed = set(symbols)
    pinned: set[sympy.Symbol] = set()
    for _, expr in sizes:
        for term in sympy.preorder_traversal(expr):
            if not _linear_term(term):
                pinned |= term.free_symbols & allowed
        for s in expr.free_symbols & allowed:
            if expr.is_polynomial(s) and sympy.degree(expr, s) > 1:
                pinned.add(s)
    return pinned


def multilinear_problem(sizes: Sequence[tuple[str, Any]], symbols: Sequence[sympy.Symbol],
                        constants: Iterable[sympy.Symbol] = ()) -> str | None:
    """None when every size of ``sizes`` (:func:`_sizes`) is a polynomial of degree at most one in
    each of ``symbols`` (what a SizeProgram fits), ``constants`` taken as fixed; else the first
    size that is not."""
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
        if any(poly.degree(s) > 1 for s in symbols):
            return f"{name}: size {expr} is of degree above 1 in a symbol"
    return None


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
    apart)."""
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


def fit_range(parent: KilnEngineModule, base: Binding, ranges: dict[sympy.Symbol, Any], nodes: Sequence[fx.Node],
              concrete: Callable[[Binding], tuple[fx.GraphModule, Any]], settings: CompilationSettings, device: str,
              name: str) -> SizeRange | None:
    """The SizeRange of a block whose engine ``parent`` was built at ``base`` (its symbols'
    values), or None (logged) when its plans do not fit one. ``concrete(binding)`` gives the
    block's concrete copy (graph module, Block) at another binding."""
    start = time.perf_counter()
    sizes = _sizes(nodes)
    pinned = pinned_symbols(sizes, tuple(base))
    symbols = tuple(s for s in base if s not in pinned)
    problem = multilinear_problem(sizes, symbols, pinned) if symbols else "no symbol's sizes are multilinear"
    bindings = sample_bindings(symbols, ranges, base) if problem is None else None
    if problem is None and bindings is None:
        problem = "its ranges are too narrow to sample"
    if problem is not None or bindings is None:
        log.info("%s: an engine per size (%s)", name, problem)
        return None
    samples: list[tuple[dict[str, int], Any]] = [({str(s): v for s, v in bindings[0].items()}, parent.engine.graph())]
    builder = _C.Builder(builder_config(settings, device))
    try:
        for binding in bindings[1:]:
            gm, block = concrete(binding)
            network = _C.import_aten(describe_block_parts(gm, block, settings).graph)
            samples.append(({str(s): v for s, v in binding.items()}, builder.optimize(network)))
        program = _C.SizeProgram.fit(samples)
    except _C.KilnError as err:
        log.info("%s: an engine per size (its plans do not fit one: %s)", name, err)
        return None
    held = "".join(f", {s}={base[s]} held" for s in pinned)
    log.info("%s: one engine for %s%s (%d sizes fitted from %d plans in %.3f s)", name,
             ", ".join(ranges[s].text() for s in symbols), held, program.fitted, len(samples),
             time.perf_counter() - start)
    return SizeRange(parent, program, symbols, {str(s): ranges[s].max for s in symbols},
                     {s: base[s] for s in pinned})


def make_instance(r: SizeRange, binding: Binding, name: str, level: int = 0) -> KilnEngineModule:
    """The engine module of ``r``'s block at ``binding``: an instance of its opt engine, its
    kernels made at optimization ``level`` (0: untimed). Raises kiln.KilnError when the fitted
    plan does not hold there or a kernel cannot be made."""
    parent = r.parent
    for s, v in r.pinned.items():
        if binding[s] != v:
            raise _C.UnsupportedError(f"{s}={binding[s]}: the fitted sizes hold at {s}={v} only")
    plan = r.program.evaluate(parent.engine.graph(), {str(s): binding[s] for s in r.symbols})
    # The untimed instance serves at once: no cuDNN engine compiled for its shape (the timed one may).
    engine = parent.engine.instance(plan, level, level == 0)
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
    that no call waits for tactic timing. The thread is not a daemon: an exiting interpreter
    waits for the job at hand instead of stopping it inside a build."""

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
