"""Data stage: read the configured source (`pipeline.data.sources`), split it seeded and stratified, and
build tf.data pipelines.

The default source is scikit-learn's bundled digits (no download ever).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tfship.core.errors import DatasetError
from tfship.pipeline.config import DataSection
from tfship.pipeline.data.sources import DIGITS_IMAGE_SHAPE, DIGITS_PIXEL_MAX, read_digits, read_source
from tfship.pipeline.data.split_types import ArraySplit, DatasetSplits

__all__ = ["ArraySplit", "DatasetSplits", "DIGITS_IMAGE_SHAPE", "DIGITS_PIXEL_MAX", "load_digits_arrays",
           "load_split_arrays", "make_dataset"]


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Load scikit-learn's bundled digits: images float32 [1797, 8, 8, 1] in [0, 1], labels int64 [1797]."""
    data = read_digits()
    return data.features["image"], data.labels


def load_split_arrays(config: DataSection, seed: int, cache_dir: Path | None = None) -> DatasetSplits:
    """Read the configured source and split it into seeded, stratified train / validation / test arrays; a
    streaming source (TFRecord, CSV, image folder) into streamed splits instead
    (`pipeline.data.streaming.load_stream_splits`; `cache_dir` keeps its scan).

    The same (config, seed) always gives the same split, so `tfship query` can send exactly the
    held-out test samples the pipeline validated on.

    Raises:
        DatasetError: a reader error (file, line or column named), several inputs, or a split too
            small to hold every class.
    """
    from sklearn.model_selection import train_test_split

    from tfship.pipeline.data.streaming import STREAMING_SOURCES, load_stream_splits

    if config.source in STREAMING_SOURCES:
        return load_stream_splits(config, seed, cache_dir)
    source = read_source(config)
    input_name, features = source.single_input()
    labels = source.labels
    classes = len(source.class_names)
    held_out = config.validation_fraction + config.test_fraction
    counts = np.bincount(labels, minlength=classes)
    if held_out * len(labels) < 2 * classes or counts.min() < 3:
        raise DatasetError(
            f"data: {len(labels)} samples, {counts.min()} in the rarest class: too few to hold every one of "
            f"{classes} classes in train, validation and test with validation_fraction + test_fraction = {held_out}")
    index = np.arange(len(labels))
    try:
        train, rest = train_test_split(index, test_size=held_out, stratify=labels, random_state=seed)
        val, test = train_test_split(rest, test_size=config.test_fraction / held_out, stratify=labels[rest],
                                     random_state=seed)
    except ValueError as err:
        raise DatasetError(f"data: cannot split stratified: {err}") from err
    return DatasetSplits(
        train=ArraySplit(features[train], labels[train], train),
        validation=ArraySplit(features[val], labels[val], val),
        test=ArraySplit(features[test], labels[test], test),
        class_names=source.class_names,
        input_name=input_name,
        feature_names=source.feature_names,
    )


def make_dataset(split: ArraySplit, batch_size: int, *, training: bool, seed: int, shuffle_buffer: int = 2048,
                 cache: bool = True, repeat: bool = False):
    """Build a `tf.data.Dataset` of (inputs [B, ...] in the split's dtype, labels int64 [B]).

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
    dtype = tf.as_dtype(split.images.dtype)

    def as_model_dtypes(inputs, labels):
        return tf.cast(inputs, dtype), tf.cast(labels, tf.int64)

    dataset = tf.data.Dataset.from_tensor_slices((split.images, split.labels))
    dataset = dataset.map(as_model_dtypes, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if cache:
        dataset = dataset.cache()
    if training:
        dataset = dataset.shuffle(min(shuffle_buffer, len(split)), seed=seed, reshuffle_each_iteration=True)
        if repeat:
            dataset = dataset.repeat()
    dataset = dataset.batch(batch_size, drop_remainder=training)
    return dataset.prefetch(tf.data.AUTOTUNE)


def held_out_digits(count: int, config: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The first `count` held-out test rows of the configured data (`tfship query`'s samples).

    Returns:
        images [count, ...] (float32 in [0, 1] for the bundled digits, [count, 8, 8, 1]) and labels int64 [count].

    Raises:
        ConfigError, DatasetError: the config or its data source is unusable.
    """
    from tfship.pipeline.config import load_config

    cfg = load_config(config)
    test = load_split_arrays(cfg.data, cfg.run.seed, scan_cache_dir(cfg)).test
    return test.images[:count], test.labels[:count]


def scan_cache_dir(config) -> Path:
    """Where a streaming source's scan is cached: `<run.runs_dir>/.data-scan`."""
    return Path(config.run.runs_dir) / ".data-scan"
