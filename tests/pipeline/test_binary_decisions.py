"""A one-column sigmoid output is a binary decision at its threshold, recognised with the default config: the
gate's accuracy is the one Keras measures (`keras.metrics.BinaryAccuracy`), agreement counts flipped decisions,
and a file flipping 38 % of them is refused whatever the tolerances are set to. Real Keras SavedModels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfship.core.contract import Signature, TensorSpec
from tfship.pipeline.config import load_config
from tfship.pipeline.conversion.artifacts import Artifact
from tfship.pipeline.gate.parity_lines import judgement_lines
from tfship.pipeline.gate.task_metric import infer_task
from tfship.pipeline.gate.validate import validate_artifacts

ROWS = 400
CONTRACT = Signature.of("serving_default", (TensorSpec(name="user", dtype="float32", shape=(None, 6)),
                                            TensorSpec(name="item", dtype="float32", shape=(None, 6))),
                        (TensorSpec(name="prob", dtype="float32", shape=(None, 1)),))


def _recommender():
    """Two-tower-ish Keras model: [user, item] -> Dense(16, relu) -> Dense(1, sigmoid) `prob`."""
    import keras

    keras.utils.set_random_seed(5)
    user, item = keras.Input((6,), name="user"), keras.Input((6,), name="item")
    hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([user, item]))
    prob = keras.layers.Dense(1, activation="sigmoid", name="prob")(hidden)
    return keras.Model([user, item], prob)


def _export(model, folder: Path) -> Path:
    import keras
    import tensorflow as tf

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", lambda user, item: {"prob": model([user, item], training=False)},
                         input_signature=[tf.TensorSpec([None, 6], tf.float32, name="user"),
                                          tf.TensorSpec([None, 6], tf.float32, name="item")])
    archive.write_out(str(folder), verbose=False)
    return folder


@pytest.fixture(scope="module")
def recommender(tmp_path_factory):
    import keras

    folder = tmp_path_factory.mktemp("binary")
    rng = np.random.default_rng(8)
    inputs = {"user": rng.normal(size=(ROWS, 6)).astype(np.float32),
              "item": rng.normal(size=(ROWS, 6)).astype(np.float32)}
    labels = (inputs["user"][:, 0] + 0.5 * rng.normal(size=ROWS) > 0).astype(np.int64)
    model = _recommender()
    logits_model = keras.Model(model.inputs, model.get_layer("prob").input)
    reference = _export(model, folder / "reference")
    # the planted file: the sigmoid's bias moved so that 38 % of the rows cross 0.5
    dense = model.get_layer("prob")
    kernel, bias = dense.get_weights()
    pre = np.asarray(logits_model.predict([inputs["user"], inputs["item"]], verbose=0)) @ kernel + bias
    shift = np.quantile(pre[pre > 0], min(1.0, 0.38 * ROWS / max(1, int(np.sum(pre > 0))))) if np.any(pre > 0) else 0
    dense.set_weights([kernel, bias - shift - 1e-3])
    planted = _export(model, folder / "planted")
    dense.set_weights([kernel, bias])
    keras_accuracy = keras.metrics.BinaryAccuracy()
    keras_accuracy.update_state(labels, model.predict([inputs["user"], inputs["item"]], verbose=0))
    return {"reference": reference, "planted": planted, "inputs": inputs, "labels": labels,
            "keras_accuracy": 100.0 * float(keras_accuracy.result())}


def _judge(recommender, overrides=None, **settings):
    parity = load_config(None, overrides or {}).parity.model_copy(update=settings)
    reference = Artifact("saved_model", "saved_model", "float32", recommender["reference"])
    return validate_artifacts(reference, [Artifact("copy", "saved_model", "float32", recommender["reference"]),
                                          Artifact("tflite_int8", "saved_model", "int8", recommender["planted"])],
                              CONTRACT, recommender["inputs"], recommender["labels"], parity)


def test_a_sigmoid_column_is_recognised_and_scored_as_keras_scores_it(recommender):
    """Default config: `prob` is the prediction, threshold 0.5, accuracy equal to Keras' BinaryAccuracy."""
    report = _judge(recommender)
    assert report.metric_output == "prob" and report.metric == "accuracy_%"
    assert report.reference_metric == pytest.approx(recommender["keras_accuracy"], abs=1e-4)  # Keras: float32
    task = infer_task({"logit": np.array([[-2.0], [0.5], [3.0]])}, None)
    assert task.threshold == 0.0 and list(task.labels) == [0, 1, 1]  # a logit column: threshold 0


def test_a_file_flipping_38_percent_is_refused_whatever_the_tolerances(recommender):
    """int8 value bound at 100 % of the range and every tie excused: the flips alone refuse it; the correct
    copy passes with 0 flips."""
    report = _judge(recommender, {"validate.int8.atol": 1.0}, max_tie_share=1.0)
    copy, planted = report.rows[1], report.rows[2]
    assert copy.passed and copy.flips == 0 and copy.top1_agreement == 100.0, copy.reason
    assert not planted.passed
    assert 0.30 < planted.flips / ROWS < 0.45, planted.flips
    assert planted.flips_decision["verdict"] == "refused", planted.flips_decision
    assert "decisions flipped on output 'prob'" in planted.reason, planted.reason
    lines = "\n".join(judgement_lines(report.to_json()))  # report.md: the decisions with their bounds
    assert "| tflite_int8 |" in lines and "refused:" in lines and "95 % confidence" in lines, lines
