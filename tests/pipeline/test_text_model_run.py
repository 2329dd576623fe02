"""The string-input model of issue 11 end to end: `city` (string [-1, 1]) -> StringLookup -> Embedding ->
Dense, data given as UTF-8 bytes, through export, ONNX and TFLite (float32, dynamic range), the parity gate
at batch 1, 7 and 64, and the serve-check of every backend."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

from tests.pipeline.conftest import run_tfship

CITIES = ["paris", "rome", "oslo", "lima", "são paulo"]


def city_model():
    """`city` string [-1, 1] -> `scores` float32 [-1, 3] (factory for `--model`)."""
    keras.utils.set_random_seed(3)
    city = keras.Input((1,), dtype="string", name="city")
    ids = keras.layers.StringLookup(vocabulary=CITIES, name="lookup")(city)
    embedded = keras.layers.Flatten()(keras.layers.Embedding(len(CITIES) + 1, 4, name="embedding")(ids))
    return keras.Model(city, keras.layers.Dense(3, name="scores")(embedded))


@pytest.mark.slow
def test_text_input_model_publishes_onnx_and_tflite(tmp_path):
    rows = np.array([[c] for c in [*CITIES, "nowhere"]] * 12)
    np.savez(tmp_path / "data.npz", city=np.char.encode(rows, "utf-8"))
    completed = run_tfship("run", "--model", "tests.pipeline.test_text_model_run:city_model", "--data",
                           str(tmp_path / "data.npz"), "--runs-dir", str(tmp_path / "runs"), "--repository",
                           str(tmp_path / "models"), "--set", "run.model_name=city",
                           "--set", 'convert.tflite_modes=["float32", "dynamic_range"]')
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    manifest = json.loads((tmp_path / "models" / "city" / "1" / "manifest.json").read_text())
    rows_by_name = {r["artifact"]: r for r in manifest["parity"]["artifacts"]}
    assert {"onnx", "tflite_float32", "tflite_dynamic_range"} <= set(rows_by_name)
    assert all(r["passed"] and r["batch_sizes"] == [1, 7, 64] for r in rows_by_name.values())
    served = manifest["serve_check"]["artifacts"]
    assert set(served) == {"saved_model", "onnx", "tflite_float32", "tflite_dynamic_range"}
    assert all(row["passed"] for row in served.values())
    assert {row["backend"] for row in served.values()} == {"saved_model", "onnx", "tflite"}
    assert manifest["signature_def"]["serving_default"]["inputs"] == [
        {"name": "city", "dtype": "string", "shape": [-1, 1]}]
