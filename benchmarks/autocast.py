"""Rule-based autocast against plain FP16 and FP32 engines: error and latency.

    python3 benchmarks/autocast.py [--device cuda] [--models resnet50,bert] [--batch 1] [--low fp16|bf16]
                                   [--calibrate 4] [--runs 100] [--out autocast.md]
    python3 benchmarks/autocast.py --device cpu --small --runs 5      # a smoke check on the CPU

Models are built from configs with random weights (nothing is downloaded), re-randomized at the
scale of their own initialization (kiln.testing.randomize_weights): torchvision resnet50 at
224x224 and transformers BertModel (base config) at sequence length 128; ``--small`` builds
resnet18 at 64x64 and a two-layer BERT of width 64 at length 16 instead (rows "(small)"). Per model, rows:

  fp32        the FP32 model compiled by kiln.compile (TF32 allowed, Kiln's default)
  fp16        plain half precision: the model and its inputs in ``.half()`` (``.bfloat16()`` with
              ``--low bf16``), compiled with enabled_precisions in that type
  autocast    the FP32 model compiled with ``enable_autocast=True`` in the low type, calibrated on
              ``--calibrate`` random batches like the timed one (0: no calibration data)

Columns: ``ms`` median latency of ``--runs`` calls (CUDA events on a GPU; perf_counter on the
CPU), ``rel_err`` ``||out - ref|| / ||ref||`` and ``max_abs`` the largest difference, both
against eager FP32 with TF32 off on the same inputs (first output), ``low/fp32`` the nodes
autocast put in the low type / kept in float32 and why, ``compile_s`` compile and first call.
The table goes to ``--out`` (Markdown) and to the log.
"""

from __future__ import annotations

import argparse
import collections
import copy
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import kiln
from kiln.testing import first_output, randomize_weights, relative_error, tf32_allowed

log = logging.getLogger("kiln.bench.autocast")

LOW = {"fp16": torch.float16, "bf16": torch.bfloat16}


def resnet(small: bool, batch: int) -> tuple[torch.nn.Module, Callable[[], list[torch.Tensor]]]:
    import torchvision
    if small:
        return torchvision.models.resnet18(num_classes=10), lambda: [torch.randn(batch, 3, 64, 64)]
    return torchvision.models.resnet50(), lambda: [torch.randn(batch, 3, 224, 224)]


def bert(small: bool, batch: int) -> tuple[torch.nn.Module, Callable[[], list[torch.Tensor]]]:
    import transformers
    if small:
        config = transformers.BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=128, max_position_embeddings=64)
        length = 16
    else:
        config, length = transformers.BertConfig(), 128
    return transformers.BertModel(config), lambda: [torch.randint(0, config.vocab_size, (batch, length))]


MODELS = {"resnet50": resnet, "bert": bert}


class _Settings:
    """CompilationSettings plus the autocast fields, for a kiln.settings that lacks them."""

    def __init__(self, base: Any, fields: dict[str, Any]) -> None:
        self._base = base
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def compile_autocast(model: torch.nn.Module, inputs: list[torch.Tensor], device: str, **options: Any) -> Any:
    from kiln.settings import option_names
    if "enable_autocast" in option_names():
        return kiln.compile(model, inputs, device=device, **options)
    from kiln.aot import KilnModule
    from kiln.lowering import lower_module
    from kiln.pipeline import compile_lowered, supported_targets
    from kiln.settings import settings_from_options
    autocast = {k: v for k, v in options.items() if k.startswith("autocast_") or k == "enable_autocast"}
    base = settings_from_options(None, device=device, **{k: v for k, v in options.items() if k not in autocast})
    settings = _Settings(base, autocast)
    lowered = lower_module(model, inputs, keep=supported_targets())
    gm = compile_lowered(lowered, settings, device, graph_name=type(model).__name__)  # type: ignore[arg-type]
    return KilnModule(gm, lowered.in_spec, lowered.out_spec)


