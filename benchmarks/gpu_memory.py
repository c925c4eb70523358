"""Where the device memory of a Kiln-compiled model goes (on a GPU).

    python3 benchmarks/gpu_memory.py [--models resnet50,vit_b_16,bert] [--batch 1] [--dtype fp16]

`gpu_models.py` reports one number per row: device memory in use at the peak of the runs over
what was in use before the compilation. This script splits it, per model, in one process and in
the order given (a model listed twice shows what the second build of a process costs):

  total_mib    device memory in use after 10 calls, over what was in use before compiling
               (torch.cuda.mem_get_info, so allocations outside PyTorch's allocator count)
  build_mib    of which already in use when the compilation returned
  torch_mib    of which held by PyTorch's caching allocator (reserved; outputs, copies)
  weights_mib  the model's weights in the compute dtype (an engine keeps one copy)
  arena_mib    the engines' activation arenas (one context each)
  ws_mib       the engines' workspaces
  other_mib    the rest: library handles and their workspaces, loaded kernel code, ...
"""

from __future__ import annotations

import argparse
import gc
import logging

import torch

import kiln
from gpu_models import DTYPES, model_on_gpu, used_bytes  # type: ignore[import-not-found]

log = logging.getLogger("kiln.bench.gpu_memory")
MIB = 2.0**20


def measure(name: str, batch: int, dtype: torch.dtype) -> None:
    model, inputs = model_on_gpu(name, batch, dtype)
    weights = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    with torch.no_grad():
        model(*inputs)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        base, base_torch = used_bytes(), torch.cuda.memory_reserved()
        compiled = kiln.compile(model, arg_inputs=inputs, enabled_precisions={dtype})
        torch.cuda.synchronize()
        built = used_bytes()
        for _ in range(10):
            compiled(*inputs)
        torch.cuda.synchronize()
        total = used_bytes() - base
        torch_bytes = torch.cuda.memory_reserved() - base_torch
        engines = [m.engine for m in compiled.engines()]
        arena = sum(e.arena_bytes for e in engines)
        ws = sum(e.workspace_size for e in engines)
        other = total - torch_bytes - weights - arena - ws
        log.info("%-22s %9.1f %9.1f %9.1f %11.1f %9.1f %7.1f %9.1f %7d", f"{name} b{batch}", total / MIB,
                 (built - base) / MIB, torch_bytes / MIB, weights / MIB, arena / MIB, ws / MIB, other / MIB,
                 len(engines))
        del compiled
    del model
    gc.collect()
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,vit_b_16,bert")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", default="fp16", choices=sorted(DTYPES))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log.info("%-22s %9s %9s %9s %11s %9s %7s %9s %7s", "model", "total_mib", "build_mib", "torch_mib",
             "weights_mib", "arena_mib", "ws_mib", "other_mib", "engines")
    for name in args.models.split(","):
        measure(name, args.batch, DTYPES[args.dtype])


if __name__ == "__main__":
    main()
