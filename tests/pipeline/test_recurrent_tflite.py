"""Recurrent layers to TFLite: a Keras 3 LSTM model cannot be lowered with a dynamic batch, so the convert
stage tries the known recipes and publishes the file the `unrolled` recipe produced (named in convert.json);
a model whose time dimension is dynamic is refused with every recipe tried and why."""

from __future__ import annotations

import json
import re

import keras
import numpy as np
import pytest

from tests.pipeline.conftest import run_tfship
from tfship.pipeline.config import load_config
from tfship.pipeline.orchestration import steps
from tfship.pipeline.orchestration.stages import RunFolder
from tfship.signatures.recurrent import recurrent_layers, unrolled_copy


def lstm_classifier():
    """`sequence` f32 [-1, 10, 4] -> LSTM(8, sequences) -> GRU(6) -> `scores` [-1, 3]."""
    keras.utils.set_random_seed(0)
    sequence = keras.Input((10, 4), name="sequence")
    hidden = keras.layers.LSTM(8, return_sequences=True, name="lstm")(sequence)
    hidden = keras.layers.GRU(6, name="gru")(hidden)
    return keras.Model(sequence, keras.layers.Dense(3, name="scores")(hidden))


def test_unrolled_copy_has_the_same_outputs():
    model = lstm_classifier()
    assert recurrent_layers(model) == {"lstm": 10, "gru": 10}
    x = np.random.default_rng(0).random((5, 10, 4), dtype=np.float32)
    clone = unrolled_copy(model)
    assert all(layer.unroll for layer in clone.layers if isinstance(layer, keras.layers.RNN))
    np.testing.assert_allclose(np.asarray(clone(x)), np.asarray(model(x)), atol=1e-6)
    dynamic = keras.Model(inp := keras.Input((None, 4)), keras.layers.LSTM(3, name="free")(inp))
    with pytest.raises(ValueError, match=r"\['free'\] have a dynamic time dimension"):
        unrolled_copy(dynamic)


@pytest.mark.slow
def test_lstm_model_publishes_tflite_through_the_unrolled_recipe(tmp_path):
    x = np.random.default_rng(1).random((48, 10, 4), dtype=np.float32)
    np.savez(tmp_path / "data.npz", sequence=x)
    completed = run_tfship("run", "--model", "tests.pipeline.test_recurrent_tflite:lstm_classifier", "--data",
                           str(tmp_path / "data.npz"), "--runs-dir", str(tmp_path / "runs"), "--repository",
                           str(tmp_path / "models"), "--set", "run.model_name=lstm",
                           "--set", 'convert.tflite_modes=["float32"]')
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    outcomes = {o["name"]: o for o in json.loads((run / "convert.json").read_text())}
    assert outcomes["tflite_float32"]["status"] == "produced" and outcomes["tflite_float32"]["recipe"] == "unrolled"
    assert "| tflite_float32 | produced | unrolled |" in (run / "report.md").read_text()
    manifest = json.loads((tmp_path / "models" / "lstm" / "1" / "manifest.json").read_text())
    rows = {r["artifact"]: r for r in manifest["parity"]["artifacts"]}
    assert rows["tflite_float32"]["passed"]


def test_dynamic_time_lstm_is_refused_naming_the_recipes_tried(tmp_path):
    from tfship.core.errors import TfshipError
    from tfship.pipeline.export_only.user_model import load_user_data

    keras.utils.set_random_seed(0)
    sequence = keras.Input((None, 4), name="sequence")
    model = keras.Model(sequence, keras.layers.Dense(3, name="scores")(keras.layers.LSTM(5, name="free")(sequence)))
    config = load_config(None, {"convert.tflite_modes": ["float32"], "export.behaviour_checks": False})
    run = RunFolder.create(tmp_path / "runs", "free")
    np.savez(tmp_path / "data.npz", sequence=np.random.default_rng(2).random((16, 6, 4), dtype=np.float32))
    steps.export_user_stage(config, run, model, tmp_path / "data.npz")
    data = load_user_data(tmp_path / "data.npz", steps.read_contract(run), 8, 0)
    try:  # a required artifact left out fails the stage; an optional one is only reported
        reasons = {o.name: o.reason for o in steps.convert_stage(config, run, data).outcomes}["tflite_float32"]
    except TfshipError as err:
        reasons = str(err)
    assert "recipe 'fixed_batch' (batch 1)" in reasons
    assert re.search(r"recipe 'default'.*[Tt]ensor list.*recipe 'unrolled' not available: no unrolled copy: "
                     r"ValueError: .*\['free'\] have a dynamic time dimension.*fused-LSTM", reasons), reasons
