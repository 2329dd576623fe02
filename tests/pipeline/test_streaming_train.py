"""The training loop on streamed TFRecord shards: input figures (records/s, input-wait share) in train.json and
TensorBoard, progress lines when stderr is no terminal, iterator position across a stop and resume, and
`train.assert_inputs` stopping with one line (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tfship.pipeline.config import load_config
from tfship.pipeline.data.splits import load_split_arrays
from tfship.pipeline.training.train import TrainInputs, train_model

REPO_ROOT = Path(__file__).resolve().parents[2]


def write_digits_shards(folder: Path, shards: int) -> str:
    """scikit-learn's digits as `shards` TFRecord files of tf.Example {image: float32[64] in [0, 1], label: int64,
    id: int64}; returns their glob."""
    import tensorflow as tf
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images.astype(np.float32) / 16.0).reshape(-1, 64)
    for shard in range(shards):
        with tf.io.TFRecordWriter(str(folder / f"digits-{shard:03d}.tfrecord")) as writer:
            for i in range(shard, len(images), shards):
                feature = {"image": tf.train.Feature(float_list=tf.train.FloatList(value=images[i])),
                           "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(bunch.target[i])])),
                           "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return str(folder / "digits-*.tfrecord")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_digits_shards(tmp_path_factory.mktemp("shards"), 8)


def _config(shards, **extra):
    overrides = {"data.source": "tfrecord", "data.path": shards, "data.input_name": "image",
                 "data.feature_spec": {"image": {"dtype": "float32", "shape": [64]}}, "data.features": ["image"],
                 "model.kind": "mlp", "model.hidden_units": [64], "train.jit_compile": False, "train.epochs": 3}
    return load_config(None, overrides | extra)


def test_streamed_training_reports_input_figures_and_progress_lines(shards, tmp_path):
    config = _config(shards, **{"train.progress_every_s": 0.001, "train.assert_inputs": True,
                                "model.normalize": True, "data.sample_size": 300})
    splits = load_split_arrays(config.data, config.run.seed)
    assert len(splits.train) > 300 and splits.train.images.shape == (300, 64)
    lines: list[str] = []
    result = train_model(TrainInputs(config, splits, tmp_path / "checkpoints", tmp_path / "tensorboard",
                                     log=lines.append))
    summary = result.summary()
    figures = summary["input"]
    assert figures["records_per_second"] > 0 and 0.0 <= figures["input_wait_share"] <= 1.0
    assert figures["steps_measured"] == result.steps - 1 and figures["skipped_records"] == 0
    assert result.steps == 3 * (len(splits.train) // 64)
    assert result.test_accuracy > 0.85  # a 64-unit MLP on digits, 3 epochs: ~0.9-0.95
    normalize = result.model.get_layer("normalize")  # adapted on the 300-record train sample, not the split
    np.testing.assert_allclose(normalize.mean.numpy().ravel(), splits.train.images.mean(axis=0), atol=1e-5)
    progress = [line for line in lines if line.startswith("train: step ")]
    assert progress and all("records/s" in line and "input wait" in line and "ETA" in line for line in progress)
    assert progress[-1].startswith(f"train: step {result.steps}/{result.steps} epoch 3 loss ")
    import tensorflow as tf

    tags = {value.tag for file in (tmp_path / "tensorboard" / "train").glob("events.out.tfevents.*")
            for event in tf.compat.v1.train.summary_iterator(str(file)) for value in event.summary.value}
    assert {"input/records_per_second", "input/input_wait_share"} <= tags


def test_resumed_run_consumes_the_records_of_an_uninterrupted_run(shards, tmp_path):
    """The data iterator is checkpointed: stopped after 7 steps and resumed, the run reads the same records in
    the same order as one that never stopped (same batches, so bit-identical weights under determinism)."""
    config = _config(shards, **{"train.epochs": 2, "train.deterministic": True, "data.batch_size": 32})
    splits = load_split_arrays(config.data, config.run.seed)
    full = train_model(TrainInputs(config, splits, tmp_path / "full"))
    stopped = config.model_copy(update={"train": config.train.model_copy(update={"max_steps": 7})})
    train_model(TrainInputs(stopped, splits, tmp_path / "part"))
    resumed = train_model(TrainInputs(config, splits, tmp_path / "part", resume=True))
    assert resumed.summary()["resumed_from_step"] == 7 and resumed.steps == full.steps
    for a, b in zip(full.model.get_weights(), resumed.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_iterator_checkpoint_restores_the_exact_record_position(shards, tmp_path):
    """At the data level: ids read by 5 + 5 batches across an iterator checkpoint equal 10 uninterrupted batches."""
    import tensorflow as tf

    from tfship.pipeline.config import DataSection
    from tfship.pipeline.data.stream import StreamSplit

    spec = {"id": {"dtype": "int64", "shape": [1]}}
    data = DataSection(source="tfrecord", path=shards, feature_spec=spec, features=("id",))
    train = load_split_arrays(data, 0).train
    assert isinstance(train, StreamSplit)

    def batches():
        return train.dataset(16, training=True, seed=3, repeat=True)

    whole = [x.numpy()[:, 0].tolist() for x, _ in batches().take(10)]
    iterator = iter(batches())
    first = [next(iterator)[0].numpy()[:, 0].tolist() for _ in range(5)]
    saved = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "position"))
    again = iter(batches())
    tf.train.Checkpoint(iterator=again).read(saved).assert_consumed()
    second = [next(again)[0].numpy()[:, 0].tolist() for _ in range(5)]
    assert first + second == whole
    assert len({i for batch in whole for i in batch}) > 100  # shuffled across files, not one file's run


def test_assert_inputs_nan_is_one_line_naming_check_feature_and_record(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype(np.float32)  # row 37 falls in the train split (seed 42)
    x[37, 2] = np.nan
    np.savez(tmp_path / "data.npz", x=x, label=(x[:, 0] > 0).astype(np.int64))
    command = [sys.executable, "-m", "tfship.pipeline.cli", "train", "--runs-dir", str(tmp_path / "runs"),
               "--set", "data.source=npz", "--set", f"data.path={tmp_path / 'data.npz'}",
               "--set", "train.assert_inputs=true", "--set", "model.kind=mlp", "--set", "train.epochs=1",
               "--set", "train.jit_compile=false"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "DatasetError" in line]
    assert len(errors) == 1 and "Traceback" not in done.stderr
    assert errors[0].endswith(f"train.assert_inputs: NaN or Inf in the inputs: feature 'x', record 37 (0-based) of "
                              f"{tmp_path / 'data.npz'} (1 such record(s) in the train split)")


QUIET_LOAD = """
import sys, tensorflow as tf
from tfship.serving.runtimes.saved_model import GraphSession
from tfship.serving.runtimes.base import RuntimeOptions
from tfship.core.saved_model import read_signatures, serving_tags

