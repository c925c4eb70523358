"""Dynamic shapes (kiln/dynamic.py): one symbolic program serves every size in its ranges.

Outputs are compared with eager PyTorch at several sizes, through kiln.compile (torch.export's
dynamic_shapes, kiln.Input ranges) and torch.compile (dynamic=True, mark_dynamic); export and
lowering are counted to happen once; errors, settings and the dry-run report are checked
word for word. A dynamic program's bundle is run by the C++ runtime and kiln-run at several
sizes, against eager."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import kiln
import kiln.aot
import kiln.dynamic
import kiln.dynamo
import kiln.lowering
from kiln import _C
from kiln.archive import _safe_expression
from kiln.cached_build import cache_stats, reset_cache_stats
from kiln.dynamic import Specializations, dynamic_program_of
from kiln.runtime import KilnEngineModule


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Encoder(torch.nn.Module):
    """One transformer encoder layer over token ids, with a padding mask."""

    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm1 = torch.nn.LayerNorm(dim)
        self.ff1 = torch.nn.Linear(dim, 4 * dim)
        self.ff2 = torch.nn.Linear(4 * dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        b, s, d = h.shape
        q, k, v = self.qkv(h).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        bias = (1.0 - mask[:, None, None, :].to(h.dtype)) * -10000.0
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + bias
        att = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)
        h = self.norm1(h + self.proj(att))
        return self.norm2(h + self.ff2(F.gelu(self.ff1(h))))


class Reshaper(torch.nn.Module):
    """view / reshape with the symbolic sizes themselves."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(12, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        y = self.lin(x).view(b, n, 3, 4).transpose(1, 2).reshape(b * 3, n * 4)
        return torch.tanh(y).reshape(b, -1) * 2.0 + x.reshape(b, n * 12)[:, : n * 12].sum(-1, keepdim=True)


