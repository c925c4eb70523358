"""Measurements of one candidate: latency, throughput, memory, and its error against eager.

Latency is per call with the device synchronized after each, so on a GPU it holds the host's and
the device's time; throughput issues ``runs`` calls back to back and synchronizes once (on the
CPU every call is synchronous, so it is derived from the latencies). Memory is what is in use
after compiling and running a candidate minus what was in use before: device memory (CUDA's
``mem_get_info``, which counts Kiln's own allocations) on a GPU, the resident set on the CPU.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from kiln.testing import relative_error
from kiln.tune.inputs import Inputs, batch_items

__all__ = ["Timing", "time_calls", "memory_in_use", "compare_outputs", "tolerance_for", "synchronize",
           "float_dtypes"]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_in_use(device: torch.device) -> int:
    """Bytes in use: on the device for CUDA, the process's resident set for the CPU (0 if unknown)."""
    if device.type == "cuda":
        synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        return int(total - free)
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class Timing:
    """Latencies (ms) of single synchronized calls and the throughput of back-to-back calls."""

    def __init__(self, latencies_ms: Sequence[float], throughput: float) -> None:
        self.latencies_ms = list(latencies_ms)
        self.median_ms = statistics.median(self.latencies_ms) if self.latencies_ms else float("nan")
        self.p90_ms = _percentile(self.latencies_ms, 0.9)
        self.throughput = throughput


def time_calls(fn: Callable[..., Any], samples: Sequence[Inputs], *, warmup: int, runs: int,
               device: torch.device) -> Timing:
    latencies: list[float] = []
    items, seconds = 0, 0.0
    clock = time.perf_counter
    for sample in samples:
        for _ in range(warmup):
            sample.call(fn)
        synchronize(device)
        for _ in range(runs):
            t0 = clock()
            sample.call(fn)
            synchronize(device)
            latencies.append((clock() - t0) * 1e3)
        n = batch_items(sample)
        if device.type == "cuda":
            t0 = clock()
            for _ in range(runs):
                sample.call(fn)
            synchronize(device)
            seconds += clock() - t0
        else:
            seconds += sum(latencies[-runs:]) / 1e3
        items += n * runs
    return Timing(latencies, items / seconds if seconds > 0 else float("nan"))


def _leaves(out: Any) -> tuple[list[Any], Any]:
    if hasattr(out, "to_tuple") and not isinstance(out, torch.Tensor):  # transformers ModelOutput
        out = out.to_tuple()
    return pytree.tree_flatten(out)


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    inf_e = torch.isinf(e)
    if not torch.equal(torch.isnan(a), torch.isnan(e)) or not torch.equal(torch.isinf(a), inf_e) \
            or not torch.equal(a[inf_e], e[inf_e]):
        return float("inf")  # a NaN or an infinity where eager has none, or another one
    finite = torch.isfinite(e)
    return relative_error(a[finite], e[finite])


def compare_outputs(actual: Any, expected: Any) -> tuple[float, str]:
    """(largest relative error over the float tensors, problem): the problem is "" when the outputs
    have eager's structure, shapes and dtypes and every other leaf equals eager's; else it says
    what differs and the error is infinite."""
    a_leaves, a_spec = _leaves(actual)
    e_leaves, e_spec = _leaves(expected)
    if a_spec != e_spec:
        return math.inf, f"output structure {a_spec} differs from eager's {e_spec}"
    worst = 0.0
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return math.inf, f"output {i} is a {type(a).__name__}, eager's a tensor"
            if a.shape != e.shape or a.dtype != e.dtype:
                return math.inf, (f"output {i} is {a.dtype}{list(a.shape)}, eager's {e.dtype}{list(e.shape)}")
            if e.is_floating_point() or e.is_complex():
                worst = max(worst, _relative_error(a, e))
            elif not torch.equal(a.cpu(), e.cpu()):
                return math.inf, f"output {i} ({e.dtype}) differs from eager's"
        elif a != e:
            return math.inf, f"output {i} is {a!r}, eager's {e!r}"
    return worst, ""


def float_dtypes(module: torch.nn.Module, samples: Sequence[Inputs]) -> set[torch.dtype]:
    """The float dtypes eager computes in: those of the module's tensors and of the inputs."""
    tensors = list(module.parameters()) + list(module.buffers())
    tensors += [x for s in samples for x in s.leaves() if isinstance(x, torch.Tensor)]
    return {t.dtype for t in tensors if t.is_floating_point()}


def tolerance_for(dtypes: set[torch.dtype] | frozenset[torch.dtype], tolerances: Mapping[str, float]) -> float:
    """The tolerance of the least precise dtype among ``dtypes`` (float32's when there is none)."""
    names = {str(d).removeprefix("torch.") for d in dtypes} & set(tolerances)
    return max((tolerances[n] for n in names), default=tolerances["float32"])
