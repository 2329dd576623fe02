"""`train.assert_inputs` failures as one line: the check, the feature, and where the record came from.

The assertion runs inside tf.data (`train_checks.input_assertions`), where the failing batch no longer knows
its records; the record is found again here, in the train split (in memory: its row in the source file; streamed:
its file and record number), so the error is one `DatasetError` line with exit 2, not a TensorFlow traceback.
"""

from __future__ import annotations

import re

import numpy as np

from tfship.core.errors import DatasetError


def assert_inputs_error(text: str, inputs) -> DatasetError:
    """The `DatasetError` for TensorFlow's assertion message `text` (holding "assert_inputs: <check>").

    Args:
        text: the InvalidArgumentError's message.
        inputs: the train stage's `TrainInputs` (config, splits).
    """
    match = re.search(r"assert_inputs: ([^\]\n\"']+)", text)
    check = match.group(1).strip().rstrip(".") if match else "an input check"
    splits, data = inputs.splits, inputs.config.data
    classes = len(splits.class_names)
    where = _locate(splits.train, check, classes, data)
    return DatasetError(f"train.assert_inputs: {check}: feature {splits.input_name!r}, {where}")


def _bad_rows(images: np.ndarray, labels: np.ndarray, check: str, classes: int) -> np.ndarray:
    flat = images.reshape(len(images), -1)
    if "NaN or Inf" in check and np.issubdtype(flat.dtype, np.floating):
        return ~np.isfinite(flat).all(axis=1)
    if "label" in check:
        return (labels < 0) | (labels >= classes)
    return np.zeros(len(images), bool)


def _locate(split, check: str, classes: int, data) -> str:
    if hasattr(split, "files"):
        return _locate_streamed(split, check, classes)
    bad = np.flatnonzero(_bad_rows(split.images, split.labels, check, classes))
    if not len(bad):
        return "a record of the train split"
    row = int(bad[0])
    source = str(data.path) if data.path is not None else data.source
    origin = int(split.rows[row]) if getattr(split, "rows", None) is not None else None
    found = f"record {origin} (0-based) of {source}" if origin is not None else f"train split row {row} of {source}"
    return f"{found} ({len(bad)} such record(s) in the train split)"


def _locate_streamed(split, check: str, classes: int) -> str:
    """The first bad record's file and record number (reads the train split's files one by one)."""
    for file in split.files:
        index = 0
        for raw in split.format.read(file).batch(4096):
            keep = np.ones(int(raw.shape[0]), bool)
            if split.hash_split is not None and split.split_id is not None:
                keep = split.hash_split.split_ids(raw).numpy() == split.split_id
            inputs, texts = split.format.parse(raw)
            table = {name.encode(): i for i, name in enumerate(split.class_names)}
            labels = np.asarray([table.get(t, -1) for t in texts.numpy()], np.int64)
            bad = np.flatnonzero(_bad_rows(np.asarray(inputs), labels, check, classes) & keep)
            if len(bad):
                return f"{file}: {split.format.where(index + int(bad[0]), None)}"
            index += int(raw.shape[0])
    return "a record of the train split"
