"""Streaming sources (`pipeline.data.stream`, `scan`, `streaming`): TFRecord shards (plain and GZIP) as
tf.data pipelines, the hash split, and every named bad input, each from the smallest data that shows it."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tfship.core.errors import DatasetError
from tfship.pipeline.config import DataSection
from tfship.pipeline.data.splits import load_split_arrays

SPEC = {"x": {"dtype": "float32", "shape": [2]}}


def _example(x=(0.0, 0.0), label=0, *, key=None, drop=(), ints=False) -> bytes:
    import tensorflow as tf

    feature = {}
    if "x" not in drop:
        feature["x"] = (tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in x])) if ints
                        else tf.train.Feature(float_list=tf.train.FloatList(value=list(x))))
    if "label" not in drop:
        feature["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
    if key is not None:
        feature["key"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[key]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write(path, records, compression=""):
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path), options=compression or None) as writer:
        for record in records:
            writer.write(record)
    return path


def _config(path, **extra) -> DataSection:
    return DataSection(source="tfrecord", path=path, feature_spec=SPEC, **extra)


def _all_ids(split) -> list[int]:
    return [int(v) for x, _ in split.dataset(64, training=False, seed=0) for v in x.numpy()[:, 0]]


@pytest.mark.parametrize(("compression", "suffix"), [("GZIP", ".gz"), ("ZLIB", ".zz")])
def test_compressed_shards_stream_every_record_once_in_a_stable_hash_split(tmp_path, compression, suffix):
    for shard in range(6):
        _write(tmp_path / f"part-{shard:03d}.tfrecord{suffix}",
               [_example((float(shard * 100 + i), 1.0), i % 3) for i in range(40)], compression)
    config = _config(str(tmp_path / f"part-*.tfrecord{suffix}"), batch_size=16)
    splits = load_split_arrays(config, seed=0)
    ids = [_all_ids(part) for part in (splits.train, splits.validation, splits.test)]
    assert sorted(sum(ids, [])) == sorted(s * 100 + i for s in range(6) for i in range(40))
    assert [len(i) for i in ids] == [len(splits.train), len(splits.validation), len(splits.test)]
    assert splits.class_names == ("0", "1", "2") and splits.stream["files"] == {"all": 6}
    assert 0.5 < len(ids[0]) / 240 < 0.8  # 65 % expected; the hash is fixed, so is this count
    again = load_split_arrays(config, seed=7)
    assert _all_ids(again.test) == ids[2]
    batches = list(splits.train.dataset(16, training=True, seed=1).take(3))
    assert all(x.shape == (16, 2) and y.dtype.name == "int64" for x, y in batches)
    first = [x.numpy() for x, _ in splits.train.dataset(16, training=True, seed=1).take(3)]
    np.testing.assert_array_equal(first, [x.numpy() for x, _ in batches])  # seeded shuffle: the same order


def test_separate_file_sets_replace_the_hash_split(tmp_path):
    for name, count in (("train", 30), ("validation", 8), ("test", 6)):
        _write(tmp_path / f"{name}.tfrecord", [_example((float(i), 0.0), i % 2) for i in range(count)])
    config = DataSection(source="tfrecord", feature_spec=SPEC, train_path=tmp_path / "train.tfrecord",
                         validation_path=tmp_path / "validation.tfrecord", test_path=tmp_path / "test.tfrecord")
    splits = load_split_arrays(config, seed=0)
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (30, 8, 6)
    assert splits.test.images.shape == (6, 2) and splits.test.labels.tolist() == [0, 1, 0, 1, 0, 1]
    with pytest.raises(DatasetError, match=r"data\.test_path missing"):
        load_split_arrays(DataSection(source="tfrecord", feature_spec=SPEC, train_path=tmp_path / "train.tfrecord",
                                      validation_path=tmp_path / "validation.tfrecord"), seed=0)


def test_a_glob_matching_nothing_is_named(tmp_path):
    with pytest.raises(DatasetError, match=r"data\.path: .*nothing-\*\.tfrecord: the pattern matches no file"):
        load_split_arrays(_config(str(tmp_path / "nothing-*.tfrecord")), seed=0)


def test_an_unreadable_file_is_named(tmp_path):
    _write(tmp_path / "a.tfrecord", [_example()])
    os.symlink(tmp_path / "gone.tfrecord", tmp_path / "b.tfrecord")  # matched by the glob, cannot be opened
    with pytest.raises(DatasetError, match=r"b\.tfrecord: unreadable file"):
        load_split_arrays(_config(str(tmp_path / "*.tfrecord")), seed=0)


def _corrupt_shard(tmp_path):
    """Shard 7 of 8, its third record's payload bit-flipped (the data CRC fails there)."""
    records = [_example((float(i), 0.0), i % 2) for i in range(5)]
    for shard in range(8):
        _write(tmp_path / f"shard-{shard}.tfrecord", records)
    path = tmp_path / "shard-7.tfrecord"
    data = bytearray(path.read_bytes())
    offset = sum(len(r) + 16 for r in records[:2])
    data[offset + 12 + 3] ^= 0xFF  # inside record 3's bytes (after its 8-byte length and 4-byte length CRC)
    path.write_bytes(bytes(data))
    return offset


