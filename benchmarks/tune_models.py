"""kiln.tune on the reference models: which backend wins per submodule, and what the whole model gains.

    python3 benchmarks/tune_models.py [--device cuda] [--dtype fp16] [--models resnet50,bert,vit,mobilenet,mixed]
                                      [--backends eager,kiln-jit,kiln-aot,inductor,inductor-reduce-overhead]
                                      [--strategy min_latency] [--batch 8] [--samples 2] [--runs 20] [--out DIR]
    python3 benchmarks/tune_models.py --device cpu --small       # a smoke check of the script on a CPU

Models are built from configs with random weights (nothing is downloaded; every parameter
re-randomized with kiln.testing.randomize_weights): torchvision resnet50, vit_b_16 and
mobilenet_v3_large at 224x224, transformers BertModel (base config) at sequence length 128, and
``mixed``, a model whose four stages favour different backends: a conv stack (engines), a chain of
small pointwise ops (launch-bound: CUDA graphs), a top-k router (an op Kiln leaves to PyTorch) and a
stage whose loop count depends on the data (torch.export cannot trace it; Dynamo breaks the graph).
``--small`` uses small versions (a thin one-block-per-stage ResNet-50, a 2-layer BERT and ViT,
mobilenet_v3_small, a narrow mixed model) at small inputs, so that the whole run takes minutes on
a CPU.

Per model: ``kiln.tune.inspect`` on the samples, its top-level submodules taking at least
``--min-share`` of the time are wrapped (all four stages of ``mixed``), and ``kiln.tune.tune``
measures every backend on each (Kiln backends with ``enabled_precisions={dtype}`` and
``min_block_size=1``), then every backend on the whole model (the wrappers passing through) and the
per-module choices together, and lifts the best whole-model backend to the root when it beats them
(``compare_whole``; ``--no-single`` turns it off). The report's whole-model section gives the best
single backend on the whole model and its latency; nothing is compiled twice for it. Then the
whole model is timed eagerly and tuned (median of ``--runs`` synchronized calls) and its output
compared with eager's. The tuning is saved (``kiln.tune.save`` into DIR/tuned/MODEL) and
reloaded in a fresh process (``kiln.tune.load``, nothing tuned there), which reports each
module's source and the whole-model choice's, the load time, the latency and the error against
eager. Results go to DIR/tune_models.json (every module's full tuning report and the whole-model
one) and DIR/tune_models.md (per model: eager and tuned ms, the speedup, the whole-model decision,
the best single backend, the relative error; per wrapped module and for the whole model: the
winner, why, and each candidate's status and median ms).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

import kiln
import kiln.tune as kt
from kiln.testing import first_output, randomize_weights, relative_error
from kiln.tune.measure import time_calls

log = logging.getLogger("kiln.bench.tune_models")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


# ---- the mixed model -----------------------------------------------------------------------------

class ConvStack(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1)]
        for _ in range(3):
            layers += [nn.BatchNorm2d(width), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).mean(dim=(2, 3))


class PointwiseChain(nn.Module):
    """Twenty small elementwise steps: on a GPU each is a kernel launch unless fused or graphed."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))
        self.shift = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(10):
            x = torch.nn.functional.gelu(x * self.scale + self.shift * (i + 1))
            x = x - 0.1 * torch.sigmoid(x)
        return x


class TopKRouter(nn.Module):
    """Keeps the k largest activations per row (aten.topk, which Kiln leaves to PyTorch)."""

    def __init__(self, width: int, k: int) -> None:
        super().__init__()
        self.gate, self.out, self.k = nn.Linear(width, width), nn.Linear(width, width), k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.gate(x)
        values, index = torch.topk(scores, self.k, dim=-1)
        sparse = torch.zeros_like(scores).scatter(-1, index, torch.softmax(values, dim=-1))
        return self.out(sparse * x)


