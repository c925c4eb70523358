"""Where a Kiln engine's error comes from: a torchvision ResNet compiled stage by stage.

    python3 benchmarks/gpu_stage_error.py [--model resnet50] [--batch 32] [--dtype fp32]

Builds the model as benchmarks/gpu_models.py does (random weights), computes the exact FP32
activations between stages (eager, TF32 off), then compiles each stage alone (the stem
conv1/bn1/relu, the max-pool, every bottleneck block of layer1..layer4, the head) with Kiln in
the chosen dtype and prints each one's relative error against the exact output for the same
input, next to eager's own error in that dtype (TF32 on for FP32, as the GPU benchmark runs).
A stage far above eager's error is where Kiln goes wrong.
"""

from __future__ import annotations

import argparse
import logging

import torch

from gpu_models import DTYPES, build_model  # type: ignore[import-not-found]
from kiln.testing import randomize_weights, relative_error

log = logging.getLogger("kiln.bench.gpu_stage_error")


def stages(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    m = model
    out: list[tuple[str, torch.nn.Module]] = [("stem", torch.nn.Sequential(m.conv1, m.bn1, m.relu)),
                                              ("maxpool", m.maxpool)]
    for name in ("layer1", "layer2", "layer3", "layer4"):
        for i, block in enumerate(getattr(m, name)):
            out.append((f"{name}.{i}", block))
    out.append(("head", torch.nn.Sequential(m.avgpool, torch.nn.Flatten(1), m.fc)))
    return out


def parts(block: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """A bottleneck / basic block's convs with their batch norms (and activations), one by one."""
    out = []
    for i in (1, 2, 3):
        if hasattr(block, f"conv{i}"):
            mods = [getattr(block, f"conv{i}"), getattr(block, f"bn{i}")]
            out.append((f"conv{i}", torch.nn.Sequential(*mods)))
    if block.downsample is not None:
        out.append(("downsample", block.downsample))
    return out


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += [ln for ln in record.getMessage().splitlines() if ln.startswith("kernel conv")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--detail", default="", help="comma-separated stages (e.g. layer4.0) to split into "
                        "their convs, each with the build log line of its conv kernel")
    parser.add_argument("--only", default="", help="comma-separated stages to compile (default: all)")
    parser.add_argument("--no-graphs", action="store_true", help="compile with use_cuda_graphs=False")
    parser.add_argument("--device", default="cuda", help="cuda (the point of it) or cpu (to try the script)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    dtype = DTYPES[args.dtype]
    model, inputs = build_model(args.model, args.batch)
    randomize_weights(model.eval())
    model = model.to(args.device)
    x = inputs[0].to(args.device)
    log.info("%s b%d %s: per-stage relative error against exact FP32 eager", args.model, args.batch, args.dtype)
    collect = _Collect()
    logging.getLogger("kiln.compile").addHandler(collect)
    logging.getLogger("kiln.compile").setLevel(logging.DEBUG)
    detail = set(filter(None, args.detail.split(",")))
    only = set(filter(None, args.only.split(",")))
    options = {"enabled_precisions": {dtype}, "min_block_size": 1, "use_cuda_graphs": not args.no_graphs}
    with torch.no_grad():
        for name, stage in stages(model):
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            ref = stage(x)
            if only and name not in only:
                x = ref
                continue
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            xl = x.to(dtype)
            staged = stage.to(dtype)
            eager = staged(xl).float()
            torch._dynamo.reset()
            compiled = torch.compile(staged, backend="kiln", options=options)
            got = compiled(xl).float()
            ratio = relative_error(got, ref) / max(relative_error(eager, ref), 1e-12)
            log.info("  %-10s kiln %.2e  eager %.2e  (x%.1f)%s", name, relative_error(got, ref),
                     relative_error(eager, ref), ratio, "  <-- far above eager" if ratio > 10 and relative_error(got, ref) > 1e-4 else "")
            stage.float()
            if name in detail:
                for pname, part in parts(stage):
                    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
                    inp = x if pname in ("conv1", "downsample") else part_in
                    pref = part(inp)
                    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
                    torch._dynamo.reset()
                    collect.lines.clear()
                    pc = torch.compile(part.to(dtype), backend="kiln", options=options)
                    pgot = pc(inp.to(dtype)).float()
                    part.float()
                    log.info("    %-10s kiln %.2e  %s", pname, relative_error(pgot, pref), " | ".join(collect.lines))
                    part_in = torch.relu(pref)
            x = ref
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        ref = model(inputs[0].to(args.device))
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch._dynamo.reset()
        whole = torch.compile(model.to(dtype), backend="kiln", options=options)
        got = whole(inputs[0].to(args.device).to(dtype)).float()
        log.info("  %-10s kiln %.2e", "whole", relative_error(got, ref))


if __name__ == "__main__":
    main()
