"""The data of a named-input run: `model.kind = tabular | recommender`, or any `model.task` other than
classification, trained by `tfship train` from tf.Examples with one named model input per feature.

`check_named` refuses, before any data is read, what this path cannot train, each with one line naming the
key and the value. `NamedSplits` streams the train, validation and test splits as tf.data pipelines of
(named inputs {name: [B, ...]}, labels [B]) batches (TensorFlow's "batch, then parse": one vectorised
`tf.io.parse_example` per batch, `pipeline.training.input_specs.parse_batch`):

* from `data.train_path`, `data.validation_path` and `data.test_path` (globs), or
* from `data.path` split by a hash of each serialized record (`tf.strings.to_hash_bucket_fast`, 10,000
  buckets): buckets below `test_fraction` are test, the next `validation_fraction` validation, the rest train.

Labels: classification int64 class ids in [0, len(data.classes)), binary int64 0/1, regression float32. A label
outside that range stops the pass with a `DatasetError` naming `data.label` and the allowed range.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tfship.core.errors import DatasetError
from tfship.pipeline.training.input_specs import (  # noqa: F401  (is_named, check_named: used from here too)
    HASH_BUCKETS,
    InputSpec,
    check_named,
    is_named,
)


@dataclass(frozen=True)
class NamedSplits:
    """Streamed splits of named inputs (see the module docstring).

    Attributes:
        specs: the model inputs, in order.
        task: "classification" | "binary" | "regression".
        class_names: classification: the declared class names; else ().
        label: the label feature; label_dtype its tf.Example dtype.
        files: {"train" | "validation" | "test": files}; hashed: the three share `data.path`'s files.
        compression: "" | "GZIP" | "ZLIB".
        fractions: (test, validation) shares of the hash split.
        shuffle_buffer: records in the train split's shuffle buffer.
    """

    specs: tuple[InputSpec, ...]
    task: str
    class_names: tuple[str, ...]
    label: str
    label_dtype: str
    files: dict
    hashed: bool
    compression: str
    fractions: tuple[float, float]
    shuffle_buffer: int
    sample_size: int

    @property
    def num_classes(self) -> int:
        """Outputs of a classification head (2 for binary and regression: unused there)."""
        return max(len(self.class_names), 2)

    def summary(self) -> dict:
        """The data stage's record: inputs, task, files per split."""
        return {"kind": "named_inputs", "task": self.task, "label": self.label,
                "inputs": [{"name": s.name, "feature": s.feature, "kind": s.kind, "dtype": s.dtype,
                            "shape": list(s.shape)} for s in self.specs],
                "split": "hash of data.path" if self.hashed else "train/validation/test paths",
                "files": {name: len(files) for name, files in self.files.items()}}

    def dataset(self, split: str, batch_size: int, *, training: bool = False, seed: int = 0):
        """(named inputs, labels) batches of `split`; training: shuffled (seeded) and drop_remainder."""
        import tensorflow as tf

        from tfship.pipeline.training.input_specs import parse_batch

        records = tf.data.TFRecordDataset(list(self.files[split]), compression_type=self.compression)
        if self.hashed:
            records = records.filter(self._in_split(split))
        if training:
            records = records.shuffle(self.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        parse = parse_batch(self.specs, self.label, self.label_dtype)
        return (records.batch(batch_size, drop_remainder=training)
                .map(lambda batch: self._checked(*parse(batch)), num_parallel_calls=tf.data.AUTOTUNE)
                .prefetch(tf.data.AUTOTUNE))

    def _in_split(self, split: str):
        import tensorflow as tf

        test, validation = (int(round(f * HASH_BUCKETS)) for f in self.fractions)
        low, high = {"test": (0, test), "validation": (test, test + validation),
                     "train": (test + validation, HASH_BUCKETS)}[split]

        def keep(record):
            bucket = tf.strings.to_hash_bucket_fast(record, HASH_BUCKETS)
            return tf.logical_and(bucket >= low, bucket < high)

        return keep

    def _checked(self, inputs, labels):
        import tensorflow as tf

        if self.task == "regression":
            return inputs, tf.cast(labels, tf.float32)
        top = len(self.class_names) if self.task == "classification" else 2
        message = f"data.label = {self.label}: a {self.task} label outside [0, {top})"  # no quotes: TF escapes them
        with tf.control_dependencies([tf.debugging.assert_non_negative(labels, message=message),
                                      tf.debugging.assert_less(labels, tf.constant(top, labels.dtype),
                                                               message=message)]):
            return inputs, tf.identity(labels)

    def held_out(self, rows: int | None = None) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The first `rows` (default `data.sample_size`) test rows: ({input name: [N, ...]}, labels [N]).

        Raises:
            DatasetError: the test split is empty, or a record fails to parse.
        """
        import tensorflow as tf

        rows = rows or self.sample_size
        parts, labels = [], []
        try:
            for inputs, batch_labels in self.dataset("test", 512).take((rows + 511) // 512):
                parts.append({k: v.numpy() for k, v in inputs.items()})
                labels.append(batch_labels.numpy())
        except tf.errors.OpError as err:
            raise DatasetError(f"test split ({self.files['test'][0]}, ...): {err.message.splitlines()[0]}") from None
        if not labels:
            raise DatasetError(f"test split ({self.files['test'][0]}, ...): no record")
        named = {k: np.concatenate([p[k] for p in parts])[:rows] for k in parts[0]}
        return named, np.concatenate(labels)[:rows]


def named_splits(config) -> NamedSplits:
    """The named-input splits of `config` (checked by `check_named`; files listed, no record read).

    Raises:
        ConfigError: see `check_named`. DatasetError: a glob matching no file, mixed compression.
    """
    from tfship.pipeline.data.files import compression_of, expand

    specs, data = check_named(config), config.data
    if data.train_path is not None:
        files = {name: expand(getattr(data, f"{name}_path"), f"data.{name}_path")
                 for name in ("train", "validation", "test")}
    else:
        files = dict.fromkeys(("train", "validation", "test"), expand(data.path, "data.path"))
    every = sorted({f for group in files.values() for f in group})
    kinds = {compression_of(f, data.compression) for f in every}
    if len(kinds) != 1:
        raise DatasetError(f"data.compression = {data.compression!r}: the files mix compressions {sorted(kinds)}")
    label = data.feature_spec.get(data.label)
    label_dtype = label.dtype if label is not None else ("float32" if config.model.task == "regression" else "int64")
    classes = tuple(data.classes) if config.model.task == "classification" else ()
    return NamedSplits(specs, config.model.task, classes, data.label, label_dtype, files, data.train_path is None,
                       kinds.pop(), (data.test_fraction, data.validation_fraction), data.shuffle_buffer,
                       data.sample_size)


def write_held_out(splits: NamedSplits, path) -> None:
    """Write the held-out rows as ship's NPZ layout (one array per input, labels as `y`) for the export, the
    gate and `tfship query --run`; written to a temporary name and renamed, so no half file is left.
    """
    import os
    from pathlib import Path

    inputs, labels = splits.held_out()
    path = Path(path)
    partial = path.with_name(path.name + ".partial.npz")
    np.savez(partial, **inputs, y=labels)
    os.replace(partial, path)
