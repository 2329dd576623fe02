"""The typed records the data stage hands on: `ArraySplit` (arrays in memory) and `DatasetSplits` (train,
validation and test, in memory or streamed: `pipeline.data.stream.StreamSplit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ArraySplit:
    """One split: `images` is the model's single input array [N, ...] (digits: float32 [N, 8, 8, 1]
    in [0, 1]; text: int token ids [N, L]); `labels` int64 [N] class ids.
    """

    images: np.ndarray
    labels: np.ndarray
    rows: np.ndarray | None = None  # each sample's 0-based row in the source (errors name it)

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class DatasetSplits:
    """Train, validation and test splits plus the class names (index = class id) and the input name.

    A streaming source's splits are `pipeline.data.stream.StreamSplit`s (tf.data over the files; `images` /
    `labels` are bounded samples of them), and `stream` describes them (files, split, the scan's counts).
    """

    train: ArraySplit | Any
    validation: ArraySplit | Any
    test: ArraySplit | Any
    class_names: tuple[str, ...]
    input_name: str = "image"
    feature_names: tuple[str, ...] = ()
    stream: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """Sample counts per split (and, for a streaming source, its description and class names)."""
        counts = {"train": len(self.train), "validation": len(self.validation), "test": len(self.test)}
        if not self.stream:
            return counts
        return counts | {"class_names": list(self.class_names), "streaming": self.stream}
