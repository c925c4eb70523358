"""Refit, the engine cache and MutableModule on a GPU: new weights reach CUDA engines.

Two small models with random, non-zero weights (kiln.testing.randomize_weights), compiled with
kiln.compile for ``device="cuda"`` in FP16 (``enabled_precisions={torch.half}``: the model stays
FP32, the engines compute in FP16) and in FP32:

* ConvNet: conv + batch norm + ReLU, a residual block, global average pooling, a linear head
  (batch norms folded into the convs, NHWC weights: the refit program re-derives them);
* Block: a pre-norm transformer block (layer_norm, linear q / k / v, sdpa with head dim 64 through
  F.scaled_dot_product_attention, output projection, GELU MLP, residuals).

Specifications:

* after ``kiln.refit`` with another model's weights the compiled module (the same engine
  objects, no build) gives what a fresh CUDA build with those weights gives, within FP16
  rounding (relative error <= 2e-3; FP32 1e-5), and matches eager FP32 (1e-2 in FP16, 1e-4 in
  FP32), also after the engine's captured CUDA graph was replayed before the refit;
* the engine cache on CUDA: a second model of the same architecture with other weights hits the
  entry the first stored (no build) and computes with its own weights; a second process hits too;
* MutableModule on CUDA refits after ``load_state_dict`` and in-place updates, without a rebuild.

FP32 runs without TF32 (the setting ``allow_tf32=False``, and eager likewise), so that the FP32
comparisons are tight. Errors are relative: ``||out - ref|| / ||ref||``. Skipped, with the reason, where Kiln
has no CUDA device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.cache import DiskEngineCache
from kiln.cached_build import cache_stats, reset_cache_stats
from kiln.mutable import MutableModule
from kiln.testing import randomize_weights, relative_error

pytestmark = pytest.mark.cuda  # skipped without a GPU (conftest.py)

DEVICE = "cuda"
PRECISIONS = {"fp16": torch.float16, "fp32": torch.float32}
VS_EAGER = {"fp16": 1e-2, "fp32": 1e-4}          # against eager FP32
REFIT_VS_BUILD = {"fp16": 2e-3, "fp32": 1e-5}    # refitted engine against a fresh build
DIFFERENT = 0.1                                  # two weight sets give outputs at least this far apart


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(32)
        self.conv1 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn0(self.stem(x)))
        y = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(x + self.bn2(self.conv2(y)))
        return self.head(x.mean(dim=(2, 3)))


class Block(nn.Module):
    """A pre-norm transformer block on [B, S, 128] with two heads of 64."""

    def __init__(self, dim: int = 128, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.ln1(x)

        def split(t: torch.Tensor) -> torch.Tensor:  # [B, S, D] -> [B, H, S, D / H]
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(split(self.q(h)), split(self.k(h)), split(self.v(h)))
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def _input(arch: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(123)
    shape = (2, 3, 32, 32) if arch == "convnet" else (2, 32, 128)
    return torch.randn(shape, generator=gen).to(DEVICE)


def _model(arch: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = ConvNet() if arch == "convnet" else Block()
    return randomize_weights(model.eval(), seed=seed).to(DEVICE)


def _options(precision: str, **extra: Any) -> dict[str, Any]:
    strict = {"allow_tf32": False} if precision == "fp32" else {}  # no TF32 in Kiln's FP32 kernels
    return dict(device=DEVICE, enabled_precisions={PRECISIONS[precision]}, min_block_size=1,
                require_full_compilation=True, **strict, **extra)


@pytest.fixture
def strict_fp32(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """For the fp32 cases: no TF32 in eager (Kiln's kernels: _options)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("precision") == "fp32":
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
        monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    yield


@pytest.fixture(autouse=True)
def fresh_stats() -> None:
    reset_cache_stats()


def _run(fn: Callable[..., Any], x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = fn(x)
    assert isinstance(out, torch.Tensor) and out.device == x.device, type(out)
    return out.float()


# ---- kiln.refit --------------------------------------------------------------------------

@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("arch", ["convnet", "transformer"])
def test_refit_matches_a_fresh_build_and_eager(arch: str, precision: str, strict_fp32: None) -> None:
    old, new, x = _model(arch, 0), _model(arch, 1), _input(arch)
    want_old, want_new = _run(old, x), _run(new, x)
    assert relative_error(want_new, want_old) > DIFFERENT  # the refit has something to change

    compiled = kiln.compile(old, arg_inputs=[x], **_options(precision))
    engines = compiled.engines()
    assert engines and compiled.summary.coverage == 100.0
    before = [(m.engine, m.engine.weights_version) for m in engines]
    got_old = _run(compiled, x)
    _run(compiled, x)  # a replay of the captured CUDA graph, which the refit must invalidate
    assert relative_error(got_old, want_old) <= VS_EAGER[precision], relative_error(got_old, want_old)

    reset_cache_stats()
    kiln.refit(compiled, new)
    assert cache_stats()["builds"] == 0
    assert [m.engine for m in compiled.engines()] == [e for e, _ in before]  # the same engines
    assert all(m.engine.weights_version > v for m, (_, v) in zip(compiled.engines(), before))
    got = _run(compiled, x)
    assert relative_error(got, want_new) <= VS_EAGER[precision], relative_error(got, want_new)
    x2 = torch.randn_like(x)  # the recaptured graph on other data
    assert relative_error(_run(compiled, x2), _run(new, x2)) <= VS_EAGER[precision]

    fresh = kiln.compile(new, arg_inputs=[x], **_options(precision))
    assert cache_stats()["builds"] == len(fresh.engines())
    built = _run(fresh, x)
    assert relative_error(got, built) <= REFIT_VS_BUILD[precision], relative_error(got, built)


def test_refit_with_a_state_dict_on_the_cpu() -> None:
    """New weights may live on another device than the engines (a checkpoint loaded to the CPU)."""
    old, new, x = _model("convnet", 0), _model("convnet", 1), _input("convnet")
    compiled = kiln.compile(old, arg_inputs=[x], **_options("fp16"))
    _run(compiled, x)
    kiln.refit(compiled, {k: v.cpu() for k, v in new.state_dict().items()})
    got = _run(compiled, x)
    assert relative_error(got, _run(new, x)) <= VS_EAGER["fp16"]


# ---- the engine cache ----------------------------------------------------------------------

def _cached_options(precision: str, cache_dir: Path) -> dict[str, Any]:
    return _options(precision, cache_built_engines=True, reuse_cached_engines=True, immutable_weights=False,
                    engine_cache_dir=str(cache_dir))


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("arch", ["convnet", "transformer"])
def test_cache_hit_computes_with_the_second_models_weights(arch: str, precision: str, strict_fp32: None,
                                                          tmp_path: Path) -> None:
    a, b, x = _model(arch, 0), _model(arch, 1), _input(arch)
    ca = kiln.compile(a, arg_inputs=[x], **_cached_options(precision, tmp_path))
    n = len(ca.engines())
    assert n >= 1
    stats = cache_stats()
    assert stats["builds"] == n and stats["misses"] == n and stats["stored"] == n and stats["hits"] == 0
    assert len(DiskEngineCache(tmp_path).entries()) == n

    cb = kiln.compile(b, arg_inputs=[x], **_cached_options(precision, tmp_path))
    stats = cache_stats()
    assert stats["builds"] == n and stats["hits"] == n  # nothing built for the second model
    assert stats["refits"] == n and stats["refits_skipped"] == 0 and stats["rejected"] == 0
    ya, yb = _run(ca, x), _run(cb, x)
    want_a, want_b = _run(a, x), _run(b, x)
    assert relative_error(ya, want_a) <= VS_EAGER[precision], relative_error(ya, want_a)
    assert relative_error(yb, want_b) <= VS_EAGER[precision], relative_error(yb, want_b)
    assert relative_error(yb, ya) > DIFFERENT


def _python_env() -> dict[str, str]:
    env = dict(os.environ)
    package_root = str(Path(kiln.__file__).absolute().parent.parent)  # the kiln under test
    env["PYTHONPATH"] = os.pathsep.join([package_root, str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    return env


def _compile_in_new_process(cache_dir: Path, out: Path) -> dict[str, Any]:
    script = textwrap.dedent(f"""
        import json, logging, threading, torch, kiln
        import test_cuda_refit_cache as t
        from kiln.cached_build import cache_stats
        ahead = []
        class Keep(logging.Handler):
            def emit(self, record):
                ahead.append(record.getMessage())
        logging.getLogger("kiln.runtime").addHandler(Keep())
        logging.getLogger("kiln.runtime").setLevel(logging.DEBUG)
        t.DEVICE = {DEVICE!r}
        model, x = t._model("convnet", 0), t._input("convnet")
        compiled = kiln.compile(model, arg_inputs=[x], **t._cached_options("fp16", {str(cache_dir)!r}))
        with torch.no_grad():
            torch.save(compiled(x).cpu(), {str(out)!r})
        for thread in threading.enumerate():
            if thread.name.startswith("kiln-warm-up"):
                thread.join()
        logs = [m.engine.build_log for m in compiled.modules() if hasattr(m, "engine")]
        setup = [line for log in logs for line in log.splitlines() if line.startswith("libraries set up")]
        print(json.dumps(dict(cache_stats(), library_setup=setup,
                              ahead=[m for m in ahead if "set up ahead" in m])))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_python_env(),
                         timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_second_process_loads_the_cached_engine(tmp_path: Path) -> None:
    first = _compile_in_new_process(tmp_path / "cache", tmp_path / "a.pt")
    assert first["builds"] == 1 and first["stored"] == 1 and first["hits"] == 0
    second = _compile_in_new_process(tmp_path / "cache", tmp_path / "b.pt")
    assert second["builds"] == 0 and second["hits"] == 1 and second["stored"] == 0
    assert second["refits"] == 0 and second["refits_skipped"] == 1  # the same weights: nothing to refit
    # kiln.compile set cuBLASLt up while torch.export traced (kiln.runtime.warm_up), once: the
    # engine's load found it done and did not set it up again.
    assert len(second["ahead"]) == 1 and "cuBLASLt handle" in second["ahead"][0], second
    assert second["library_setup"] == [], second
    ya, yb = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert relative_error(yb, ya) <= 1e-3, relative_error(yb, ya)  # the engine the first process built
    x = _input("convnet")
    assert relative_error(yb, _run(_model("convnet", 0), x)) <= VS_EAGER["fp16"]


# ---- MutableModule -----------------------------------------------------------------------

@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("arch", ["convnet", "transformer"])
def test_mutable_module_refits_after_load_state_dict(arch: str, precision: str, strict_fp32: None) -> None:
    model, x = _model(arch, 0), _input(arch)
    mm = MutableModule(model, device=DEVICE, enabled_precisions={PRECISIONS[precision]}, min_block_size=1,
                       require_full_compilation=True)
    tol = VS_EAGER[precision]
    before = _run(mm, x)
    assert relative_error(before, _run(model, x)) <= tol
    assert mm.builds == 1 and mm.refits == 0

    reset_cache_stats()
    mm.load_state_dict(_model(arch, 1).state_dict())
    after = _run(mm, x)
    assert mm.builds == 1 and mm.refits == 1 and cache_stats()["builds"] == 0
    assert relative_error(after, _run(_model(arch, 1), x)) <= tol
    assert relative_error(after, before) > DIFFERENT

    with torch.no_grad():  # in place, through the wrapped model: seen by the version counters
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(-0.5)
    again = _run(mm, x)
    assert mm.builds == 1 and mm.refits == 2 and cache_stats()["builds"] == 0
    assert relative_error(again, _run(model, x)) <= tol


def test_word_checksum_on_the_gpu_is_the_cpu_sum_of_the_same_bytes() -> None:
    """weights_fingerprint sums device weights on the device (_C.word_checksum): the same bytes
    give the CPU backend's sum, whatever the sizes (odd byte counts, an element-offset view)."""
    gen = torch.Generator().manual_seed(3)
    host = [torch.randn(1000, 37, generator=gen), torch.randn(5, generator=gen).half(),
            torch.randint(0, 256, (3 << 20,), generator=gen, dtype=torch.uint8)]
    device = [t.to(DEVICE) for t in host]
    device.append(torch.randn(77, generator=gen).half().to(DEVICE)[1:])  # two bytes into its storage
    host.append(device[-1].cpu())

    def buffers(ts: list[torch.Tensor]) -> list[tuple[int, int]]:
        return [(t.data_ptr(), t.numel() * t.element_size()) for t in ts]

    on_gpu = kiln._C.word_checksum(DEVICE, buffers(device), torch.cuda.current_stream().cuda_stream)
    assert on_gpu == kiln._C.word_checksum("cpu", buffers([t.contiguous() for t in host]))


def test_fingerprint_reads_device_weights_after_the_callers_stream() -> None:
    """The fingerprint of device weights is computed on a worker thread at a cache hit; it must
    see what the caller's stream wrote before (a load_state_dict still running there)."""
    from kiln.cached_build import current_streams, weights_fingerprint
    weights = {"w": torch.randn(4096, 1024, device=DEVICE), "b": torch.randn(1024, device=DEVICE)}
    before = weights_fingerprint(weights)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # the write below lands some 50 ms later
        weights["w"].fill_(0.5)
        streams = current_streams(weights)
    got = weights_fingerprint(weights, streams)
    torch.cuda.synchronize()
    assert got == weights_fingerprint(weights) != before
