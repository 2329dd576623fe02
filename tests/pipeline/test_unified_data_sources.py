"""The one loader (`pipeline.data.splits.load_splits`) for named inputs and every task: a breast-cancer CSV with
named columns (binary), a diabetes CSV (regression), a TFRecord with a string categorical feature whose
vocabulary the scan finds, bad labels named by file and record, declared split sizes that skip the scan, and a
checkpointable training iterator over named CSV records. All data is written here (scikit-learn's bundled sets).
"""

from __future__ import annotations

import csv

import numpy as np
import pytest

from tfship.core.errors import ConfigError, DatasetError
from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.data.splits import load_splits
from tfship.pipeline.training.input_specs import check_trainable


def write_csv(path, header, rows) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def breast_cancer_csv(path):
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    header = [*bunch.feature_names, "diagnosis"]  # "mean radius": not a valid input name
    write_csv(path, header, [[*map(float, x), int(y)] for x, y in zip(bunch.data, bunch.target, strict=True)])
    return bunch


def config(**sections) -> PipelineConfig:
    return PipelineConfig.model_validate({"run": {"seed": 1}, **sections})


def test_a_breast_cancer_csv_gives_binary_dict_batches_of_named_columns(tmp_path):
    bunch = breast_cancer_csv(tmp_path / "cancer.csv")
    cfg = config(data={"source": "csv", "path": str(tmp_path / "cancer.csv"), "label": "diagnosis",
                       "sample_size": 50}, model={"kind": "tabular", "task": "binary"})
    check_trainable(cfg)
    splits = load_splits(cfg, tmp_path / "scan")
    assert splits.task == "binary" and splits.class_names == ("0", "1")
    assert len(splits.specs) == 30 and splits.specs[0].name == "mean_radius" and splits.specs[0].feature == "mean radius"
    assert all(s.kind == "dense" and s.dtype == "float32" and s.shape == () for s in splits.specs)
    assert len(splits.train) + len(splits.validation) + len(splits.test) == len(bunch.target)
    inputs, labels = next(iter(splits.train.dataset(32, training=True, seed=0)))
    assert set(inputs) == {s.name for s in splits.specs}
    assert inputs["mean_radius"].dtype.name == "float32" and inputs["mean_radius"].shape == (32,)
    assert labels.dtype.name == "int64" and labels.shape == (32,) and set(labels.numpy()) <= {0, 1}
    assert list(splits.stream["scan"]["labels"]) == []  # binary: no label vocabulary collected
    sample = splits.test.images
    assert isinstance(sample, dict) and sample["mean_radius"].shape == (50,) and splits.test.labels.shape == (50,)
    row = int(np.flatnonzero(np.isclose(bunch.data[:, 0], sample["mean_radius"][0]))[0])  # values as written
    assert splits.test.labels[0] == bunch.target[row]


def test_a_regression_csv_gives_float_labels_and_collects_no_label_vocabulary(tmp_path):
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes()
    write_csv(tmp_path / "d.csv", [*bunch.feature_names, "progression"],
              [[*map(float, x), float(y)] for x, y in zip(bunch.data, bunch.target, strict=True)])
    cfg = config(data={"source": "csv", "path": str(tmp_path / "d.csv"), "label": "progression"},
                 model={"kind": "tabular", "task": "regression"})
    splits = load_splits(cfg, None)
    assert splits.class_names == () and list(splits.stream["scan"]["labels"]) == []
    inputs, labels = next(iter(splits.validation.dataset(16, training=False, seed=0)))
    assert labels.dtype.name == "float32" and float(labels.numpy().max()) > 25.0  # raw targets, not class ids
    assert set(splits.train.labels.tolist()) <= set(bunch.target.astype(np.float32).tolist())


def test_a_one_input_csv_trains_regression_as_one_matrix(tmp_path):
    write_csv(tmp_path / "r.csv", ["a", "b", "y"], [[i, i * 2, i * 0.5] for i in range(200)])
    cfg = config(data={"source": "csv", "path": str(tmp_path / "r.csv"), "label": "y"},
                 model={"kind": "mlp", "task": "regression"})
    splits = load_splits(cfg, None)
    assert splits.specs == () and splits.train.images.shape[1:] == (2,)
    _, labels = next(iter(splits.train.dataset(8, training=True, seed=0)))
    assert labels.dtype.name == "float32"


