"""Models trained with mixed precision are exported as their float32 copy: the SavedModel is float32 in and
out, computes in float32 (batch-independent at float32 tolerance, ONNX-convertible), and `configs/digits-bf16.toml`
publishes every artifact end to end like a float32 run."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

from tests.pipeline.conftest import REPO_ROOT, run_tfship
from tfship.pipeline.config import load_config
from tfship.pipeline.orchestration import steps
from tfship.pipeline.orchestration.stages import RunFolder
from tfship.pipeline.training.model import build_model


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_trained_mixed_precision_model_exports_its_float32_copy(policy, splits, tmp_path):
    config = load_config(None)
    model = build_model(config.model, (8, 8, 1), 10, 0, precision=policy)
    assert model.get_layer(index=1).compute_dtype in ("float16", "bfloat16")
    run = RunFolder.create(tmp_path / "runs", "digits")
    outcome = steps.export_stage(config, run, splits, model)
    assert outcome.audit.passed and outcome.behaviour.passed, outcome.behaviour.to_json()
    record = json.loads((run.root / "export.json").read_text())
    assert record["trained_precision"] == [policy] and record["float32_copy"] is True
    from tfship.pipeline.conversion.artifacts import saved_model_runner

    images = splits.test.images[:16]
    logits = saved_model_runner(run.artifacts)({"image": images})["logits"]
    assert logits.dtype == np.float32
    float32_logits = np.asarray(keras.ops.convert_to_numpy(model(images, training=False)), np.float32)
    np.testing.assert_allclose(logits, float32_logits, atol=0.1)  # the same weights; 16-bit compute differs a bit


@pytest.mark.slow
def test_bf16_config_publishes_every_artifact(tmp_path):
    completed = run_tfship("run", "--config", str(REPO_ROOT / "configs" / "digits-bf16.toml"), "--set",
                           "train.epochs=2", "--runs-dir", str(tmp_path / "runs"), "--repository",
                           str(tmp_path / "models"))
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    manifest = json.loads((tmp_path / "models" / "digits-bf16" / "1" / "manifest.json").read_text())
    assert manifest["metrics"]["train"]["mixed_precision"] == "mixed_bfloat16"
    assert manifest["parity"]["passed"] and manifest["audit"]["behaviour"]["passed"]
    assert {r["artifact"] for r in manifest["parity"]["artifacts"]} >= {
        "onnx", "tflite_float32", "tflite_float16", "tflite_dynamic_range", "tflite_int8"}
    (run,) = (tmp_path / "runs").iterdir()
    assert json.loads((run / "export.json").read_text())["trained_precision"] == ["mixed_bfloat16"]
