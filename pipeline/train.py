"""Train stage: a custom `tf.GradientTape` loop inside one XLA-compiled `tf.function`.

The step has an explicit `input_signature` with a `None` batch dimension and
`reduce_retracing=False`, so it is traced exactly once per run; the trace count is counted by a
Python side effect that only runs while tracing, and reported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.config import PipelineConfig
from pipeline.data import DatasetSplits, make_dataset
from pipeline.errors import StageError


@dataclass(frozen=True)
class TrainInputs:
    """What the train stage needs: the config, the data splits and where to checkpoint."""

    config: PipelineConfig
    splits: DatasetSplits
    checkpoint_dir: Path


@dataclass(frozen=True)
class EpochMetrics:
    """One epoch: mean training loss, training and validation accuracy (fractions in [0, 1])."""

    epoch: int
    loss: float
    train_accuracy: float
    validation_accuracy: float


@dataclass(frozen=True)
class TrainResult:
    """The trained Keras model and what the loop measured."""

    model: Any
    history: tuple[EpochMetrics, ...]
    train_step_traces: int
    test_accuracy: float
    checkpoint_path: Path
    seconds: float
    steps: int
    jit_compile: bool

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary (no model)."""
        return {
            "epochs": len(self.history),
            "steps": self.steps,
            "train_step_traces": self.train_step_traces,
            "jit_compile": self.jit_compile,
            "final_loss": self.history[-1].loss,
            "validation_accuracy": self.history[-1].validation_accuracy,
            "test_accuracy": self.test_accuracy,
            "seconds": round(self.seconds, 3),
            "checkpoint": str(self.checkpoint_path),
            "partial_batch": "dropped (training batches are drop_remainder=True; evaluation keeps all)",
        }


class _StepFunctions:
    """Holds the compiled train step and the (non-XLA) evaluation function for one model."""

    def __init__(self, model, optimizer, clip_global_norm: float | None, jit_compile: bool, image_shape):
        import keras
        import tensorflow as tf

        self.traces = 0
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        image_spec = tf.TensorSpec([None, *image_shape], tf.float32, name="image")
        label_spec = tf.TensorSpec([None], tf.int64, name="label")

        @tf.function(input_signature=[image_spec, label_spec], jit_compile=jit_compile, reduce_retracing=False)
        def train_step(images, labels):
            self.traces += 1  # Python side effect: runs only while tracing.
            with tf.GradientTape() as tape:
                logits = model(images, training=True)
                loss = loss_fn(labels, logits)
            gradients = tape.gradient(loss, model.trainable_variables)
            if clip_global_norm is not None:
                gradients, _ = tf.clip_by_global_norm(gradients, clip_global_norm)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=-1), labels), tf.float32))
            return loss, correct

        @tf.function(input_signature=[image_spec])
        def predict_logits(images):
            return model(images, training=False)

        self.train_step = train_step
        self.predict_logits = predict_logits

    def accuracy(self, images: np.ndarray, labels: np.ndarray, batch_size: int = 512) -> float:
        """Top-1 accuracy (fraction) of the model in inference mode."""
        correct = 0
        for start in range(0, len(labels), batch_size):
            logits = self.predict_logits(images[start:start + batch_size]).numpy()
            correct += int(np.sum(np.argmax(logits, axis=-1) == labels[start:start + batch_size]))
        return correct / max(1, len(labels))


def train_model(inputs: TrainInputs, progress=None) -> TrainResult:
    """Train the configured built-in model on the train split; checkpoint at the end.

    Args:
        inputs: config, splits (images float32 [N, 8, 8, 1], labels int64 [N]) and checkpoint folder.
        progress: optional `rich.progress.Progress` to report steps on.

    Raises:
        StageError: if the loss becomes NaN or Inf (naming the epoch), or the step was traced more
            than once (a retrace would mean a shape or dtype leak in the input pipeline).
    """
    import keras
    import tensorflow as tf

    from pipeline.model import build_cnn

    config = inputs.config
    splits = inputs.splits
    image_shape = tuple(splits.train.images.shape[1:])
    model = build_cnn(config.model, image_shape, len(splits.class_names), config.run.seed)
    optimizer = keras.optimizers.Adam(learning_rate=config.train.learning_rate)
    # Create the slot variables up front: a tf.function that creates variables is traced twice.
    optimizer.build(model.trainable_variables)
    steps_fn = _StepFunctions(model, optimizer, config.train.clip_global_norm, config.train.jit_compile, image_shape)
    dataset = make_dataset(splits.train, config.data.batch_size, training=True, seed=config.run.seed,
                           shuffle_buffer=config.data.shuffle_buffer)
    steps_per_epoch = len(splits.train) // config.data.batch_size
    if steps_per_epoch == 0:
        raise StageError(f"train: data.batch_size={config.data.batch_size} is larger than the train split "
                         f"({len(splits.train)} samples)")
    task = progress.add_task("train", total=steps_per_epoch * config.train.epochs) if progress else None
    history: list[EpochMetrics] = []
    started = time.perf_counter()
    steps = 0
    for epoch in range(1, config.train.epochs + 1):
        loss_sum, correct_sum, seen = 0.0, 0.0, 0
        for images, labels in dataset:
            loss, correct = steps_fn.train_step(images, labels)
            loss_value = float(loss)
            if not np.isfinite(loss_value):
                raise StageError(f"train: loss became {loss_value} at epoch {epoch}, step {steps + 1}")
            loss_sum += loss_value * int(labels.shape[0])
            correct_sum += float(correct)
            seen += int(labels.shape[0])
            steps += 1
            if progress is not None:
                progress.update(task, advance=1, description=f"train epoch {epoch}/{config.train.epochs} "
                                f"loss {loss_sum / seen:.4f}")
        validation_accuracy = steps_fn.accuracy(splits.validation.images, splits.validation.labels)
        history.append(EpochMetrics(epoch, loss_sum / seen, correct_sum / seen, validation_accuracy))
    seconds = time.perf_counter() - started
    if steps_fn.traces != 1:
        raise StageError(f"train: the train step was traced {steps_fn.traces} times; expected exactly 1")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    checkpoint_path = Path(checkpoint.save(str(inputs.checkpoint_dir / "final")))
    return TrainResult(
        model=model,
        history=tuple(history),
        train_step_traces=steps_fn.traces,
        test_accuracy=steps_fn.accuracy(splits.test.images, splits.test.labels),
        checkpoint_path=checkpoint_path,
        seconds=seconds,
        steps=steps,
        jit_compile=config.train.jit_compile,
    )