def write_shops(path, rows: int, bad_label_at: int | None = None, task: str = "binary"):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    countries = np.array([b"de", b"fr", b"it", b"es"])
    with tf.io.TFRecordWriter(str(path)) as writer:
        for row in range(rows):
            country = countries[rng.integers(0, 4)]
            price = rng.normal(size=2).astype(np.float32) * 10 + 100
            label = int(country == b"fr")
            if row == bad_label_at:
                label = 7
            value = (tf.train.Feature(float_list=tf.train.FloatList(value=[price[0] * 0.1]))
                     if task == "regression" else tf.train.Feature(int64_list=tf.train.Int64List(value=[label])))
            feature = {"country": tf.train.Feature(bytes_list=tf.train.BytesList(value=[country])),
                       "price": tf.train.Feature(float_list=tf.train.FloatList(value=price)),
                       "label": value}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


SHOP_SPEC = {"country": {"dtype": "string", "kind": "categorical"}, "price": {"shape": [2]},
             "label": {"dtype": "int64"}}


def shops_config(tmp_path, **data) -> PipelineConfig:
    return config(data={"source": "tfrecord", "path": str(tmp_path / "shops.tfrecord"), "label": "label",
                        "feature_spec": SHOP_SPEC, "sample_size": 64, **data},
                  model={"kind": "tabular", "task": "binary", "hidden_units": [8], "embedding_dim": 4})


def test_a_string_feature_without_vocabulary_gets_the_scanned_values_and_stays_a_raw_string(tmp_path):
    write_shops(tmp_path / "shops.tfrecord", 400)
    cfg = shops_config(tmp_path)
    specs = check_trainable(cfg)  # no vocabulary declared: no refusal, the scan finds it
    assert [s.dtype for s in specs] == ["string", "float32"]
    splits = load_splits(cfg, tmp_path / "scan")
    country = next(s for s in splits.specs if s.name == "country")
    assert country.vocabulary == ("de", "es", "fr", "it") and country.num_ids == 5
    inputs, labels = next(iter(splits.train.dataset(16, training=True, seed=0)))
    assert inputs["country"].dtype.name == "string" and inputs["price"].shape == (16, 2)
    assert np.array_equal(labels.numpy(), (inputs["country"].numpy() == b"fr").astype(np.int64))
    again = load_splits(cfg, tmp_path / "scan")  # the cached scan keeps the vocabulary
    assert again.specs == splits.specs
    from tfship.pipeline.training.model import build_task_model

    model = build_task_model(cfg, splits)  # the model takes the raw strings and looks them up itself
    assert model.get_layer("country_lookup").get_vocabulary()[1:] == ["de", "es", "fr", "it"]
    assert model.inputs[[t.name for t in model.inputs].index("country")].dtype == "string"
    assert model(inputs).shape == (16, 1)


def test_a_string_sequence_gets_its_vocabulary_from_the_scan_padded_with_empty_strings(tmp_path):
    import tensorflow as tf

    rng = np.random.default_rng(2)
    with tf.io.TFRecordWriter(str(tmp_path / "tags.tfrecord")) as writer:
        for _row in range(200):
            tags = [t.encode() for t in rng.choice(["red", "blue", "green"], rng.integers(0, 4))]
            feature = {"tags": tf.train.Feature(bytes_list=tf.train.BytesList(value=tags)),
                       "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(b"red" in tags)]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    cfg = config(data={"source": "tfrecord", "path": str(tmp_path / "tags.tfrecord"), "label": "label",
                       "feature_spec": {"tags": {"dtype": "string", "kind": "sequence", "length": 3},
                                        "label": {"dtype": "int64"}}},
                 model={"kind": "tabular", "task": "binary", "hidden_units": [4], "embedding_dim": 2})
    splits = load_splits(cfg, None)
    (tags,) = splits.specs
    assert tags.vocabulary == ("blue", "green", "red") and tags.num_ids == 5  # "" -> 0, unknown -> 1, 2 + index
    inputs, _ = next(iter(splits.train.dataset(8, training=True, seed=0)))
    assert inputs["tags"].dtype.name == "string" and inputs["tags"].shape == (8, 3)
    from tfship.pipeline.training.model import build_task_model

    model = build_task_model(cfg, splits)
    assert model.get_layer("tags_lookup")(tf.constant([["red", "", "pink"]])).numpy().tolist() == [[4, 0, 1]]
    assert model(inputs).shape == (8, 1)


