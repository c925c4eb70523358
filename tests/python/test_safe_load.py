"""kiln.load runs no code from a file and finds damage when it loads, not at the first call.

A program saved by kiln.save loads by default and gives eager's outputs, and holds no pickle
beyond example inputs PyTorch's restricted unpickler reads. Crafted files whose loading would
unpickle a ``__reduce__`` payload (example inputs, a weight marked ``use_pickle``, an opaque
constant), evaluate a shape expression or load AOTInductor libraries are refused with an error
naming the part, and the payload never runs; with ``trusted=True`` torch's own loading runs
(the payload does run then). Damage: truncations, flipped bytes anywhere in the archive, and
flipped bytes inside an embedded engine behind a consistent zip, each give a kiln error at
kiln.load or a program whose outputs are eager's, never a crash or a wrong result.
"""

from __future__ import annotations

import io
import json
import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

import kiln
from kiln.archive import UnsafeFileError, _safe_expression

ROOT = "archive/"  # kiln.save writes through a file object: torch names the archive's folder so


class Payload:
    """Unpickling it opens (creates) ``marker``: evidence that code from the file ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> Any:
        return (open, (self.marker, "w"))


def mlp() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module, torch.Tensor]:
    model, x = mlp(), torch.randn(2, 16, generator=torch.Generator().manual_seed(5))
    path = tmp_path_factory.mktemp("ep") / "m.ep"
    kiln.save(kiln.compile(model, [x], min_block_size=1), path, [x])
    return path, model, x


def records(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i.filename) for i in z.infolist()}


def rewritten(src: Path, dst: Path, changes: dict[str, bytes | None]) -> Path:
    """A copy of ``src`` as a consistent zip with records (named without the root folder)
    replaced, added, or removed (None)."""
    items = records(src)
    for key, data in changes.items():
        name = ROOT + key
        if data is None:
            items.pop(name)
        else:
            items[name] = data
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
        for name, data in items.items():
            z.writestr(name, data)
    return dst


def payload_bytes(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save(Payload(marker), buf)
    return buf.getvalue()


def assert_refused_unless_trusted(path: Path, marker: Path, match: str) -> None:
    """kiln.load refuses the crafted file without running its payload, and the payload is real:
    loading it as trusted runs it (torch.export's own loading)."""
    with pytest.raises(UnsafeFileError, match=match):
        kiln.load(path)
    assert not marker.exists()
    try:
        kiln.load(path, trusted=True)
    except kiln.KilnError:
        pass  # the payload ran before the load failed
    assert marker.exists()


def run_matches(program: torch.export.ExportedProgram, model: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model(x), atol=1e-5, rtol=1e-5)


def test_kiln_save_writes_what_the_safe_load_accepts(saved: Any) -> None:
    path, model, x = saved
    items = records(path)
    weights = json.loads(items[ROOT + "data/weights/model_weights_config.json"])["config"]
    constants = json.loads(items[ROOT + "data/constants/model_constants_config.json"])["config"]
    assert weights and not any(meta["use_pickle"] for meta in weights.values())
    assert all(meta["path_name"].startswith("tensor_") and not meta["use_pickle"] for meta in constants.values())
    torch.load(io.BytesIO(items[ROOT + "data/sample_inputs/model.pt"]), weights_only=True)
    run_matches(kiln.load(path), model, x)


def test_example_inputs_with_a_payload_are_refused_unless_trusted(saved: Any, tmp_path: Path) -> None:
    path, _, _ = saved
    marker = tmp_path / "ran"
    bad = rewritten(path, tmp_path / "bad.ep", {"data/sample_inputs/model.pt": payload_bytes(marker)})
    assert_refused_unless_trusted(bad, marker, r"example inputs \(data/sample_inputs/model.pt\).*trusted=True")


def test_a_weight_stored_as_a_pickle_is_refused(saved: Any, tmp_path: Path) -> None:
    path, _, _ = saved
    marker = tmp_path / "ran"
    config = json.loads(records(path)[ROOT + "data/weights/model_weights_config.json"])
    (fqn, meta), = config["config"].items()
    meta["use_pickle"] = True
    bad = rewritten(path, tmp_path / "bad.ep", {"data/weights/model_weights_config.json": json.dumps(config).encode(),
                                                "data/weights/" + meta["path_name"]: payload_bytes(marker)})
    assert_refused_unless_trusted(bad, marker, rf"weight '{fqn}' \({meta['path_name']}\) is stored as a pickle")


def test_an_opaque_constant_is_refused(saved: Any, tmp_path: Path) -> None:
    path, _, _ = saved
    marker = tmp_path / "ran"
    config = {"config": {"obj": {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True,
                                 "tensor_meta": None}}}
    bad = rewritten(path, tmp_path / "bad.ep", {"data/constants/model_constants_config.json": json.dumps(config).encode(),
                                                "data/constants/opaque_obj_0": pickle.dumps(Payload(marker))})
    assert_refused_unless_trusted(bad, marker, r"constant 'obj' \(opaque_obj_0\) is a pickled object")


def test_a_shape_expression_that_is_not_arithmetic_is_refused(saved: Any, tmp_path: Path) -> None:
    path, _, _ = saved
    marker = tmp_path / "ran"
    program = json.loads(records(path)[ROOT + "models/model.json"])
    expr = f"__import__('pathlib').Path({str(marker)!r}).touch() or 2"  # the input's first size, to sympify
    program["graph_module"]["graph"]["tensor_values"]["args_0"]["sizes"][0] = {
        "as_expr": {"expr_str": expr, "hint": {"as_int": 2}}}
    bad = rewritten(path, tmp_path / "bad.ep", {"models/model.json": json.dumps(program).encode()})
    assert_refused_unless_trusted(bad, marker, r"shape expression .*pathlib.* would evaluate it")
    assert _safe_expression("s0 + 2*s1") and _safe_expression("Max(1, FloorDiv(s0, 2)) <= u3")
    assert not _safe_expression("s0.__class__") and not _safe_expression("exit()")


def test_aotinductor_libraries_and_old_layouts_are_refused(saved: Any, tmp_path: Path) -> None:
    path, _, _ = saved
    bad = rewritten(path, tmp_path / "aoti.ep", {"data/aotinductor/model/model.so": b"\x7fELF"})
    with pytest.raises(UnsafeFileError, match="AOTInductor"):
        kiln.load(bad)
    marker = tmp_path / "ran"
    old = tmp_path / "old.ep"  # torch's layout before 2.7: a pickled state dict beside the JSON
    with zipfile.ZipFile(old, "w") as z:
        z.writestr("version", "8.20")
        z.writestr("serialized_state_dict.pt", payload_bytes(marker))
    with pytest.raises(kiln.CorruptedError, match="older layout holds pickles"):
        kiln.load(old)
    assert not marker.exists()


def test_truncated_files_raise_at_load(saved: Any, tmp_path: Path) -> None:
    path, _, _ = saved
    data = path.read_bytes()
    for size in (0, 1, 22, len(data) // 4, len(data) // 2, len(data) - 22, len(data) - 1):
        cut = tmp_path / f"cut{size}.ep"
        cut.write_bytes(data[:size])
        with pytest.raises(kiln.KilnError, match="kiln.load"):
            kiln.load(cut)


def test_flipped_bytes_give_an_error_at_load_or_eagers_outputs(saved: Any, tmp_path: Path) -> None:
    path, model, x = saved
    data = path.read_bytes()
    rng = random.Random(1234)
    errors = 0
    for i, offset in enumerate(sorted(rng.sample(range(len(data)), 40))):
        damaged = bytearray(data)
        damaged[offset] ^= 1 << rng.randrange(8)
        flipped = tmp_path / f"flip{i}.ep"
        flipped.write_bytes(bytes(damaged))
        try:
            program = kiln.load(flipped)
        except kiln.KilnError as err:
            assert "kiln.load" in str(err)
            errors += 1
            continue
        run_matches(program, model, x)  # a byte nothing reads (a timestamp, a stack trace)
    assert errors > 0


def test_a_damaged_engine_inside_a_consistent_zip_raises_at_load(saved: Any, tmp_path: Path) -> None:
    path, _, _ = saved
    blob = bytearray(records(path)[ROOT + "data/weights/weight_0"])
    for offset in (0, 9, len(blob) // 2, len(blob) - 3):
        damaged = bytearray(blob)
        damaged[offset] ^= 0x10
        bad = rewritten(path, tmp_path / f"engine{offset}.ep", {"data/weights/weight_0": bytes(damaged)})
        with pytest.raises(kiln.EngineFileError, match=r"engine 0 \(execute_engine\)"):
            kiln.load(bad)


def test_a_spec_that_does_not_match_its_engine_raises_at_load(saved: Any, tmp_path: Path) -> None:
    path, _, _ = saved
    text = records(path)[ROOT + "models/model.json"].decode()
    spec = '\\"outputs\\":[[\\"float32\\",[2,4]]]'
    assert spec in text
    bad = rewritten(path, tmp_path / "spec.ep", {"models/model.json": text.replace(spec, spec.replace("[2,4]", "[2,5]")).encode()})
    with pytest.raises(kiln.CorruptedError, match=r"engine output 'output_0' is float32 \[2, 4\], its spec says float32 \[2, 5\]"):
        kiln.load(bad)
