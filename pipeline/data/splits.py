"""Data stage: read the configured source (`pipeline.data.sources`), split it seeded and stratified, and
build tf.data pipelines. `load_splits(config, cache_dir)` is the one loader of every config (every model kind,
task and source; named inputs for tabular / recommender); `load_split_arrays` the one-input classification
reading of a `DataSection` it delegates to; `write_held_out` (`pipeline.data.held_out`) the held-out NPZ.

The default source is scikit-learn's bundled digits (no download ever).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tfship.core.errors import DatasetError
from tfship.pipeline.config import DataSection
from tfship.pipeline.data.held_out import write_held_out
from tfship.pipeline.data.sources import DIGITS_IMAGE_SHAPE, DIGITS_PIXEL_MAX, read_digits, read_source
from tfship.pipeline.data.split_types import ArraySplit, DatasetSplits

__all__ = ["ArraySplit", "DatasetSplits", "DIGITS_IMAGE_SHAPE", "DIGITS_PIXEL_MAX", "load_digits_arrays",
           "load_split_arrays", "load_splits", "make_dataset", "write_held_out"]


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Load scikit-learn's bundled digits: images float32 [1797, 8, 8, 1] in [0, 1], labels int64 [1797]."""
    data = read_digits()
    return data.features["image"], data.labels


def load_splits(config, cache_dir: Path | None = None) -> DatasetSplits:
    """The one loader of every config: `config.data` read for `config.model.kind` and `config.model.task`.

    Returns:
        `DatasetSplits` with `task`, `class_names` (classification: the classes; binary ("0", "1");
        regression ()), and `specs` non-empty for the named-input kinds (tabular, recommender). Each split is
        an in-memory `ArraySplit` (digits, npz) or a `StreamSplit` (tfrecord, csv, image_folder); batches
        are (inputs [B, ...] or {name: [B, ...]}, labels int64 [B] | float32 [B] for regression).

    Raises:
        DatasetError: a reader error (file, line or record named), a label outside the task's range, a split
            too small; ConfigError: a bad feature spec.
    """
    return _load(config.data, config.run.seed, cache_dir, config.model.kind, config.model.task)


def load_split_arrays(config: DataSection, seed: int, cache_dir: Path | None = None) -> DatasetSplits:
    """Read the configured source and split it into seeded, stratified train / validation / test arrays; a
    streaming source (TFRecord, CSV, image folder) into streamed splits instead
    (`pipeline.data.streaming.load_stream_splits`; `cache_dir` keeps its scan). One input, classification
    (`load_splits` reads a whole config: every kind and task).

    The same (config, seed) always gives the same split, so `tfship query` can send exactly the
    held-out test samples the pipeline validated on.

    Raises:
        DatasetError: a reader error (file, line or column named), several inputs, or a split too
            small to hold every class.
    """
    return _load(config, seed, cache_dir, "cnn", "classification")


NAMED_KINDS = ("tabular", "recommender")


def _load(config: DataSection, seed: int, cache_dir: Path | None, kind: str, task: str) -> DatasetSplits:
    from sklearn.model_selection import train_test_split

    from tfship.pipeline.data.input_spec import InputSpec
    from tfship.pipeline.data.labels import LabelRule
    from tfship.pipeline.data.streaming import STREAMING_SOURCES, load_stream_splits

    if config.source in STREAMING_SOURCES:
        return load_stream_splits(config, seed, cache_dir, kind=kind, task=task)
    source = read_source(config)
    specs: tuple[InputSpec, ...] = ()
    if kind in NAMED_KINDS:
        features, specs = _named_arrays(source.features)
        input_name = next(iter(features))
    else:
        input_name, features = source.single_input()
    labels = source.labels
    class_names = source.class_names
    if task != "classification":
        where = str(config.path) if config.path is not None else config.source
        labels = LabelRule(task).to_numpy(np.asarray(class_names, dtype=object)[labels], where)
        class_names = ("0", "1") if task == "binary" else ()
    held_out = config.validation_fraction + config.test_fraction
    stratify = labels if task != "regression" else None
    if stratify is not None:
        classes = len(class_names)
        counts = np.bincount(labels, minlength=classes)
        if held_out * len(labels) < 2 * classes or counts.min() < 3:
            raise DatasetError(
                f"data: {len(labels)} samples, {counts.min()} in the rarest class: too few to hold every one of "
                f"{classes} classes in train, validation and test with validation_fraction + test_fraction = "
                f"{held_out}")
    elif held_out * len(labels) < 2 or len(labels) < 6:
        raise DatasetError(f"data: {len(labels)} samples: too few for train, validation and test")
    index = np.arange(len(labels))
    try:
        train, rest = train_test_split(index, test_size=held_out, stratify=stratify, random_state=seed)
        val, test = train_test_split(rest, test_size=config.test_fraction / held_out,
                                     stratify=None if stratify is None else labels[rest], random_state=seed)
    except ValueError as err:
        raise DatasetError(f"data: cannot split stratified: {err}") from err

    def part(rows):
        inputs = {k: v[rows] for k, v in features.items()} if isinstance(features, dict) else features[rows]
        return ArraySplit(inputs, labels[rows], rows)

    return DatasetSplits(train=part(train), validation=part(val), test=part(test), class_names=class_names,
                         input_name=input_name, feature_names=source.feature_names, task=task, specs=specs,
                         sample_size=config.sample_size)