def test_a_bad_label_is_named_by_file_record_and_value(tmp_path):
    write_shops(tmp_path / "shops.tfrecord", 100, bad_label_at=41)
    with pytest.raises(DatasetError) as caught:
        load_splits(shops_config(tmp_path), None)
    message = str(caught.value)
    assert "shops.tfrecord: record 42: label '7' is not 0 or 1 (model.task = 'binary')" in message


def test_a_bad_regression_label_in_a_csv_is_named_by_line(tmp_path):
    write_csv(tmp_path / "r.csv", ["a", "y"], [[i, "oops" if i == 5 else i] for i in range(60)])
    cfg = config(data={"source": "csv", "path": str(tmp_path / "r.csv"), "label": "y"},
                 model={"kind": "tabular", "task": "regression"})
    with pytest.raises(DatasetError, match=r"r.csv: line 7: label 'oops' is not a finite number"):
        load_splits(cfg, None)


def test_declared_split_sizes_skip_the_scan_and_say_so(tmp_path):
    write_shops(tmp_path / "shops.tfrecord", 200)
    spec = SHOP_SPEC | {"country": SHOP_SPEC["country"] | {"vocabulary": ["de", "fr"]}}
    sizes = {"train": 120, "validation": 40, "test": 40}
    cfg = shops_config(tmp_path, feature_spec=spec, split_sizes=sizes)
    check_trainable(cfg)
    splits = load_splits(cfg, tmp_path / "scan")
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (120, 40, 40)  # as declared
    assert splits.stream["counts"] == "declared (data.split_sizes), not counted"
    assert splits.stream["scan"]["seconds"] == 0.0 and not (tmp_path / "scan").exists()  # no pass was made
    with pytest.raises(ConfigError, match=r"data.feature_spec.country.vocabulary = \[\]: data.split_sizes"):
        check_trainable(shops_config(tmp_path, split_sizes=sizes))
    classify = config(data={"source": "csv", "path": str(tmp_path / "x.csv"), "split_sizes": sizes},
                      model={"kind": "mlp"})
    with pytest.raises(ConfigError, match=r"data.classes = \[\]: data.split_sizes skips"):
        check_trainable(classify)


def test_the_training_iterator_of_a_named_csv_split_is_checkpointable(tmp_path):
    import tensorflow as tf

    rows = [[i % 7, ["x", "y", "z"][i % 3], i % 2] for i in range(300)]
    write_csv(tmp_path / "c.csv", ["n", "kind", "label"], rows)
    cfg = config(data={"source": "csv", "path": str(tmp_path / "c.csv"), "categorical": {"kind": []}},
                 model={"kind": "tabular", "task": "binary"})
    splits = load_splits(cfg, None)
    assert [s.dtype for s in splits.specs] == ["float32", "string"] and splits.specs[1].vocabulary == ("x", "y", "z")
    iterator = iter(splits.train.dataset(8, training=True, seed=3, repeat=True))
    next(iterator)
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    saved = checkpoint.save(str(tmp_path / "ckpt" / "it"))
    expected = next(iterator)
    checkpoint.restore(saved)
    restored = next(iterator)
    assert np.array_equal(restored[0]["kind"].numpy(), expected[0]["kind"].numpy())
    assert np.array_equal(restored[1].numpy(), expected[1].numpy())


