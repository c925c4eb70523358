"""benchmarks/call_split.py on the CPU: one row per model, the checks after the launch on a graph
that runs again alike, every time positive."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "call_split.py"


def test_a_call_is_split_around_its_launch(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--small", "--models", "bert",
                           "--dtype", "fp32", "--calls", "20"], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in done.stderr.splitlines() if line.startswith("| bert")]
    assert len(rows) == 1, done.stderr[-2000:]
    model, batch, before, run, after, watch, constants, after_launch = (c.strip() for c in rows[0])
    assert (model, batch, after_launch) == ("bert", "1", "yes")
    assert all(float(v) > 0 for v in (before, run, after))
    assert float(watch.split()[0]) > 0 and int(watch.split("(")[1].rstrip(")")) > 0 and int(constants) > 0
