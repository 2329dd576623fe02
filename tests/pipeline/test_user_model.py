"""Export-only mode (`tfship run --model ... --data ...`): a user's multi-input, dict-head model is
exported from its own contract, converted, proven and published; a model leaking training behaviour is
refused with the layer named; the task metric and index outputs follow any contract."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.pipeline.conftest import run_tfship
from tests.pipeline.user_models import write_classification_npz
from tfship.core.contract import Signature, TensorSpec
from tfship.core.errors import DatasetError, ParityError
from tfship.pipeline.config import load_config
from tfship.pipeline.export_only.user_model import load_user_data
from tfship.pipeline.gate.compare import Tolerance, compare_outputs
from tfship.pipeline.gate.task_metric import index_scores, infer_task

FACTORY = "tests.pipeline.user_models:two_input_classifier"


@pytest.mark.slow
def test_export_only_run_publishes_a_multi_input_model(tmp_path):
    data = write_classification_npz(tmp_path / "data.npz")
    completed = run_tfship("run", "--model", FACTORY, "--data", str(data), "--runs-dir", str(tmp_path / "runs"),
                           "--repository", str(tmp_path / "models"), "--set", "run.model_name=user",
                           "--set", 'convert.tflite_modes=["float32", "float16"]',
                           "--set", "convert.onnx_simplify=true", "--set", 'export.extra_signatures={scores_only=["scores"]}')
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "Layer (type)" not in completed.stdout  # Keras' model summary is not printed unless asked
    version = tmp_path / "models" / "user" / "1"
    manifest = json.loads((version / "manifest.json").read_text())
    signature = manifest["signature_def"]["serving_default"]
    assert {t["name"]: t["dtype"] for t in signature["inputs"]} == {"pixels": "float32", "count": "int64"}
    assert {t["name"]: t["dtype"] for t in signature["outputs"]} == {"scores": "float32", "class_id": "int64"}
    parity = manifest["parity"]
    assert parity["metric"] == "accuracy_%" and parity["metric_output"] == "class_id"
    assert parity["reference_metric"] == 100.0
    assert {r["artifact"] for r in parity["artifacts"]} == {"saved_model", "onnx", "tflite_float32",
                                                             "tflite_float16"}
    assert all(r["batch_sizes"] == [1, 7, 64] for r in parity["artifacts"])
    assert manifest["audit"]["behaviour"]["passed"]
    run = sorted((tmp_path / "runs").iterdir())[-1]
    stages = {s["name"]: s["status"] for s in json.loads((run / "stages.json").read_text())}
    assert stages["train"] == "skipped" and stages["publish"] == "ok"
    for name in ("report.md", "errors_scores.png", "errors_class_id.png", "size.png"):
        assert (run / name).is_file(), name
    assert "-m onnxslim" in (run / "artifacts" / "model.onnx.reproduce.sh").read_text()
    info = json.loads(run_tfship("inspect", str(version), "--json").stdout)
    assert set(info["signatures"]) == {"serving_default", "scores_only"}


@pytest.mark.slow
def test_export_only_refuses_a_training_mode_batch_norm_naming_it(tmp_path):
    data = write_classification_npz(tmp_path / "data.npz")
    completed = run_tfship("run", "--model", "tests.pipeline.user_models:forced_batch_norm", "--data", str(data),
                           "--runs-dir", str(tmp_path / "runs"), "--repository", str(tmp_path / "models"))
    assert completed.returncode == 2
    assert "AuditError" in completed.stderr and "'stuck_bn'" in completed.stderr
    assert "BatchNormalization" in completed.stderr and "training mode" in completed.stderr
    assert not (tmp_path / "models").exists()


def test_data_reader_names_missing_arrays_and_bad_shapes(tmp_path):
    contract = Signature.of("serving_default", (TensorSpec(name="pixels", dtype="float32", shape=(None, 16)),
                                                     TensorSpec(name="count", dtype="int64", shape=(None, 1))), ())
    np.savez(tmp_path / "missing.npz", pixels=np.zeros((4, 16), np.float32))
    with pytest.raises(DatasetError, match=r"missing arrays \['count'\]"):
        load_user_data(tmp_path / "missing.npz", contract, 10, 0)
    np.savez(tmp_path / "shape.npz", pixels=np.zeros((4, 15)), count=np.zeros((4, 1)))
    with pytest.raises(DatasetError, match=r"input 'pixels' has shape \[4, 15\]"):
        load_user_data(tmp_path / "shape.npz", contract, 10, 0)
    np.savez(tmp_path / "ok.npz", pixels=np.zeros((5, 16)), count=np.ones((5, 1)), y=np.linspace(0, 1, 5))
    data = load_user_data(tmp_path / "ok.npz", contract, 3, 0)
    assert data.inputs["pixels"].dtype == np.float32 and data.inputs["count"].dtype == np.int64
    assert data.labels.dtype == np.float64 and len(data.calibration["pixels"]) == 3


def test_task_metric_follows_the_contract():
    scores = np.array([[0.1, 0.9], [0.8, 0.2], [0.5, 0.5]], np.float32)
    reference = {"class_id": np.array([1, 0, 0]), "scores": scores, "price": np.array([[1.0], [2.0], [3.0]])}
    assert index_scores(reference) == {"class_id": "scores"}
    task = infer_task(reference, np.array([1, 0, 1]), "auto", None)
    assert (task.kind, task.prediction) == ("classification", "class_id")
    assert task.score(reference) == pytest.approx(200 / 3)
    regression = infer_task(reference, np.array([1.0, 2.0, 4.0]), "auto", "price")
    assert (regression.kind, regression.score(reference)) == ("regression", pytest.approx(1 / 3))
    assert infer_task(reference, None, "auto", None).label_source == "reference"
    with pytest.raises(ParityError, match="no output fits a classification metric"):
        infer_task({"price": reference["price"]}, np.array([1, 0, 2]), "classification", None)


def test_index_outputs_are_tie_aware_and_strings_exact():
    scores = np.array([[0.5, 0.5], [0.1, 0.9]], np.float32)
    reference = {"scores": scores, "label": np.array([0, 1])}
    tolerance = Tolerance(1e-5, 1e-5)
    tie = compare_outputs({"scores": scores, "label": np.array([1, 1])}, reference, tolerance)
    assert all(row.passed for row in tie)
    wrong = compare_outputs({"scores": scores, "label": np.array([0, 0])}, reference, tolerance)[1]
    assert not wrong.passed and "1 of 2 indices differ" in wrong.detail
    text = compare_outputs({"word": np.array([b"a", b"c"], dtype=object)}, {"word": np.array(["a", "b"])}, tolerance)[0]
    assert not text.passed and "1 of 2 strings differ" in text.detail
    assert compare_outputs({"word": np.array([b"a", b"b"], dtype=object)}, {"word": np.array(["a", "b"])},
                           tolerance)[0].passed


def test_config_accepts_the_new_sections():
    config = load_config(None, {"export.extra_signatures": {"predict_proba": ["probabilities"]},
                                "validate.task": "regression", "convert.onnx_simplify": True})
    assert config.export.extra_signatures == {"predict_proba": ("probabilities",)}
    assert config.parity.task == "regression" and config.convert.onnx_simplify


def test_text_inputs_load_from_str_or_utf8_bytes(tmp_path):
    contract = Signature.of("serving_default", (TensorSpec(name="city", dtype="string", shape=(None, 1)),), ())
    cities = np.array([["paris"], ["são paulo"], ["oslo"]])
    np.savez(tmp_path / "bytes.npz", city=np.char.encode(cities, "utf-8"), y=np.array([0, 1, 2]))
    np.savez(tmp_path / "text.npz", city=cities, y=np.array([0, 1, 2]))
    for name in ("bytes.npz", "text.npz"):
        data = load_user_data(tmp_path / name, contract, 2, 0)
        assert data.inputs["city"].dtype.kind == "U" and data.inputs["city"].tolist() == cities.tolist(), name
    np.savez(tmp_path / "numbers.npz", city=np.array([[1.0], [2.0]]))
    with pytest.raises(DatasetError, match=r"input 'city' is a string input; the array holds float64"):
        load_user_data(tmp_path / "numbers.npz", contract, 2, 0)