def _close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def _cnn() -> SmallCNN:
    torch.manual_seed(0)
    m = SmallCNN().eval()
    with torch.no_grad():  # non-trivial batch-norm statistics
        for bn in (m.bn1, m.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    return m


def _encoder_inputs(b: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, 50, (b, s))
    mask = torch.ones(b, s, dtype=torch.long)
    mask[0, s // 2:] = 0  # padding in the first sequence
    return ids, mask


@pytest.fixture
def export_count(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts torch.export.export calls and lowerings."""
    counts = {"export": 0, "lower": 0}
    real_export = torch.export.export
    real_lower = kiln.aot.lower_exported_program
    real_module_lower = kiln.lowering.lower_exported_program

    def export(*args, **kwargs):
        counts["export"] += 1
        return real_export(*args, **kwargs)

    def lower(*args, **kwargs):
        counts["lower"] += 1
        return real_lower(*args, **kwargs)

    def module_lower(*args, **kwargs):
        counts["lower"] += 1
        return real_module_lower(*args, **kwargs)

    monkeypatch.setattr(torch.export, "export", export)
    monkeypatch.setattr(kiln.aot, "lower_exported_program", lower)
    monkeypatch.setattr(kiln.lowering, "lower_exported_program", module_lower)
    return counts


# ---- kiln.compile ---------------------------------------------------------------------------

def test_cnn_dynamic_batch_matches_eager(export_count: dict[str, int]) -> None:
    m = _cnn()
    compiled = kiln.compile(m, [torch.randn(2, 3, 16, 16)], dynamic_shapes=({0: Dim("b", min=1, max=8)},),
                            min_block_size=1)
    assert (export_count["export"], export_count["lower"]) == (1, 1)
    with torch.no_grad():
        for b in (1, 2, 5, 8, 3):
            x = torch.randn(b, 3, 16, 16)
            _close(compiled(x), m(x))
    assert (export_count["export"], export_count["lower"]) == (1, 1)
    table = dynamic_program_of(compiled)
    assert table is not None
    assert sorted(spec.binding[next(iter(spec.binding))] for spec in table.live.values()) == [1, 2, 3, 5, 8]
    table.wait_tuned()  # a new batch runs on padded rows until its instance is made in the background
    assert len(compiled.engines()) == 5  # one block, one engine per size


def test_encoder_dynamic_sequence_matches_eager(export_count: dict[str, int]) -> None:
    torch.manual_seed(1)
    m = Encoder().eval()
    seq = Dim("seq", min=2, max=64)
    compiled = kiln.compile(m, list(_encoder_inputs(2, 8)), dynamic_shapes=({1: seq}, {1: seq}))
    assert compiled.summary.coverage == 100.0
    with torch.no_grad():
        for s in (8, 3, 17, 64):
            ids, mask = _encoder_inputs(2, s)
            _close(compiled(ids, mask), m(ids, mask))
    assert (export_count["export"], export_count["lower"]) == (1, 1)


def test_reshape_with_symbolic_sizes_matches_eager() -> None:
    torch.manual_seed(2)
    m = Reshaper().eval()
    compiled = kiln.compile(m, [torch.randn(2, 5, 12)],
                            dynamic_shapes=({0: Dim("b", min=1, max=16), 1: Dim("n", min=2, max=32)},))
    with torch.no_grad():
        for b, n in ((2, 5), (1, 2), (7, 31), (16, 32)):
            x = torch.randn(b, n, 12)
            _close(compiled(x), m(x))


def test_out_of_range_and_mismatched_sizes_raise() -> None:
    m = _cnn()
    compiled = kiln.compile(m, [torch.randn(2, 3, 16, 16)], dynamic_shapes=({0: Dim("b", min=1, max=32)},),
                            min_block_size=1)
    with pytest.raises(kiln.ShapeRangeError) as err:
        compiled(torch.randn(40, 3, 16, 16))
    assert str(err.value) == "kiln: input 'x' dim 0 is 40, outside the range 1..32 this program was compiled for"
    with pytest.raises(ValueError) as err:
        compiled(torch.randn(2, 3, 16, 15))
    assert str(err.value) == "kiln: input 'x' dim 3 is 15, this program was compiled for 16"
    with pytest.raises(ValueError) as err:
        compiled(torch.randn(2, 3, 16))
    assert str(err.value) == "kiln: input 'x' has 3 dims, this program was compiled for 4"

    torch.manual_seed(1)
    enc = Encoder().eval()
    seq = Dim("seq", min=2, max=64)
    compiled = kiln.compile(enc, list(_encoder_inputs(2, 8)), dynamic_shapes=({1: seq}, {1: seq}))
    ids, _ = _encoder_inputs(2, 9)
    _, mask = _encoder_inputs(2, 10)
    with pytest.raises(ValueError) as err:
        compiled(ids, mask)
    assert str(err.value) == ("kiln: input 'mask' dim 1 is 10, but this program needs it equal to input 'ids' "
                              "dim 1 (9)")


class _SizeBranch(torch.nn.Module):
    """A branch on the sequence length whose guard torch.export cannot prove over the range
    (``true_everywhere``: (s*s)//7 > 3s - 100, true for every s; else s % 5 != 3, false at 18, 23, ...)."""

    def __init__(self, true_everywhere: bool) -> None:
        super().__init__()
        self.lin, self.true_everywhere = torch.nn.Linear(8, 8), true_everywhere

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, y = x.shape[1], self.lin(x)
        if ((s * s) // 7 > 3 * s - 100) if self.true_everywhere else (s % 5 != 3):
            return torch.relu(y) * 2
        return y - 1


@pytest.mark.parametrize("true_everywhere", [True, False])
def test_a_guard_export_cannot_prove_becomes_a_run_time_check(true_everywhere: bool,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(3)
    m = _SizeBranch(true_everywhere).eval()
    seq = Dim("seq", min=16, max=128)
    with pytest.raises(Exception, match="Constraints violated"):  # what plain torch.export makes of it
        torch.export.export(m, (torch.randn(2, 64, 8),), dynamic_shapes=({1: seq},), strict=False)
    with caplog.at_level(logging.INFO, logger="kiln"):
        compiled = kiln.compile(m, [torch.randn(2, 64, 8)], dynamic_shapes=({1: seq},), min_block_size=1)
    assert "could not prove a guard over the dynamic range; it becomes a run-time check" in caplog.text
    assert compiled.summary.ops_in_engines == {"aten.linear.default": 1, "aten.relu.default": 1,
                                               "aten.mul.Tensor": 1}, compiled.summary
    with torch.no_grad():
        for n in (16, 40, 64, 101, 127):
            x = torch.randn(2, n, 8)
            _close(compiled(x), m(x))
        if not true_everywhere:  # a size that takes the other branch raises; the next one serves
            with pytest.raises(RuntimeError, match="Runtime assertion failed"):
                compiled(torch.randn(2, 23, 8))
            x = torch.randn(2, 24, 8)
            _close(compiled(x), m(x))


def test_specializations_are_least_recently_used(caplog: pytest.LogCaptureFixture) -> None:
    m = _cnn()
    # Every size builds engines of its own (no instances, which are kept apart from the capacity).
    compiled = kiln.compile(m, [torch.randn(2, 3, 16, 16)], dynamic_shapes=({0: Dim("b", min=1, max=8)},),
                            min_block_size=1, specialization_cache_size=2, dynamic_instances=False)
    table = dynamic_program_of(compiled)
    assert isinstance(table, Specializations)
    with caplog.at_level(logging.INFO, logger="kiln"), torch.no_grad():
        for b in (3, 2, 4):
            x = torch.randn(b, 3, 16, 16)
            _close(compiled(x), m(x))
    assert [list(spec.binding.values()) for spec in table.live.values()] == [[2], [4]]
    table.wait_tuned()
    assert len(compiled.engines()) == 2
    new = [r.getMessage() for r in caplog.records if "new specialization" in r.getMessage()]
    dropped = [r.getMessage() for r in caplog.records if "dropped the specialization" in r.getMessage()]
    assert len(new) == 2  # 3 and 4; 2 (the opt shape) was built at compile time
    assert len(dropped) == 1 and "for s" in dropped[0] and dropped[0].endswith(
        "=3 (least recently used; specialization_cache_size=2)")


class TwoParts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(self.a(x)) * 2.0, torch.nonzero(y).to(torch.float32).sum() + self.b(x).sum()


def test_blocks_share_engines_across_unrelated_sizes() -> None:
    """A block whose own sizes do not change between two specializations keeps its engine."""
    torch.manual_seed(3)
    m = TwoParts().eval()
    compiled = kiln.compile(m, [torch.randn(2, 8), torch.randn(4)],
                            dynamic_shapes=({0: Dim("b", min=1, max=8)}, {0: Dim("n", min=2, max=8)}),
                            min_block_size=1)
    with torch.no_grad():
        for b, n in ((2, 4), (2, 6), (3, 6)):
            x, y = torch.randn(b, 8), torch.randn(n)
            for out, ref in zip(compiled(x, y), m(x, y)):
                _close(out, ref)


def test_kiln_input_ranges() -> None:
    m = _cnn()
    spec = kiln.Input(min_shape=(1, 3, 16, 16), opt_shape=(4, 3, 16, 16), max_shape=(8, 3, 16, 16))
    compiled = kiln.compile(m, inputs=[spec], min_block_size=1, device="cpu")
    table = dynamic_program_of(compiled)
    assert table is not None
    (symbol,) = table.shapes.symbols
    r = table.shapes.ranges[symbol]
    assert (r.min, r.max, r.opt) == (1, 8, 4)
    assert [list(s.binding.values()) for s in table.live.values()] == [[4]]  # opt built at compile time
    with torch.no_grad():
        for b in (1, 8):
            x = torch.randn(b, 3, 16, 16)
            _close(compiled(x), m(x))


def test_kiln_input_unifies_dims_that_must_be_equal() -> None:
    torch.manual_seed(1)
    m = Encoder().eval()
    ids = kiln.Input((1, 2), (2, 8), (4, 32), dtype=torch.long)
    mask = kiln.Input((1, 2), (2, 8), (4, 32), dtype=torch.long)
    compiled = kiln.compile(m, inputs=[ids, mask], device="cpu")
    with torch.no_grad():
        for b, s in ((1, 2), (4, 32), (3, 11)):
            x, mk = _encoder_inputs(b, s)
            _close(compiled(x, mk), m(x, mk))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"min_shape": (1, 3), "opt_shape": (2, 3)},
     "kiln.Input: give min_shape, opt_shape and max_shape (or shape for a static input)"),
    ({"min_shape": (2, 3), "opt_shape": (1, 3), "max_shape": (4, 3)},
     "kiln.Input: dim 0 needs min <= opt <= max, got 2, 1, 4"),
    ({"min_shape": (1, 3), "opt_shape": (2, 3), "max_shape": (4,)},
     "kiln.Input: min_shape (1, 3), opt_shape (2, 3) and max_shape (4,) have different numbers of dims"),
    ({"shape": (1, 3), "max_shape": (4, 3)},
     "kiln.Input: give shape (a static input) or min_shape, opt_shape and max_shape, not both"),
    ({"shape": (1, "a")}, "kiln.Input: shape must be a tuple of ints, got (1, 'a')"),
])
def test_kiln_input_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        kiln.Input(**kwargs)
    assert str(err.value) == message


def test_dynamic_shapes_given_twice_is_an_error() -> None:
    spec = kiln.Input((1, 3, 16, 16), (2, 3, 16, 16), (4, 3, 16, 16))
    with pytest.raises(ValueError) as err:
        kiln.compile(_cnn(), [spec], dynamic_shapes=({0: Dim("b")},))
    assert str(err.value) == ("kiln.compile: give the dynamic shapes once, as dynamic_shapes or as kiln.Input ranges "
                              "in the inputs")


# ---- settings and dry run -------------------------------------------------------------------

@pytest.mark.parametrize(("key", "value", "message"), [
    ("specialization_cache_size", 0, "Kiln option 'specialization_cache_size' must be >= 1, got 0"),
    ("specialization_cache_size", 2.0,
     "Kiln option 'specialization_cache_size' must be an int, got 2.0 (float)"),
    ("dynamic_max_size", 1, "Kiln option 'dynamic_max_size' must be >= 2, got 1"),
    ("dynamic_max_size", True, "Kiln option 'dynamic_max_size' must be an int, got True (bool)"),
])
def test_settings_validation(key: str, value: object, message: str) -> None:
    with pytest.raises(ValueError) as err:
        kiln.CompilationSettings(**{key: value})
    assert str(err.value) == message


def test_unbounded_dim_is_clamped_to_dynamic_max_size() -> None:
    m = _cnn()
    compiled = kiln.compile(m, [torch.randn(2, 3, 16, 16)], dynamic_shapes=({0: Dim("b")},), min_block_size=1,
                            dynamic_max_size=6)
    with torch.no_grad():
        x = torch.randn(6, 3, 16, 16)
        _close(compiled(x), m(x))
    with pytest.raises(kiln.ShapeRangeError) as err:
        compiled(torch.randn(7, 3, 16, 16))
    assert str(err.value).endswith("dim 0 is 7, outside the range 0..6 this program was compiled for") or \
        str(err.value).endswith("dim 0 is 7, outside the range 2..6 this program was compiled for")


def test_dry_run_reports_symbols_and_ranges(tmp_path) -> None:
    report = tmp_path / "report.txt"
    torch.manual_seed(1)
    m = Encoder().eval()
    seq = Dim("seq", min=2, max=64)
    compiled = kiln.compile(m, list(_encoder_inputs(2, 8)), dynamic_shapes=({1: seq}, {1: seq}), dryrun=str(report))
    text = report.read_text()
    lines = text.splitlines()
    start = lines.index("  dynamic shapes (partitioned once; engines built per concrete size in these ranges):")
    ids_line, mask_line = lines[start + 1], lines[start + 2]
    symbol = ids_line.split("[2, ")[1].split("]")[0]
    assert ids_line == f"    ids: [2, {symbol}] with {symbol} in 2..64 (opt 8)"
    assert mask_line == f"    mask: [2, {symbol}] with {symbol} in 2..64 (opt 8)"
    assert compiled.engines() == []


# ---- kiln.save / kiln.load --------------------------------------------------------------------

ROOT = "archive/"  # kiln.save writes through a file object: torch names the archive's folder so


def _python_env() -> dict[str, str]:
    env = dict(os.environ)
    package_root = str(Path(kiln.__file__).absolute().parent.parent)  # the kiln under test
    env["PYTHONPATH"] = os.pathsep.join([package_root, env.get("PYTHONPATH", "")])
    return env


def _records(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i.filename) for i in z.infolist()}


def _rewritten(src: Path, dst: Path, changes: dict[str, bytes]) -> Path:
    """A copy of ``src`` as a consistent zip with records (named without the root folder) replaced."""
    items = _records(src)
    for key, data in changes.items():
        assert ROOT + key in items
        items[ROOT + key] = data
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
        for name, data in items.items():
            z.writestr(name, data)
    return dst


def _description(path: Path) -> dict:
    return json.loads(_records(path)[ROOT + "extra/kiln_dynamic.json"])


def _engine_record(path: Path, i: int) -> str:
    """The archive record holding engine ``i`` of a saved dynamic program."""
    config = json.loads(_records(path)[ROOT + "data/weights/kiln_engines_weights_config.json"])["config"]
    return "data/weights/" + config[f"engine_{i}"]["path_name"]


def _batches(compiled: torch.nn.Module) -> list[int]:
    table = dynamic_program_of(compiled)
    assert table is not None
    return [next(iter(spec.binding.values())) for spec in table.live.values()]


@pytest.fixture(scope="module")
def saved_cnn(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A CNN compiled for batch 1..8 (opt 2), run at batch 5 too, saved; with eager's outputs and
    the compiled program's own at batches 2, 5 and 3, and its error for batch 9."""
    out = tmp_path_factory.mktemp("dynamic_save")
    m = _cnn()
    # Engines built per size (not instances, tests/python/test_dynamic_instances.py): what is saved.
    compiled = kiln.compile(m, [torch.randn(2, 3, 16, 16)], dynamic_shapes=({0: Dim("b", min=1, max=8)},),
                            min_block_size=1, dynamic_instances=False)
    torch.manual_seed(5)
    inputs = {b: torch.randn(b, 3, 16, 16) for b in (2, 5, 3)}
    with torch.no_grad():
        compiled(inputs[5])
        assert _batches(compiled) == [2, 5]
        path = out / "cnn.ep"
        ep = kiln.save(compiled, path, [inputs[2]])
        assert isinstance(ep, torch.export.ExportedProgram)
        outputs = {b: compiled(x) for b, x in inputs.items()}
        eager = {b: m(x) for b, x in inputs.items()}
    with pytest.raises(kiln.ShapeRangeError) as err:
        compiled(torch.randn(9, 3, 16, 16))
    torch.save(inputs, out / "inputs.pt")
    return {"path": path, "dir": out, "model": m, "inputs": inputs, "outputs": outputs, "eager": eager,
            "error": str(err.value)}


def test_saved_dynamic_program_serves_in_a_fresh_process(saved_cnn: dict) -> None:
    out = saved_cnn["dir"]
    script = textwrap.dedent(f"""
        import json, torch, kiln
        from kiln.cached_build import cache_stats, reset_cache_stats
        reset_cache_stats()
        program = kiln.load({str(saved_cnn["path"])!r})
        module = program.module()
        inputs = torch.load({str(out / "inputs.pt")!r})
        result = {{"type": type(program).__name__, "builds_at_load": cache_stats()["builds"]}}
        outputs = {{}}
        with torch.no_grad():
            for b in (2, 5):
                outputs[b] = module(inputs[b])
            result["builds_saved_sizes"] = cache_stats()["builds"]
            outputs[3] = module(inputs[3])
            result["builds_new_size"] = cache_stats()["builds"]
            try:
                module(torch.randn(9, 3, 16, 16))
            except kiln.ShapeRangeError as err:
                result["error"] = str(err)
        torch.save(outputs, {str(out / "outputs.pt")!r})
        with open({str(out / "result.json")!r}, "w") as f:
            json.dump(result, f)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_python_env())
    assert run.returncode == 0, run.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["type"] == "DynamicProgram"
    assert (result["builds_at_load"], result["builds_saved_sizes"]) == (0, 0)  # the saved engines serve 2 and 5
    assert result["builds_new_size"] >= 1  # 3 was never built: built on its first call
    assert result["error"] == saved_cnn["error"] == ("kiln: input 'x' dim 0 is 9, outside the range 1..8 this "
                                                     "program was compiled for")
    outputs = torch.load(out / "outputs.pt")
    for b in (2, 5):  # the saved engines themselves: exactly what the compiled program computed
        torch.testing.assert_close(outputs[b], saved_cnn["outputs"][b], atol=0, rtol=0)
    for b in (2, 5, 3):
        _close(outputs[b], saved_cnn["eager"][b])


def test_loaded_dynamic_program_saves_again_and_loads_trusted(saved_cnn: dict, tmp_path: Path) -> None:
    program = kiln.load(saved_cnn["path"], trusted=True)
    module = program.module()
    assert program.module() is module and isinstance(program.exported_program, torch.export.ExportedProgram)
    assert _batches(module) == [2, 5] and len(module.engines()) == 2
    with torch.no_grad():
        module(saved_cnn["inputs"][3])
        again = tmp_path / "again.ep"
        kiln.save(module, again, [])
        reset_cache_stats()
        reloaded = kiln.load(again).module()
        assert _batches(reloaded) == [2, 5, 3]
        for x in saved_cnn["inputs"].values():
            torch.testing.assert_close(reloaded(x), module(x), atol=0, rtol=0)
    assert cache_stats()["builds"] == 0


def test_saved_encoder_keeps_its_ranges_settings_and_order(tmp_path: Path) -> None:
    torch.manual_seed(1)
    m = Encoder().eval()
    seq = Dim("seq", min=2, max=64)
    compiled = kiln.compile(m, list(_encoder_inputs(2, 8)), dynamic_shapes=({1: seq}, {1: seq}),
                            specialization_cache_size=3, dynamic_instances=False)
    with torch.no_grad():
        for s in (17, 5):
            compiled(*_encoder_inputs(2, s))
        compiled(*_encoder_inputs(2, 8))  # the most recently used now
        kiln.save(compiled, tmp_path / "enc.ep", list(_encoder_inputs(2, 8)))
        reset_cache_stats()
        loaded = kiln.load(tmp_path / "enc.ep").module()
        table = dynamic_program_of(loaded)
        assert table is not None and table.capacity == 3
        assert [list(spec.binding.values()) for spec in table.live.values()] == [[17], [5], [8]]
        for s in (17, 5, 8):
            ids, mask = _encoder_inputs(2, s)
            torch.testing.assert_close(loaded(ids, mask), compiled(ids, mask), atol=0, rtol=0)
        assert cache_stats()["builds"] == 0
        ids, mask = _encoder_inputs(2, 30)
        _close(loaded(ids, mask), m(ids, mask))
        assert cache_stats()["builds"] >= 1
        # the least recently used (17) made room for 30, as in the process that saved it
        assert [list(spec.binding.values()) for spec in table.live.values()] == [[5], [8], [30]]
        ids, _ = _encoder_inputs(2, 9)
        _, mask = _encoder_inputs(2, 10)
        with pytest.raises(kiln.ShapeRangeError) as err:
            loaded(ids, mask)
    assert str(err.value) == ("kiln: input 'mask' dim 1 is 10, but this program needs it equal to input 'ids' "
                              "dim 1 (9)")


def test_saved_engines_shared_between_sizes_are_saved_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The block depends on b only: (2, 4) and (2, 6) share its engine, saved once and shared again
    after loading; at b=3 its build fails (made to), so it runs in PyTorch there, after loading too."""
    real_build = kiln.dynamic.build_block

    def build(gm, block, settings, device, name, **kwargs):
        return None if name.endswith("=3]") else real_build(gm, block, settings, device, name, **kwargs)

    monkeypatch.setattr(kiln.dynamic, "build_block", build)
    torch.manual_seed(3)
    m = TwoParts().eval()
    compiled = kiln.compile(m, [torch.randn(2, 8), torch.randn(4)],
                            dynamic_shapes=({0: Dim("b", min=1, max=8)}, {0: Dim("n", min=2, max=8)}),
                            min_block_size=1, dynamic_instances=False)
    inputs = [(torch.randn(b, 8), torch.randn(n)) for b, n in ((2, 4), (2, 6), (3, 6))]
    with torch.no_grad():
        expected = [compiled(*xy) for xy in inputs]
        kiln.save(compiled, tmp_path / "two.ep", list(inputs[0]))
        description = _description(tmp_path / "two.ep")
        assert [spec["blocks"] for spec in description["specializations"]] == [[0], [0], [None]]
        assert len(description["engines"]) == 1
        monkeypatch.setattr(kiln.dynamic, "build_block", real_build)
        reset_cache_stats()
        loaded = kiln.load(tmp_path / "two.ep").module()
        runners = [spec.runners[0] for spec in dynamic_program_of(loaded).live.values()]
        assert runners[0] is runners[1] and isinstance(runners[0], KilnEngineModule)
        assert isinstance(runners[2], torch.fx.GraphModule)  # PyTorch at b=3, as when saved
        for xy, want in zip(inputs, expected):
            for out, ref in zip(loaded(*xy), want):
                torch.testing.assert_close(out, ref, atol=0, rtol=0)
            for out, ref in zip(loaded(*xy), m(*xy)):
                _close(out, ref)
        assert cache_stats()["builds"] == 0


def test_damaged_dynamic_files_raise_at_load(saved_cnn: dict, tmp_path: Path) -> None:
    path = saved_cnn["path"]
    data = path.read_bytes()
    for size in (0, len(data) // 3, len(data) - 22):
        cut = tmp_path / f"cut{size}.ep"
        cut.write_bytes(data[:size])
        with pytest.raises(kiln.KilnError, match="kiln.load"):
            kiln.load(cut)
    record = _engine_record(path, 1)
    blob = bytearray(_records(path)[ROOT + record])
    blob[len(blob) // 2] ^= 0x10
    bad = _rewritten(path, tmp_path / "engine.ep", {record: bytes(blob)})
    with pytest.raises(kiln.EngineFileError, match=r"^kiln.load: .*engine\.ep: engine 1 \(engine 0 of SmallCNN "
                       r"\[s\d+=5\]\): "):
        kiln.load(bad)
    # Each engine named for the other's sizes: both are sound files, neither fits its block there.
    text = _records(path)[ROOT + "extra/kiln_dynamic.json"].decode()
    doc = json.loads(text)
    assert [spec["blocks"] for spec in doc["specializations"]] == [[0], [1]]
    doc["specializations"][0]["blocks"], doc["specializations"][1]["blocks"] = [1], [0]
    swapped = _rewritten(path, tmp_path / "swapped.ep", {"extra/kiln_dynamic.json": json.dumps(doc).encode()})
    with pytest.raises(kiln.CorruptedError, match=r"engine 1 \(engine 0 of SmallCNN \[s\d+=2\]\) does not fit its "
                       r"block: engine input '.*' is .* \[5, 3, 16, 16\], but PyTorch computes .* \[2, 3, 16, 16\]"):
        kiln.load(swapped)
    bad = _rewritten(path, tmp_path / "json.ep", {"extra/kiln_dynamic.json": text[:-5].encode()})
    with pytest.raises(kiln.CorruptedError, match=r"description \(kiln_dynamic.json\) is not JSON"):
        kiln.load(bad)
    doc = json.loads(text)
    doc["blocks"][0]["inputs"] = 2
    bad = _rewritten(path, tmp_path / "blocks.ep", {"extra/kiln_dynamic.json": json.dumps(doc).encode()})
    with pytest.raises(kiln.VersionMismatchError, match=r"partitions into 1 block\(s\) here \(10 ops, 1 in, 1 out\), "
                       r"into 1 when it was saved \(10 ops, 2 in, 1 out\)"):
        kiln.load(bad)
    doc = json.loads(text)
    doc["specializations"][1]["inputs"] = [[12, 3, 16, 16]]
    bad = _rewritten(path, tmp_path / "spec.ep", {"extra/kiln_dynamic.json": json.dumps(doc).encode()})
    with pytest.raises(kiln.CorruptedError, match=r"specialization 1 does not fit the program: kiln: input 'x' dim 0 "
                       r"is 12, outside the range 1..8"):
        kiln.load(bad)


def _kiln_run() -> str | None:
    build = os.environ.get("KILN_BUILD_DIR")
    if build and (Path(build) / "kiln-run").exists():
        return str(Path(build) / "kiln-run")
    return shutil.which("kiln-run")


def test_dynamic_program_bundle_serves_its_range(tmp_path: Path) -> None:
    """A bundle of a dynamic program holds, per block, the engine its instances run on and the
    fitted sizes: the C++ runtime and kiln-run serve any batch in the range without Python, and
    refuse one outside it naming the input, the dim and the range."""
    m = _cnn()
    x = torch.randn(2, 3, 16, 16)
    compiled = kiln.compile(m, [x], dynamic_shapes=({0: Dim("b", min=1, max=8)},), min_block_size=1)
    path = tmp_path / "m.kiln"
    assert isinstance(kiln.save(compiled, path, [x], output_format="kiln_bundle"), torch.export.ExportedProgram)
    bundle = _C.Bundle.load(path)
    assert bundle.dynamic
    with torch.no_grad():
        for b in (2, 1, 5, 8):
            xb = torch.randn(b, 3, 16, 16)
            _close(torch.from_numpy(bundle.run([xb.numpy()])[0]), m(xb))
    with pytest.raises(kiln.ShapeMismatchError, match=r"input 0 'x' dim 0 \(\w+\) is 9, outside its range \[1, 8\]"):
        bundle.run([torch.randn(9, 3, 16, 16).numpy()])
    with pytest.raises(kiln.ShapeMismatchError, match=r"dim 2 is 15; the bundle takes 16 there \(a static dim\)"):
        bundle.bind([[2, 3, 15, 16]])

    runner = _kiln_run()
    if runner is None:
        pytest.skip("kiln-run is not built (set KILN_BUILD_DIR)")
    x5 = torch.randn(5, 3, 16, 16)
    np.save(tmp_path / "x5.npy", x5.numpy())
    run = subprocess.run([runner, str(path), "--inputs", str(tmp_path / "x5.npy"), "--iterations", "1", "--outputs",
                          str(tmp_path / "out")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert re.search(r"sizes: \w+=5", run.stdout), run.stdout
    with torch.no_grad():
        _close(torch.from_numpy(np.load(tmp_path / "out" / "out0_result_0.npy")), m(x5))
    run = subprocess.run([runner, str(path), "--shapes", "x:7x3x16x16", "--iterations", "1"], capture_output=True,
                         text=True)
    assert run.returncode == 0 and re.search(r"sizes: \w+=7", run.stdout), run.stdout + run.stderr
    run = subprocess.run([runner, str(path), "--shapes", "input0:9x3x16x16"], capture_output=True, text=True)
    assert run.returncode == 1 and "outside its range [1, 8]" in run.stderr, run.stderr


def test_encoder_bundle_serves_sequence_lengths(tmp_path: Path) -> None:
    torch.manual_seed(1)
    m = Encoder().eval()
    seq = Dim("seq", min=2, max=64)
    compiled = kiln.compile(m, list(_encoder_inputs(2, 8)), dynamic_shapes=({1: seq}, {1: seq}))
    kiln.save(compiled, tmp_path / "enc.kiln", list(_encoder_inputs(2, 8)), output_format="kiln_bundle")
    bundle = _C.Bundle.load(tmp_path / "enc.kiln")
    with torch.no_grad():
        for s in (8, 3, 17, 64):
            ids, mask = _encoder_inputs(2, s)
            _close(torch.from_numpy(bundle.run([ids.numpy(), mask.numpy()])[0]), m(ids, mask))
    with pytest.raises(kiln.ShapeMismatchError, match=r"input 1 'mask' dim 1 \(\w+\) is 9, an earlier input gave"):
        bundle.bind([[2, 8], [2, 9]])


def test_a_block_without_one_engine_for_its_range_is_not_bundled(saved_cnn: dict, tmp_path: Path) -> None:
    m = _cnn()
    x = torch.randn(2, 3, 16, 16)
    compiled = kiln.compile(m, [x], dynamic_shapes=({0: Dim("b", min=1, max=8)},), min_block_size=1,
                            dynamic_instances=False)
    with pytest.raises(kiln.UnsupportedError, match=r"kiln.save\(output_format='kiln_bundle'\): block 0 \(.*\) has no "
                       r"engine for the whole range"):
        kiln.save(compiled, tmp_path / "m.kiln", [x], output_format="kiln_bundle")
    assert not (tmp_path / "m.kiln").exists()
    with pytest.raises(kiln.UnsupportedError, match=r"kiln.extract_engines: .* is a dynamic-shape program"):
        kiln.extract_engines(saved_cnn["path"], tmp_path / "engines")


def test_srepr_shape_expressions_pass_the_archive_check() -> None:
    """torch.export.save writes symbolic sizes as sympy's srepr; kiln.load's check takes those and
    still refuses what is not arithmetic on symbols."""
    s0 = "Symbol('s0', positive=True, integer=True)"
    for expr in (s0, f"Mul(Integer(2), {s0})", f"FloorDiv(Add({s0}, Integer(-1)), Integer(2))",
                 f"Mul(Float('1.5', precision=53), {s0})", f"StrictLessThan({s0}, int_oo)", "true"):
        assert _safe_expression(expr), expr
    for expr in ("Symbol('__import__')", f"{s0}.__class__", "Symbol('s0', positive=eval)", "Symbol(\"s0\")",
                 "Function('s0')(Integer(1))", "Symbol('s0 + os1')"):
        assert not _safe_expression(expr), expr


def test_save_refuses_a_snapshot_whose_weights_changed(tmp_path: Path) -> None:
    m = _cnn()
    x = torch.randn(2, 3, 16, 16)
    compiled = kiln.compile(m, [x], dynamic_shapes=({0: Dim("b", min=1, max=8)},), min_block_size=1,
                            share_weights=False)
    kiln.save(compiled, tmp_path / "before.ep", [x])
    with torch.no_grad():
        m.fc.weight.mul_(2.0)
    with pytest.raises(kiln.UnsupportedError, match="weights changed in place since this dynamic-shape program was "
                                                   "compiled with share_weights=False"):
        kiln.save(compiled, tmp_path / "after.ep", [x])


# ---- torch.compile --------------------------------------------------------------------------

@pytest.fixture
def dynamo_lowerings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    torch._dynamo.reset()
    calls = [0]
    real = kiln.dynamo.lower_module

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(kiln.dynamo, "lower_module", counting)
    yield calls
    torch._dynamo.reset()


def test_torch_compile_dynamic_true_lowers_once(dynamo_lowerings: list[int]) -> None:
    m = _cnn()
    f = torch.compile(m, backend="kiln", dynamic=True, options={"min_block_size": 1})
    with torch.no_grad():
        for b in (2, 5, 7, 2):
            x = torch.randn(b, 3, 16, 16)
            _close(f(x), m(x))
    assert dynamo_lowerings[0] == 1


def test_torch_compile_dynamic_program_is_launched_first_and_follows_weights(dynamo_lowerings: list[int]) -> None:
    # A symbolic program serves every size, so it stays the graph's last specialization: each call
    # launches it and checks the weights after, and a change in place is followed at any size.
    m = _cnn()
    known = set(kiln.pipeline.LIVE_GRAPHS)
    f = torch.compile(m, backend="kiln", dynamic=True, options={"min_block_size": 1})
    with torch.no_grad():
        for b in (2, 5):
            x = torch.randn(b, 3, 16, 16)
            _close(f(x), m(x))
        (graph,) = [g for g in kiln.pipeline.LIVE_GRAPHS if g not in known]
        assert graph.dynamic and graph._last is not None
        assert graph._last.every_shape and graph._last.checks_after_launch
        for b in (7, 5, 2):
            m.conv1.weight.mul_(-1.25)
            m.bn2.running_var.mul_(1.5)
            x = torch.randn(b, 3, 16, 16)
            _close(f(x), m(x))
    assert dynamo_lowerings[0] == 1


class Scaled(torch.nn.Module):
    """A Python float argument, which Dynamo passes as a tensor under dynamic=True."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(12, 6)

    def forward(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.tanh(self.fc(x) * scale)


def test_torch_compile_dynamic_program_is_kept_per_float_argument(dynamo_lowerings: list[int]) -> None:
    # The symbolic program holds the float arguments as constants: another value is another
    # program, even when the program last launched is tried first.
    torch.manual_seed(4)
    m = Scaled().eval()
    f = torch.compile(m, backend="kiln", dynamic=True, options={"min_block_size": 1})
    with torch.no_grad():
        for b, scale in ((2, 0.5), (3, 0.5), (4, 2.0), (3, 0.5), (2, 2.0)):
            x = torch.randn(b, 12)
            _close(f(x, scale), m(x, scale))


def test_torch_compile_encoder_mark_dynamic(dynamo_lowerings: list[int]) -> None:
    torch.manual_seed(1)
    m = Encoder().eval()
    f = torch.compile(m, backend="kiln")
    ids, mask = _encoder_inputs(2, 8)
    torch._dynamo.mark_dynamic(ids, 1, min=2, max=32)
    torch._dynamo.mark_dynamic(mask, 1, min=2, max=32)
    with torch.no_grad():
        _close(f(ids, mask), m(ids, mask))
        for s in (5, 32, 13):
            ids, mask = _encoder_inputs(2, s)
            _close(f(ids, mask), m(ids, mask))
        assert dynamo_lowerings[0] == 1
        # Beyond mark_dynamic's max, Dynamo's guards fail and it hands over a new graph: still right.
        ids, mask = _encoder_inputs(2, 40)
        _close(f(ids, mask), m(ids, mask))


def test_torch_compile_beyond_dynamic_max_size_follows_weights_there_too(dynamo_lowerings: list[int]) -> None:
    # A size beyond the clamped range runs a static build of its own from inside the symbolic
    # program's run: that build follows weights changed in place as the program does.
    torch.manual_seed(5)
    m = Reshaper().eval()
    f = torch.compile(m, backend="kiln", dynamic=True, options={"dynamic_max_size": 8})
    with torch.no_grad():
        for b in (3, 11):
            x = torch.randn(b, 4, 12)
            _close(f(x), m(x))
        for b in (11, 3, 11):
            m.lin.weight.mul_(-1.5)
            x = torch.randn(b, 4, 12)
            _close(f(x), m(x))
    assert dynamo_lowerings[0] == 2


def test_torch_compile_beyond_dynamic_max_size_builds_statically(dynamo_lowerings: list[int],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(2)
    m = Reshaper().eval()
    f = torch.compile(m, backend="kiln", dynamic=True, options={"dynamic_max_size": 8})
    with caplog.at_level(logging.INFO, logger="kiln"), torch.no_grad():
        for b in (3, 8, 11):
            x = torch.randn(b, 4, 12)
            _close(f(x), m(x))
    assert dynamo_lowerings[0] == 2  # the symbolic program, then 11 statically
    assert any("outside the range 2..8 this program was compiled for; building this input signature statically"
               in r.getMessage() for r in caplog.records)


def test_a_size_that_is_an_expression_of_a_symbol_is_solved_for_it() -> None:
    torch.manual_seed(0)
    model = Reshaper().eval()
    half = Dim("half", min=2, max=4)
    with torch.no_grad():
        compiled = kiln.compile(model, [torch.randn(4, 4, 12)], dynamic_shapes=({0: 2 * half},), min_block_size=1)
        for batch in (4, 6, 8):
            x = torch.randn(batch, 4, 12)
            _close(compiled(x), model(x))
        with pytest.raises(kiln.ShapeRangeError, match=r"^kiln: input 'x' dim 0 is 10 \((s\d+) = 5\), outside the "
                           r"range 2\.\.4 of \1 this program was compiled for$"):
            compiled(torch.randn(10, 4, 12))
        with pytest.raises(kiln.ShapeRangeError, match=r"^kiln: input 'x' dim 0 is 5, but this program needs"):
            compiled(torch.randn(5, 4, 12))


def test_sizes_are_checked_when_no_block_is_built() -> None:
    torch.manual_seed(0)
    model = Reshaper().eval()
    b = Dim("b", min=2, max=6)
    with torch.no_grad():
        compiled = kiln.compile(model, [torch.randn(4, 4, 12)], dynamic_shapes=({0: b},), min_block_size=1000)
        x = torch.randn(3, 4, 12)
        _close(compiled(x), model(x))
        with pytest.raises(kiln.ShapeRangeError, match=r"^kiln: input 'x' dim 0 is 9, outside the range 2\.\.6 "):
            compiled(torch.randn(9, 4, 12))


def test_a_program_with_a_derived_input_size_is_not_saved(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Reshaper().eval()
    with torch.no_grad():
        compiled = kiln.compile(model, [torch.randn(4, 4, 12)], dynamic_shapes=({0: 2 * Dim("half", min=2, max=4)},),
                                min_block_size=1)
        with pytest.raises(kiln.UnsupportedError, match=r"^kiln\.save: input 'x' dim 0 is the derived size 2\*s\d+ in "
                           r"this dynamic-shape program; torch\.export cannot lower such a program again"):
            kiln.save(compiled, str(tmp_path / "m.pt2"), arg_inputs=[torch.randn(4, 4, 12)])


def test_calls_from_threads_build_each_new_size_once() -> None:
    import threading
    torch.manual_seed(0)
    model = Reshaper().eval()
    with torch.no_grad():
        compiled = kiln.compile(model, [torch.randn(4, 4, 12)], dynamic_shapes=({0: Dim("b", min=2, max=8)},),
                                min_block_size=1)
        table = dynamic_program_of(compiled.gm)
        assert table is not None
        inputs = {b: torch.randn(b, 4, 12) for b in (3, 5)}
        errors: list[BaseException] = []

        def call(b: int) -> None:
            try:
                with torch.no_grad():
                    _close(compiled(inputs[b]), model(inputs[b]))
            except BaseException as err:  # noqa: BLE001 - reported by the test thread
                errors.append(err)
        threads = [threading.Thread(target=call, args=(b,)) for b in (3, 5, 3, 5, 3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert sorted(s.binding[next(iter(s.binding))] for s in table.live.values()) == [3, 4, 5]
    assert len(table.built) == 3  # one specialization per size: the opt shape, 3 and 5


class SdpaEncoder(torch.nn.Module):
    """Attention through F.scaled_dot_product_attention with an additive padding mask."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(50, dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        b, s, d = h.shape
        q, k, v = self.qkv(h).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        bias = (1.0 - mask[:, None, None, :].to(h.dtype)) * -10000.0
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.proj(att.transpose(1, 2).reshape(b, s, d)) + h


class CausalGqa(torch.nn.Module):
    """Causal grouped-query attention with an explicit scale, all as F.scaled_dot_product_attention
    arguments (4 query heads over 2 key / value heads)."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q = self.q(x).view(b, s, 4, d // 4).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, 2, d // 4).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, None, 0.0, True, scale=0.3, enable_gqa=True)
        return att.transpose(1, 2).reshape(b, s, d)


@pytest.mark.parametrize("model", [SdpaEncoder, CausalGqa])
def test_attention_exports_as_one_node_with_its_arguments(model: type[torch.nn.Module]) -> None:
    """With symbolic sizes, export runs F.scaled_dot_product_attention as kiln::export_sdpa (no
    math-backend decomposition to evaluate) and the program holds aten's op with the same
    arguments: mask, causal flag, scale and GQA; outputs match eager across the range."""
    torch.manual_seed(5)
    m = model().eval()
    seq = Dim("seq", min=4, max=64)
    if model is SdpaEncoder:
        make, dims = (lambda s: _encoder_inputs(2, s)), ({1: seq}, {1: seq})
    else:
        make, dims = (lambda s: [torch.randn(2, s, 32)]), ({1: seq},)
    ep, _ = kiln.lowering.export_module(m, make(16), dynamic_shapes=dims)
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.kiln.export_sdpa.default not in targets
    (node,) = [n for n in ep.graph.nodes if n.target == torch.ops.aten.scaled_dot_product_attention.default]
    if model is CausalGqa:
        assert node.args[3:] == (None, 0.0, True) and node.kwargs == {"scale": 0.3, "enable_gqa": True}, node
    compiled = kiln.compile(m, make(16), dynamic_shapes=dims, min_block_size=1)
    with torch.no_grad():
        for s in (16, 5, 64, 33):
            x = make(s)
            torch.testing.assert_close(compiled(*x), m(*x), rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
def test_cuda_sequence_range_serves_lengths_that_are_no_multiple_of_8() -> None:
    """On CUDA, export evaluates sdpa with the math backend: the memory-efficient kernel's
    check of the mask's row stride would otherwise narrow the range to multiples of 8."""
    torch.manual_seed(2)
    m = SdpaEncoder().eval().cuda()
    seq = Dim("seq", min=16, max=128)

    def inputs(s: int) -> list[torch.Tensor]:
        return [x.cuda() for x in _encoder_inputs(2, s)]
    compiled = kiln.compile(m, inputs(32), dynamic_shapes=({1: seq}, {1: seq}), device="cuda")
    with torch.no_grad():
        for s in (33, 17, 100):
            x = inputs(s)
            torch.testing.assert_close(compiled(*x), m(*x), rtol=2e-3, atol=2e-3)


@pytest.mark.cuda
def test_cuda_dynamic_bundle_serves_its_range(tmp_path: Path) -> None:
    """The C++ runtime makes a CUDA bundle's instances (Bundle::at) for each batch it is given."""
    m = _cnn().cuda()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    compiled = kiln.compile(m, [x], dynamic_shapes=({0: Dim("b", min=1, max=8)},), min_block_size=1, device="cuda")
    kiln.save(compiled, tmp_path / "m.kiln", [x], output_format="kiln_bundle")
    bundle = _C.Bundle.load(tmp_path / "m.kiln")
    assert bundle.dynamic and bundle.device.startswith("cuda")
    with torch.no_grad():
        for b in (3, 8, 1):
            xb = torch.randn(b, 3, 16, 16)
            got = torch.from_numpy(bundle.run([xb.numpy()])[0])
            torch.testing.assert_close(got, m(xb.cuda()).cpu(), rtol=2e-3, atol=2e-3)


def test_exports_record_no_stack_traces_and_restore_the_setting() -> None:
    """Kiln's exports leave FX's per-node stack traces out (nothing reads them) and put torch's
    setting back afterwards, also when the export fails."""
    if not hasattr(torch.fx.config, "do_not_emit_stack_traces"):
        pytest.skip("this torch has no setting for FX stack traces")

    class Branchy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.sum() > 0 else x + 1

    before = torch.fx.config.do_not_emit_stack_traces
    ep, _ = kiln.lowering.export_module(torch.nn.Linear(4, 3), [torch.randn(5, 4)], None,
                                        ({0: Dim("b", min=1, max=8)},))
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    assert calls and not any(n.meta.get("stack_trace") for n in calls)
    assert torch.fx.config.do_not_emit_stack_traces == before
    with pytest.raises(RuntimeError, match="data-dependent"):  # a branch on a value: no symbolic export
        kiln.lowering.export_module(Branchy(), [torch.randn(5, 4)], None, ({0: Dim("b", min=1, max=8)},))
    assert torch.fx.config.do_not_emit_stack_traces == before
    plain = torch.export.export(torch.nn.Linear(4, 3), (torch.randn(5, 4),), strict=False)
    assert any(n.meta.get("stack_trace") for n in plain.graph.nodes if n.op == "call_function")


@torch.no_grad()
def test_a_one_block_program_runs_its_specialization_without_the_glue_graph() -> None:
    """A dynamic program that is one block on its inputs runs the specialization's engine for it
    directly, as a static one runs its engine; with glue ops in PyTorch it runs its graph."""
    torch.manual_seed(0)
    one = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval()
    compiled = kiln.compile(one, [torch.randn(4, 16)], min_block_size=1, dynamic_shapes=({0: Dim("b", min=1, max=32)},))
    assert compiled._run is not compiled.gm
    for b in (4, 7, 1, 32, 7):
        x = torch.randn(b, 16)
        torch.testing.assert_close(compiled(x), one(x))
    with pytest.raises(kiln.dynamic.ShapeRangeError, match="33"):
        compiled(torch.randn(33, 16))

    class Glue(torch.nn.Module):  # a second output that only PyTorch computes (nonzero's size)
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.relu(x @ x.T), torch.nonzero(x > 0)
    glue = Glue()
    compiled = kiln.compile(glue, [torch.randn(4, 16)], min_block_size=1, dynamic_shapes=({0: Dim("b", min=2, max=32)},))
    assert compiled._run is compiled.gm
    x = torch.randn(6, 16)
    for got, want in zip(compiled(x), glue(x)):
        torch.testing.assert_close(got, want)