def test_a_tabular_model_over_a_one_input_source_gets_a_dict_and_npz_tasks_keep_their_labels(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.normal(size=(90, 3)).astype(np.float32), label=rng.normal(size=90))
    cfg = config(data={"source": "npz", "path": str(tmp_path / "d.npz")}, model={"kind": "tabular",
                                                                                    "task": "regression"})
    splits = load_splits(cfg, None)
    assert [s.name for s in splits.specs] == ["x"] and isinstance(splits.train.images, dict)
    assert splits.train.labels.dtype == np.float32
    from tfship.pipeline.data.splits import make_dataset

    inputs, labels = next(iter(make_dataset(splits.train, 4, training=True, seed=0)))
    assert inputs["x"].shape == (4, 3) and labels.dtype.name == "float32"
    np.savez(tmp_path / "b.npz", x=rng.normal(size=(90, 3)).astype(np.float32), label=rng.integers(0, 2, 90))
    binary = load_splits(config(data={"source": "npz", "path": str(tmp_path / "b.npz")},
                                model={"kind": "mlp", "task": "binary"}), None)
    assert binary.class_names == ("0", "1") and binary.train.labels.dtype == np.int64
    np.savez(tmp_path / "bad.npz", x=np.zeros((90, 3), np.float32), label=np.arange(90) % 3)
    with pytest.raises(DatasetError, match=r"bad.npz: sample \d+: label '2' is not 0 or 1"):
        load_splits(config(data={"source": "npz", "path": str(tmp_path / "bad.npz")},
                           model={"kind": "mlp", "task": "binary"}), None)


def test_named_csv_records_get_skip_corrupt_split_key_and_sharding(tmp_path):
    rows = [[i, f"user{i % 10}", "not-a-number" if i == 13 else i * 0.5, i % 2] for i in range(400)]
    write_csv(tmp_path / "u.csv", ["id", "user", "x", "label"], rows)
    data = {"source": "csv", "path": str(tmp_path / "u.csv"), "features": ["x"], "split_key": "user"}
    model = {"kind": "tabular", "task": "binary"}
    with pytest.raises(DatasetError, match=r"u.csv: line 15 '13,user3,not-a-number,1'"):
        load_splits(config(data=data, model=model), None)
    splits = load_splits(config(data=data | {"skip_corrupt": True}, model=model), None)
    assert len(splits.train) + len(splits.validation) + len(splits.test) == 399  # the bad line skipped, counted
    assert splits.stream["scan"]["skipped"]["malformed_records"] == 1
    assert splits.stream["split"] == "hash of 'user'"
    seen = {}
    for name in ("train", "validation", "test"):
        xs = np.concatenate([b[0]["x"].numpy() for b in getattr(splits, name).dataset(64, training=False, seed=0)])
        seen[name] = {int(x * 2) % 10 for x in xs}  # the user of each row
    assert not (seen["train"] & seen["validation"]) and not (seen["train"] & seen["test"])  # users stay in a split
    halves = [np.concatenate([b[0]["x"].numpy() for b in splits.train.dataset(8, training=False, seed=0,
                                                                              shard=(2, rank))]) for rank in (0, 1)]
    assert len(halves[0]) + len(halves[1]) == len(splits.train) and not set(halves[0]) & set(halves[1])


def test_an_npz_with_a_string_array_feeds_a_tabular_model_raw_strings(tmp_path):
    from tfship.pipeline.data.splits import make_dataset
    from tfship.pipeline.training.model import build_task_model

    rng = np.random.default_rng(4)
    country = rng.choice(["de", "fr", "it"], 120)
    np.savez(tmp_path / "s.npz", country=country, price=rng.normal(size=(120, 2)).astype(np.float32),
             label=(country == "fr").astype(np.int64))
    cfg = config(data={"source": "npz", "path": str(tmp_path / "s.npz")},
                 model={"kind": "tabular", "task": "binary", "hidden_units": [4], "embedding_dim": 2})
    splits = load_splits(cfg, None)
    by_name = {s.name: s for s in splits.specs}
    assert by_name["country"].dtype == "string" and by_name["country"].vocabulary == ("de", "fr", "it")
    assert by_name["price"].shape == (2,)
    inputs, labels = next(iter(make_dataset(splits.train, 8, training=True, seed=0)))
    assert inputs["country"].dtype.name == "string"
    assert np.array_equal(labels.numpy(), (inputs["country"].numpy() == b"fr").astype(np.int64))
    assert build_task_model(cfg, splits)(inputs).shape == (8, 1)
