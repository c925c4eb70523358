"""benchmarks/dynamic_shapes.py --back-to-back on the CPU: sizes served twice in a row, the second
pass making no specialization, every output matching eager."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "dynamic_shapes.py"


def test_back_to_back_serves_sizes_that_come_back_without_new_specializations(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--models", "bert", "--back-to-back", "--sizes", "3",
                           "--out", str(tmp_path / "serve.md")], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in (tmp_path / "serve.md").read_text().splitlines()[2:]]
    passes = {r[1].strip(): r for r in rows}
    assert [cell.split(":")[0].strip() for cell in passes["1"][2].split(";")] == ["16", "24", "32"]
    assert passes["1"][3].strip() == "3" and passes["2"][3].strip() == "0"
