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
    named = re.search(r"of input '([^']+)'", check)
    feature = named.group(1) if named else splits.input_name
    task = getattr(splits, "task", "classification")
    where = _locate(splits.train, check, task, len(splits.class_names), data, named.group(1) if named else None)
    return DatasetError(f"train.assert_inputs: {check}: feature {feature!r}, {where}")


def _bad_rows(images, labels: np.ndarray, check: str, task: str, classes: int, name: str | None) -> np.ndarray:
    """Rows [N] bool that fail `check`: non-finite values of the input (`name` among named inputs), or a label
    outside the task's range (classification [0, classes), binary 0/1, regression finite).
    """
    values = images[name] if isinstance(images, dict) and name is not None else images
    if "NaN or Inf" in check and "label" not in check and not isinstance(values, dict):
        flat = np.asarray(values).reshape(len(labels), -1)
        return np.asarray(~np.isfinite(flat).all(axis=1)) if np.issubdtype(flat.dtype, np.floating) else \
            np.zeros(len(labels), bool)
    if "label" in check:
        if task == "regression":
            return ~np.isfinite(labels.astype(np.float64))
        top = classes if task == "classification" else 2
        return (labels < 0) | (labels >= top)
    return np.zeros(len(labels), bool)


def _locate(split, check: str, task: str, classes: int, data, name: str | None) -> str:
    if hasattr(split, "files"):
        return _locate_streamed(split, check, task, classes, name)
    bad = np.flatnonzero(_bad_rows(split.images, split.labels, check, task, classes, name))
    if not len(bad):
        return "a record of the train split"
    row = int(bad[0])
    source = str(data.path) if data.path is not None else data.source
    origin = int(split.rows[row]) if getattr(split, "rows", None) is not None else None
    found = f"record {origin} (0-based) of {source}" if origin is not None else f"train split row {row} of {source}"
    return f"{found} ({len(bad)} such record(s) in the train split)"


def _locate_streamed(split, check: str, task: str, classes: int, name: str | None) -> str:
    """The first bad record's file and record number (reads the train split's files one by one, parsed as the
    training stream parses them: `StreamSplit._parse`); images are decoded one by one and not searched.
    """
    if getattr(split.format, "per_record", False):
        return "a record of the train split"
    for file in split.files:
        index = 0
        for raw in split.format.read(file).batch(4096):
            keep = np.ones(int(raw.shape[0]), bool)
            if split.hash_split is not None and split.split_id is not None:
                keep = split.hash_split.split_ids(raw).numpy() == split.split_id
            inputs, labels = split._parse(raw)
            arrays = {k: np.asarray(v) for k, v in inputs.items()} if isinstance(inputs, dict) else np.asarray(inputs)
            bad = np.flatnonzero(_bad_rows(arrays, np.asarray(labels), check, task, classes, name) & keep)
            if len(bad):
                return f"{file}: {split.format.where(index + int(bad[0]), None)}"
            index += int(raw.shape[0])
    return "a record of the train split"
