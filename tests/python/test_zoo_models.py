"""The zoo of benchmarks/zoo.py at its small sizes, on the CPU: every model builds, runs eagerly and
gives finite, input-dependent outputs of the shape its registry entry states; and the benchmark's
own helpers (model selection, batch planning, the docs section) do what they say."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
import zoo  # noqa: E402
import zoo_models  # noqa: E402

from kiln.testing import randomize_weights  # noqa: E402

FAMILIES = {"cnn", "vision-transformer", "nlp-encoder", "decoder", "encoder", "unet", "dense-prediction"}


def test_registry_covers_the_families() -> None:
    assert len(zoo_models.MODELS) >= 30
    assert {m.family for m in zoo_models.MODELS.values()} == FAMILIES
    for m in zoo_models.MODELS.values():
        assert m.max_batch >= 1 and m.dtypes and set(m.dtypes) <= {"fp16", "bf16"}, m.name
    # the transformers run in BF16 too; the CNNs in FP16 only
    assert zoo_models.MODELS["bert"].dtypes == ("fp16", "bf16")
    assert zoo_models.MODELS["resnet50"].dtypes == ("fp16",)


@pytest.mark.parametrize("name", list(zoo_models.MODELS))
def test_small_model_runs_eagerly(name: str) -> None:
    entry = zoo_models.MODELS[name]
    model, inputs = entry.create_randomized(2, small=True)
    assert sum(p.numel() for p in model.parameters()) < 6_000_000, "small variants stay small"
    with torch.no_grad():
        out = model(*inputs)
        first = out if isinstance(out, torch.Tensor) else out[0]
        assert tuple(first.shape) == entry.output_shape(2, True)
        flat = zoo.flat_output(out)
        assert torch.isfinite(flat).all()
        assert flat.std() > 1e-6, "constant output"
        # the output depends on the input: batch items differ, and other inputs change it by over 1%
        assert not torch.allclose(first[0], first[1])
        again = zoo.flat_output(model(*entry.make_inputs(2, small=True, seed=5)))
    assert zoo.rel_error(again, flat) > 1e-2


def test_batchnorm_calibration_keeps_the_signal() -> None:
    """Random running statistics make MobileNetV3's output all but independent of its input;
    calibrated ones do not, and the calibration leaves the model in eval mode with its momenta."""
    entry = zoo_models.MODELS["mobilenet_v3_large"]
    model, inputs = entry.create(2, small=True)
    randomize_weights(model)
    others = entry.make_inputs(2, small=True, seed=5)

    def dependence() -> float:
        with torch.no_grad():
            return zoo.rel_error(zoo.flat_output(model(*others)), zoo.flat_output(model(*inputs)))
    assert dependence() < 1e-4
    momenta = [m.momentum for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    zoo_models.calibrate_batchnorm(model, entry.make_inputs(8, small=True, seed=9))
    assert dependence() > 0.1
    assert not model.training
    assert [m.momentum for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)] == momenta


def test_residual_branches_start_near_zero() -> None:
    """create() zeroes the last norm of each ResNet / RegNet residual branch; randomize_weights
    then draws those around zero, the other norms around one."""
    from torchvision.models.resnet import Bottleneck
    for name in ("resnet50", "deeplabv3_resnet50", "retinanet_fpn"):
        model, _ = zoo_models.MODELS[name].create_randomized(1, small=True)
        blocks = [m for m in model.modules() if isinstance(m, Bottleneck)]
        assert blocks, name
        for b in blocks:
            assert b.bn3.weight.abs().max() < 0.15 and b.bn3.weight.abs().max() > 0
            assert (b.bn1.weight - 1).abs().max() < 0.6
    model, _ = zoo_models.MODELS["regnet_y_1_6gf"].create(1, small=True)
    last = [m.f.c[1].weight for m in model.modules() if hasattr(m, "f") and hasattr(m.f, "c")]
    assert last and all(w.eq(0).all() for w in last)


def test_create_is_deterministic() -> None:
    entry = zoo_models.MODELS["llama"]
    (m1, x1), (m2, x2) = entry.create(1, small=True), entry.create(1, small=True)
    assert all(torch.equal(a, b) for a, b in zip(x1, x2))
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))


def test_select() -> None:
    assert [m.name for m in zoo_models.select("bert,swin*")] == ["swin_t", "swin_v2_t", "bert"]
    assert {m.family for m in zoo_models.select("unet")} == {"unet"}
    assert len(zoo_models.select("all")) == len(zoo_models.MODELS)
    with pytest.raises(ValueError, match="no zoo model matches nosuch"):
        zoo_models.select("bert,nosuch")


def test_plan_caps_batches_and_picks_dtypes() -> None:
    deeplab, bert = zoo_models.MODELS["deeplabv3_resnet50"], zoo_models.MODELS["bert"]
    plan = [(m.name, b, d) for m, b, d in zoo.plan_groups([deeplab, bert], [1, 32, 64], ["fp16", "bf16"])]
    # 32 and 64 both become deeplab's 16 and bert's 32, once each; deeplab (a CNN) has no BF16
    assert plan == [("deeplabv3_resnet50", 1, "fp16"), ("deeplabv3_resnet50", 16, "fp16"),
                    ("bert", 1, "fp16"), ("bert", 1, "bf16"), ("bert", 32, "fp16"), ("bert", 32, "bf16")]
    assert [d for _, _, d in zoo.plan_groups([deeplab], [1], ["fp32"])] == ["fp32"]


def test_vs_ro_prefers_a_measured_ro_and_drift_pairs_it_with_the_stored() -> None:
    def row(backend: str, ms: float, source: str = "measured") -> zoo.Row:
        return zoo.Row("bert", "nlp-encoder", 32, "fp16", backend, ms=ms, source=source)
    rows = [row("ro", 2.0, "stored"), row("ro", 2.2, "anchor"), row("kiln", 1.1)]
    zoo.set_vs_ro(rows)
    assert rows[2].vs_ro == pytest.approx(2.0)
    assert zoo.drift(rows) == [("bert b32 fp16", pytest.approx(1.1))]
    table = zoo.markdown(rows, {"device": "cpu", "device_name": "cpu", "runs": 5, "small": True,
                                "baseline_note": "n/a", "date": "today",
                                "versions": {"torch": "t", "kiln": "k"}})
    assert "| bert | nlp-encoder | 32 | fp16 |  | 2.200 | 1.100 |" in table
    assert "geometric mean 1.10" in table


def test_merge_median_takes_each_rows_median_run(tmp_path: Path) -> None:
    import json

    def run(folder: str, kiln_ms: float, kiln_error: str = "") -> Path:
        rows = [zoo.Row("bert", "nlp-encoder", 32, "fp16", "ro", ms=2.0, source="stored"),
                zoo.Row("bert", "nlp-encoder", 32, "fp16", "kiln", ms=kiln_ms, error=kiln_error, rel_err=1e-3)]
        path = tmp_path / folder
        path.mkdir()
        header = {"device": "cuda", "device_name": "X", "runs": 50, "small": False, "baseline": "reuse",
                  "baseline_note": "", "paths": ["dynamo"], "date": "today", "drift": [],
                  "versions": {"torch": "2", "kiln": "0"}}
        (path / "zoo.json").write_text(json.dumps({"header": header, "rows": [zoo.dataclasses.asdict(r)
                                                                               for r in rows]}))
        return path

    # Three processes of the same row, one on a slow host; a fourth that failed does not count.
    runs = [run("a", 1.6), run("b", 2.4), run("c", 1.5), run("d", float("nan"), "timeout")]
    assert zoo.merge(runs, tmp_path / "out", tmp_path / "baseline", False, median=True) == 0
    rows = {r["backend"]: r for r in json.loads((tmp_path / "out" / "zoo.json").read_text())["rows"]}
    assert rows["kiln"]["ms"] == 1.6 and rows["kiln"]["error"] == ""
    assert rows["kiln"]["vs_ro"] == pytest.approx(2.0 / 1.6)
    assert rows["kiln"]["note"] == "median of 3 runs (1.500-2.400 ms)"
    assert rows["ro"]["ms"] == 2.0 and rows["ro"]["note"] == ""
    # Without --median the last folder's row wins, error and all.
    assert zoo.merge(runs, tmp_path / "last", tmp_path / "baseline", False) == 0
    last = {r["backend"]: r for r in json.loads((tmp_path / "last" / "zoo.json").read_text())["rows"]}
    assert last["kiln"]["error"] == "timeout"


def test_merge_lists_only_rows_no_run_measured(tmp_path: Path) -> None:
    import json

    def run(folder: str, backends: list[str], header_extra: dict) -> Path:
        rows = [zoo.Row("bert", "nlp-encoder", 32, "fp16", b, ms=1.0, rel_err=1e-3) for b in backends]
        path = tmp_path / folder
        path.mkdir()
        header = {"device": "cuda", "device_name": "X", "runs": 50, "small": False, "baseline": "skip",
                  "baseline_note": "", "paths": ["dynamo", "aot"], "date": "today",
                  "versions": {"torch": "2", "kiln": "0"}, **header_extra}
        (path / "zoo.json").write_text(json.dumps({"header": header, "rows": [zoo.dataclasses.asdict(r)
                                                                               for r in rows]}))
        return path

    # The first run stopped before kiln-aot and vit's rows; the second measured kiln-aot.
    a = run("a", ["eager", "kiln"], {"stopped": True, "missing": [["bert", 32, "fp16", "kiln-aot"],
                                                                  ["vit_b_16", 1, "fp16", "eager"]]})
    b = run("b", ["kiln-aot"], {"stopped": False, "missing": []})
    assert zoo.merge([a, b], tmp_path / "out", tmp_path / "baseline", False) == 0
    header = json.loads((tmp_path / "out" / "zoo.json").read_text())["header"]
    assert header["stopped"] and header["missing"] == [["vit_b_16", 1, "fp16", "eager"]]
    assert "before 1 row(s) were measured: vit_b_16 b1 fp16 eager." in (tmp_path / "out" / "zoo.md").read_text()
    c = run("c", ["eager"], {"stopped": False, "missing": []})
    c_vit = json.loads((c / "zoo.json").read_text())
    c_vit["rows"][0]["model"], c_vit["rows"][0]["batch"] = "vit_b_16", 1
    (c / "zoo.json").write_text(json.dumps(c_vit))
    assert zoo.merge([a, b, c], tmp_path / "all", tmp_path / "baseline", False) == 0
    header = json.loads((tmp_path / "all" / "zoo.json").read_text())["header"]
    assert not header["stopped"] and header["missing"] == []
    # A stopped run that did not list what it missed leaves the table incomplete.
    old = run("old", ["eager"], {"stopped": True})
    assert zoo.merge([old, b], tmp_path / "old_out", tmp_path / "baseline", False) == 0
    assert json.loads((tmp_path / "old_out" / "zoo.json").read_text())["header"]["stopped"]

    tasks = [zoo.Task("bert", 32, "fp16", k) for k in ("eager", "kiln")]
    assert zoo.unmeasured([zoo.Row("bert", "nlp-encoder", 32, "fp16", "eager")], tasks) == [
        ["bert", 32, "fp16", "kiln"]]


def test_write_docs_replaces_only_the_marked_section(tmp_path: Path) -> None:
    doc = tmp_path / "zoo.md"
    doc.write_text(f"intro\n{zoo.DOCS_START}\nold table\n{zoo.DOCS_END}\nafter\n")
    zoo.write_docs("new table\n", doc)
    assert doc.read_text() == f"intro\n{zoo.DOCS_START}\nnew table\n{zoo.DOCS_END}\nafter\n"


def test_fallback_note_keeps_what_and_why() -> None:
    built = ("Kiln could not build engine 0 of UNet (aten.linear.default x34, aten.add.Tensor x28); running it in "
             "PyTorch: [shape mismatch] reshape: cannot reshape f32[1,16,16,16] (node 'add')")
    assert zoo.fallback_note(built) == ("could not build engine 0 of UNet: [shape mismatch] reshape: cannot reshape "
                                        "f32[1,16,16,16] (node 'add')")
    lowered = "Kiln could not lower graph 2 (TypeError: f() takes (x)); running it in eager PyTorch"
    assert zoo.fallback_note(lowered) == "could not lower graph 2: TypeError: f() takes (x)"


def _run_zoo(tmp_path: Path, *extra: str) -> list[dict]:
    import json
    args = ["--device", "cpu", "--small", "--models", "vit_b_16", "--batches", "1", "--dtypes", "f32",
            "--baseline", "skip", "--runs", "2", "--warmup", "1", "--out", str(tmp_path), *extra]
    assert zoo.main(args) == 0
    return json.loads((tmp_path / "zoo.json").read_text())["rows"]


def test_zoo_end_to_end_on_cpu(tmp_path: Path) -> None:
    rows = {r["backend"]: r for r in _run_zoo(tmp_path, "--paths", "aot")}
    assert set(rows) == {"eager", "kiln-aot"}
    aot = rows["kiln-aot"]
    assert aot["error"] == "" and aot["ms"] > 0 and aot["compile_s"] > 0
    assert aot["rel_err"] < 1e-5 and aot["coverage"] == 100.0 and aot["engines"] >= 1 and aot["graphs"] == 1
    assert rows["eager"]["rel_err"] == 0.0
    assert "| vit_b_16 | vision-transformer | 1 | fp32 |" in (tmp_path / "zoo.md").read_text()


def test_a_row_past_its_timeout_is_a_row_with_the_error(tmp_path: Path) -> None:
    # No worker starts within 0.1 s: each row is killed and recorded, and the run goes on to the end.
    rows = _run_zoo(tmp_path, "--paths", "dynamo", "--row-timeout", "0.1")
    assert [(r["backend"], r["error"]) for r in rows] == [("eager", "timeout: no result after 0.1 s"),
                                                          ("kiln", "timeout: no result after 0.1 s")]
