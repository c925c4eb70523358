"""Helpers for checking Kiln against eager PyTorch, shared by the tests, benchmarks and examples."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["first_output", "randomize_weights", "relative_error", "tf32_allowed"]


def randomize_weights(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Re-draws every parameter and batch-norm statistic of ``model`` in place, at the scale the
    model's own initialization gave each tensor.

    A parameter whose values spread is re-drawn from a normal with their mean and standard
    deviation: weights keep the scale their architecture chose for them, which keeps residual
    networks' activations of moderate size. A parameter initialized to one value (a zero head, a
    zero bias, a norm scale of one) would hide wrong results, so it becomes that value plus noise
    of a tenth of its size (0.02 around zero). Batch-norm running means are drawn around 0 (0.1
    spread) and variances in [0.5, 1.5], so folding them is exercised. A scheme that gave every
    weight one He-style scale made MobileNetV3's activations reach ~1e3 and its FP16 rounding
    error 100-600 times larger (docs/history/perf-notes.md, items 94 and 97). Returns ``model``.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() == 0:
                continue
            values = p.detach().float()
            mean = values.mean().item()
            std = values.std().item() if p.numel() > 1 else 0.0
            if not math.isfinite(mean) or not math.isfinite(std):  # never initialized: He-style
                mean, std = 0.0, (2.0 / p[0].numel()) ** 0.5 if p.dim() >= 2 else 0.1
            if std == 0.0:
                std = 0.1 * max(abs(mean), 0.2)
            p.copy_(mean + std * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=gen) + 0.5)
            elif name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=gen) * 0.1)
    return model


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` in float64 (0 when both are zero)."""
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    denom = e.norm().item()
    diff = (a - e).norm().item()
    return diff / denom if denom > 0 else diff


@contextlib.contextmanager
def tf32_allowed(allowed: bool) -> Iterator[None]:
    """TF32 in cuBLAS and cuDNN on or off for the block, restored after it."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def first_output(out: Any) -> torch.Tensor:
    """The first tensor of a model's output: a tensor, a tuple, or a transformers ModelOutput."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return out[0]
