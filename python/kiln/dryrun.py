"""The dry-run / coverage report: what Kiln would build for one graph, without building it.

Per graph it states the op totals and coverage, every op that stays in PyTorch with its count
and reason, each block that would become an engine (inputs, outputs, op counts) and how the
outcome changes with ``min_block_size``, and the build settings in force (with the torch.compile
mode they came from); for a dynamic program, each input with symbolic sizes and the range and
opt value of each symbol. ``dryrun=True`` (or ``"-"``) prints it to stdout; ``dryrun="path"`` writes
it to that file (the first report of a process replaces the file, later ones are appended). It
is also logged on ``kiln.dryrun``: at DEBUG when printed (a logging setup showing INFO would
otherwise show it twice), else at INFO (a file, or a report that ``debug`` asked for without a
dry run).
"""

from __future__ import annotations

import collections
import math
import sys
from collections.abc import Sequence

import torch
import torch.fx as fx

from kiln._logging import get_logger
from kiln.partition import Block, PartitionResult
from kiln.settings import MODES, CompilationSettings

log = get_logger("dryrun")

__all__ = ["format_report", "emit_report", "describe_value"]

_written: set[str] = set()


def describe_value(node: fx.Node) -> str:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        dtype = str(val.dtype).removeprefix("torch.")
        return f"{node.name}: {dtype}[{', '.join(str(s) for s in val.shape)}]"
    return f"{node.name}: {type(val).__name__}"


def _histogram(counts: collections.Counter[str], limit: int = 8) -> str:
    items = counts.most_common()
    text = ", ".join(f"{name} x{n}" for name, n in items[:limit])
    return text + (f", ... ({len(items) - limit} more kinds)" if len(items) > limit else "")


def _block_lines(block: Block, title: str) -> list[str]:
    lines = [f"  {title}: {block.num_ops} ops ({block.num_compute_ops} compute): {_histogram(block.histogram())}"]
    lines.append("      inputs:  " + (", ".join(describe_value(n) for n in block.inputs) or "(none)"))
    lines.append("      outputs: " + ", ".join(describe_value(n) for n in block.outputs))
    if block.constants:
        lines.append(f"      constants: {len(block.constants)}")
    return lines


def _threshold_lines(result: PartitionResult, settings: CompilationSettings) -> list[str]:
    candidates = result.blocks + result.small_blocks
    if settings.require_full_compilation:
        return ["  min_block_size does not apply (require_full_compilation=True)"]
    if not candidates:
        return ["  min_block_size: no block of supported ops, so no value builds an engine"]
    sizes = sorted({b.num_compute_ops for b in candidates})
    lines = ["  min_block_size -> engines (ops in engines, coverage):"]
    low = 1
    for size in sizes:
        kept = [b for b in candidates if b.num_compute_ops >= size]
        ops = sum(b.num_ops for b in kept)
        mark = "  <- current" if low <= settings.min_block_size <= size else ""
        span = f"{low}" if low == size else f"{low}..{size}"
        lines.append(f"    {span:>9}: {len(kept)} engine{'s' if len(kept) != 1 else ''} ({ops} ops, "
                     f"{100.0 * ops / max(result.total_ops, 1):.1f}%){mark}")
        low = size + 1
    mark = "  <- current" if settings.min_block_size >= low or math.isinf(settings.min_block_size) else ""
    lines.append(f"    {'>= ' + str(low):>9}: 0 engines{mark}")
    return lines


def _settings_line(settings: CompilationSettings) -> str:
    precisions = ", ".join(str(p).removeprefix("torch.") for p in sorted(settings.enabled_precisions, key=str))
    text = (f"  build settings: optimization_level={settings.optimization_level}, "
            f"use_cuda_graphs={settings.use_cuda_graphs}, enabled_precisions={{{precisions}}}")
    if settings.mode is not None:
        made = ", ".join(f"{k}={v}" for k, v in MODES[settings.mode].items()) or "Kiln's defaults"
        text += f"; torch.compile mode {settings.mode!r} -> {made}"
    return text


def format_report(result: PartitionResult, settings: CompilationSettings, graph_name: str,
                  dynamic_inputs: Sequence[str] | None = None) -> str:
    """The report of one graph; ``dynamic_inputs`` (kiln.dynamic) lists each input with symbolic
    sizes and its symbols' ranges."""
    supported_pct = 100.0 * result.supported_ops / result.total_ops if result.total_ops else 100.0
    built = not settings.builds_nothing
    lines = [f"Kiln dry run: {graph_name}",
             f"  total ops: {result.total_ops}",
             f"  supported ops: {result.supported_ops} ({supported_pct:.1f}%)",
             f"  coverage: {result.coverage:.1f}% ({result.ops_in_engines} of {result.total_ops} ops in "
             f"{len(result.blocks)} engine{'s' if len(result.blocks) != 1 else ''}"
             f"{'' if built else ' with these settings'})",
             _settings_line(settings)]
    if dynamic_inputs:
        lines.append("  dynamic shapes (partitioned once; engines built per concrete size in these ranges):")
        lines.extend(f"    {text}" for text in dynamic_inputs)
    if result.unsupported:
        lines.append("  unsupported ops (run in PyTorch):")
        for name, (count, reasons) in sorted(result.unsupported.items(), key=lambda kv: (-kv[1][0], kv[0])):
            lines.append(f"    {name} x{count}: {'; '.join(r for r in reasons if r) or 'no reason given'}")
    if result.excluded:
        lines.append("  kept in PyTorch by torch_executed_ops: " + _histogram(result.excluded, 100))
    if result.blocks:
        lines.append(f"  engines ({len(result.blocks)}):")
        for i, block in enumerate(result.blocks):
            lines.extend(_block_lines(block, f"engine {i}"))
    if result.small_blocks:
        limit = settings.min_block_size
        lines.append(f"  blocks left in PyTorch by min_block_size={limit} ({len(result.small_blocks)}):")
        for i, block in enumerate(result.small_blocks):
            lines.extend(_block_lines(block, f"block {i}"))
    left = result.pytorch_ops()
    if left:
        lines.append("  all ops run in PyTorch: " + _histogram(left, 100))
    lines.extend(_threshold_lines(result, settings))
    return "\n".join(lines)


def emit_report(text: str, settings: CompilationSettings) -> None:
    target = settings.dryrun
    if target is True or target == "-":
        log.debug("%s", text)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return
    log.info("%s", text)
    if isinstance(target, str):
        mode = "a" if target in _written else "w"
        _written.add(target)
        with open(target, mode, encoding="utf-8") as f:
            f.write(text + "\n\n")
