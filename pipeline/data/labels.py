"""Labels by task, one rule for the counted pass (NumPy: which labels are bad, and why) and for the stream
(TensorFlow: the label tensor the loop trains on).

* classification: int64 class ids [B]: the label text's index in the class names, or, when the class names are
  declared and are not numbers while the labels are int64 (`ids`), the label itself as a class id in
  [0, len(classes));
* binary: int64 [B] in {0, 1} (from "0"/"1", 0/1 or 0.0/1.0);
* regression: float32 [B] (any finite number).

Formats hand labels over as strings [B] (int64 features as their decimal text) or, for a float32 feature,
as float32 [B].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TASKS = ("classification", "binary", "regression")


@dataclass(frozen=True)
class LabelRule:
    """How labels of one run are checked and converted (see the module docstring).

    Attributes:
        task: "classification" | "binary" | "regression".
        class_names: classification: the class names (empty while the scan still collects them).
        ids: classification: the labels are class ids in [0, len(class_names)), not class names.
    """

    task: str = "classification"
    class_names: tuple[str, ...] = ()
    ids: bool = False

    @property
    def collects(self) -> bool:
        """Whether the scan collects the label texts (classification without declared classes)."""
        return self.task == "classification" and not self.class_names

    def bad(self, raw: np.ndarray) -> np.ndarray:
        """Bool [N]: which of `raw` (bytes or numbers [N]) are outside the task's range."""
        if self.collects:
            return np.zeros(len(raw), bool)
        if self.task == "classification" and not self.ids:
            return ~np.isin(_texts(raw), np.asarray(self.class_names, dtype=object))
        values = _floats(raw)
        if self.task == "regression":
            return ~np.isfinite(values)
        if self.task == "binary":
            return ~((values == 0) | (values == 1))
        with np.errstate(invalid="ignore"):
            return ~((values == np.round(values)) & (values >= 0) & (values < len(self.class_names)))

    def reason(self) -> str:
        """Why a label `bad` flagged is bad (follows "label 'x' ")."""
        if self.task == "regression":
            return "is not a finite number (model.task = 'regression')"
        if self.task == "binary":
            return "is not 0 or 1 (model.task = 'binary')"
        if self.ids:
            return f"is not a class id in [0, {len(self.class_names)}) (data.classes = {list(self.class_names)})"
        return f"is not one of the declared classes {list(self.class_names)}"

    def to_tensor(self, raw):
        """The label tensor of `raw` string [B] (or float32 [B]): int64 [B] (classification, binary) or float32
        [B] (regression). A label outside the range fails an assertion (InvalidArgumentError): the scan
        names such records before training; only files changed since the scan (or declared split sizes,
        which skip it) get here.
        """
        import tensorflow as tf

        from tfship.pipeline.data.formats import lookup_ids

        if self.task == "regression":
            return tf.strings.to_number(raw, tf.float32) if raw.dtype == tf.string else tf.cast(raw, tf.float32)
        if self.task == "binary":
            value = tf.strings.to_number(raw, tf.float32) if raw.dtype == tf.string else tf.cast(raw, tf.float32)
            ok = tf.reduce_all(tf.logical_or(tf.equal(value, 0.0), tf.equal(value, 1.0)))
            check = tf.debugging.assert_equal(ok, True, message="a binary label other than 0 or 1")
            with tf.control_dependencies([check]):
                return tf.cast(value, tf.int64)
        if self.ids:
            ids = tf.strings.to_number(raw, tf.int64) if raw.dtype == tf.string else tf.cast(raw, tf.int64)
        else:
            ids = lookup_ids(raw if raw.dtype == tf.string else tf.strings.as_string(raw), self.class_names)
        ok = tf.reduce_all(tf.logical_and(ids >= 0, ids < len(self.class_names)))
        with tf.control_dependencies([tf.debugging.assert_equal(ok, True, message="a label outside the classes")]):
            return tf.identity(ids)

    def to_numpy(self, raw, where: str) -> np.ndarray:
        """In-memory labels: int64 [N] (binary) or float32 [N] (regression) of `raw` [N].

        Raises:
            DatasetError: a label outside the range, naming `where`, the sample and the value.
        """
        from tfship.core.errors import DatasetError

        raw = np.asarray(raw)
        bad = np.flatnonzero(self.bad(raw))
        if len(bad):
            raise DatasetError(f"{where}: sample {int(bad[0])}: label {show(raw[bad[0]])} {self.reason()}")
        values = _floats(raw)
        return values.astype(np.float32) if self.task == "regression" else values.astype(np.int64)


def label_rule(task: str, class_names: tuple[str, ...] = (), int_labels: bool = False) -> LabelRule:
    """The rule of `task` (class names only for classification); int64 labels with declared class names that
    are not all integers are class ids.
    """
    if task != "classification":
        return LabelRule(task)
    names = tuple(class_names)
    ids = bool(int_labels and names and not all(_is_int(n) for n in names))
    return LabelRule(task, names, ids)


def show(value) -> str:
    """A label value as the errors show it: 'text' for strings, the number otherwise."""
    if isinstance(value, bytes):
        return repr(value.decode(errors="replace"))
    if isinstance(value, str):
        return repr(value)
    return repr(float(value)) if isinstance(value, float | np.floating) else repr(int(value))


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _texts(raw: np.ndarray) -> np.ndarray:
    if raw.dtype.kind in "fiu":
        return np.asarray([str(x) for x in raw.tolist()], dtype=object)
    return np.asarray([x.decode() if isinstance(x, bytes) else str(x) for x in raw.tolist()], dtype=object)


def _floats(raw: np.ndarray) -> np.ndarray:
    """float64 [N] of `raw` (numbers, or texts parsed; NaN where a text is not a number)."""
    raw = np.asarray(raw)
    if raw.dtype.kind in "fiub":
        return raw.astype(np.float64)
    unique, inverse = np.unique(raw, return_inverse=True)
    parsed = np.empty(len(unique), np.float64)
    for i, text in enumerate(unique.tolist()):
        try:
            parsed[i] = float(text.decode() if isinstance(text, bytes) else text)
        except ValueError:
            parsed[i] = np.nan
    return parsed[inverse.reshape(-1)]
