"""Dynamic shapes (kiln/dynamic.py): one symbolic program serves every size in its ranges.

Outputs are compared with eager PyTorch at several sizes, through kiln.compile (torch.export's
dynamic_shapes, kiln.Input ranges) and torch.compile (dynamic=True, mark_dynamic); export and
lowering are counted to happen once; errors, settings and the dry-run report are checked
word for word."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import kiln
import kiln.aot
import kiln.dynamo
import kiln.lowering
from kiln.dynamic import Specializations, dynamic_program_of


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


def test_specializations_are_least_recently_used(caplog: pytest.LogCaptureFixture) -> None:
    m = _cnn()
    compiled = kiln.compile(m, [torch.randn(2, 3, 16, 16)], dynamic_shapes=({0: Dim("b", min=1, max=8)},),
                            min_block_size=1, specialization_cache_size=2)
    table = dynamic_program_of(compiled)
    assert isinstance(table, Specializations)
    with caplog.at_level(logging.INFO, logger="kiln"), torch.no_grad():
        for b in (3, 2, 4):
            x = torch.randn(b, 3, 16, 16)
            _close(compiled(x), m(x))
    assert [list(spec.binding.values()) for spec in table.live.values()] == [[2], [4]]
    assert len(compiled.engines()) == 2
    new = [r.getMessage() for r in caplog.records if "new specialization" in r.getMessage()]
    dropped = [r.getMessage() for r in caplog.records if "dropped the specialization" in r.getMessage()]
    assert len(new) == 2  # 3 and 4; 2 (the opt shape) was built at compile time
    assert len(dropped) == 1 and "for s" in dropped[0] and dropped[0].endswith(
        "=3 (least recently used; specialization_cache_size=2)")


def test_blocks_share_engines_across_unrelated_sizes() -> None:
    """A block whose own sizes do not change between two specializations keeps its engine."""

    class TwoParts(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(8, 8)
            self.b = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.relu(self.a(x)) * 2.0, torch.nonzero(y).to(torch.float32).sum() + self.b(x).sum()

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


def test_save_of_a_dynamic_program_is_refused(tmp_path) -> None:
    m = _cnn()
    x = torch.randn(2, 3, 16, 16)
    compiled = kiln.compile(m, [x], dynamic_shapes=({0: Dim("b", min=1, max=8)},), min_block_size=1)
    with pytest.raises(kiln.UnsupportedError) as err:
        kiln.save(compiled, tmp_path / "m.ep", [x])
    assert str(err.value).startswith("kiln.save: the module is a dynamic-shape program")


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
