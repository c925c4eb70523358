"""Per-call host overhead of a Kiln engine call from PyTorch (CPU, a tiny engine).

    python3 benchmarks/overhead.py [--iters 20000] [--repeats 7]

For an engine whose kernels take next to no time (a few pointwise ops on 16 floats), the time
of one call is almost all host overhead. The script reports, per call (median over repeats
of the mean over ``--iters`` calls):

  execute_ptrs     ExecutionContext.execute_ptrs on prepared address lists: the binding and
                   the engine's own dispatch, the floor under any front end;
  engine module    KilnEngineModule(x): input checks, output allocation with PyTorch's
                   allocator, addresses, execute_ptrs: the per-call cost of one engine;
  kiln.compile     the compiled program (KilnModule + its GraphModule) around that engine;
  torch.compile    the same through Dynamo (adds Dynamo's guard checks);
  eager            the model in eager PyTorch, for scale.

"front-end overhead" is engine module minus execute_ptrs. The target is an engine module call
under 15 us on the CPU this runs on.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import kiln

log = logging.getLogger("kiln.bench.overhead")


class Tiny(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2.0 + 1.0)


def per_call_us(fn: Callable[[], Any], iters: int, repeats: int) -> float:
    for _ in range(min(iters, 2000)):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)

    model, x = Tiny().eval(), torch.randn(1, 16)
    with torch.no_grad():
        compiled = kiln.compile(model, arg_inputs=[x], min_block_size=1)
        (engine,) = compiled.engines()
        dynamo = torch.compile(model, backend="kiln", options={"min_block_size": 1}, dynamic=False)
        dynamo(x)
        out = torch.empty(1, 16)
        ins, outs = [x.data_ptr()], [out.data_ptr()]
        ctx = engine._context
        results = {
            "execute_ptrs": per_call_us(lambda: ctx.execute_ptrs(ins, outs, 0), args.iters, args.repeats),
            "engine module": per_call_us(lambda: engine(x), args.iters, args.repeats),
            "kiln.compile": per_call_us(lambda: compiled(x), args.iters, args.repeats),
            "torch.compile": per_call_us(lambda: dynamo(x), args.iters, args.repeats),
            "eager": per_call_us(lambda: model(x), args.iters, args.repeats),
        }
        torch.testing.assert_close(engine(x)[0], model(x))
    log.info("per-call time, tiny engine on CPU (median of %d x %d calls):", args.repeats, args.iters)
    for name, us in results.items():
        log.info("  %-14s %8.2f us", name, us)
    overhead = results["engine module"] - results["execute_ptrs"]
    log.info("front-end overhead (engine module - execute_ptrs): %.2f us", overhead)
    verdict = "meets" if results["engine module"] < 15.0 else "MISSES"
    log.info("engine module call %.2f us %s the 15 us target", results["engine module"], verdict)


if __name__ == "__main__":
    main()
