"""The one training loop's K-step blocks (issue 39), in process on the bundled digits: resume is bit-identical to
an uninterrupted run whatever K either run used, a SIGTERM stops at a block's end with a checkpoint, a non-finite
step is named at any K, timed checkpoints, train.json's bounded records, and no second (Keras fit) loop."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest

from tfship.core.errors import StageError
from tfship.pipeline.config import load_config
from tfship.pipeline.data.splits import load_split_arrays
from tfship.pipeline.training.train import TrainInputs, train_model

FAST = {"train.epochs": 2, "train.jit_compile": False, "train.tensorboard": False}
TRAINING = Path(__file__).resolve().parents[2] / "pipeline" / "training"


def _train(folder: Path, overrides: dict, resume: bool = False, log=None):
    config = load_config(None, FAST | overrides)
    splits = load_split_arrays(config.data, config.run.seed)
    return train_model(TrainInputs(config, splits, folder, resume=resume, log=log))


# --- a model whose fifth training forward pass gives NaN (model.factory) -----------------------------------
def nan_at_fifth_step_factory(input_shape, num_classes):
    import keras
    import tensorflow as tf

    class NanOnFifthCall(keras.layers.Layer):
        def build(self, input_shape):
            self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False, name="calls")

        def call(self, inputs, training=None):
            if not training:
                return inputs
            self.calls.assign_add(1.0)
            return inputs * tf.where(self.calls >= 5.0, np.float32(np.nan), np.float32(1.0))

    inputs = keras.Input(shape=input_shape, name="image")
    hidden = keras.layers.Dense(8, activation="relu", name="first")(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(NanOnFifthCall()(hidden)))


@pytest.mark.parametrize("steps_per_execution", [1, 8, "auto"])
def test_a_non_finite_step_is_named_at_any_k(tmp_path, steps_per_execution):
    # The XLA probe's first call runs a real step and restores every model variable (the counter too), so the
    # fifth training step is the first NaN one, inside the first 8-step block.
    with pytest.raises(StageError, match=r"non-finite values at step 5: loss nan; first non-finite gradient: "):
        _train(tmp_path, {"model.factory": "tests.pipeline.test_train_blocks:nan_at_fifth_step_factory",
                          "train.steps_per_execution": steps_per_execution})


@pytest.mark.slow
def test_sigterm_stops_at_a_block_end_and_resume_at_another_k_equals_an_uninterrupted_run(tmp_path):
    common = {"train.deterministic": True, "train.checkpoint_every_steps": 10}
    full = _train(tmp_path / "full", common | {"train.steps_per_execution": 1})

    def stop_after_step_20(line: str) -> None:
        if line.startswith("checkpoint saved: step 20 "):
            os.kill(os.getpid(), signal.SIGTERM)

    cut = tmp_path / "cut"
    with pytest.raises(StageError, match=r"stopped by SIGTERM at step 20 of 36: checkpoint saved"):
        _train(cut, common | {"train.steps_per_execution": 7}, log=stop_after_step_20)
    resumed = _train(cut, common | {"train.steps_per_execution": "auto"}, resume=True)
    assert resumed.summary()["resumed_from_step"] == 20 and resumed.steps == full.steps == 36
    for a, b in zip(full.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert [h.step for h in resumed.history] == [h.step for h in full.history] == [18, 36]


def test_timed_checkpoints_and_bounded_records(tmp_path):
    lines: list[str] = []
    result = _train(tmp_path, {"train.steps_per_execution": 3, "train.checkpoint_every_s": 1e-6}, log=lines.append)
    summary = result.summary()
    saves = [line for line in lines if line.startswith("checkpoint saved: ")]
    # a save after every block but the last (which ends the run and saves once more): 12 blocks of 3 steps
    assert summary["steps_per_execution"] == {"setting": 3, "blocks": 12, "mean_steps_per_block": 3.0,
                                              "last_block_steps": 3}
    assert summary["checkpoints"]["count"] == len(saves) == 12 and summary["checkpoints"]["last_step"] == 36
    assert not any("checkpoint saved" in note for note in summary["notes"])  # train.json: a count, not a line each
    assert summary["input"]["steps_measured"] == 36 - 3  # the first block (trace, pipeline fill) is not measured
    assert 0.0 <= summary["input"]["input_wait_share"] <= 1.0


def _fit_calls(root: Path) -> list[str]:
    pattern = re.compile(r"\.fit\(|\bfit_generator\(|train_on_batch\(")
    return [f"{path.name}:{number}" for path in sorted(root.rglob("*.py"))
            for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]


def test_there_is_one_training_loop_and_no_keras_fit(tmp_path):
    assert _fit_calls(TRAINING) == []
    assert not (TRAINING / "named_train.py").exists()
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "second_loop.py").write_text("def train(model, data):\n    return model.fit(data, epochs=1)\n")
    assert _fit_calls(planted) == ["second_loop.py:2"]
