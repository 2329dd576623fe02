"""The one counted pass over a streaming source: records per split, the label vocabulary (classification
without declared classes only: never for binary or regression), the values of string inputs and CSV categorical
columns without a declared vocabulary (at most `MAX_VOCABULARY` each), and every record parsed once, so bad
data stops the run before training writes anything. Labels are checked by the run's task
(`pipeline.data.labels.LabelRule`): a bad one is named by file, record and value.

Each file is read on its own (`format.read(file).batch(4096)`), so an error names its file: a corrupt
frame by the record number and byte offset where reading broke, a record that does not parse (a missing
feature, a wrong type or length, a non-number in a CSV column) by its record number, found by parsing the
failing batch's records one at a time. Under `skip_corrupt` such records are skipped and counted instead
(a corrupt frame ends its file: the records after it cannot be framed and are not counted).

The result is kept as JSON beside the runs (`<runs_dir>/.data-scan/<key>.json`, the key hashing the data
settings and every file's size and modification time), so `tfship query` and a resumed run do not read the
data again, and in each run folder's data.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tfship.core.errors import DatasetError

SCAN_BATCH = 4096
PROGRESS_EVERY_S = 5.0


@dataclass(frozen=True)
class ScanResult:
    """What the pass found.

    Attributes:
        counts: records per split ("train", "validation", "test"), skipped records excluded.
        labels: label texts seen (sorted; numeric ones numerically).
        categories: CSV categorical column -> values seen (sorted).
        bad_records: file index (str) -> malformed record indices (skip_corrupt only).
        skipped: {"malformed_records": n, "corrupt_frames": n, "details": [first 20 locations]}.
        records: records read in all; seconds: the pass's wall time.
    """

    counts: dict[str, int]
    labels: tuple[str, ...]
    categories: dict[str, tuple[str, ...]]
    bad_records: dict[str, tuple[int, ...]]
    skipped: dict
    records: int
    seconds: float
    files: int = 0

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class _Tally:
    counts: np.ndarray = field(default_factory=lambda: np.zeros(3, np.int64))
    labels: set = field(default_factory=set)
    categories: dict = field(default_factory=dict)
    bad: dict = field(default_factory=dict)
    details: list = field(default_factory=list)
    corrupt_frames: int = 0
    records: int = 0


def scan_key(config, files: dict[str, tuple[str, ...]], extra: str = "") -> str:
    """A hash of the data settings, `extra` (the task and model kind: what the scan collects depends on them)
    and each file's name, size and mtime (the scan cache's key).
    """
    digest = hashlib.sha256(json.dumps(config.model_dump(mode="json"), sort_keys=True).encode() + extra.encode())
    for split, names in sorted(files.items()):
        for name in names:
            stat = os.stat(name)
            digest.update(f"{split}\0{name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:32]


def cached_scan(cache_dir: Path | None, key: str, run: Callable[[], ScanResult]) -> ScanResult:
    """The cached result under `cache_dir/<key>.json`, else `run()` (then written there atomically)."""
    path = cache_dir / f"{key}.json" if cache_dir is not None else None
    if path is not None and path.is_file():
        try:
            saved = json.loads(path.read_text())
            return ScanResult(**{**saved, "labels": tuple(saved["labels"]),
                                 "categories": {k: tuple(v) for k, v in saved["categories"].items()},
                                 "bad_records": {k: tuple(v) for k, v in saved["bad_records"].items()}})
        except (OSError, ValueError, TypeError, KeyError):
            pass
    result = run()
    if path is not None:
        from tfship.core.files import write_json_atomic

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, result.to_json())
        except OSError:
            pass
    return result


def scan(fmt, file_sets: list[tuple[tuple[str, ...], int | None]], hash_split, *, skip_corrupt: bool,
         declared_classes: tuple[str, ...] = (), say: Callable[[str], None] | None = None,
         labels_by=None) -> ScanResult:
    """Read every record of every file once.

    Args:
        fmt: the record format (`pipeline.data.formats`).
        file_sets: (files, split id) pairs; split id None: the hash split decides per record.
        hash_split: `pipeline.data.stream.HashSplit` (used where split id is None).
        skip_corrupt: skip and count bad records instead of raising.
        declared_classes: when given, a label outside them is an error (or skipped).
        say: progress line sink (a line every `PROGRESS_EVERY_S` seconds); default stderr.
        labels_by: the task's `LabelRule` (default: classification over `declared_classes`); a label it
            calls bad is an error (or skipped).

    Raises:
        DatasetError: a corrupt frame (file, record number, byte offset), a malformed record (file, record
            number, TensorFlow's reason), a label outside the task's range (file, record, value), or more
            than `MAX_VOCABULARY` values of one string input (naming the setting that would declare them).
    """
    from tfship.pipeline.data.labels import LabelRule

    declared = labels_by if labels_by is not None else LabelRule("classification", tuple(declared_classes))
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    tally, started, last = _Tally(), time.monotonic(), time.monotonic()
    parse = _scan_function(fmt, hash_split)
    total_files = sum(len(files) for files, _ in file_sets)
    done = 0
    for files, split_id in file_sets:
        for file in files:
            _scan_file(fmt, parse, file, done, split_id, tally, skip_corrupt, declared)
            done += 1
            if time.monotonic() - last >= PROGRESS_EVERY_S:
                last = time.monotonic()
                rate = tally.records / max(last - started, 1e-9)
                say(f"data scan: {tally.records:,} records, {done}/{total_files} files, {rate:,.0f} records/s")
    labels = sorted(tally.labels)
    try:
        labels = sorted(labels, key=float)
    except ValueError:
        pass
    malformed = sum(len(v) for v in tally.bad.values())
    return ScanResult(
        counts=dict(zip(("train", "validation", "test"), tally.counts.tolist(), strict=True)),
        labels=tuple(labels), categories={k: tuple(sorted(v)) for k, v in tally.categories.items()},
        bad_records={str(k): tuple(v) for k, v in tally.bad.items()},
        skipped={"malformed_records": malformed, "corrupt_frames": tally.corrupt_frames,
                 "details": tally.details[:20]},
        records=tally.records, seconds=round(time.monotonic() - started, 3), files=total_files)


def _scan_function(fmt, hash_split):
    import tensorflow as tf

    @tf.function
    def parse(batch):
        inputs, labels = fmt.parse(batch)
        splits = hash_split.split_ids(batch) if hash_split is not None else tf.zeros(tf.shape(batch), tf.int32)
        extra = fmt.raw_columns(batch) if hasattr(fmt, "raw_columns") else {}
        lengths = tf.strings.length(batch)
        return tf.shape(labels)[0], labels, splits, extra, lengths

    return parse


def _scan_file(fmt, parse, file: str, file_index: int, split_id, tally: _Tally, skip_corrupt: bool,
               declared) -> None:
    import tensorflow as tf

    iterator = iter(fmt.read(file).batch(SCAN_BATCH).prefetch(2))
    index, offset = 0, 0
    framed = getattr(fmt, "kind", "") == "tfrecord" and not fmt.compression
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except tf.errors.OpError as err:
            where_index, where_offset = _locate_break(fmt, file)
            message = f"{file}: corrupt data at {fmt.where(where_index, where_offset)}: {_first_line(err)}"
            if not skip_corrupt:
                raise DatasetError(message) from None
            tally.corrupt_frames += 1
            tally.details.append(message)
            if where_index > index:  # the failing batch's records before the break are read (ignore_errors keeps them)
                rest = next(iter(fmt.read(file).skip(index).take(where_index - index).batch(SCAN_BATCH)))
                _count(parse(rest), split_id, tally, declared, fmt, file, index, None, skip_corrupt, file_index)
                tally.records += where_index - index
            return
        try:
            outputs = parse(batch)
            good = None
        except tf.errors.InvalidArgumentError as err:
            good = _bad_in_batch(fmt, parse, file, batch, index, offset if framed else None, err, skip_corrupt,
                                 tally, file_index)
            outputs = parse(tf.boolean_mask(batch, good)) if good.any() else None
        if outputs is not None:
            _count(outputs, split_id, tally, declared, fmt, file, index, good, skip_corrupt, file_index)
        lengths = tf.strings.length(batch).numpy()
        offset += int(lengths.sum()) + fmt_framing(fmt) * len(lengths)
        index += len(lengths)
        tally.records += len(lengths)


def fmt_framing(fmt) -> int:
    """Bytes around each record's data in the file: 16 for TFRecord frames, 0 for text lines."""
    from tfship.pipeline.data.formats import TFRECORD_FRAMING_BYTES

    return TFRECORD_FRAMING_BYTES if getattr(fmt, "kind", "") == "tfrecord" else 0


def _count(outputs, split_id, tally: _Tally, declared, fmt, file: str, index: int, good, skip_corrupt: bool,
           file_index: int) -> None:
    from tfship.pipeline.data.input_spec import MAX_VOCABULARY, vocabulary_error
    from tfship.pipeline.data.labels import show

    _, labels, splits, extra, _ = outputs
    labels = labels.numpy()
    splits = splits.numpy() if split_id is None else np.full(len(labels), split_id)
    outside = declared.bad(labels)
    if outside.any():
        row = int(np.flatnonzero(outside)[0])
        record = index + (int(np.flatnonzero(good)[row]) if good is not None else row)
        message = f"{file}: {fmt.where(record, None)}: label {show(labels[row])} {declared.reason()}"
        if not skip_corrupt:
            raise DatasetError(message)
        positions = np.flatnonzero(good) if good is not None else np.arange(len(labels))
        tally.bad.setdefault(file_index, []).extend(int(index + positions[r]) for r in np.flatnonzero(outside))
        tally.details.append(message)
        labels, splits = labels[~outside], splits[~outside]
        extra = {k: v.numpy()[~outside] if v.shape.rank == 1 and v.shape[0] == len(outside) else v.numpy()
                 for k, v in extra.items()}
    tally.counts += np.bincount(splits, minlength=3)[:3]
    if declared.collects:
        tally.labels.update(x.decode() for x in np.unique(labels))
    for column, values in extra.items():
        if column == fmt.label:
            continue
        values = values.numpy() if hasattr(values, "numpy") else values
        found = tally.categories.setdefault(column, set())
        found.update(x.decode() for x in np.unique(values))
        if len(found) > MAX_VOCABULARY:
            key = fmt.vocabulary_key(column) if hasattr(fmt, "vocabulary_key") else f"data.categorical.{column}"
            raise DatasetError(f"{file}: {vocabulary_error(column, key, len(found))}")


def _bad_in_batch(fmt, parse, file, batch, index, offset, err, skip_corrupt, tally, file_index) -> np.ndarray:
    """Which records of a batch that failed to parse are good (bool [B]); raises naming the first bad one."""
    import tensorflow as tf

    good = np.ones(int(batch.shape[0]), bool)
    lengths = tf.strings.length(batch).numpy()
    for row in range(len(good)):
        try:
            parse(batch[row:row + 1])
        except tf.errors.InvalidArgumentError as row_err:
            good[row] = False
            record_offset = None if offset is None else offset + int(lengths[:row].sum()) + fmt_framing(fmt) * row
            shown = f" {batch[row].numpy().decode(errors='replace')[:120]!r}" if fmt.kind == "csv" else ""
            message = f"{file}: {fmt.where(index + row, record_offset)}{shown}: {_first_line(row_err)}"
            if not skip_corrupt:
                raise DatasetError(message) from None
            tally.bad.setdefault(file_index, []).append(index + row)
            tally.details.append(message)
    if good.all():
        raise DatasetError(f"{file}: records {index + 1}-{index + len(good)}: {_first_line(err)}") from None
    return good


def _locate_break(fmt, file: str) -> tuple[int, int | None]:
    """(record index, byte offset) where reading `file` one record at a time breaks."""
    import tensorflow as tf

    index, offset = 0, 0
    try:
        for record in fmt.read(file):
            offset += len(record.numpy()) + fmt_framing(fmt)
            index += 1
    except tf.errors.OpError:
        pass
    framed = getattr(fmt, "kind", "") == "tfrecord" and not fmt.compression
    return index, offset if framed else None


_NOISE = ("Graph execution error", "Detected at node", "File ", "[[", "Additional GRPC", "Stack trace")


def _first_line(err) -> str:
    """TensorFlow's reason from an OpError's message, less graph-execution boilerplate (at most 300 chars)."""
    import re

    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", getattr(err, "message", str(err)))
    text = text.replace("\\'", "'")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith(_NOISE)]
    first = lines[0] if lines else type(err).__name__
    asserted = re.match(r"assertion failed: \[(.*?)\s*\](?: \[|$)", first)  # tf.debugging.assert_*: its message only
    return (asserted.group(1) if asserted else first)[:300]