def latency_ms(fn: Callable[[], Any], runs: int, device: str) -> float:
    for _ in range(min(10, runs)):
        fn()
    times = []
    for _ in range(runs):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def to(inputs: list[torch.Tensor], device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    return [x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device) for x in inputs]


def run_model(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    low = LOW[args.low]
    device = args.device
    build, make_inputs = MODELS[name](args.small, args.batch)
    torch.manual_seed(0)
    model = randomize_weights(build.eval()).to(device)
    inputs = to(make_inputs(), device, torch.float32)
    calibration = [tuple(to(make_inputs(), device, torch.float32)) for _ in range(args.calibrate)]
    with torch.no_grad(), tf32_allowed(False):
        ref = first_output(model(*inputs)).float()
    low_model = copy.deepcopy(model).to(low)
    low_inputs = to(inputs, device, low)
    variants: list[tuple[str, Callable[[], Any], list[torch.Tensor]]] = [
        ("fp32", lambda: kiln.compile(model, inputs, device=device), inputs),
        (args.low, lambda: kiln.compile(low_model, low_inputs, device=device, enabled_precisions={low}), low_inputs),
        ("autocast", lambda: compile_autocast(
            model, inputs, device, enable_autocast=True, autocast_low_precision_type=low,
            autocast_excluded_nodes=set(), autocast_excluded_ops=set(), autocast_max_output_threshold=512.0,
            autocast_max_depth_of_reduction=None, autocast_calibration_dataloader=calibration or None), inputs),
    ]
    rows = []
    for label, make, call_inputs in variants:
        torch._dynamo.reset()
        with torch.no_grad():
            t0 = time.perf_counter()
            compiled = make()
            out = first_output(compiled(*call_inputs)).float()
            if device == "cuda":
                torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            ms = latency_ms(lambda: compiled(*call_inputs), args.runs, device)
        report = compiled.gm.meta.get("kiln_autocast") if hasattr(compiled, "gm") else None
        precision = ""
        if report is not None:
            rules = collections.Counter(d.rule for d in report.decisions.values() if not d.low)
            kept = ", ".join(f"{rule} x{k}" for rule, k in rules.most_common())
            precision = f"{len(report.lowered)}/{len(report.kept)}" + (f" ({kept})" if kept else "")
        rows.append({"model": f"{name} (small)" if args.small else name, "variant": label, "ms": ms,
                     "rel_err": relative_error(out, ref),
                     "max_abs": (out - ref).abs().max().item(), "low/fp32": precision, "compile_s": compile_s,
                     "engines": compiled.summary.engines, "in_pytorch": sum(compiled.summary.ops_in_pytorch.values())})
        log.info("%s %s: %.3f ms, rel_err %.2e", name, label, ms, rows[-1]["rel_err"])
        compiled = None  # frees the engines before the next variant's build
    return rows


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace, device_name: str) -> str:
    lines = [f"# Autocast ({args.low}) vs plain {args.low} vs FP32 on {device_name}", "",
             f"batch {args.batch}{', small models' if args.small else ''}; {args.calibrate} calibration batch(es); "
             f"median of {args.runs} runs; errors against eager FP32 (TF32 off).", "",
             "| model | variant | ms | rel_err | max_abs | low/fp32 nodes | engines | ops in PyTorch | compile_s |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['variant']} | {r['ms']:.3f} | {r['rel_err']:.2e} | {r['max_abs']:.2e} | "
                     f"{r['low/fp32']} | {r['engines']} | {r['in_pytorch']} | {r['compile_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,bert")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--low", choices=sorted(LOW), default="fp16")
    parser.add_argument("--calibrate", type=int, default=4, help="calibration batches (0: none)")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--small", action="store_true", help="small models (a CPU smoke check)")
    parser.add_argument("--out", default="autocast.md", help="the Markdown table's file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: PyTorch sees no GPU (use --device cpu --small for a smoke check)")
    rows = [row for name in args.models.split(",") for row in run_model(name, args)]
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    table = markdown(rows, args, device_name)
    with open(args.out, "w") as f:
        f.write(table)
    log.info("\n%s", table)


if __name__ == "__main__":
    main()
