"""Every value the training loop logs is read through the strategy: learning rate (constant and scheduled),
loss scale and weight histograms of variables created under MirroredStrategy log as plain floats."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfship.pipeline.config import load_config
from tfship.pipeline.training.distribute import read_float, read_value
from tfship.pipeline.training.optim import build_optimizer, current_learning_rate, loss_scale
from tfship.pipeline.training.tensorboard_log import TensorBoardLog


def test_values_held_by_a_mirrored_strategy_log_as_floats(tmp_path):
    strategy = tf.distribute.MirroredStrategy()
    settings = [({}, 3e-3), ({"train.schedule": "cosine", "train.warmup_steps": 4}, 3e-3 / 4)]
    for overrides, first_rate in settings:
        config = load_config(None, {**overrides, "train.mixed_precision": "mixed_float16"}).train
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="dense")])
            optimizer = build_optimizer(config, 100)
            optimizer.build(model.trainable_variables)
        assert isinstance(getattr(optimizer.iterations, "value", None), tf.distribute.DistributedValues)
        assert current_learning_rate(optimizer) == np.float32(first_rate)
        assert loss_scale(optimizer) == 2.0 ** 15
    per_replica = strategy.run(lambda: tf.constant(2.5))
    assert read_float(per_replica) == 2.5 and read_float(np.float32(1.5)) == 1.5
    board = TensorBoardLog(tmp_path, scalar_every=1, histogram_every=1)
    board.step(1, {"learning_rate": optimizer.learning_rate, "loss_scale": optimizer.dynamic_scale,
                   "loss": per_replica}, model.trainable_variables)
    board.epoch(1, {"accuracy": tf.constant(0.5)})
    board.close()
    assert read_value(model.trainable_variables[0]).shape == (3, 2)
    events = list((tmp_path / "train").glob("events.out.tfevents.*"))
    tags = {v.tag for path in events for e in tf.compat.v1.train.summary_iterator(str(path)) for v in e.summary.value}
    assert {"learning_rate", "loss_scale", "loss"} <= tags, tags
    assert any(t.endswith("dense/kernel") for t in tags) and any(t.endswith("dense/bias") for t in tags), tags
    json.dumps({"lr": current_learning_rate(optimizer)})  # a plain float


@pytest.mark.slow
def test_mirrored_training_on_the_default_config_logs_the_learning_rate(tmp_path):
    """The reported crash: `tfship train --set train.strategy=mirrored` with TensorBoard on (the default)."""
    from tests.pipeline.conftest import run_tfship

    completed = run_tfship("train", "--set", "train.strategy=mirrored", "--epochs", "1",
                           "--runs-dir", str(tmp_path / "runs"), timeout=600)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    assert json.loads((run / "train.json").read_text())["strategy"] == "mirrored"
    events = list((run / "tensorboard" / "train").glob("events.out.tfevents.*"))
    rates = [v.simple_value or float(tf.make_ndarray(v.tensor)) for path in events
             for e in tf.compat.v1.train.summary_iterator(str(path)) for v in e.summary.value
             if v.tag == "learning_rate"]
    assert rates and all(r == np.float32(3e-3) for r in rates), rates
