"""The in-memory data forms `tfship.ship(model, data)` takes, the way Keras' `Model.fit(x, y)` does.

Accepted forms (anything else is a `ConfigError` naming them):

* `(x, y)`: `x` one array [N, ...] (a single-input model), a list of arrays in the model's input order
  (needs a `keras.Model` object, whose `inputs` give the names), a dict {input name: array [N, ...]}, or a
  data frame (pandas' `DataFrame`, or any object with `columns` and `to_numpy()`; pandas is not imported)
  with one column per input, the column's name the input's, as Keras' `fit` takes it (a single-input model
  whose input names no column takes the whole frame as its [N, columns] array); `y` labels [N] (class ids, or
  float targets [N, ...], a Series too) or None.
* a `tf.data.Dataset` of `(x, y)` batches (or of `x` batches): every batch is read and concatenated, so
  it must be finite; `x` takes the same three forms.
* a dict {input name: array, optional "y"} (the NPZ layout), or one array `x`.

Every form becomes named arrays {input name | "x": [N, ...], "y": [N]} for `data.npz`, which
`pipeline.export_only.user_model` reads. Arrays must be numeric or string; a rectangular object array whose
values are all `str` (pandas' form for text) or all `bytes` becomes a string array, while a ragged list or an
object array of mixed or other values (numpy would pickle it, which NPZ refuses) is named here, not in an
internal temporary file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfship.core.errors import ConfigError

LABEL_KEYS = ("y", "label", "labels")
FORMS = ("(x, y) with x an array, a list of arrays in the model's input order or a dict {input name: array}",
         "a data frame with one column per input", "a tf.data.Dataset of (x, y) batches",
         "a dict {input name: array, optional 'y': labels}", "an array x",
         "a path (NPZ, CSV, image folder)")


def expected_forms() -> str:
    """The accepted data forms, one sentence (for error messages)."""
    return "expected " + "; ".join(FORMS)


def model_input_names(model: Any) -> tuple[str, ...] | None:
    """A `keras.Model`'s input names in call order; None for a path or factory (not loaded here)."""
    inputs = getattr(model, "inputs", None)
    if not inputs:
        return None
    return tuple(str(getattr(tensor, "name", "")).split(":")[0] for tensor in inputs)


