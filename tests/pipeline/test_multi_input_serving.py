"""A three-input two-class model (dense, categorical id, padded id sequence) shipped from `(x_dict, y)`: published,
and every published artifact (SavedModel, ONNX, TFLite) answers a TF Serving Predict with the named inputs over
gRPC and REST with the Keras model's own values; `tfship query --run` sends the run's held-out rows by name and
reports the task's metric (accuracy), the value `core.tasks` gives on the Keras model's predictions.

(A one-column sigmoid head is judged by the gate once issue 30's binary decisions land; until then the
gate has no metric for it, so this model has two logits.)"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tfship
from tfship.core.tasks import task_metrics
from tfship.pipeline.config import DataSection
from tfship.pipeline.training.input_specs import input_specs
from tfship.pipeline.training.multi_input import tabular

from .conftest import run_tfship

pytestmark = pytest.mark.slow
ROWS = 256


def _three_inputs():
    data = DataSection(source="tfrecord", path="/unused", label="label", feature_spec={
        "price": {"shape": [3]}, "store": {"dtype": "int64", "kind": "categorical", "num_ids": 20},
        "clicks": {"dtype": "int64", "kind": "sequence", "num_ids": 50, "length": 5}, "label": {"dtype": "int64"}})
    rng = np.random.default_rng(0)
    x = {"price": rng.standard_normal((ROWS, 3)).astype(np.float32), "store": rng.integers(0, 20, ROWS),
         "clicks": np.where(rng.random((ROWS, 5)) < 0.6, rng.integers(1, 50, (ROWS, 5)), 0)}
    y = (x["price"][:, 0] + 0.1 * (x["store"] % 3) > 0.1).astype(np.int64)
    return input_specs(data), x, y


def test_three_input_model_is_published_and_served_by_name_from_every_artifact(tmp_path):
    import keras

    specs, x, y = _three_inputs()
    model = tabular(specs, "classification", 2, hidden_units=(16,), name="three")
    model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, epochs=5, batch_size=64, verbose=0)
    expected = model.predict(x, verbose=0)
    result = tfship.ship(model, (x, y), runs_dir=tmp_path / "runs", repository=tmp_path / "models",
                         convert={"tflite_modes": ["float32"]})
    assert result.ok, result.errors
    assert {a.name for a in result.artifacts} >= {"saved_model", "onnx", "tflite_float32"}
    inputs = tfship.inspect(result.published).signatures["serving_default"]["inputs"]
    assert sorted(t["name"] for t in inputs) == ["clicks", "price", "store"]
    rows = {name: value[:16] for name, value in x.items()}
    for backend in ("saved_model", "onnx", "tflite"):
        with tfship.serve(tmp_path / "models", backend=backend) as served:
            for protocol in ("grpc", "rest"):
                answer = served.client(protocol).predict(rows)
                np.testing.assert_allclose(answer["logits"], expected[:16], atol=1e-5,
                                           err_msg=f"{backend} over {protocol}")
            if backend == "saved_model":
                done = run_tfship("query", "--target", served.grpc, "--model-name", "three", "--run",
                                  str(result.run), "--count", str(ROWS), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = re.search(r"accuracy: (\d\.\d{4}) on (\d+) rows", done.stdout)
    assert printed and int(printed.group(2)) == ROWS, done.stdout[-2000:]
    assert float(printed.group(1)) == pytest.approx(task_metrics("classification", expected, y)["accuracy"], abs=1e-4)
