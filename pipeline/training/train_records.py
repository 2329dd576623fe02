"""What the train stage takes and gives: `TrainInputs`, `EpochMetrics`, `TrainResult` (shared by the custom loop,
`pipeline.training.train`, the one training loop).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfship.pipeline.config import PipelineConfig
from tfship.pipeline.data.splits import DatasetSplits

PARTIAL_BATCH = "dropped (training batches are drop_remainder=True; evaluation keeps all)"


@dataclass(frozen=True)
class TrainInputs:
    """What the train stage needs.

    Attributes:
        config: the pipeline config.
        splits: the data splits.
        checkpoint_dir: CheckpointManager folder (`<run>/checkpoints`).
        tensorboard_dir: TensorBoard folder (`<run>/tensorboard`); None writes no events.
        resume: continue from the latest checkpoint in `checkpoint_dir`.
        log: called with one line per notable event (XLA choice, checkpoints, early stop).
    """

    config: PipelineConfig
    splits: DatasetSplits
    checkpoint_dir: Path
    tensorboard_dir: Path | None = None
    resume: bool = False
    log: Callable[[str], None] | None = None


@dataclass(frozen=True)
class EpochMetrics:
    """One epoch: mean training loss (the task's loss: cross-entropy in nats, squared error in label units
    squared), training and validation accuracy (fractions in [0, 1]; None for regression), validation loss,
    the step the epoch ended at, the task's primary metric (`core.tasks.primary`: accuracy, auc, mae) and its
    validation value, and for regression the training MAE (label units).
    """

    epoch: int
    loss: float
    train_accuracy: float | None
    validation_accuracy: float | None
    validation_loss: float = float("nan")
    step: int = 0
    metric: str = "accuracy"
    validation_metric: float | None = None
    train_mae: float | None = None


@dataclass(frozen=True)
class TrainResult:
    """The trained Keras model and what the loop measured (`details`: JSON-ready extras)."""

    model: Any
    history: tuple[EpochMetrics, ...]
    train_step_traces: int
    test_accuracy: float | None
    checkpoint_path: Path
    seconds: float
    steps: int
    jit_compile: bool
    details: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary (no model)."""
        return {
            "epochs": len(self.history),
            "steps": self.steps,
            "train_step_traces": self.train_step_traces,
            "jit_compile": self.jit_compile,
            "final_loss": self.history[-1].loss if self.history else None,
            "validation_accuracy": self.history[-1].validation_accuracy if self.history else None,
            "test_accuracy": self.test_accuracy,
            "seconds": round(self.seconds, 3),
            "checkpoint": str(self.checkpoint_path),
            "partial_batch": PARTIAL_BATCH,
            **self.details,
        }
