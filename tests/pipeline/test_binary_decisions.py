"""A one-column sigmoid output is a binary task, recognised with the default config: the gate's metric is the
one `core.tasks` judges a binary task by (AUC, equal to scikit-learn's `roc_auc_score` on Keras' predictions),
its drop decided by DeLong's paired test (a file that ranks worse is refused, a correct copy passes); agreement
counts the decisions flipped at the threshold, and a file flipping 38 % of them is refused whatever the
tolerances are set to, though its AUC is intact. Real Keras SavedModels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfship.core.contract import Signature, TensorSpec
from tfship.core.tasks import primary
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
    # the weakened file: the weights of the one informative feature (user[0]) x 0.75, so the ranking loses AUC
    # while few decisions flip
    hidden = next(layer for layer in model.layers if isinstance(layer, keras.layers.Dense) and layer is not dense)
    hidden_kernel, hidden_bias = hidden.get_weights()
    weakened = hidden_kernel.copy()
    weakened[0] *= 0.75
    hidden.set_weights([weakened, hidden_bias])
    weakened_file = _export(model, folder / "weakened")
    hidden.set_weights([hidden_kernel, hidden_bias])
    return {"reference": reference, "planted": planted, "weakened": weakened_file, "inputs": inputs, "labels": labels,
            "keras_scores": model.predict([inputs["user"], inputs["item"]], verbose=0)}


def _judge(recommender, candidate: str = "planted", overrides=None, **settings):
    parity = load_config(None, overrides or {}).parity.model_copy(update=settings)
    reference = Artifact("saved_model", "saved_model", "float32", recommender["reference"])
    return validate_artifacts(reference, [Artifact("copy", "saved_model", "float32", recommender["reference"]),
                                          Artifact("tflite_int8", "saved_model", "int8", recommender[candidate])],
                              CONTRACT, recommender["inputs"], recommender["labels"], parity)


def test_a_sigmoid_column_is_recognised_and_scored_by_the_binary_task_metric(recommender):
    """Default config: `prob` is the prediction, threshold 0.5, the metric `core.tasks.primary("binary")` (AUC),
    equal to scikit-learn's `roc_auc_score` of Keras' own predictions; parity.json and report.md name it."""
    from sklearn.metrics import roc_auc_score

    report = _judge(recommender)
    assert report.metric_output == "prob" and report.metric == primary("binary").name == "auc"
    assert report.reference_metric == pytest.approx(roc_auc_score(recommender["labels"], recommender["keras_scores"]),
                                                    abs=1e-4)  # Keras vs the SavedModel: float32 rounding only
    copy = report.rows[1]
    assert copy.auc_decision["verdict"] == "passed" and copy.auc_decision["estimate"] == 0.0, copy.auc_decision
    assert copy.accuracy_decision is None and "DeLong" in copy.auc_decision["method"]
    payload = report.to_json()
    assert payload["metric"] == "auc" and payload["artifacts"][1]["auc_decision"]["verdict"] == "passed"
    assert "AUC drop (points of AUC; DeLong's paired test)" in "\n".join(judgement_lines(payload))
    task = infer_task({"logit": np.array([[-2.0], [0.5], [3.0]])}, None)
    assert task.threshold == 0.0 and list(task.labels) == [0, 1, 1] and task.name == "auc"  # a logit column
    one_class = infer_task({"prob": np.array([[0.2], [0.7]])}, np.array([1, 1]))
    assert one_class.name == "accuracy_%" and not one_class.auc  # AUC needs both classes: accuracy judges


def test_a_file_that_ranks_worse_is_refused_by_its_auc_drop(recommender):
    """The informative feature's weights x 0.75: about 2.8 points of AUC lost while only ~2 % of the decisions
    flip (within int8's 10 %): the AUC drop's DeLong bounds lie above the allowed 1 point and refuse it alone,
    with the value bound at 100 % of the range; the correct copy passes."""
    report = _judge(recommender, "weakened", {"validate.int8.atol": 1.0}, max_tie_share=1.0)
    copy, weakened = report.rows[1], report.rows[2]
    assert copy.passed, copy.reason
    decision = weakened.auc_decision
    assert decision["verdict"] == "refused" and decision["low"] > decision["allowed"] == 0.01, decision
    assert decision["estimate"] < 0.05, decision  # a few points, not a broken model
    assert weakened.flips_decision["verdict"] != "refused", weakened.flips_decision  # the flips alone would pass
    assert weakened.metric == pytest.approx(report.reference_metric - decision["estimate"])
    assert not weakened.passed and weakened.reason.startswith("AUC drop (DeLong) on output 'prob'"), weakened.reason


def test_a_file_flipping_38_percent_is_refused_whatever_the_tolerances(recommender):
    """int8 value bound at 100 % of the range and every tie excused: the flips alone refuse it; the correct
    copy passes with 0 flips."""
    report = _judge(recommender, overrides={"validate.int8.atol": 1.0}, max_tie_share=1.0)
    copy, planted = report.rows[1], report.rows[2]
    assert copy.passed and copy.flips == 0 and copy.top1_agreement == 100.0, copy.reason
    assert not planted.passed
    assert 0.30 < planted.flips / ROWS < 0.45, planted.flips
    assert planted.flips_decision["verdict"] == "refused", planted.flips_decision
    assert "decisions flipped on output 'prob'" in planted.reason, planted.reason
    assert planted.auc_decision["verdict"] == "passed", planted.auc_decision  # a shifted bias keeps the ranking
    lines = "\n".join(judgement_lines(report.to_json()))  # report.md: the decisions with their bounds
    assert "| tflite_int8 |" in lines and "refused:" in lines and "95 % confidence" in lines, lines
