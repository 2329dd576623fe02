"""Data of `make bench-train-loop` (bench/train/loop_vs_fit.py), generated once into bench/work/ and kept.

* `mlp_shards`: N tf.Examples {x: float32 [32] standard normal, label: int64 in 0..9 = argmax(x[:10])} in 8
  TFRecord shards (the train split), plus a validation and a test file of `HELD_OUT` records each at every N (so
  tfship and the reference train on exactly the same records: `data.train_path` is the 8 shards; and the
  end-to-end case's two sizes differ only in their training records). Seeded; a `COMPLETE` marker names
  what was written, and a folder that holds it is reused.
* the recommender's shards come from `bench.train.recommender._data` (pipeline.data.recommender_data).

Records are written as bench/input/make_data does: one template Example serialized by TensorFlow, its float
bytes and label byte replaced per record in NumPy (labels < 128 keep a 1-byte varint).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

WIDTH, CLASSES, SHARDS, HELD_OUT = 32, 10, 8, 2000


def _records(count: int, seed: int) -> np.ndarray:
    from bench.input.make_data import _template

    template, x_at, label_at = _template(WIDTH)
    x = np.random.default_rng(seed).standard_normal((count, WIDTH), dtype=np.float32)
    labels = np.argmax(x[:, :CLASSES], axis=1).astype(np.uint8)
    rows = np.tile(np.frombuffer(template, np.uint8), (count, 1))
    rows[:, x_at:x_at + 4 * WIDTH] = x.view(np.uint8).reshape(count, -1)
    rows[:, label_at] = labels
    return np.array([row.tobytes() for row in rows], dtype=object)


def _write(path: Path, count: int, seed: int) -> None:
    import tensorflow as tf

    partial = path.with_name(path.name + ".partial")
    tf.data.experimental.TFRecordWriter(str(partial)).write(tf.data.Dataset.from_tensor_slices(_records(count, seed)))
    partial.replace(path)


def mlp_shards(folder: Path, total: int, seed: int = 0, say=print) -> dict[str, str]:
    """{train, validation, test}: globs of `total` training records in 8 shards and the two held-out files
    (`HELD_OUT` records each). Kept when already written with the same settings."""
    folder.mkdir(parents=True, exist_ok=True)
    held_out = HELD_OUT
    marker, stamp = folder / "COMPLETE", f"{total} {SHARDS} {WIDTH} {CLASSES} {held_out} {seed}"
    paths = {"train": str(folder / "part-*.tfrecord"), "validation": str(folder / "validation.tfrecord"),
             "test": str(folder / "test.tfrecord")}
    if marker.is_file() and marker.read_text() == stamp:
        return paths
    per_shard = -(-total // SHARDS)
    for shard in range(SHARDS):
        _write(folder / f"part-{shard:05d}.tfrecord", min(per_shard, total - shard * per_shard), seed + shard)
        say(f"bench-train-loop: wrote shard {shard + 1}/{SHARDS} of {total:,} records into {folder}")
    _write(folder / "validation.tfrecord", held_out, seed + 1000)
    _write(folder / "test.tfrecord", held_out, seed + 1001)
    marker.write_text(stamp)
    return paths
