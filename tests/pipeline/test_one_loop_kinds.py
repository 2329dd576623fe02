"""Every kind and task through the one training loop (issue 39), on data written here: a breast-cancer CSV with
named columns (`mlp` binary with normalisation, and `tabular` binary on two workers over `tfship train`), a
diabetes CSV (`tabular` regression with accumulation and early stopping on the validation MAE), shop TFRecords
with a string category (`tabular` classification, the vocabulary from the counted pass, a gradient-penalty step
and a frozen layer) and the design's recommender (binary) resumed at another K to the weights of an
uninterrupted run."""

from __future__ import annotations

import csv
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from tests.pipeline.conftest import run_tfship
from tfship.core.errors import StageError
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.data.splits import load_splits
from tfship.pipeline.training.train import TrainInputs, train_model

pytestmark = pytest.mark.slow
FAST = {"jit_compile": False, "tensorboard": False, "clip_global_norm": 0.0}


def _csv(path: Path, header, rows) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def breast_cancer(path: Path) -> Path:
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    return _csv(path, [*bunch.feature_names, "diagnosis"],
                [[*map(float, x), int(y)] for x, y in zip(bunch.data, bunch.target, strict=True)])


def diabetes(path: Path) -> Path:
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes()  # 442 rows, target 25..346
    return _csv(path, [*bunch.feature_names, "progression"],
                [[*map(float, x), float(y)] for x, y in zip(bunch.data, bunch.target, strict=True)])


def _config(data: dict, model: dict, train: dict, folder: Path) -> PipelineConfig:
    return PipelineConfig.model_validate({"run": {"seed": 3, "runs_dir": str(folder / "runs")}, "data": data,
                                          "model": model, "train": FAST | train})


def _train(config: PipelineConfig, folder: Path, resume: bool = False, log=None):
    splits = load_splits(config, folder / "scan")
    return train_model(TrainInputs(config, splits, folder / "checkpoints", resume=resume, log=log)), splits


def test_mlp_trains_a_breast_cancer_csv_as_binary_with_normalisation(tmp_path):
    config = _config({"source": "csv", "path": str(breast_cancer(tmp_path / "cancer.csv")), "label": "diagnosis",
                      "batch_size": 32, "test_fraction": 0.25, "validation_fraction": 0.15},
                     {"kind": "mlp", "task": "binary", "normalize": True, "hidden_units": [16], "dropout": 0.0},
                     {"epochs": 20, "learning_rate": 1e-3}, tmp_path)
    result, splits = _train(config, tmp_path)
    summary = result.summary()
    assert splits.task == "binary" and summary["task"] == "binary" and summary["trainer"] == "tape_loop"
    assert summary["test_auc"] > 0.97, summary["test_metrics"]  # a scaled logistic regression reaches ~0.99
    assert result.model.outputs[0].shape[-1] == 1 and "normalize" in [layer.name for layer in result.model.layers]


def test_check_numerics_passes_a_clean_binary_step_and_names_a_broken_one(tmp_path):
    """Binary cross-entropy (the hand-written, clipped one) raises no check-numerics report on clean data; a
    feature column holding infinities does, naming the op and the step."""
    rows = [[float(i % 7), float(i % 3), i % 2] for i in range(400)]
    clean = _csv(tmp_path / "clean.csv", ["a", "b", "y"], rows)
    data = {"source": "csv", "path": str(clean), "label": "y", "batch_size": 32}
    model = {"kind": "mlp", "task": "binary", "hidden_units": [8], "dropout": 0.0}
    result, _ = _train(_config(data, model, {"epochs": 1, "check_numerics": True}, tmp_path / "a"), tmp_path / "a")
    assert result.summary()["debug"]["check_numerics"] and result.steps > 0
    for row in rows[::10]:
        row[0] = float("inf")  # every split gets some
    broken = _csv(tmp_path / "broken.csv", ["a", "b", "y"], rows)
    with pytest.raises(StageError, match=r"check_numerics: op '\w+' produced NaN or Inf.*at step \d+"):
        _train(_config(data | {"path": str(broken)}, model,
                       {"epochs": 1, "check_numerics": True}, tmp_path / "b"), tmp_path / "b")


