"""Checks an installed Kiln the way a user meets it: ``python -m kiln.check``.

Prints how the extension was built (compiler, C++ runtime, the CUDA libraries it was built
against and the ones loaded), then compiles several torchvision models and one transformers
model, each in a fresh process, through ``torch.compile(backend="kiln")`` and ``kiln.compile``,
and compares every output with eager PyTorch in FP32. A crash in a child is reported with its
signal. Exits with 1 when any check fails, so scripts can rely on it::

    python -m kiln.check                       # the GPU when there is one, else the CPU
    python -m kiln.check --device cpu --models resnet18,bert --paths compile
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
import subprocess
import sys
import time
from typing import Any

import torch

log = logging.getLogger("kiln.check")

# name -> (batch, image size or sequence length) on the GPU; the CPU runs smaller inputs.
GPU_MODELS = {"resnet18": (4, 224), "densenet121": (8, 224), "mobilenet_v3_large": (2, 224),
              "vit_b_16": (2, 224), "bert": (2, 128)}
CPU_MODELS = {"resnet18": (2, 64), "bert": (2, 32)}
PATHS = ("compile", "export")  # torch.compile(backend="kiln"), kiln.compile
TOLERANCE = {"float32": 2e-3, "float16": 1e-2, "bfloat16": 3e-2}


@dataclasses.dataclass
class Result:
    model: str
    path: str
    ok: bool
    error: float | None = None
    seconds: float = 0.0
    detail: str = ""


def build(name: str, batch: int, size: int) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """A model from its architecture's config with random weights, and inputs (nothing is downloaded)."""
    from .testing import randomize_weights

    gen = torch.Generator().manual_seed(0)
    if name == "bert":
        import transformers

        config = transformers.BertConfig() if size >= 128 else transformers.BertConfig(
            hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256)
        model = transformers.BertModel(config)
        ids = torch.randint(0, config.vocab_size, (batch, size), generator=gen)
        inputs = [ids, torch.ones(batch, size, dtype=torch.int64)]
    else:
        import torchvision

        model = getattr(torchvision.models, name)()
        inputs = [torch.randn(batch, 3, size, size, generator=gen)]
    return randomize_weights(model.eval()), inputs


def run_one(name: str, path: str, device: str, dtype: torch.dtype) -> Result:
    """Compiles one model through one path in this process and compares it with eager FP32."""
    import kiln

    from .testing import first_output, relative_error

    batch, size = (GPU_MODELS if device.startswith("cuda") else CPU_MODELS)[name]
    model, inputs = build(name, batch, size)
    with torch.no_grad():
        reference = first_output(model(*inputs)).float()
    model = model.to(device=device, dtype=dtype)
    inputs = [x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device) for x in inputs]
    start = time.perf_counter()
    with torch.no_grad():
        if path == "compile":
            compiled = torch.compile(model, backend="kiln",
                                     options={"enabled_precisions": {dtype}, "min_block_size": 1})
        else:
            compiled = kiln.compile(model, inputs, enabled_precisions={dtype}, min_block_size=1)
        out = first_output(compiled(*inputs))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    error = relative_error(out.float(), reference)
    limit = TOLERANCE[str(dtype).removeprefix("torch.")]
    ok = bool(torch.isfinite(out).all()) and error <= limit
    return Result(name, path, ok, error, seconds, "" if ok else f"error {error:.2e} over {limit:.0e}")


def run_child(name: str, path: str, device: str, dtype: str, timeout: float) -> Result:
    """run_one in a fresh interpreter, so that each check starts from a clean process."""
    cmd = [sys.executable, "-m", "kiln.check", "--one", f"{name}:{path}", "--device", device, "--dtype", dtype]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Result(name, path, False, seconds=timeout, detail=f"no result within {timeout:.0f} s")
    seconds = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        return Result(**json.loads(lines[-1]))
    if proc.returncode < 0:
        detail = f"crashed: {signal.Signals(-proc.returncode).name}"
    else:
        detail = f"exit code {proc.returncode}"
    tail = (proc.stderr.strip().splitlines() or [""])[-1]
    return Result(name, path, False, seconds=seconds, detail=f"{detail}: {tail}" if tail else detail)


def build_report() -> tuple[list[str], list[str]]:
    """Lines describing the build, and problems found in it (library versions that do not match)."""
    import kiln

    info: dict[str, Any] = kiln._C.build_info()
    lines = [f"kiln {kiln.__version__}: {info['library']}", f"  compiler: {info['compiler']}",
             f"  C++ runtime: {info['cxx_runtime']}", f"  torch {torch.__version__}, "
             f"CUDA backend {'with a device' if kiln.cuda_available() else 'absent or no device'}"]
    for lib in info["libraries"]:
        lines.append(f"  {lib['name']}: built {lib['built']}, loaded {lib['loaded']} ({lib['file']})")
    return lines, kiln.library_version_problems(info["libraries"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln.check", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default=None,
                        help="float16 on a GPU and float32 on the CPU by default")
    parser.add_argument("--models", default=None, help="comma-separated; default: "
                        f"{','.join(GPU_MODELS)} on a GPU, {','.join(CPU_MODELS)} on the CPU")
    parser.add_argument("--paths", default=",".join(PATHS), help="compile (torch.compile), export (kiln.compile)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per model and path")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    dtype_name = args.dtype or ("float16" if args.device.startswith("cuda") else "float32")
    table = GPU_MODELS if args.device.startswith("cuda") else CPU_MODELS

    if args.one:  # a child: one model, one path, a JSON line on stdout
        name, path = args.one.split(":")
        result = run_one(name, path, args.device, getattr(torch, dtype_name))
        sys.stdout.write(json.dumps(dataclasses.asdict(result)) + "\n")
        return 0

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    lines, problems = build_report()
    for line in lines + [f"  problem: {p}" for p in problems]:
        log.info(line)
    models = args.models.split(",") if args.models else list(table)
    paths = args.paths.split(",")
    unknown = [m for m in models if m not in table] + [p for p in paths if p not in PATHS]
    if unknown:
        parser.error(f"unknown model or path {unknown}; models: {sorted(table)}, paths: {list(PATHS)}")
    failed = len(problems)
    log.info("%-20s %-8s %-6s %10s %8s", "model", "path", "result", "error", "seconds")
    for name in models:
        for path in paths:
            r = run_child(name, path, args.device, dtype_name, args.timeout)
            failed += not r.ok
            error = f"{r.error:.2e}" if r.error is not None else "-"
            log.info("%-20s %-8s %-6s %10s %8.1f %s", name, path, "ok" if r.ok else "FAIL", error, r.seconds, r.detail)
    log.info("%d passed, %d failed", len(models) * len(paths) + len(problems) - failed, failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
