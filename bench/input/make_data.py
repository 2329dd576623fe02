"""Benchmark data written fast: TFRecord shards of tf.Example {x: float32[width], label: int64} and CSV files,
into a work folder outside git (bench/work/, gitignored).

Each record is one serialized Example: a template serialized by TensorFlow once, then copied per record
with its float bytes and label byte replaced in NumPy (labels < 128 keep a 1-byte varint, so the layout is
fixed); shards are written by `tf.data.experimental.TFRecordWriter` (framing and CRCs by TensorFlow).
Labels: the sign pattern of x[0] and x[1] (4 classes), so a model can learn them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _template(width: int) -> tuple[bytes, int, int]:
    """(serialized Example, offset of x's float bytes, offset of the label's varint byte)."""
    import tensorflow as tf

    def example(x, label):
        feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                   "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    marker = np.arange(1, width + 1, dtype=np.float32) * np.float32(1.2345678)
    one, two = example(marker, 1), example(marker, 2)
    label_at = next(i for i, (a, b) in enumerate(zip(one, two, strict=True)) if a != b)
    x_at = one.find(marker.tobytes())
    if x_at < 0 or len(one) != len(two):
        raise RuntimeError("unexpected tf.Example layout")
    return one, x_at, label_at


def records(count: int, width: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(serialized records object [count] of bytes, labels int64 [count])."""
    template, x_at, label_at = _template(width)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((count, width), dtype=np.float32)
    labels = (x[:, 0] > 0).astype(np.int64) * 2 + (x[:, 1] > 0)
    rows = np.tile(np.frombuffer(template, np.uint8), (count, 1))
    rows[:, x_at:x_at + 4 * width] = x.view(np.uint8).reshape(count, -1)
    rows[:, label_at] = labels.astype(np.uint8)
    return np.array([row.tobytes() for row in rows], dtype=object), labels


def write_tfrecord_shards(folder: Path, total: int, shards: int, width: int, seed: int = 0) -> str:
    """`shards` files `part-00000.tfrecord`... holding `total` records; returns their glob. Kept when present."""
    import tensorflow as tf

    folder.mkdir(parents=True, exist_ok=True)
    done = folder / "COMPLETE"
    if done.is_file() and done.read_text() == f"{total} {shards} {width} {seed}":
        return str(folder / "part-*.tfrecord")
    per_shard = -(-total // shards)
    for shard in range(shards):
        count = min(per_shard, total - shard * per_shard)
        data, _ = records(count, width, seed + shard)
        tf.data.experimental.TFRecordWriter(str(folder / f"part-{shard:05d}.tfrecord")).write(
            tf.data.Dataset.from_tensor_slices(data))
    done.write_text(f"{total} {shards} {width} {seed}")
    return str(folder / "part-*.tfrecord")


def write_csv_files(folder: Path, total: int, files: int, width: int, seed: int = 0) -> str:
    """`files` CSV files with a header (x0..x{width-1},label) holding `total` rows; returns their glob."""
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / "COMPLETE"
    if done.is_file() and done.read_text() == f"{total} {files} {width} {seed}":
        return str(folder / "part-*.csv")
    per_file = -(-total // files)
    header = ",".join([*(f"x{i}" for i in range(width)), "label"])
    for index in range(files):
        count = min(per_file, total - index * per_file)
        rng = np.random.default_rng(seed + index)
        x = rng.standard_normal((count, width), dtype=np.float32)
        labels = (x[:, 0] > 0).astype(np.int64) * 2 + (x[:, 1] > 0)
        table = np.concatenate([x, labels[:, None].astype(np.float32)], axis=1)
        np.savetxt(folder / f"part-{index:05d}.csv", table, delimiter=",", header=header, comments="",
                   fmt=["%.5f"] * width + ["%d"])
    done.write_text(f"{total} {files} {width} {seed}")
    return str(folder / "part-*.csv")


def write_digits_shards(folder: Path, shards: int) -> str:
    """scikit-learn's digits as TFRecord shards of {image: float32[8, 8, 1] in [0, 1], label: int64}."""
    import tensorflow as tf
    from sklearn.datasets import load_digits

    folder.mkdir(parents=True, exist_ok=True)
    bunch = load_digits()
    images = (bunch.images.astype(np.float32) / 16.0).reshape(-1, 64)
    for shard in range(shards):
        with tf.io.TFRecordWriter(str(folder / f"digits-{shard:03d}.tfrecord")) as writer:
            for i in range(shard, len(images), shards):
                feature = {"image": tf.train.Feature(float_list=tf.train.FloatList(value=images[i])),
                           "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(bunch.target[i])]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return str(folder / "digits-*.tfrecord")
