"""Dataset readers on small files written by the tests: CSV, NPZ, image folder, TFRecord, and the
errors that name the file, line or column."""

from __future__ import annotations

import numpy as np
import pytest

from tfship.core.errors import DatasetError
from tfship.pipeline.config import DataSection
from tfship.pipeline.data.sources import read_csv, read_image_folder, read_npz, read_source, read_tfrecord
from tfship.pipeline.data.splits import load_split_arrays, make_dataset


def _write_csv(path, rows, header="x1,x2,colour,species"):
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


@pytest.fixture()
def iris_like(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(90):
        label = ("setosa", "versicolor", "virginica")[i % 3]
        rows.append(f"{rng.normal(i % 3):.3f},{rng.normal():.3f},{('red', 'blue')[i % 2]},{label}")
    return _write_csv(tmp_path / "flowers.csv", rows)


def test_csv_stacks_columns_and_one_hot_encodes_categoricals(iris_like):
    data = read_csv(iris_like, ("x1", "x2", "colour"), "species", categorical={"colour": ("red", "blue")},
                    classes=("setosa", "versicolor", "virginica"))
    name, matrix = data.single_input()
    assert name == "features" and matrix.shape == (90, 4) and matrix.dtype == np.float32
    assert data.feature_names == ("x1", "x2", "colour=red", "colour=blue")
    np.testing.assert_array_equal(matrix[:2, 2:], [[1, 0], [0, 1]])
    assert data.class_names == ("setosa", "versicolor", "virginica") and data.labels[:3].tolist() == [0, 1, 2]


def test_csv_errors_name_file_line_and_column(tmp_path, iris_like):
    with pytest.raises(DatasetError, match=r"flowers\.csv: missing column 'petal'"):
        read_csv(iris_like, ("petal",), "species")
    bad = _write_csv(tmp_path / "bad.csv", ["1,2,red,setosa", "1,oops,red,setosa"])
    with pytest.raises(DatasetError, match=r"bad\.csv: line 3, column 'x2': 'oops' is not a number"):
        read_csv(bad, ("x1", "x2"), "species")
    with pytest.raises(DatasetError, match=r"bad\.csv: line 2, column 'colour': category 'red'"):
        read_csv(bad, ("x1", "colour"), "species", categorical={"colour": ("blue",)})
    with pytest.raises(DatasetError, match=r"flowers\.csv: line 2, column 'species': label 'setosa' is not one of"):
        read_csv(iris_like, ("x1",), "species", classes=("versicolor", "virginica"))


def test_split_of_a_csv_source_is_a_stable_hash_split_and_keeps_class_names(iris_like):
    """A CSV source is streamed: each line goes to train, validation or test by the hash of its bytes (no
    full pass, the same split every run), so the splits are disjoint and together hold every line once."""
    config = DataSection(source="csv", path=iris_like, features=("x1", "x2"), label="species", batch_size=8)
    splits = load_split_arrays(config, seed=3)
    again = load_split_arrays(config, seed=3)
    np.testing.assert_array_equal(splits.test.labels, again.test.labels)
    np.testing.assert_array_equal(splits.test.images, again.test.images)
    assert splits.class_names == ("setosa", "versicolor", "virginica") and splits.input_name == "features"
    assert len(splits.train) + len(splits.validation) + len(splits.test) == 90
    rows = [{tuple(r) for r in part.images.tolist()} for part in (splits.train, splits.validation, splits.test)]
    assert sum(len(r) for r in rows) == 90 and len(set().union(*rows)) == 90
    assert set(splits.train.labels.tolist()) == {0, 1, 2}
    batches = list(make_dataset(splits.train, 8, training=True, seed=1))
    assert all(int(x.shape[0]) == 8 and x.dtype.name == "float32" for x, _ in batches)


def test_npz_keeps_named_arrays_and_dtypes(tmp_path):
    path = tmp_path / "tokens.npz"
    np.savez(path, tokens=np.arange(40, dtype=np.int32).reshape(10, 4), extra=np.ones((10, 2)),
             label=np.array(["a", "b"] * 5))
    data = read_npz(path, (), "label")
    assert set(data.features) == {"tokens", "extra"} and data.features["tokens"].dtype == np.int32
    assert data.features["extra"].dtype == np.float32 and data.class_names == ("a", "b")
    with pytest.raises(DatasetError, match=r"tokens\.npz: missing array 'ids'"):
        read_npz(path, ("ids",), "label")
    with pytest.raises(DatasetError, match="the training models take one input"):
        data.single_input()


def _write_png(path, value, size=(6, 5)):
    import tensorflow as tf

    pixels = np.full((*size, 3), value, np.uint8)
    path.write_bytes(tf.io.encode_png(pixels).numpy())


def test_image_folder_resizes_rescales_and_names_a_bad_file(tmp_path):
    for name, value in (("cat", 10), ("dog", 200)):
        (tmp_path / name).mkdir()
        for i in range(3):
            _write_png(tmp_path / name / f"{i}.png", value)
    data = read_image_folder(tmp_path, (4, 4), rescale=1 / 255.0)
    images = data.features["image"]
    assert images.shape == (6, 4, 4, 3) and data.class_names == ("cat", "dog")
    np.testing.assert_allclose(images[0, 0, 0], [10 / 255] * 3, rtol=1e-5)
    (tmp_path / "dog" / "broken.png").write_bytes(b"not an image")
    with pytest.raises(DatasetError, match=r"broken\.png: cannot decode image"):
        read_image_folder(tmp_path, (4, 4))
    with pytest.raises(DatasetError, match=r"class folder 'dog' is not one of the declared classes"):
        read_image_folder(tmp_path, (4, 4), classes=("cat",))


def _example(values, label):
    import tensorflow as tf

    feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=values))}
    if label is not None:
        feature["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def test_tfrecord_with_declared_feature_spec(tmp_path):
    import tensorflow as tf

    path = tmp_path / "data.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(12):
            writer.write(_example([float(i), 1.0, 2.0], i % 2))
    config = DataSection(source="tfrecord", path=path, feature_spec={"x": {"dtype": "float32", "shape": [3]}},
                         classes=("even", "odd"), input_name="features")
    with pytest.raises(DatasetError, match="label '0' is not one of the declared classes"):
        read_source(config)
    data = read_tfrecord(path, config.feature_spec, "label")
    assert data.features["x"].shape == (12, 3) and data.class_names == ("0", "1")
    broken = tmp_path / "missing.tfrecord"
    with tf.io.TFRecordWriter(str(broken)) as writer:
        writer.write(_example([1.0, 2.0, 3.0], 1))
        writer.write(_example([1.0, 2.0, 3.0], None))
    with pytest.raises(DatasetError, match=r"missing\.tfrecord: record 2"):
        read_tfrecord(broken, config.feature_spec, "label")
    (tmp_path / "corrupt.tfrecord").write_bytes(path.read_bytes()[:-7])
    with pytest.raises(DatasetError, match=r"corrupt\.tfrecord: record"):
        read_tfrecord(tmp_path / "corrupt.tfrecord", config.feature_spec, "label")
