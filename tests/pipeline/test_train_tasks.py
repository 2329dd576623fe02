"""`tfship train` / `tfship run` with named inputs and every task (model.task = classification | binary |
regression, model.kind = tabular | recommender): refusals before any data is read, the loss and the metric in
train.json, the gate's metric in the parity report, and `promote --task` refusing on it.

The data is generated here: tf.Examples with a dense [3] feature, a categorical id and a padded sequence of ids,
with a planted signal s = x0 + 1.5 [id == 2] + 0.5 (# of 3s in the sequence); the label is s (regression),
[s > median] (binary) or its tercile (classification, 3 classes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tfship.core.errors import ConfigError
from tfship.core.tasks import primary, task_metrics
from tfship.pipeline.config import load_config

ENV = os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2", "COLUMNS": "200"}
TFSHIP = str(Path(sys.executable).with_name("tfship"))


def write_examples(path: Path, rows: int, task: str, seed: int = 0) -> None:
    """`rows` tf.Examples (see the module docstring) into one TFRecord file."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    dense = rng.normal(size=(rows, 3)).astype(np.float32)
    ids = rng.integers(0, 6, rows)
    lengths = rng.integers(0, 5, rows)  # 0..4 ids: some rows are all padding
    sequences = [rng.integers(1, 10, n) for n in lengths]
    signal = dense[:, 0] + 1.5 * (ids == 2) + 0.5 * np.array([np.sum(s == 3) for s in sequences])
    if task == "regression":
        labels = signal.astype(np.float32)
    elif task == "binary":
        labels = (signal + rng.normal(scale=0.3, size=rows) > np.median(signal)).astype(np.int64)
    else:
        labels = np.digitize(signal, np.quantile(signal, [1 / 3, 2 / 3])).astype(np.int64)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for row in range(rows):
            label = (tf.train.Feature(float_list=tf.train.FloatList(value=[labels[row]])) if task == "regression"
                     else tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[row]])))
            features = {"dense": tf.train.Feature(float_list=tf.train.FloatList(value=dense[row])),
                        "shop": tf.train.Feature(int64_list=tf.train.Int64List(value=[ids[row]])),
                        "visits": tf.train.Feature(int64_list=tf.train.Int64List(value=sequences[row])),
                        "label": label}
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())


def config_text(folder: Path, task: str, **extra: str) -> str:
    """A tabular config over `folder`/data.tfrecord for `task` (`extra`: "section.key" -> TOML value)."""
    label_dtype = "float32" if task == "regression" else "int64"
    classes = 'classes = ["low", "mid", "high"]\n' if task == "classification" else ""
    text = f"""
[run]
model_name = "shops_{task}"
runs_dir = "{folder / 'runs'}"
seed = 3

[data]
source = "tfrecord"
path = "{folder / 'data.tfrecord'}"
label = "label"
{classes}batch_size = 32
sample_size = 300
validation_fraction = 0.15
test_fraction = 0.25

[data.feature_spec.dense]
shape = [3]
[data.feature_spec.shop]
dtype = "int64"
kind = "categorical"
num_ids = 6
[data.feature_spec.visits]
dtype = "int64"
kind = "sequence"
num_ids = 10
length = 4
[data.feature_spec.label]
dtype = "{label_dtype}"

[model]
kind = "tabular"
task = "{task}"
hidden_units = [32, 16]
embedding_dim = 8
dropout = 0.0

[train]
epochs = 12
learning_rate = 0.01

[convert]
tflite_modes = ["float32"]

[publish]
repository = "{folder / 'models'}"
"""
    for dotted, value in extra.items():
        section, key = dotted.split(".", 1)
        text = text.replace(f"[{section}]\n", f"[{section}]\n{key} = {value}\n", 1)
    return text