def _named_arrays(arrays: dict[str, np.ndarray]):
    """({name: array}, specs) of in-memory arrays for a named-input model: numeric arrays dense float32 [N, ...];
    a string array [N] a categorical string input (vocabulary: its values, sorted; at most `MAX_VOCABULARY`).

    Raises:
        DatasetError: a string array of more than one value per row, or with too many distinct values.
    """
    from tfship.pipeline.data.input_spec import MAX_VOCABULARY, InputSpec, vocabulary_error

    features, specs = {}, []
    for name, array in arrays.items():
        if array.dtype.kind not in "USO":
            features[name] = np.asarray(array, np.float32)
            specs.append(InputSpec(name, name, "dense", "float32", tuple(array.shape[1:]), str(array.dtype)))
            continue
        if array.ndim != 1:
            raise DatasetError(f"data: string array {name!r} has shape {list(array.shape)}; a string input holds "
                               "one value per row [N]")
        values = np.asarray([x.decode() if isinstance(x, bytes) else str(x) for x in array.tolist()], dtype=object)
        vocabulary = sorted(set(values.tolist()))
        if len(vocabulary) > MAX_VOCABULARY:
            raise DatasetError(f"data: {vocabulary_error(name, f'data.features ({name})', len(vocabulary))}")
        features[name] = values
        specs.append(InputSpec(name, name, "categorical", "string", (), "string").with_vocabulary(vocabulary))
    return features, tuple(specs)


def make_dataset(split: ArraySplit, batch_size: int, *, training: bool, seed: int, shuffle_buffer: int = 2048,
                 cache: bool = True, repeat: bool = False):
    """Build a `tf.data.Dataset` of (inputs [B, ...] in the split's dtype, or {name: [B, ...]} for named
    inputs, labels [B]: int64, float32 when the split's labels are floats (regression)).

    Training datasets are cached, reshuffled each epoch (seeded: the order is reproducible) and
    batched with `drop_remainder=True`, so every step has the same shape and XLA compiles the step
    once (the partial last batch is dropped, at most `batch_size - 1` samples per epoch; they are
    seen in other epochs because of the shuffle). `repeat=True` makes the training stream endless,
    so one iterator (checkpointed with the model) runs the whole training. Evaluation datasets keep
    every sample. A parallel, order-preserving map fixes dtypes; both prefetch with AUTOTUNE.
    """
    import tensorflow as tf

    if not isinstance(split, ArraySplit):  # a StreamSplit streams its files
        return split.dataset(batch_size, training=training, seed=seed, shuffle_buffer=shuffle_buffer, repeat=repeat)
    label_dtype = tf.float32 if split.labels.dtype.kind == "f" else tf.int64
    dataset = tf.data.Dataset.from_tensor_slices((split.images, split.labels))  # pyright: ignore[reportArgumentType]  # tf stub: a nested structure (tuple, dict of arrays) is sliced too
    dataset = dataset.map(_model_dtypes(split.images, label_dtype), num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True)
    if cache:
        dataset = dataset.cache()
    if training:
        dataset = dataset.shuffle(min(shuffle_buffer, len(split)), seed=seed, reshuffle_each_iteration=True)
        if repeat:
            dataset = dataset.repeat()
    dataset = dataset.batch(batch_size, drop_remainder=training)
    return dataset.prefetch(tf.data.AUTOTUNE)


def _model_dtypes(images: np.ndarray | dict[str, np.ndarray], label_dtype):
    """The map function casting a split's (inputs, labels) to the model's dtypes (string inputs kept)."""
    import tensorflow as tf

    if isinstance(images, dict):
        dtypes = {k: tf.string if v.dtype.kind in "USO" else tf.as_dtype(v.dtype) for k, v in images.items()}

        def named_dtypes(inputs, labels):
            cast = {k: v if dtypes[k] == tf.string else tf.cast(v, dtypes[k]) for k, v in inputs.items()}
            return cast, tf.cast(labels, label_dtype)
        return named_dtypes
    dtype = tf.as_dtype(images.dtype)

    def one_dtype(inputs, labels):
        return tf.cast(inputs, dtype), tf.cast(labels, label_dtype)
    return one_dtype


def held_out_digits(count: int, config: Path | None = None) -> tuple[np.ndarray | dict[str, np.ndarray], np.ndarray]:
    """The first `count` held-out test rows of the configured data (`tfship promote --label stable`'s evidence).

    Returns:
        images [count, ...] (float32 in [0, 1] for the bundled digits, [count, 8, 8, 1]), or for named inputs
        {input name: [count, ...]}, and labels int64 [count].

    Raises:
        ConfigError, DatasetError: the config or its data source is unusable.
    """
    from tfship.pipeline.config import load_config

    cfg = load_config(config)
    test = load_split_arrays(cfg.data, cfg.run.seed, scan_cache_dir(cfg)).test
    images = test.images
    return ({k: v[:count] for k, v in images.items()} if isinstance(images, dict) else images[:count],
            test.labels[:count])


def scan_cache_dir(config) -> Path:
    """Where a streaming source's scan is cached: `<run.runs_dir>/.data-scan`."""
    return Path(config.run.runs_dir) / ".data-scan"