def test_tabular_regression_with_accumulation_and_early_stopping_on_the_validation_mae(tmp_path):
    config = _config({"source": "csv", "path": str(diabetes(tmp_path / "diabetes.csv")), "label": "progression",
                      "batch_size": 16, "test_fraction": 0.2, "validation_fraction": 0.2},
                     {"kind": "tabular", "task": "regression", "normalize": True, "hidden_units": [32, 16]},
                     {"epochs": 200, "learning_rate": 1e-2, "accumulation_steps": 2, "early_stopping_patience": 3,
                      "early_stopping_metric": "validation_metric"}, tmp_path)
    result, splits = _train(config, tmp_path)
    summary = result.summary()
    labels = splits.test.labels
    assert summary["stopped_early"] and len(result.history) < 200
    assert summary["optimizer_updates"] == result.steps // 2 and summary["accumulation_steps"] == 2
    # far below the error of always predicting the mean (~64 on this target), and both figures reported
    assert summary["test_mae"] < 0.8 * float(np.mean(np.abs(labels - labels.mean()))), summary["test_metrics"]
    assert {"mae", "rmse", "loss"} <= set(summary["test_metrics"]) and result.test_accuracy is None
    assert result.history[-1].metric == "mae" and result.history[-1].train_accuracy is None


def _shops(path: Path, rows: int = 1500) -> Path:
    import tensorflow as tf

    rng = np.random.default_rng(5)
    countries = np.array([b"de", b"fr", b"it"])
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(rows):
            index = int(rng.integers(0, 3))
            price = (rng.normal(size=2) + index).astype(np.float32)
            feature = {"country": tf.train.Feature(bytes_list=tf.train.BytesList(value=[countries[index]])),
                       "price": tf.train.Feature(float_list=tf.train.FloatList(value=price)),
                       "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[index]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return path


def test_tabular_classification_of_raw_strings_with_a_gradient_penalty_and_a_frozen_layer(tmp_path):
    spec = {"country": {"dtype": "string", "kind": "categorical"}, "price": {"shape": [2]},
            "label": {"dtype": "int64"}}
    config = _config({"source": "tfrecord", "path": str(_shops(tmp_path / "shops.tfrecord")), "label": "label",
                      "feature_spec": spec, "classes": ["de", "fr", "it"], "batch_size": 32},
                     {"kind": "tabular", "task": "classification", "hidden_units": [16, 8], "embedding_dim": 4},
                     {"epochs": 3, "step": {"kind": "gradient_penalty", "penalty_weight": 0.01},
                      "freeze": ["dense1"], "assert_inputs": True}, tmp_path)
    result, splits = _train(config, tmp_path)
    summary = result.summary()
    assert summary["step_kind"]["kind"] == "gradient_penalty" and summary["frozen"]["layers"] == ["dense1"]
    assert summary["test_accuracy"] > 0.9  # the country names the class
    model_inputs = {tensor.name: tensor.dtype for tensor in result.model.inputs}
    assert model_inputs["country"] == "string"  # raw strings in, StringLookup inside the model
    probe = result.model({"country": np.array([["fr"]]), "price": np.array([[1.0, 1.0]], np.float32)})
    assert int(np.argmax(np.asarray(probe))) == 1


def _recommender(folder: Path) -> tuple[dict, dict]:
    from tfship.pipeline.data.recommender_data import (
        RecommenderDataSpec,
        recommender_feature_spec,
        write_recommender_data,
    )

    spec = RecommenderDataSpec(records=4000, shards=4, users=500, items=300, history_length=6, clusters=4)
    manifest = write_recommender_data(folder, spec, say=lambda line: None)
    data = {"source": "tfrecord", "feature_spec": recommender_feature_spec(spec), "label": "label",
            "batch_size": 64, **{f"{split}_path": str(folder / manifest[split][0])
                                 for split in ("validation", "test")},
            "train_path": str(folder / "part-0000[01]-of-00004.tfrecord")}
    return data, manifest


def test_the_recommender_resumes_at_another_k_to_the_weights_of_an_uninterrupted_run(tmp_path):
    data, manifest = _recommender(tmp_path / "data")
    model = {"kind": "recommender", "task": "binary", "hidden_units": [16], "embedding_dim": 8,
             "factory_args": {"pooling": "mean"}}
    train = {"epochs": 2, "deterministic": True, "checkpoint_every_steps": 10, "optimizer": "sgd",
             "learning_rate": 0.05}
    full, _ = _train(_config(data, model, train | {"steps_per_execution": 1}, tmp_path / "full"), tmp_path / "full")

    def stop_after_step_20(line: str) -> None:
        if line.startswith("checkpoint saved: step 20 "):
            os.kill(os.getpid(), signal.SIGTERM)

    cut = tmp_path / "cut"
    with pytest.raises(StageError, match=r"stopped by SIGTERM at step 20 of"):
        _train(_config(data, model, train | {"steps_per_execution": 6}, cut), cut, log=stop_after_step_20)
    resumed, _ = _train(_config(data, model, train | {"steps_per_execution": "auto"}, cut), cut, resume=True)
    assert resumed.summary()["resumed_from_step"] == 20 and resumed.steps == full.steps
    for a, b in zip(full.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert resumed.summary()["sparse_gradients"]  # the embedding tables' gradients stayed IndexedSlices
    assert resumed.summary()["test_auc"] > 0.5


def test_two_workers_train_a_named_csv_as_binary_through_tfship_train(tmp_path):
    path = breast_cancer(tmp_path / "cancer.csv")
    config = tmp_path / "cancer.toml"
    config.write_text(f"""
[run]
model_name = "cancer"
runs_dir = "{tmp_path / 'runs'}"

[data]
source = "csv"
path = "{path}"
label = "diagnosis"
batch_size = 32

[model]
kind = "tabular"
task = "binary"
normalize = true
hidden_units = [16]

[train]
epochs = 4
jit_compile = false
tensorboard = false
checkpoint_every_steps = 5
""")
    completed = run_tfship("train", "--config", str(config), "--workers", "2", timeout=400)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    (chief,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    train = json.loads((chief / "train.json").read_text())
    assert train["strategy"] == "multi_worker" and train["replicas"] == 2 and train["task"] == "binary"
    assert train["train_step_traces"] == 1 and train["test_auc"] > 0.9
    inputs = train["inputs"]
    assert "mean_radius" in inputs and len(inputs) == 30  # one named input per column, names made valid


def cancer_factory(specs, task, num_classes, width=8):
    """A user's own model over named inputs (`model.factory`): every column concatenated, one hidden layer."""
    import keras

    inputs = {spec.name: keras.Input(shape=spec.shape, name=spec.name, dtype=spec.dtype) for spec in specs}
    columns = [keras.layers.Reshape((1,))(inputs[spec.name]) if not spec.shape else inputs[spec.name]
               for spec in specs]
    hidden = keras.layers.Dense(width, activation="relu", name="user_hidden")(
        keras.layers.BatchNormalization(name="user_scale")(keras.layers.Concatenate()(columns)))
    return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid", name="probability")(hidden))


def test_a_users_factory_over_named_columns_with_recompute(tmp_path):
    config = _config({"source": "csv", "path": str(breast_cancer(tmp_path / "cancer.csv")), "label": "diagnosis",
                      "batch_size": 32},
                     {"kind": "tabular", "task": "binary", "factory": "tests.pipeline.test_one_loop_kinds:cancer_factory",
                      "factory_args": {"width": 8}, "recompute": ["user_hidden"]},
                     {"epochs": 3, "steps_per_execution": 1}, tmp_path)
    result, _ = _train(config, tmp_path)
    summary = result.summary()
    assert summary["recompute"] == ["user_hidden"] and summary["steps_per_execution"]["mean_steps_per_block"] == 1.0
    assert "user_hidden" in [layer.name for layer in result.model.layers] and summary["test_auc"] > 0.9