def test_a_corrupt_record_in_the_middle_of_shard_7_names_file_and_offset(tmp_path):
    offset = _corrupt_shard(tmp_path)
    with pytest.raises(DatasetError, match=rf"shard-7\.tfrecord: corrupt data at record 3 \(byte offset {offset}\)"):
        load_split_arrays(_config(str(tmp_path / "shard-*.tfrecord")), seed=0)


def test_skip_corrupt_skips_and_counts(tmp_path):
    _corrupt_shard(tmp_path)
    _write(tmp_path / "shard-8.tfrecord", [_example((1.0, 2.0), 1), _example(drop=("x",)), _example((3.0, 4.0), 0)])
    splits = load_split_arrays(_config(str(tmp_path / "shard-*.tfrecord"), skip_corrupt=True), seed=0)
    skipped = splits.stream["scan"]["skipped"]
    assert skipped["corrupt_frames"] == 1 and skipped["malformed_records"] == 1
    total = len(splits.train) + len(splits.validation) + len(splits.test)
    assert total == 7 * 5 + 2 + 2  # shard 7 ends at its corrupt record 3; shard 8 loses its malformed record
    assert sum(len(_all_ids(p)) for p in (splits.train, splits.validation, splits.test)) == total


@pytest.mark.parametrize(("record", "reason"), [
    (_example(drop=("x",)), "x"),                        # missing feature
    (_example((1.0, 2.0), ints=True), "x"),              # int64 where float32 is declared
    (_example((1.0, 2.0, 3.0)), "x"),                    # 3 values where the shape is [2]
    (_example(drop=("label",)), "label"),                # missing label
], ids=["missing-feature", "wrong-type", "wrong-length", "missing-label"])
def test_a_malformed_record_names_file_and_record(tmp_path, record, reason):
    _write(tmp_path / "data.tfrecord", [_example(), record, _example()])
    with pytest.raises(DatasetError, match=rf"data\.tfrecord: record 2 \(byte offset \d+\): .*{reason}"):
        load_split_arrays(_config(tmp_path / "data.tfrecord"), seed=0)


def test_an_undeclared_label_names_file_and_record(tmp_path):
    _write(tmp_path / "data.tfrecord", [_example(label=0), _example(label=1), _example(label=5)])
    with pytest.raises(DatasetError, match=r"data\.tfrecord: record 3: label '5' is not one of the declared classes"):
        load_split_arrays(_config(tmp_path / "data.tfrecord", classes=("0", "1")), seed=0)


def _png(path, size, value):
    import tensorflow as tf

    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = tf.fill([*size, 3], tf.constant(value, tf.uint8))
    path.write_bytes(tf.io.encode_png(pixels).numpy())