def _tfship(*words: str, cwd: Path, expect: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run([TFSHIP, *words], cwd=cwd, capture_output=True, text=True, timeout=900, env=ENV)
    assert done.returncode == expect, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _config(tmp_path: Path, task: str, **extra: str) -> Path:
    path = tmp_path / f"{task}.toml"
    path.write_text(config_text(tmp_path, task, **extra))
    return path


# --- refused before any data is read (no data file exists in these tests) ---------------------------------------


def test_a_wrong_task_is_refused_naming_the_key_and_value(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_config(_config(tmp_path, "binary"), {"model.task": "ordinal"})
    assert "model.task" in str(caught.value) and "'ordinal'" in str(caught.value)
    done = _tfship("train", "--config", str(_config(tmp_path, "binary")), "--set", "model.task=ordinal",
                   cwd=tmp_path, expect=2)
    line = done.stderr.strip()
    assert "\n" not in line and "model.task" in line and "ordinal" in line, line


@pytest.mark.parametrize(("overrides", "named"), [
    ({"model.kind": "cnn"}, ("model.kind = 'cnn'", "3 model inputs")),
    ({"data.feature_spec.visits.ragged": True}, ("data.feature_spec.visits.ragged = true",
                                                 "data.feature_spec.visits.length")),
    ({"model.task": "classification", "data.feature_spec.label.dtype": "float32"},
     ("data.feature_spec.label.dtype = 'float32'", "'classification'")),
    ({"model.normalize": True, "model.factory": "x:y"}, ("model.normalize = true", "model.factory")),
])
def test_what_the_named_path_cannot_train_is_refused_before_reading(tmp_path, overrides, named):
    from tfship.pipeline.training.input_specs import check_trainable

    config = load_config(_config(tmp_path, "binary"), overrides)
    assert not (tmp_path / "data.tfrecord").exists()  # nothing to read: the refusal comes first
    with pytest.raises(ConfigError) as caught:
        check_trainable(config)
    message = str(caught.value)
    assert "\n" not in message and all(part in message for part in named), message


@pytest.mark.parametrize("command", ["train", "run"])
def test_a_config_that_cannot_train_leaves_no_run_folder(tmp_path, command):
    """tfship train and tfship run refuse before the run folder exists: nothing half-made to clean up."""
    done = _tfship(command, "--config", str(_config(tmp_path, "binary")), "--set", "model.kind=cnn", cwd=tmp_path,
                   expect=2)
    assert "model.kind = 'cnn'" in done.stderr.strip().splitlines()[-1], done.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_classification_needs_its_classes_only_without_a_scan_and_a_good_config_passes(tmp_path):
    from tfship.pipeline.training.input_specs import check_trainable

    good = load_config(_config(tmp_path, "classification"))
    assert [s.name for s in check_trainable(good)] == ["dense", "shop", "visits"]
    undeclared = load_config(_config(tmp_path, "classification"), {"data.classes": []})
    assert len(check_trainable(undeclared)) == 3  # the scan finds the class names
    sizes = {"data.classes": [], "data.split_sizes": {"train": 8, "validation": 2, "test": 2}}
    with pytest.raises(ConfigError, match=r"data\.classes = \[\]: data.split_sizes skips"):
        check_trainable(load_config(_config(tmp_path, "classification"), sizes))
    one_input_cnn = load_config(_config(tmp_path, "classification"), {"model.kind": "cnn"})
    with pytest.raises(ConfigError, match=r"model.kind = 'cnn'.*3 model inputs.*model.kind = 'tabular'"):
        check_trainable(one_input_cnn)


def test_the_factories_refuse_a_ragged_sequence_naming_the_feature_and_length():
    from tfship.pipeline.training.input_specs import InputSpec
    from tfship.pipeline.training.multi_input import tabular

    ragged = InputSpec("visits", "visits", "sequence", "int64", (None,), "int64", (), 10, True)
    with pytest.raises(ValueError) as caught:
        tabular((ragged,), "binary")
    assert "data.feature_spec.visits.ragged = true" in str(caught.value)
    assert "data.feature_spec.visits.length" in str(caught.value)


# --- trained through `tfship train` ------------------------------------------------------------------------------

def _recomputed(run: Path, config) -> dict[str, float]:
    """The task's figures of the saved `model.keras` on the whole test split, computed here."""
    import keras

    import tfship.pipeline.training.sparse_embedding  # noqa: F401
    from tfship.pipeline.data.splits import load_splits

    model = keras.models.load_model(run / "model.keras")
    splits = load_splits(config, None)
    outputs, labels = [], []
    for batch, batch_labels in splits.test.dataset(128, training=False, seed=0):
        outputs.append(np.asarray(model(batch, training=False)))
        labels.append(batch_labels.numpy())
    return task_metrics(config.model.task, np.concatenate(outputs), np.concatenate(labels))


@pytest.fixture(scope="module", params=["classification", "binary", "regression"])
def shipped(request, tmp_path_factory):
    """One `tfship run` per task (v1 of shops_<task>), shared by the train.json test and the gate/query/promote
    test: the run's train stage is the same training `tfship train` runs (`tfship train` itself is run below on
    a bad label, and in test_one_loop_kinds / test_tasks_and_inputs)."""
    task = request.param
    folder = tmp_path_factory.mktemp(f"shipped_{task}")
    write_examples(folder / "data.tfrecord", 1200, task)
    config_path = _config(folder, task)
    done = _tfship("run", "--config", str(config_path), cwd=folder)
    (run,) = [p for p in (folder / "runs").iterdir() if not p.name.startswith(".")]  # .data-scan: the scan
    return {"task": task, "folder": folder, "config": config_path, "run": run, "done": done}


@pytest.mark.slow
def test_tfship_run_trains_each_task_and_train_json_carries_its_metric(shipped):
    task, run, done = shipped["task"], shipped["run"], shipped["done"]
    assert "ran out of data" not in done.stderr and "shuffle=True" not in done.stderr, done.stderr[-2000:]
    train = json.loads((run / "train.json").read_text())
    metric = primary(task).name
    assert train["task"] == task and train["metric"] == metric
    assert train["trainer"] == "tape_loop" and train["train_step_traces"] == 1  # the one loop's step, traced once
    recomputed = _recomputed(run, load_config(shipped["config"]))
    assert train[f"test_{metric}"] == pytest.approx(recomputed[metric], abs=1e-5)
    history = train["history"]
    assert history[-1]["loss"] < history[0]["loss"]  # the task's loss went down
    if task == "regression":
        labels_std = 1.0  # s has std >= 1 (x0 alone is N(0, 1)): MAE far below it means the signal was learnt
        assert train["test_mae"] < 0.5 * labels_std and train["test_accuracy"] is None
    elif task == "binary":
        assert train["test_auc"] > 0.85
    else:
        assert train["test_accuracy"] > 0.6  # 3 balanced classes: chance is 1/3


def test_a_label_outside_the_task_range_stops_naming_the_label(tmp_path):
    write_examples(tmp_path / "data.tfrecord", 300, "classification")  # class ids 0..2 given to a binary task
    done = _tfship("train", "--config", str(_config(tmp_path, "binary")), cwd=tmp_path, expect=2)
    line = done.stderr.strip().splitlines()[-1]
    assert "tfship train: DatasetError" in line and "data.tfrecord" in line, line
    assert "label '2' is not 0 or 1 (model.task = 'binary')" in line, line


# --- the whole run: the gate's metric, `tfship query --run` and `promote --task` --------------------------------

QUERY_LINE = {"classification": r"accuracy[^\n]*?(\d+\.\d+)", "binary": r"auc: (\d+\.\d{4})",
              "regression": r"mae: (\d+\.\d{4})"}


def _gate_metric(run: Path) -> str:
    """The parity report's task metric, by the task metric's name (the gate writes accuracy in percent)."""
    return json.loads((run / "parity.json").read_text())["metric"].removesuffix("_%")


@pytest.mark.slow
def test_tfship_run_gates_queries_and_promotes_on_the_task_metric(shipped):
    import re

    import tfship

    task, tmp_path, config_path, good = shipped["task"], shipped["folder"], shipped["config"], shipped["run"]
    name, models = f"shops_{task}", tmp_path / "models"
    held_out = good / "held_out.npz"
    with np.load(held_out) as archive:
        assert sorted(archive.files) == ["dense", "shop", "visits", "y"]  # named inputs, as served
        rows = {k: archive[k] for k in archive.files}
    labels = rows.pop("y")
    with tfship.serve(models, name) as served:  # the published model, queried by the run's held-out rows
        query = _tfship("query", "--target", served.grpc, "--model-name", name, "--run", str(good), "--config",
                        str(config_path), "--count", "300", cwd=tmp_path).stdout
        outputs = served.client("grpc").predict(rows)
    metric = primary(task).name
    served_value = task_metrics(task, next(iter(outputs.values())), labels)[metric]
    printed = re.search(QUERY_LINE[task], query)
    assert printed, query
    scale = 100.0 if task == "classification" and float(printed.group(1)) > 1.0 else 1.0
    assert float(printed.group(1)) / scale == pytest.approx(served_value, abs=1e-3)
    _tfship("promote", name, "1", "--label", "stable", "--repository", str(models), cwd=tmp_path)
    # A barely trained candidate: v2. Only its SavedModel matters to `promote` (ONNX is left to v1's run).
    _tfship("run", "--config", str(config_path), "--set", "train.max_steps=1", "--set", "train.learning_rate=1e-5",
            "--set", "convert.onnx=false", cwd=tmp_path)
    refused = _tfship("promote", name, "2", "--label", "stable", "--repository", str(models), "--data",
                      str(held_out), "--task", task, cwd=tmp_path, expect=2)
    assert f"{metric} " in refused.stderr and "worse than stable v1" in refused.stderr, refused.stderr
    assert _gate_metric(good) == metric


def test_the_text_model_pools_all_padding_rows_without_nan():
    import tensorflow as tf

    from tfship.pipeline.training.model import build_model
    from tfship.pipeline.training.sparse_embedding import MaskedMean

    config = load_config(None, {"model.kind": "text", "model.vocab_size": 20, "model.embedding_dim": 4})
    model = build_model(config.model, (6,), 2, 0, input_name="tokens", input_dtype="int32")
    assert isinstance(model.get_layer("pool"), MaskedMean)
    tokens = np.array([[0] * 6, [3, 4, 0, 0, 0, 0]], np.int32)  # the first row is all padding
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tokens, training=True))
    gradients = tape.gradient(loss, model.trainable_variables)
    values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in gradients]
    assert all(bool(tf.reduce_all(tf.math.is_finite(v))) for v in values)
    pooled = keras_pool_gradient_is_nan()
    assert pooled, "Keras' GlobalAveragePooling1D no longer gives NaN on an all-padding row: revisit MaskedMean"


def keras_pool_gradient_is_nan() -> bool:
    """Whether Keras' own masked GlobalAveragePooling1D gives NaN for an all-padding row (0 / 0 in its value; the
    loss and every gradient behind it then are NaN: the reason the text model pools with MaskedMean)."""
    import keras
    import tensorflow as tf

    embedded = tf.Variable(tf.ones([1, 3, 2]))
    with tf.GradientTape() as tape:
        pooled = keras.layers.GlobalAveragePooling1D()(embedded, mask=tf.zeros([1, 3], tf.bool))
        loss = tf.reduce_sum(pooled)
    return bool(tf.math.is_nan(loss)) or bool(tf.reduce_any(tf.math.is_nan(tape.gradient(loss, embedded))))
