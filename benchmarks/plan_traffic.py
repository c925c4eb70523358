"""Memory traffic of Kiln's plan for a GPU, per op, without a GPU: what the builder's passes leave.

    python3 benchmarks/plan_traffic.py --models segformer,densenet --batch 32 [--dtype fp16] [--top 12]

Lowers each zoo model (full size, random weights) as the torch.compile path does, partitions it,
and runs the builder's passes for a CUDA build (`Builder.optimize`: the plan graph, before kernels
are chosen). Per plan node it counts the bytes read (every input) and written (every output); a
reshape is free (the memory planner aliases it); a gather reads as many elements as it writes. Data-movement ops (permute, slice, concat, pad,
copy, expand, split, gather, index_select) are the traffic a better layout or fusion removes;
the table gives their share of all traffic, and the largest ops by bytes.
"""

from __future__ import annotations

import argparse
import collections
import logging
from typing import Any

import torch

import zoo_models  # type: ignore[import-not-found]

log = logging.getLogger("kiln.bench.plan_traffic")

MOVEMENT = {"permute", "slice", "concat", "pad", "copy", "expand", "split", "gather", "index_select"}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def plan_graphs(model: torch.nn.Module, inputs: list[torch.Tensor], dtype: torch.dtype,
                device: str = "cuda:0") -> list[Any]:
    """The plan graph of every block of `model`, as a build for `device` at `dtype` would make it
    (no such device is needed)."""
    from kiln import _C
    from kiln.lowering import lower_module
    from kiln.partition import partition
    from kiln.pipeline import supported_targets
    from kiln.runtime import builder_config
    from kiln.settings import settings_from_options
    from kiln.translate import Capability, describe_block

    settings = settings_from_options({"enabled_precisions": {dtype}, "min_block_size": 1})
    lowered = lower_module(model, inputs, None, supported_targets())
    capability = Capability(lowered.gm, settings, device)
    result = partition(lowered.gm, capability, settings)
    builder = _C.Builder(builder_config(settings, device))
    return [builder.optimize(_C.import_aten(describe_block(lowered.gm, b, settings))) for b in result.blocks]


def traffic(graphs: list[Any]) -> tuple[collections.Counter[str], collections.Counter[str], list[tuple[int, str]]]:
    """Bytes per op, nodes per op, and (bytes, description) of every data-movement node."""
    by_op: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    moves: list[tuple[int, str]] = []
    for g in graphs:
        for n in g.nodes:
            if n.op == "reshape":
                continue
            ins = [g.type(v) for v in n.inputs if v is not None]
            outs = [g.type(v) for v in n.outputs]
            if n.op in ("gather", "index_select"):  # reads as many elements as it writes
                ins = ins[1:] + outs
            nbytes = sum(t.nbytes for t in ins + outs)
            by_op[n.op] += nbytes
            count[n.op] += 1
            if n.op in MOVEMENT:
                attrs = {k: v for k, v in n.attrs.items() if k in ("perm", "axis", "axes", "pads", "starts")}
                moves.append((nbytes, f"{n.op} {n.name} {[t.shape for t in ins]} -> "
                                      f"{[t.shape for t in outs]} {attrs}"))
    return by_op, count, moves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="segformer,densenet")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dtype", default="fp16", choices=sorted(DTYPES))
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for entry in zoo_models.select(args.models):
        model, inputs = entry.create(min(args.batch, entry.max_batch))
        with torch.no_grad():
            graphs = plan_graphs(model, inputs, DTYPES[args.dtype])
        by_op, count, moves = traffic(graphs)
        total = sum(by_op.values())
        moved = sum(v for k, v in by_op.items() if k in MOVEMENT)
        log.info("## %s b%d: %d plan nodes, %.1f MB traffic, data movement %.1f%% (%d nodes)", entry.name,
                 args.batch, sum(count.values()), total / 1e6, 100 * moved / max(total, 1),
                 sum(v for k, v in count.items() if k in MOVEMENT))
        for op, b in by_op.most_common():
            log.info("  %-18s %5d nodes %9.1f MB %5.1f%%", op, count[op], b / 1e6, 100 * b / max(total, 1))
        for b, what in sorted(moves, reverse=True)[:args.top]:
            log.info("    %8.2f MB  %s", b / 1e6, what)


if __name__ == "__main__":
    main()
