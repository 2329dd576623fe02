"""`tfship run` end to end on digits (the command `make pipeline` runs), through serve-check and
publish, and the CLI's refusals."""

from __future__ import annotations

import json

import pytest

from tests.pipeline.conftest import run_tfship
from tfship.pipeline.orchestration.publish import read_golden_set

pytestmark = pytest.mark.slow


def test_run_publishes_a_blessed_version_in_tf_serving_layout(pipeline_run):
    version_dir = pipeline_run["repository"] / "digits" / "1"
    for name in ("saved_model.pb", "variables/variables.index", "model.onnx", "model.tflite",
                 "model_float16.tflite", "model_dynamic_range.tflite", "model_int8.tflite", "manifest.json",
                 "assets.extra/tf_serving_warmup_requests", "assets.extra/tfship_golden.npz"):
        assert (version_dir / name).is_file(), name
    manifest = json.loads((version_dir / "manifest.json").read_text())
    assert manifest["version"] == 1 and manifest["audit"]["passed"] and manifest["parity"]["passed"]
    assert manifest["signature_def"]["serving_default"]["inputs"] == [
        {"name": "image", "dtype": "float32", "shape": [-1, 8, 8, 1]}]
    assert set(manifest["serve_check"]["artifacts"]) == {"saved_model", "onnx", "tflite_float32", "tflite_float16",
                                                        "tflite_dynamic_range", "tflite_int8"}
    assert manifest["status"] == "published"
    assert {a["artifact"]: a["status"] for a in manifest["artifacts"]} == {
        name: "published" for name in ("saved_model", "onnx", "tflite_float32", "tflite_float16",
                                       "tflite_dynamic_range", "tflite_int8")}
    assert manifest["libraries"]["tensorflow"].startswith("2.21")
    assert {f["path"] for f in manifest["files"]} >= {"saved_model.pb", "model.onnx"}
    inputs, outputs = read_golden_set(version_dir)
    assert inputs["image"].shape == (64, 8, 8, 1) and outputs["class_id"].shape == (64,)


def test_run_folder_records_every_stage_and_reports(pipeline_run):
    run = pipeline_run["run"]
    stages = json.loads((run / "stages.json").read_text())
    assert [s["name"] for s in stages] == ["data", "train", "export", "convert", "validate", "serve-check",
                                           "publish"]
    assert all(s["status"] == "ok" for s in stages)
    train = json.loads((run / "train.json").read_text())
    assert train["train_step_traces"] == 1
    for name in ("report.json", "report.md", "accuracy.png", "size.png", "latency.png", "config.json"):
        assert (run / name).is_file(), name
    assert "published" in pipeline_run["stdout"] and "artifacts" in pipeline_run["stdout"]


def test_warmup_records_are_tf_serving_prediction_logs(pipeline_run):
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path = pipeline_run["repository"] / "digits" / "1" / "assets.extra" / "tf_serving_warmup_requests"
    records = [prediction_log_pb2.PredictionLog.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]
    assert len(records) == 2
    request = records[0].predict_log.request
    assert request.model_spec.signature_name == "serving_default" and "image" in request.inputs


def test_inspect_prints_each_format(pipeline_run):
    version_dir = pipeline_run["repository"] / "digits" / "1"
    for target in (version_dir.parent, version_dir / "model.onnx", version_dir / "model.tflite"):
        completed = run_tfship("inspect", str(target), "--json")
        assert completed.returncode == 0, completed.stderr
        info = json.loads(completed.stdout)
        outputs = {t["name"] for t in info["signatures"]["serving_default"]["outputs"]}
        assert outputs == {"logits", "probabilities", "class_id"}


def test_validate_stage_alone_rechecks_the_run(pipeline_run):
    completed = run_tfship("validate", "--run", str(pipeline_run["run"]))
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]


def test_bad_config_stops_with_file_key_and_value(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("[train]\nepochs = 0\n")
    completed = run_tfship("run", "--config", str(config), "--runs-dir", str(tmp_path / "runs"))
    assert completed.returncode == 2
    assert str(config) in completed.stderr and "train.epochs" in completed.stderr and "got 0" in completed.stderr
    assert not (tmp_path / "runs").exists()


def test_leftover_temp_files_are_never_published(pipeline_run, tmp_path):
    run = pipeline_run["run"]
    leftover = run / "artifacts" / ".model.deadbeef.onnx"
    leftover.write_bytes(b"half a file from a killed conversion")
    try:
        completed = run_tfship("publish", "--run", str(run), "--repository", str(tmp_path / "models"))
    finally:
        leftover.unlink()
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    version_dir = tmp_path / "models" / "digits" / "1"
    assert (version_dir / "saved_model.pb").is_file()
    hidden = [p.name for p in version_dir.rglob(".*")]
    assert hidden == [], hidden
