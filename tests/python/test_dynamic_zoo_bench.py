"""benchmarks/dynamic_zoo.py on the CPU (reduced models): one dynamic compile per model, no engine
built by calls at other sizes in the range, and clear errors for
settings it cannot use."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torchvision")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import dynamic_zoo  # noqa: E402


def _rows(path: Path) -> dict[str, list[str]]:
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in path.read_text().splitlines()[2:]]
    return {r[0]: r for r in rows}


def test_a_batch_range_is_served_without_builds(tmp_path: Path) -> None:
    out = tmp_path / "batch.md"
    assert dynamic_zoo.main(["--small", "--models", "resnet50,bert", "--sizes", "1,5", "--iters", "2",
                             "--out", str(out)]) == 0
    rows = _rows(out)
    assert set(rows) == {"resnet50", "bert"}
    for row in rows.values():
        assert row[1] == "1..8 at 2" and row[3] == "0", row
        assert [cell.split(":")[0] for cell in row[4].split("; ")] == ["1", "5"], row


def test_the_sequence_axis_takes_models_of_token_ids(tmp_path: Path) -> None:
    out = tmp_path / "sequence.md"
    assert dynamic_zoo.main(["--small", "--axis", "sequence", "--models", "resnet50,bert,t5_encoder",
                             "--iters", "2", "--out", str(out)]) == 0
    rows = _rows(out)
    assert set(rows) == {"bert", "t5_encoder"}  # resnet50 takes images
    assert rows["bert"][1] == "4..16 at 8" and rows["bert"][3] == "0"
    assert rows["t5_encoder"][3] == "0"  # its S * S bucket gather fits as a square term


@pytest.mark.parametrize("argv,message", [
    (["--range", "8..2"], "--range must be LO..HI"),
    (["--sizes", "1,x"], "invalid literal"),
    (["--axis", "sequence", "--models", "resnet50"], "takes a dynamic sequence"),
])
def test_settings_it_cannot_use_are_errors_that_name_them(argv: list[str], message: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        dynamic_zoo.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
