"""benchmarks/gpu_models.py --merge: per row, the median of several runs' columns, and vs_ro from
the median ms (no device needed)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
gpu_models = pytest.importorskip("gpu_models")


def _run(path: Path, kiln_ms: float, ro_ms: float, kiln_host: float, header: str | None) -> str:
    rows = [gpu_models.Row("resnet50", 1, "fp16", "ro", ms=ro_ms, host_ms=0.2, rel_err=1e-3, peak_mib=44),
            gpu_models.Row("resnet50", 1, "fp16", "kiln", ms=kiln_ms, host_ms=kiln_host, rel_err=2e-3, peak_mib=52)]
    data = {"setup": [dataclasses.asdict(gpu_models.Setup("kiln", 16.0, kiln_host * 10))],
            "rows": [dataclasses.asdict(r) for r in rows]}
    if header is not None:
        data["header"] = header
    path.write_text(json.dumps(data))
    return str(path)


def test_merge_takes_each_columns_median_and_recomputes_vs_ro(tmp_path: Path) -> None:
    runs = [_run(tmp_path / "a.json", 0.40, 0.60, 0.08, "Device: X."),
            _run(tmp_path / "b.json", 0.70, 0.58, 0.49, "Device: X."),  # one slow-host process
            _run(tmp_path / "c.json", 0.39, 0.61, 0.07, "Device: X.")]
    rows, setups, header = gpu_models.merge(runs)
    kiln = next(r for r in rows if r.backend == "kiln")
    ro = next(r for r in rows if r.backend == "ro")
    assert (kiln.ms, kiln.host_ms, ro.ms) == (0.40, 0.08, 0.60)
    assert kiln.vs_ro == pytest.approx(0.60 / 0.40) and ro.vs_ro == 1.0
    assert kiln.rel_err == 2e-3 and kiln.peak_mib == 52
    assert setups == [gpu_models.Setup("kiln", 16.0, 0.8)]
    assert header.startswith("Device: X.") and "median of 3 runs" in header


def test_merge_writes_the_table(tmp_path: Path) -> None:
    runs = [_run(tmp_path / f"{i}.json", 0.4 + i / 100, 0.6, 0.08, None) for i in range(2)]
    out = tmp_path / "merged"
    out.mkdir()
    table = gpu_models.write_tables(out, *gpu_models.merge(runs))
    assert (out / "gpu_models.md").read_text() == table
    assert "| resnet50 | 1 | fp16 | kiln | 0.405 |" in table
    assert json.loads((out / "gpu_models.json").read_text())["rows"][1]["ms"] == pytest.approx(0.405)