def named_arrays(data: Any, input_names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """{input name or "x": [N, ...], optional "y": [N, ...]} of any accepted in-memory form.

    Args:
        data: one of the forms in this module's docstring (not a path).
        input_names: the model's input names in order (needed only for a list `x`).

    Raises:
        ConfigError: an unaccepted form (the accepted ones named), a list `x` whose length differs from the
            model's inputs or whose names are unknown, an input named like a label key, a data frame whose
            columns are not the model's inputs, an array numpy cannot hold without pickling (ragged rows, or
            object values not all `str` or all `bytes`: the input is named), or a Dataset whose elements are
            no batches.
    """
    if _is_dataset(data):
        return _from_dataset(data, input_names)
    if isinstance(data, tuple) and len(data) == 2:
        return _with_labels(_named_x(data[0], input_names, "x"), data[1])
    if isinstance(data, Mapping):
        return {str(name): _array(value, str(name)) for name, value in data.items()}
    if isinstance(data, np.ndarray) or _is_tensor(data):
        return {"x": _array(data, "x")}
    if _is_frame(data):
        return _named_x(data, input_names, "x")
    raise ConfigError(f"ship: data is a {type(data).__name__}; {expected_forms()}")


def _named_x(x: Any, input_names: Sequence[str] | None, where: str) -> dict[str, np.ndarray]:
    if _is_frame(x):
        return _from_frame(x, input_names, where)
    if isinstance(x, Mapping):
        clash = sorted(set(map(str, x)) & set(LABEL_KEYS))
        if clash:
            raise ConfigError(f"ship: {where} has an input named {clash[0]!r}, a label key {list(LABEL_KEYS)}; "
                              "rename the model input")
        return {str(name): _array(value, f"{where}[{name!r}]") for name, value in x.items()}
    if isinstance(x, list | tuple):
        if input_names is None:
            raise ConfigError(f"ship: {where} is a list of {len(x)} arrays but the model is a file or factory, "
                              "whose input order is not known here; give x as a dict {input name: array}")
        if len(x) != len(input_names):
            raise ConfigError(f"ship: {where} is a list of {len(x)} arrays; the model has {len(input_names)} "
                              f"inputs {list(input_names)}")
        return {name: _array(value, f"{where}[{index}] ({name})")
                for index, (name, value) in enumerate(zip(input_names, x, strict=True))}
    if isinstance(x, np.ndarray) or _is_tensor(x):
        return {"x": _array(x, where)}
    raise ConfigError(f"ship: {where} is a {type(x).__name__}; {expected_forms()}")


def _is_frame(value: Any) -> bool:
    return hasattr(value, "columns") and hasattr(value, "to_numpy") and not isinstance(value, np.ndarray)


def _from_frame(frame: Any, input_names: Sequence[str] | None, where: str) -> dict[str, np.ndarray]:
    """A data frame's columns by name (one per input), or the whole frame for a single input no column names."""
    columns = [str(column) for column in frame.columns]
    if input_names is not None and len(input_names) == 1 and input_names[0] not in columns:
        return {"x": _array(frame.to_numpy(), where)}
    if input_names is not None and set(columns) != set(input_names):
        raise ConfigError(f"ship: {where} is a data frame with columns {columns}; the model's inputs are "
                          f"{list(input_names)}: give one column per input, named as the input")
    return _named_x({column: np.asarray(frame[original].to_numpy())
                     for column, original in zip(columns, frame.columns, strict=True)}, None, where)


def _with_labels(arrays: dict[str, np.ndarray], y: Any) -> dict[str, np.ndarray]:
    if y is None:
        return arrays
    labels = _array(y, "y")
    if labels.ndim == 0:
        raise ConfigError(f"ship: y is a scalar ({labels!r}); expected labels [N], one per row of x")
    return arrays | {"y": labels}


def _array(value: Any, where: str) -> np.ndarray:
    if _is_ragged(value):
        raise ConfigError(f"ship: {where} is a tf.RaggedTensor; pad it to a dense array (to_tensor()) first")
    if hasattr(value, "to_numpy") and not isinstance(value, np.ndarray):  # a pandas Series or DataFrame
        value = value.to_numpy()
    try:
        array = np.asarray(value)
    except ValueError as err:  # numpy >= 1.24: a ragged nested list raises here
        raise ConfigError(f"ship: {where} is ragged or mixed ({err}); give a rectangular numeric or string "
                          "array") from None
    if array.dtype == object and array.size and array.ndim:
        values = array.ravel()
        for kind in (str, bytes):  # pandas' text column: rectangular, every value a str (or bytes)
            if all(isinstance(value, kind) for value in values):
                return array.astype(kind)
    if array.dtype == object:
        raise ConfigError(f"ship: {where} holds Python objects (dtype object: ragged rows or mixed values); give "
                          "a rectangular numeric or string array")
    return array


def _from_dataset(dataset, input_names: Sequence[str] | None) -> dict[str, np.ndarray]:
    """Concatenated batches of a finite tf.data.Dataset of (x, y) or x batches."""
    import tensorflow as tf

    if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
        raise ConfigError("ship: the tf.data.Dataset is infinite (repeat()); give a finite one of (x, y) batches")
    parts: dict[str, list[np.ndarray]] = {}
    for index, element in enumerate(dataset):
        x, y = element if isinstance(element, tuple) and len(element) == 2 else (element, None)
        named = _named_x(x, input_names, f"dataset element {index}: x")
        if (y is not None and np.ndim(y) == 0) or any(array.ndim == 0 for array in named.values()):
            raise ConfigError(f"ship: dataset element {index} holds a scalar; expected (x, y) batches "
                              "(call dataset.batch(n))")
        batch = _with_labels(named, y)
        if parts and set(batch) != set(parts):
            raise ConfigError(f"ship: dataset element {index} has {sorted(batch)}; the first had {sorted(parts)}")
        for name, array in batch.items():
            parts.setdefault(name, []).append(array)
    if not parts:
        raise ConfigError("ship: the tf.data.Dataset is empty; expected (x, y) batches")
    return {name: np.concatenate(arrays) for name, arrays in parts.items()}


def _is_dataset(value: Any) -> bool:
    return type(value).__module__.startswith("tensorflow") and hasattr(value, "element_spec")


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("tensorflow") and hasattr(value, "numpy") and not _is_ragged(value)


def _is_ragged(value: Any) -> bool:
    return type(value).__name__ == "RaggedTensor"
