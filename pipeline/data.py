"""Data stage: the bundled scikit-learn digits, a seeded stratified split and tf.data pipelines.

No download ever: `sklearn.datasets.load_digits` reads a file shipped inside scikit-learn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.config import DataSection
from pipeline.errors import DatasetError

DIGITS_IMAGE_SHAPE = (8, 8, 1)
DIGITS_PIXEL_MAX = 16.0


@dataclass(frozen=True)
class ArraySplit:
    """One split: `images` float32 [N, 8, 8, 1] scaled to [0, 1]; `labels` int64 [N] in [0, 10)."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class DatasetSplits:
    """Train, validation and test splits plus the class names (index = class id)."""

    train: ArraySplit
    validation: ArraySplit
    test: ArraySplit
    class_names: tuple[str, ...]

    def summary(self) -> dict[str, int]:
        """Sample counts per split."""
        return {"train": len(self.train), "validation": len(self.validation), "test": len(self.test)}


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Load scikit-learn's bundled digits: images float32 [1797, 8, 8, 1] in [0, 1], labels int64 [1797]."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images.astype(np.float32) / DIGITS_PIXEL_MAX).reshape((-1, *DIGITS_IMAGE_SHAPE))
    return images, bunch.target.astype(np.int64)


def load_split_arrays(config: DataSection, seed: int) -> DatasetSplits:
    """Split the configured source into seeded, stratified train / validation / test arrays.

    The same (config, seed) always gives the same split, so `tfship query` can send exactly the
    held-out test samples the pipeline validated on.

    Raises:
        DatasetError: when a split would be too small to hold every class.
    """
    from sklearn.model_selection import train_test_split

    if config.source != "digits":
        raise DatasetError(f"data.source: unknown source {config.source!r}; allowed: 'digits'")
    images, labels = load_digits_arrays()
    classes = np.unique(labels)
    held_out = config.validation_fraction + config.test_fraction
    if held_out * len(labels) < 2 * len(classes):
        raise DatasetError(
            f"data.validation_fraction + data.test_fraction = {held_out}: too small to hold every one of "
            f"{len(classes)} classes in both held-out splits")
    x_train, x_rest, y_train, y_rest = train_test_split(
        images, labels, test_size=held_out, stratify=labels, random_state=seed)
    x_val, x_test, y_val, y_test = train_test_split(
        x_rest, y_rest, test_size=config.test_fraction / held_out, stratify=y_rest, random_state=seed)
    return DatasetSplits(
        train=ArraySplit(x_train, y_train),
        validation=ArraySplit(x_val, y_val),
        test=ArraySplit(x_test, y_test),
        class_names=tuple(str(int(c)) for c in classes),
    )


def make_dataset(split: ArraySplit, batch_size: int, *, training: bool, seed: int, shuffle_buffer: int = 2048):
    """Build a `tf.data.Dataset` of (images float32 [B, 8, 8, 1], labels int64 [B]).

    Training datasets are cached, reshuffled each epoch and batched with `drop_remainder=True`, so
    every step has the same shape and XLA compiles the step once (the partial last batch is dropped,
    at most `batch_size - 1` samples per epoch; they are seen in other epochs because of the shuffle).
    Evaluation datasets keep every sample. Both prefetch with AUTOTUNE.
    """
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((split.images, split.labels)).cache()
    if training:
        dataset = dataset.shuffle(min(shuffle_buffer, len(split)), seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.batch(batch_size, drop_remainder=training)
    return dataset.prefetch(tf.data.AUTOTUNE)