def test_image_folder_streams_decoded_resized_images(tmp_path):
    for i in range(24):
        _png(tmp_path / ("cat" if i % 2 else "dog") / f"{i:02d}.png", (5 + i % 3, 7), 10 * (i % 2) + 100)
    config = DataSection(source="image_folder", path=tmp_path, image_size=(4, 4), batch_size=4)
    splits = load_split_arrays(config, seed=0)
    assert splits.class_names == ("cat", "dog") and splits.input_name == "image"
    assert len(splits.train) + len(splits.validation) + len(splits.test) == 24
    x, y = next(iter(splits.train.dataset(4, training=True, seed=0)))
    assert x.shape == (4, 4, 4, 3) and x.dtype.name == "float32"
    expected = np.where(y.numpy() == 0, 110 / 255, 100 / 255)  # cat: 110, dog: 100, every pixel
    np.testing.assert_allclose(x.numpy().reshape(4, -1).mean(axis=1), expected, rtol=1e-5)
    (tmp_path / "dog" / "zz-broken.png").write_bytes(b"not an image")
    with pytest.raises(DatasetError, match=r"zz-broken\.png: cannot decode image"):
        load_split_arrays(config, seed=0)  # the bounded samples (here: every image) decode it
    skipped = load_split_arrays(config.model_copy(update={"skip_corrupt": True}), seed=0)
    decoded = sum(int(x.shape[0]) for part in (skipped.train, skipped.validation, skipped.test)
                  for x, _ in part.dataset(4, training=False, seed=0))
    assert decoded == 24  # the broken one skipped


def test_image_folder_split_survives_moving_the_folder(tmp_path):
    """The hash split keys an image by its path below data.path, so the same folder moved elsewhere gives the
    same images in the same splits (each image's brightness is its index: the splits' pixels name them)."""
    for i in range(40):
        _png(tmp_path / "a" / ("cat" if i % 2 else "dog") / f"{i:02d}.png", (4, 4), 3 * i)

    def members(root):
        splits = load_split_arrays(DataSection(source="image_folder", path=root, image_size=(4, 4), batch_size=8), 0)
        return [sorted(round(float(v) * 255 / 3) for x, _ in part.dataset(8, training=False, seed=0)
                       for v in x.numpy().reshape(len(x), -1)[:, 0])
                for part in (splits.train, splits.validation, splits.test)]

    before = members(tmp_path / "a")
    (tmp_path / "a").rename(tmp_path / "elsewhere")
    assert members(tmp_path / "elsewhere") == before and sorted(sum(before, [])) == list(range(40))


