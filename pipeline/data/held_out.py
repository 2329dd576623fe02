"""`write_held_out`: the test split's first rows as NPZ, for the export, the gate and `tfship query --run`."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from tfship.core.errors import DatasetError
from tfship.core.files import write_npz


def held_out_rows(splits, rows: int | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The test split's first `rows` (default `splits.sample_size`) rows: ({input name: [n, ...]}, labels [n]).

    One input comes back under `splits.input_name`; named inputs under their own names. A `StreamSplit`'s rows
    are its bounded sample (the first `data.sample_size` records in file order).

    Raises:
        DatasetError: the test split holds no row.
    """
    rows = rows or splits.sample_size
    test = splits.test
    inputs = test.images
    named = dict(inputs) if isinstance(inputs, dict) else {splits.input_name: inputs}
    labels = np.asarray(test.labels)
    if len(labels) == 0:
        raise DatasetError("data: the test split holds no row to hold out")
    return {name: np.asarray(array)[:rows] for name, array in named.items()}, labels[:rows]


def write_held_out(splits, path, rows: int | None = None) -> Path:
    """Write the held-out rows (`held_out_rows`) as NPZ: one array per input name plus `y` (the labels: int64,
    float32 for regression; string inputs as unicode arrays), to a temporary name then renamed, so no half file
    is left. Works for any `DatasetSplits` (one input or named, in memory or streamed).

    Raises:
        DatasetError: the test split is empty, or an input is named `y`.
    """
    inputs, labels = held_out_rows(splits, rows)
    if "y" in inputs:
        raise DatasetError("data: an input named 'y' collides with the labels' array in the held-out NPZ; "
                           "rename the input (data.input_name or data.feature_spec.<name>.input_name)")
    arrays = {name: _unicode(array) if array.dtype == object else array for name, array in inputs.items()}
    path = Path(path)
    partial = path.with_name(path.name + ".partial.npz")
    write_npz(partial, arrays | {"y": labels})
    os.replace(partial, path)
    return path


def _unicode(array: np.ndarray) -> np.ndarray:
    """A unicode array of an object array of bytes or str (what TensorFlow's string tensors give)."""
    flat = [x.decode() if isinstance(x, bytes) else str(x) for x in array.ravel().tolist()]
    return np.asarray(flat, dtype=str).reshape(array.shape)
