"""Per-artifact outcomes: a model whose TFLite conversion needs Flex publishes everything else, naming the
left-out artifact and why in the summary, manifest, report and `tfship inspect`, and exits 3 (`partial`);
the same artifact listed in `convert.required` fails the run (exit 2, nothing published, reports written).
A single stage run alone records its own failure; `tfship validate --run` uses an export-only run's data."""

from __future__ import annotations

import json

import pytest

from tests.pipeline.conftest import run_tfship
from tests.pipeline.user_models import write_flex_npz
from tfship.pipeline.cli.app import main

FACTORY = "tests.pipeline.user_models:flex_classifier"


def _run(tmp_path, *extra):
    data = write_flex_npz(tmp_path / "flex.npz")
    return run_tfship("run", "--model", FACTORY, "--data", str(data), "--runs-dir", str(tmp_path / "runs"),
                      "--repository", str(tmp_path / "models"), "--set", "run.model_name=flex",
                      "--set", 'convert.tflite_modes=["float32", "float16"]', *extra)


@pytest.mark.slow
def test_an_optional_artifact_that_fails_is_left_out_and_the_rest_published(tmp_path):
    completed = _run(tmp_path)
    assert completed.returncode == 3, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "status: partial (2 of 4 artifacts left out: tflite_float32, tflite_float16)" in completed.stdout
    version = tmp_path / "models" / "flex" / "1"
    assert (version / "saved_model.pb").is_file() and (version / "model.onnx").is_file()
    assert not list(version.glob("*.tflite"))
    manifest = json.loads((version / "manifest.json").read_text())
    outcomes = {a["artifact"]: a for a in manifest["artifacts"]}
    assert manifest["status"] == "partial"
    assert outcomes["saved_model"]["status"] == outcomes["onnx"]["status"] == "published"
    left = outcomes["tflite_float32"]
    assert left["status"] == "left out" and left["stage"] == "convert" and "Erf" in left["reason"]
    assert "Flex" in left["reason"] and not left["required"]
    assert set(manifest["serve_check"]["artifacts"]) == {"saved_model", "onnx"}
    run = sorted((tmp_path / "runs").iterdir())[-1]
    assert "left out at convert: refused: needs Flex" in (run / "report.md").read_text()
    assert json.loads((run / "report.json").read_text())["status"] == "partial"
    info = json.loads(run_tfship("inspect", str(version), "--json").stdout)
    assert {a["artifact"]: a["status"] for a in info["artifacts"]}["tflite_float16"] == "left out"

    again = run_tfship("validate", "--run", str(run))  # the export-only run's own 70 rows, not the digits
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    parity = json.loads((run / "parity.json").read_text())
    assert parity["samples"] == 70 and parity["metric_output"] == "class_id"
    assert {r["artifact"] for r in parity["artifacts"]} == {"saved_model", "onnx"}


@pytest.mark.slow
def test_a_required_artifact_that_fails_fails_the_run_with_reports(tmp_path):
    completed = _run(tmp_path, "--set", 'convert.required=["tflite_float32"]')
    assert completed.returncode == 2, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "ConversionError" in completed.stderr and "tflite_float32" in completed.stderr
    assert not (tmp_path / "models").exists() or not list((tmp_path / "models").rglob("saved_model.pb"))
    run = sorted((tmp_path / "runs").iterdir())[-1]
    report = json.loads((run / "report.json").read_text())
    assert report["status"] == "failed" and "convert.required" in report["error"]
    assert {s["name"]: s["status"] for s in report["stages"]}["convert"] == "failed"
    assert "status: failed" in (run / "report.md").read_text()
    conversions = {c["name"]: c["status"] for c in json.loads((run / "convert.json").read_text())}
    assert conversions == {"onnx": "produced", "tflite_float32": "refused", "tflite_float16": "refused"}


def test_a_single_stage_that_fails_records_itself_failed_and_leaves_no_stale_record(tmp_path, capsys):
    run = tmp_path / "runs" / "20260101T000000Z-digits-abcd"
    (run / "artifacts").mkdir(parents=True)  # no saved_model.pb: the convert stage cannot run
    (run / "config.json").write_text("{}")
    earlier = [{"name": n, "status": "ok", "seconds": 1.0, "reason": "", "summary": {}}
               for n in ("data", "train", "export", "convert", "validate", "serve-check", "publish")]
    (run / "stages.json").write_text(json.dumps(earlier))
    for stale in ("convert.json", "parity.json", "serve_check.json"):
        (run / stale).write_text('{"passed": true}')
    assert main(["convert", "--run", str(run)]) == 2
    stages = {s["name"]: s for s in json.loads((run / "stages.json").read_text())}
    assert stages["convert"]["status"] == "failed" and "saved_model.pb does not exist" in stages["convert"]["reason"]
    assert stages["export"]["status"] == "ok"
    assert {stages[n]["status"] for n in ("validate", "serve-check", "publish")} == {"skipped"}
    assert not any((run / name).exists() for name in ("convert.json", "parity.json", "serve_check.json"))
