"""`promote` judges each task by its own metric (core.tasks): AUC for a binary model, MAE for a regression,
with named inputs, and refuses a candidate worse than stable on it beyond the allowed drop.

The models are two-input Keras models with hand-set weights, so each version's metric is known exactly:
binary probability = sigmoid(k * (a - b)) against labels a > b (AUC 1 for k > 0, 0 for k < 0); regression
prediction = w_a * a + w_b * b against labels a + b (MAE 0 for w = (1, 1)).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfship.pipeline.orchestration.promote import PromotionRefusedError, promote
from tfship.pipeline.orchestration.publish import publish_version, write_golden_set

RNG = np.random.default_rng(7)
X = {"a": RNG.random((200, 1), dtype=np.float32), "b": RNG.random((200, 1), dtype=np.float32)}


def _version(folder: Path, weights: tuple[float, float], activation: str | None) -> Path:
    import keras

    a, b = keras.Input((1,), name="a"), keras.Input((1,), name="b")
    head = keras.layers.Dense(1, activation=activation, name="probability" if activation else "prediction")
    model = keras.Model({"a": a, "b": b}, head(keras.layers.Concatenate()([a, b])))
    head.set_weights([np.array([[weights[0]], [weights[1]]], np.float32), np.zeros(1, np.float32)])
    model.export(str(folder), verbose=False)
    write_golden_set(folder, {k: v[:8] for k, v in X.items()}, {})
    return folder


@pytest.mark.parametrize(("task", "activation", "good", "bad", "close", "refusal"), [
    ("binary", "sigmoid", (4.0, -4.0), (-4.0, 4.0), (2.0, -2.0), r"auc 0\.0000 vs stable v1 1\.0000"),
    ("regression", None, (1.0, 1.0), (1.0, 0.0), (1.0, 1.002), r"mae 0\.\d+ vs stable v1 0\.0000"),
])
def test_promote_refuses_on_the_task_metric(tmp_path, task, activation, good, bad, close, refusal):
    labels = (X["a"] > X["b"]).astype(np.int64)[:, 0] if task == "binary" else (X["a"] + X["b"])[:, 0]
    repository = tmp_path / "models"
    for number, weights in enumerate((good, bad, close), start=1):
        folder = _version(tmp_path / f"v{number}", weights, activation)
        assert publish_version(folder, repository, "m", {"status": "test"}).version == number
    held_out = (X, labels)
    assert promote(repository, "m", 1, "stable", held_out=held_out, task=task)["evidence"] is None
    with pytest.raises(PromotionRefusedError, match=rf"v2 is worse than stable v1: {refusal} on 200 held-out rows"):
        promote(repository, "m", 2, "stable", held_out=held_out, task=task)
    moved = promote(repository, "m", 3, "stable", held_out=held_out, task=task)["evidence"]
    assert moved["passed"] and moved["metric"] == ("auc" if task == "binary" else "mae")
    if task == "regression":
        assert 0 < moved["candidate_metric"] <= 0.01  # worse than stable's 0, within the allowed drop
    else:
        assert moved["candidate_metric"] == 1.0