class Double(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
    def double(self, x):
        return {"y": x * 2.0}

module = Double()
tf.saved_model.save(module, sys.argv[1], signatures={"serving_default": module.double})
tags = serving_tags(sys.argv[1])
GraphSession(__import__("pathlib").Path(sys.argv[1]), tags, read_signatures(sys.argv[1], tags), RuntimeOptions())
print("LOADED-OURS", file=sys.stderr, flush=True)
with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    tf.compat.v1.saved_model.load(session, tags, sys.argv[1])
"""


def test_our_saved_model_loader_prints_no_deprecation_notice(tmp_path):
    """Our Session loader is silent; TensorFlow's same call outside it prints the notice (the check can fail)."""
    done = subprocess.run([sys.executable, "-c", QUIET_LOAD, str(tmp_path / "model")], capture_output=True, text=True,
                          timeout=300, env=os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr[-2000:]
    ours, theirs = done.stderr.split("LOADED-OURS")
    assert "is deprecated" not in ours
    assert "is deprecated" in theirs


@pytest.mark.slow
def test_two_workers_train_on_streamed_shards_each_reading_its_own_files(shards, tmp_path):
    """multi_worker on 8 TFRecord shards: two `tfship train` processes on loopback, each reading 4 of the files
    (by file: files >= workers), train together to the same model quality as one process."""
    import json
    import socket

    sockets = [socket.socket() for _ in range(2)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    workers = [f"127.0.0.1:{s.getsockname()[1]}" for s in sockets]
    for s in sockets:
        s.close()
    settings = ["--set", "train.strategy=multi_worker", "--set", "train.epochs=4", "--set", "train.tensorboard=false",
                "--set", "data.source=tfrecord", "--set", f"data.path={shards}", "--set", "data.input_name=image",
                "--set", "data.features=[\"image\"]", "--set", "model.kind=mlp", "--set", "model.hidden_units=[64]",
                "--set", 'data.feature_spec={image = {dtype = "float32", shape = [64]}}']
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = {**os.environ, "TF_CONFIG": json.dumps(tf_config), "TF_CPP_MIN_LOG_LEVEL": "3", "COLUMNS": "300"}
        command = [str(Path(sys.executable).with_name("tfship")), "train", *settings,
                   "--runs-dir", str(tmp_path / f"worker{index}")]
        processes.append(subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=900)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert not any("sharded by record" in o for o in outputs)  # 8 files for 2 workers: by file
    (chief,) = [p for p in (tmp_path / "worker0").iterdir() if not p.name.startswith(".")]
    train = json.loads((chief / "train.json").read_text())
    assert train["strategy"] == "multi_worker" and train["replicas"] == 2 and train["global_batch"] == 128
    assert train["train_step_traces"] == 1 and train["test_accuracy"] > 0.8


def test_query_samples_of_a_streamed_config_come_from_the_test_split(shards, tmp_path):
    """`tfship query`'s rows (`held_out_digits`) for a TFRecord config: the bounded test-split sample, read
    through the scan cached beside the runs (a second call reads no data again)."""
    from tfship.pipeline.data.splits import held_out_digits

    config = tmp_path / "streamed.toml"
    config.write_text(f"""[run]
runs_dir = "{tmp_path / 'runs'}"
[data]
source = "tfrecord"
path = "{shards}"
features = ["image"]
input_name = "image"
sample_size = 40
[data.feature_spec.image]
dtype = "float32"
shape = [8, 8, 1]
""")
    images, labels = held_out_digits(1000, config)
    assert images.shape == (40, 8, 8, 1) and labels.shape == (40,) and set(labels.tolist()) <= set(range(10))
    (cached,) = (tmp_path / "runs" / ".data-scan").glob("*.json")
    stamp = cached.stat().st_mtime_ns
    again, _ = held_out_digits(5, config)
    np.testing.assert_array_equal(again, images[:5])
    assert cached.stat().st_mtime_ns == stamp
