"""Helpers for checking Kiln against eager PyTorch, shared by the tests, benchmarks and examples."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["first_output", "randomize_weights", "relative_error"]


def randomize_weights(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Re-initializes every parameter and batch-norm statistic of ``model`` in place.

    Some architectures start with zero-initialized heads or unit norm scales, which hides wrong
    results. He-style scale for weights, norm scales around 1 and small biases keep activations
    of order one through plain ReLU stacks; residual networks add them up with depth
    (MobileNetV3's late blocks reach ~1e3), which makes such a model more sensitive to FP16
    rounding than a trained one (docs/perf-notes.md, item 94). Returns ``model``.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                value = torch.randn(p.shape, generator=gen) * (2.0 / p[0].numel()) ** 0.5
            elif name.endswith("weight"):
                value = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            else:
                value = 0.1 * torch.randn(p.shape, generator=gen)
            p.copy_(value)
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


def first_output(out: Any) -> torch.Tensor:
    """The first tensor of a model's output: a tensor, a tuple, or a transformers ModelOutput."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return out[0]