@pytest.mark.parametrize(("files", "by"), [(6, "file"), (1, "record")])
def test_worker_shards_are_disjoint_and_cover_the_split(tmp_path, files, by, caplog):
    """Two workers' shards of a split: by file when files >= workers, else by record (warned); no record read
    by both, none left out."""
    for shard in range(files):
        _write(tmp_path / f"part-{shard}.tfrecord", [_example((float(shard * 1000 + i), 0.0), i % 2)
                                                     for i in range(60 // files)])
    config = DataSection(source="tfrecord", feature_spec=SPEC, train_path=str(tmp_path / "part-*.tfrecord"),
                         validation_path=str(tmp_path / "part-0.tfrecord"), test_path=str(tmp_path / "part-0.tfrecord"))
    train = load_split_arrays(config, seed=0).train
    seen = []
    for rank in range(2):
        ids = [int(v) for x, _ in train.dataset(5, training=True, seed=1, shard=(2, rank)) for v in x.numpy()[:, 0]]
        seen.append(set(ids))
        assert len(ids) == len(set(ids)) == 30
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 60
    assert ("sharded by record" in caplog.text) == (by == "record")


def test_split_key_keeps_records_sharing_a_key_in_one_split(tmp_path):
    records = [_example((float(i), float(i // 5)), i % 2, key=i // 5) for i in range(300)]  # 60 keys, 5 each
    _write(tmp_path / "data.tfrecord", records)
    spec = SPEC | {"key": {"dtype": "int64", "shape": []}}
    config = DataSection(source="tfrecord", path=tmp_path / "data.tfrecord", feature_spec=spec, features=("x",),
                         split_key="key")
    splits = load_split_arrays(config, seed=0)
    keys = [{int(k) for x, _ in part.dataset(64, training=False, seed=0) for k in x.numpy()[:, 1]}
            for part in (splits.train, splits.validation, splits.test)]
    assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])
    assert len(keys[0] | keys[1] | keys[2]) == 60 and all(keys)
    assert len(splits.train) % 5 == 0 and splits.stream["split"] == "hash of 'key'"
    by_bytes = load_split_arrays(config.model_copy(update={"split_key": None}), seed=0)
    assert len(by_bytes.train) % 5 != 0 or len(by_bytes.test) != len(splits.test)  # not the same split
    with pytest.raises(DatasetError, match=r"data\.split_key: 'x' needs a scalar entry"):
        load_split_arrays(config.model_copy(update={"split_key": "x"}), seed=0)


def test_the_samples_are_bounded_by_sample_size(tmp_path):
    _write(tmp_path / "data.tfrecord", [_example((float(i), 0.0), i % 2) for i in range(400)])
    splits = load_split_arrays(_config(tmp_path / "data.tfrecord", sample_size=25), seed=0)
    assert len(splits.test) > 25 and splits.test.images.shape == (25, 2) and splits.test.labels.shape == (25,)
    assert splits.train.images.shape == (25, 2)  # normalisation adapts on this sample
    assert _all_ids(splits.test)[:25] == splits.test.images[:, 0].astype(int).tolist()  # the first, in file order


def _csv(path, lines, header="a,b,colour,kind"):
    path.write_text(header + "\n" + "\n".join(lines) + "\n")
    return path


def test_csv_streams_typed_columns_with_categories_found_by_the_scan(tmp_path):
    lines = [f"{i},{i * 0.5},{('red', 'blue', 'green')[i % 3]},{('x', 'y')[i % 2]}" for i in range(200)]
    _csv(tmp_path / "one.csv", lines[:100])
    _csv(tmp_path / "two.csv", lines[100:])
    config = DataSection(source="csv", path=str(tmp_path / "*.csv"), label="kind", categorical={"colour": ()})
    splits = load_split_arrays(config, seed=0)
    assert splits.class_names == ("x", "y") and len(splits.train) + len(splits.validation) + len(splits.test) == 200
    assert splits.feature_names == ("a", "b", "colour=blue", "colour=green", "colour=red")
    rows = np.concatenate([x.numpy() for x, _ in splits.test.dataset(32, training=False, seed=0)])
    for row in rows:
        i = int(row[0])
        assert row[1] == pytest.approx(i * 0.5) and row[2:].tolist() == [float(c == ("red", "blue", "green")[i % 3])
                                                                          for c in ("blue", "green", "red")]


def test_csv_bad_value_and_unknown_category_name_file_and_line(tmp_path):
    _csv(tmp_path / "bad.csv", ["1,2,red,x", "3,oops,red,y", "5,6,red,x"])
    with pytest.raises(DatasetError, match=r"bad\.csv: line 3 '3,oops,red,y': .*not a valid float: oops"):
        load_split_arrays(DataSection(source="csv", path=tmp_path / "bad.csv", features=("a", "b"), label="kind"),
                          seed=0)
    _csv(tmp_path / "colour.csv", ["1,2,red,x", "3,4,pink,y"])
    with pytest.raises(DatasetError, match=r"colour\.csv: line 3 '3,4,pink,y': column 'colour': a category outside \['red', 'blue'\]\.?$"):
        load_split_arrays(DataSection(source="csv", path=tmp_path / "colour.csv", features=("a", "colour"),
                                      label="kind", categorical={"colour": ("red", "blue")}), seed=0)
