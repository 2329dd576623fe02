"""The typed records the data stage hands on: `ArraySplit` (arrays in memory) and `DatasetSplits` (train,
validation and test, in memory or streamed: `pipeline.data.stream.StreamSplit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfship.pipeline.data.input_spec import InputSpec


@dataclass(frozen=True)
class ArraySplit:
    """One split: `images` is the model's single input array [N, ...] (digits: float32 [N, 8, 8, 1]
    in [0, 1]; text: int token ids [N, L]), or for named inputs a dict {input name: [N, ...]}; `labels` [N]:
    int64 class ids (classification), int64 0/1 (binary) or float32 (regression).
    """

    images: np.ndarray | dict[str, np.ndarray]
    labels: np.ndarray
    rows: np.ndarray | None = None  # each sample's 0-based row in the source (errors name it)

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class DatasetSplits:
    """Train, validation and test splits plus the class names (index = class id) and the input name.

    A streaming source's splits are `pipeline.data.stream.StreamSplit`s (tf.data over the files; `images` /
    `labels` are bounded samples of them), and `stream` describes them (files, split, the scan's counts).

    Attributes:
        class_names: classification: the class names; binary ("0", "1"); regression ().
        input_name: the one input's name (named inputs: unused, see `specs`).
        task: "classification" | "binary" | "regression" (`model.task`).
        specs: the named model inputs (`InputSpec`), non-empty whenever the model takes a dict of inputs
            (tabular, recommender); () for one input.
        sample_size: `data.sample_size` (the held-out rows `write_held_out` writes).
    """

    train: ArraySplit | Any
    validation: ArraySplit | Any
    test: ArraySplit | Any
    class_names: tuple[str, ...]
    input_name: str = "image"
    feature_names: tuple[str, ...] = ()
    stream: dict = field(default_factory=dict)
    task: str = "classification"
    specs: tuple[InputSpec, ...] = ()
    sample_size: int = 2000

    @property
    def named(self) -> bool:
        """Whether the model takes named inputs (a dict {input name: tensor})."""
        return bool(self.specs)

    def summary(self) -> dict:
        """Sample counts per split (and, for a streaming source, its description and class names; for another
        task or named inputs, the task and the inputs).
        """
        counts = {"train": len(self.train), "validation": len(self.validation), "test": len(self.test)}
        if self.task != "classification" or self.specs:
            counts |= {"task": self.task, "inputs": [
                {"name": s.name, "feature": s.feature, "kind": s.kind, "dtype": s.dtype, "shape": list(s.shape),
                 **({"vocabulary_size": len(s.vocabulary)} if s.vocabulary else {})} for s in self.specs]}
        if not self.stream:
            return counts
        return counts | {"class_names": list(self.class_names), "streaming": self.stream}
