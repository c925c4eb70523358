"""Digests that say whether a tuning result still applies: the module's structure, its weights,
the device and the software versions.

The structure digest covers every submodule's path, class and ``extra_repr`` (layer sizes and
options) and every parameter's and buffer's name, shape and dtype, not their values: a choice of
backend carries over to other weights of the same model. A kiln.tune wrapper counts by its name,
not by its choice. The weights digest covers the values,
for artifacts that hold a copy of them.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from typing import Any

import torch

from kiln.tune.module import Module

__all__ = ["structure_digest", "weights_digest", "versions", "device_name", "sha256_file"]


def _class_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def structure_digest(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, sub in module.named_modules():
        # A kiln.tune wrapper's extra_repr tells its choice, which is not structure.
        text = f"name={sub.name!r}" if isinstance(sub, Module) else sub.extra_repr()
        h.update(f"module {name} {_class_name(sub)} {text}\n".encode())
    for kind, tensors in (("param", module.named_parameters()), ("buffer", module.named_buffers())):
        for name, t in tensors:
            h.update(f"{kind} {name} {list(t.shape)} {t.dtype}\n".encode())
    return h.hexdigest()


def weights_digest(module: torch.nn.Module) -> str:
    """SHA-256 over every parameter's and buffer's name, dtype, shape and bytes."""
    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            h.update(f"{name} {t.dtype} {list(t.shape)}\n".encode())
            data = t.detach().contiguous().cpu()
            if data.numel():
                h.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def device_name(device: torch.device) -> str:
    """What runs the code: the GPU's name, or the CPU's model and the threads torch uses."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{torch.cuda.get_device_name(index)}"
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu:{model}:{torch.get_num_threads()} threads"


def versions() -> dict[str, str]:
    import kiln

    return {"kiln": str(kiln.__version__), "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "python": sys.version.split()[0], "os": f"{platform.system()}-{platform.machine()}"}


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
