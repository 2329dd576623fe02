"""Data of `make bench-train-loop` (bench/train/loop_vs_fit.py), generated once into bench/work/ and kept.

* `mlp_shards`: N tf.Examples {x: float32 [32] standard normal, label: int64 in 0..9 = argmax(x[:10])} in 8
  TFRecord shards (the train split), plus a validation and a test file of `HELD_OUT` records each at every N (so
  tfship and the reference train on exactly the same records: `data.train_path` is the 8 shards; and the
  end-to-end case's two sizes differ only in their training records). Seeded; a `COMPLETE` marker names
  what was written, and a folder that holds it is reused.
* the recommender's shards come from `bench.train.recommender._data` (pipeline.data.recommender_data).

Written without TensorFlow (the harness starts no TensorFlow for them): one Example {x, label} encoded by hand
(protobuf wire format), its float bytes and label byte replaced per record in NumPy (labels < 128 keep a 1-byte
varint), framed as TFRecord (length, masked CRC-32C of it, data, masked CRC-32C of that: google_crc32c).
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

WIDTH, CLASSES, SHARDS, HELD_OUT = 32, 10, 8, 2000


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _template() -> tuple[bytes, int, int]:
    """(serialized tf.train.Example {x: FloatList [WIDTH], label: Int64List [1]}, offset of x's float bytes,
    offset of the label's varint byte)."""
    feature_x = _field(2, _field(1, bytes(4 * WIDTH)))  # Feature.float_list, its values packed
    feature_label = _field(3, _field(1, b"\x01"))  # Feature.int64_list, one varint
    entries = _field(1, _field(1, b"x") + _field(2, feature_x)) + _field(1, _field(1, b"label") + _field(2, feature_label))
    example = _field(1, entries)  # Example.features (Features.feature: the map's entries)
    return example, example.index(bytes(4 * WIDTH)), len(example) - 1


def _records(count: int, seed: int) -> np.ndarray:
    template, x_at, label_at = _template()
    x = np.random.default_rng(seed).standard_normal((count, WIDTH), dtype=np.float32)
    labels = np.argmax(x[:, :CLASSES], axis=1).astype(np.uint8)
    rows = np.tile(np.frombuffer(template, np.uint8), (count, 1))
    rows[:, x_at:x_at + 4 * WIDTH] = x.view(np.uint8).reshape(count, -1)
    rows[:, label_at] = labels
    return rows


def _masked_crc(data: bytes) -> bytes:
    import google_crc32c

    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def _write(path: Path, count: int, seed: int) -> None:
    rows = _records(count, seed)
    length = struct.pack("<Q", rows.shape[1])
    head = length + _masked_crc(length)
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as handle:
        for row in rows:
            data = row.tobytes()
            handle.write(head + data + _masked_crc(data))
    partial.replace(path)


def mlp_shards(folder: Path, total: int, seed: int = 0, say=print) -> dict[str, str]:
    """{train, validation, test}: globs of `total` training records in 8 shards and the two held-out files
    (`HELD_OUT` records each). Kept when already written with the same settings."""
    folder.mkdir(parents=True, exist_ok=True)
    held_out = HELD_OUT
    marker, stamp = folder / "COMPLETE", f"v2 {total} {SHARDS} {WIDTH} {CLASSES} {held_out} {seed}"
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