class DataDependent(nn.Module):
    """Applies its layer 1 to 3 times, as many as the data says: no single graph holds it."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layer = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = 1 + int(x.detach().abs().mean().item() * 1000) % 3
        for _ in range(steps):
            x = torch.tanh(self.layer(x))
        return x


class Mixed(nn.Module):
    def __init__(self, width: int = 256, k: int = 32) -> None:
        super().__init__()
        self.convs = ConvStack(width)
        self.pointwise = PointwiseChain(width)
        self.router = TopKRouter(width, k)
        self.dynamic = DataDependent(width)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dynamic(self.router(self.pointwise(self.convs(x)))))


# ---- the models ----------------------------------------------------------------------------------

def build(name: str, small: bool, batch: int, gen: torch.Generator) -> tuple[nn.Module, list[Any]]:
    """A model and one sample of its inputs (positional arguments)."""
    import torchvision

    size = 32 if small else 224
    image = [torch.randn(batch, 3, size, size, generator=gen)]
    if name == "resnet50":
        if small:  # the ResNet-50 design (bottleneck blocks), one block per stage, a quarter of the width
            from torchvision.models.resnet import Bottleneck, ResNet
            return ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10, width_per_group=16), image
        return torchvision.models.resnet50(), image
    if name == "vit":
        if small:
            return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                        hidden_dim=64, mlp_dim=128, num_classes=10), image
        return torchvision.models.vit_b_16(), image
    if name == "mobilenet":
        model = torchvision.models.mobilenet_v3_small(num_classes=10) if small else \
            torchvision.models.mobilenet_v3_large()
        return model, image
    if name == "bert":
        import transformers
        config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=128, vocab_size=1000, max_position_embeddings=64) \
            if small else transformers.BertConfig()
        seq = 16 if small else 128
        ids = torch.randint(0, config.vocab_size, (batch, seq), generator=gen)
        return transformers.BertModel(config), [ids, torch.ones(batch, seq, dtype=torch.int64)]
    if name == "mixed":
        return (Mixed(width=32, k=8) if small else Mixed()), [torch.randn(batch, 3, size // 2 if small else 64,
                                                                          size // 2 if small else 64, generator=gen)]
    raise ValueError(f"unknown model {name!r}; valid: resnet50, bert, vit, mobilenet, mixed")


def make_backends(names: list[str], dtype: torch.dtype) -> list[kt.Backend]:
    options = {"enabled_precisions": {dtype}, "min_block_size": 1}
    made: list[kt.Backend] = []
    for name in names:
        if name in ("kiln", "kiln-jit"):
            made.append(kt.KilnJit(options))
        elif name == "kiln-aot":
            made.append(kt.KilnAot(options))
        else:
            made.append(kt.backend_from_spec(name))
    return made


@dataclasses.dataclass
class Result:
    model: str
    batch: int
    dtype: str
    eager_ms: float = math.nan
    tuned_ms: float = math.nan
    speedup: float = math.nan
    rel_err: float = math.nan
    tune_s: float = math.nan
    single_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    best_single: str = ""
    best_single_ms: float = math.nan
    decision: str = ""
    reload: dict[str, Any] = dataclasses.field(default_factory=dict)
    wrapped: list[str] = dataclasses.field(default_factory=list)
    inspection: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    report: dict[str, Any] = dataclasses.field(default_factory=dict)
    note: str = ""


def prepare(name: str, args: argparse.Namespace, device: torch.device,
            dtype: torch.dtype) -> tuple[nn.Module, list[list[Any]]]:
    """The model (weights from a fixed seed, so that another process rebuilds the same one) and its samples."""
    gen = torch.Generator().manual_seed(0)
    model, first = build(name, args.small, args.batch, gen)
    randomize_weights(model.eval())
    model = model.to(device=device, dtype=dtype)
    samples = [first] + [build(name, args.small, args.batch, gen)[1] for _ in range(args.samples - 1)]
    return model, [[x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device) for x in s]
                   for s in samples]


def best_single_backend(report: kt.TuneReport, result: Result) -> None:
    """Every backend's latency on the whole model and the best one, from the tuning's whole-model section."""
    if report.whole is None:
        return
    rows = [c for c in report.whole.candidates if c.ok and c.kind != kt.COMPOSED]
    result.single_ms = {c.backend: c.latency_ms for c in rows}
    best = min(rows, key=lambda c: c.latency_ms)
    result.best_single, result.best_single_ms = best.backend, best.latency_ms
    result.decision = report.whole.winner


def reload_in_fresh_process(name: str, args: argparse.Namespace, saved: Path) -> dict[str, Any]:
    """Runs this script with --reload in a new process: kiln.tune.load of the saved tuning, no tuning."""
    command = [sys.executable, __file__, "--reload", str(saved), "--models", name, "--device", args.device,
               "--dtype", args.dtype, "--batch", str(args.batch), "--samples", str(args.samples),
               "--runs", str(args.runs)] + (["--small"] if args.small else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return json.loads(lines[-1])


def reload_only(name: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """The --reload side: restores the tuning into a freshly built model and times it against eager."""
    model, samples = prepare(name, args, device, dtype)
    data = [kt.Inputs(tuple(s)) for s in samples]
    with torch.no_grad():
        reference = first_output(model(*samples[0])).float()
        start = time.perf_counter()
        model = kt.load(model, args.reload)
        load_s = time.perf_counter() - start
        sources = {m.name: m.source for m in model.modules() if isinstance(m, kt.Module)}
        root = kt.root_choice(model)
        out = first_output(model(*samples[0])).float()
        first_call_s = time.perf_counter() - start - load_s
        ms = time_calls(model, data, warmup=3, runs=args.runs, device=device).median_ms
    whole = None if root is None else {"choice": root.backend.name if root.backend is not None else kt.COMPOSED,
                                       "source": root.source}
    return {"sources": sources, "whole": whole, "load_s": load_s, "first_call_s": first_call_s, "ms": ms,
            "rel_err": relative_error(out, reference)}


def run_model(name: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> Result:
    result = Result(name, args.batch, args.dtype)
    model, samples = prepare(name, args, device, dtype)
    data = [kt.Inputs(tuple(s)) for s in samples]
    with torch.no_grad():
        reference = first_output(model(*samples[0])).float()
        result.eager_ms = time_calls(model, data, warmup=3, runs=args.runs, device=device).median_ms
        found = kt.inspect(model, data, min_share=args.min_share, max_depth=1)
        result.inspection = [s.to_json() for s in found]
        log.info("%s\n%s", name, found.table())
        # The mixed model's stages are its point: each is tuned, whatever its share.
        result.wrapped = ["convs", "pointwise", "router", "dynamic"] if name == "mixed" else found.names()
        if not result.wrapped:
            result.note = "no submodule takes --min-share of the time"
            return result
        kt.wrap(model, result.wrapped)
        config = kt.TuneConfig(backends=make_backends(args.backends.split(","), dtype), strategy=args.strategy,
                               runs=args.runs, warmup=3, compare_whole=args.single, progress=not args.quiet,
                               report=not args.quiet)
        report = kt.tune(model, data, config=config)
        result.report = report.to_json()
        result.tune_s = sum(m.tune_s for m in report.modules + ([report.whole] if report.whole else []))
        best_single_backend(report, result)
        result.rel_err = relative_error(first_output(model(*samples[0])).float(), reference)
        result.tuned_ms = time_calls(model, data, warmup=3, runs=args.runs, device=device).median_ms
        result.speedup = result.eager_ms / result.tuned_ms
        saved = Path(args.out) / "tuned" / name
        kt.save(model, saved)
        del model
    torch._dynamo.reset()
    result.reload = reload_in_fresh_process(name, args, saved)
    return result


def markdown(results: list[Result], header: str) -> str:
    def f(v: float, spec: str) -> str:
        return "" if v != v else format(v, spec)

    lines = [header, "", "| model | batch | dtype | eager ms | tuned ms | speedup | whole-model decision "
             "| best single backend (whole model) | its ms | tuned vs best single | rel err | tune s "
             "| reloaded: ms, rel err, modules from file, whole-model choice (source), load s | wrapped |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        rl = r.reload
        if "ms" in rl:
            from_file = sum(1 for s in rl["sources"].values() if s == "file")
            whole = rl.get("whole")
            root = f"{whole['choice']} ({whole['source']})" if whole else "-"
            reloaded = (f"{rl['ms']:.3f}, {rl['rel_err']:.1e}, {from_file} of {len(rl['sources'])}, {root}, "
                        f"{rl['load_s']:.1f}")
        else:
            reloaded = rl.get("error", "")
        lines.append(f"| {r.model} | {r.batch} | {r.dtype} | {f(r.eager_ms, '.3f')} | {f(r.tuned_ms, '.3f')} | "
                     f"{f(r.speedup, '.2f')} | {r.decision} | {r.best_single} | {f(r.best_single_ms, '.3f')} | "
                     f"{f(r.best_single_ms / r.tuned_ms, '.2f')} | {f(r.rel_err, '.1e')} | {f(r.tune_s, '.0f')} | "
                     f"{reloaded} | {', '.join(r.wrapped) or r.note} |")
    for r in results:
        modules = r.report.get("modules", [])
        if not modules:
            continue
        backends = [c["backend"] for c in modules[0]["candidates"]]
        lines += ["", f"### {r.model}", "", "| module | share | winner | why | " + " | ".join(backends) + " |",
                  "|---|---|---|---|" + "---|" * len(backends)]
        shares = {s["name"]: s["share"] for s in r.inspection}
        whole = r.report.get("whole")
        for m in modules + ([whole] if whole else []):
            by_name = {c["backend"]: c for c in m["candidates"]}
            cells = []
            for backend in backends:
                c = by_name.get(backend)
                ms = c["latency_ms"] if c is not None else None
                cells.append("" if c is None else f"{ms:.3f} ms" if c["status"] == "ok" and ms is not None
                             else c["status"])
            share = "100%" if m is whole else f"{100 * shares.get(m['name'], 0):.0f}%"
            winner = m["winner"] + (" (superseded)" if m.get("superseded") else "")
            lines.append(f"| {m['name']} | {share} | {winner} | {m['reason']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="default: fp16 on CUDA, fp32 on the CPU")
    parser.add_argument("--models", default="resnet50,bert,vit,mobilenet,mixed")
    parser.add_argument("--backends", help="default on CUDA: eager,kiln-jit,kiln-aot,inductor,"
                                           "inductor-reduce-overhead; on the CPU: eager,kiln-jit,kiln-aot")
    parser.add_argument("--strategy", default="min_latency")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--samples", type=int, default=2, help="tuning samples per model")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--min-share", type=float, default=0.05, help="wrap top-level submodules above this share")
    parser.add_argument("--small", action="store_true", help="small models and inputs (a smoke check)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or tables on stderr")
    parser.add_argument("--no-single", dest="single", action="store_false",
                        help="no whole-model comparison (compare_whole=False): only per-module choices")
    parser.add_argument("--out", default=".")
    parser.add_argument("--reload", metavar="DIR", help=argparse.SUPPRESS)  # the fresh-process side
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device; use --device cpu (with --small for a smoke check)")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    args.dtype = args.dtype or ("fp16" if device.type == "cuda" else "fp32")
    args.backends = args.backends or ("eager,kiln-jit,kiln-aot,inductor,inductor-reduce-overhead"
                                      if device.type == "cuda" else "eager,kiln-jit,kiln-aot")
    if args.small and args.batch == parser.get_default("batch"):
        args.batch = 2
    dtype = DTYPES[args.dtype]
    if args.reload:
        print(json.dumps(reload_only(args.models, args, device, dtype)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    header = (f"Device: {where}; torch {torch.__version__}; Kiln {kiln.__version__}; {args.dtype}; batch "
              f"{args.batch}; strategy {args.strategy}; backends {args.backends}"
              + ("; small models." if args.small else "."))
    results: list[Result] = []
    for name in args.models.split(","):
        try:
            result = run_model(name, args, device, dtype)
        except Exception as err:  # a model that breaks is a row with a note, not a lost run
            log.exception("%s failed", name)
            result = Result(name, args.batch, args.dtype, note=f"failed: {type(err).__name__}: {err}"[:200])
        results.append(result)
        torch._dynamo.reset()
        (out / "tune_models.json").write_text(json.dumps(
            {"header": header, "models": [dataclasses.asdict(r) for r in results]}, indent=1, default=str))
        table = markdown(results, header)
        (out / "tune_models.md").write_text(table)
    log.info("\n%s", table)


if __name__ == "__main__":
    main()
