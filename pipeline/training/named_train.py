"""`tfship train` for named inputs and any task: the `tabular` or `recommender` model
(`pipeline.training.multi_input`) trained with Keras `Model.fit` on the streamed splits (`named_data.NamedSplits`),
with the task's loss and metrics (`multi_input.task_loss`, `task_keras_metrics`), judged on the test split by
`core.tasks.task_metrics` (classification accuracy, binary ROC AUC, regression MAE and RMSE).

train.json (`TrainResult.summary`) carries `task`, `metric` (the task's primary metric, `core.tasks.primary`),
`test_<metric>` and every test figure under `test_metrics`; `test_accuracy` is the accuracy where the task has one
(None for regression). The custom loop's features (resume, multi-worker, step kinds, early stopping, ...) are
refused for this path before any data is read (`named_data.check_named`).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfship.core.errors import ConfigError, DatasetError, StageError
from tfship.core.tasks import primary, task_metrics
from tfship.pipeline.training.train_records import PARTIAL_BATCH, TrainInputs, TrainResult


@dataclass(frozen=True)
class TaskEpoch:
    """One epoch of a named-input run: mean training loss, validation loss (the task's loss: cross-entropy
    in nats, or squared error in label units squared), the validation value of the task's primary metric,
    validation accuracy (None for regression) and the step the epoch ended at.
    """

    epoch: int
    loss: float
    validation_loss: float
    validation_metric: float
    validation_accuracy: float | None
    step: int


def build_named_model(config, splits):
    """The configured `tabular` or `recommender` Keras model over `splits.specs` with `splits.task`'s head.

    `model.embedding_dim`, `model.hidden_units`, `model.dropout` and `run.seed` are passed; `model.factory_args`
    add the factory's own keywords (the recommender's `user`, `item`, `history`, `pooling`).

    Raises:
        ConfigError: the factory refuses its inputs or arguments (named `model.factory_args` / `model.kind`).
    """
    from tfship.pipeline.training.multi_input import recommender, tabular

    model = config.model
    factory = tabular if model.kind == "tabular" else recommender
    settings = {"embedding_dim": model.embedding_dim, "hidden_units": tuple(model.hidden_units),
                "dropout": model.dropout, "seed": config.run.seed} | dict(model.factory_args)
    try:
        return factory(splits.specs, splits.task, splits.num_classes, **settings)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"model.kind = {model.kind!r}, model.factory_args = {dict(model.factory_args)}: "
                          f"{err}") from None


def _train_updates(config, splits) -> int:
    """Optimizer updates for the learning-rate schedule: `train.max_steps`, else (only when the schedule needs
    it: cosine or a warm-up) the train split's batches counted in one pass times the epochs.
    """
    train = config.train
    if train.max_steps:
        return train.max_steps
    if train.schedule == "constant" and not train.warmup_steps:
        return 1
    batches = int(splits.dataset("train", config.data.batch_size, training=True).reduce(0, lambda n, _: n + 1))
    return max(1, batches * train.epochs)


def _step_counter(progress, task):
    """A Keras callback counting the steps trained (`.steps`) and moving the rich progress bar with the loss."""
    import keras

    class StepCounter(keras.callbacks.Callback):
        steps = 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            loss = (logs or {}).get("loss")
            if progress is not None:
                progress.update(task, advance=1, description=f"train step {self.steps}"
                                + (f" loss {float(loss):.4f}" if loss is not None else ""))

    return StepCounter()


def _traces(model) -> int | str:
    """How many times Keras traced its train step (the tf.function inside the model's train function)."""
    for cell in getattr(model.train_function, "__closure__", None) or ():
        count = getattr(cell.cell_contents, "experimental_get_tracing_count", None)
        if count is not None:
            return int(count())
    return "not counted"


def train_named(inputs: TrainInputs, progress=None) -> TrainResult:
    """Train a named-input model with Keras fit (see the module docstring), save a checkpoint.

    Raises:
        StageError: `--resume` (not available on this path), an empty train split, a non-finite loss.
        DatasetError: a record that fails to parse, or a label outside the task's range (named).
        ConfigError: see `build_named_model`.
    """
    import tensorflow as tf

    from tfship.pipeline.training.multi_input import task_keras_metrics, task_loss
    from tfship.pipeline.training.optim import build_optimizer

    config, splits = inputs.config, inputs.splits
    if inputs.resume:
        raise StageError(f"train --resume: model.kind = {config.model.kind!r} (Keras fit) does not resume; "
                         "start a new run")
    model = build_named_model(config, splits)
    jit = config.train.jit_compile is True
    model.compile(optimizer=build_optimizer(config.train, _train_updates(config, splits)),
                  loss=task_loss(splits.task), metrics=task_keras_metrics(splits.task), jit_compile=jit,
                  run_eagerly=config.train.run_eagerly)
    train_data = splits.dataset("train", config.data.batch_size, training=True, seed=config.run.seed)
    epochs = config.train.epochs
    if config.train.max_steps:
        train_data, epochs = train_data.repeat().take(config.train.max_steps), 1
    bar = progress.add_task("train", total=None) if progress is not None else None
    counter = _step_counter(progress, bar)
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():  # a streamed split has no known length: Keras ends each epoch when the
            warnings.filterwarnings("ignore", message=".*ran out of data")  # data ends, and warns that it did
            fitted = model.fit(train_data, epochs=epochs, validation_data=splits.dataset("validation", 512),
                               verbose=0, callbacks=[counter], shuffle=False)  # shuffled by the split itself
    except tf.errors.OpError as err:
        raise _data_error(splits, "train/validation", err) from None
    except ValueError as err:
        if counter.steps == 0:
            raise StageError(f"train: the train split holds fewer than data.batch_size = {config.data.batch_size} "
                             f"records ({err})") from None
        raise
    seconds = time.perf_counter() - started
    history = _epochs(fitted.history, splits.task, counter.steps)
    if counter.steps == 0:
        raise StageError(f"train: no step: the train split holds fewer than data.batch_size = "
                         f"{config.data.batch_size} records")
    if not all(math.isfinite(h.loss) for h in history):
        raise StageError(f"train: non-finite loss {[h.loss for h in history]} (model.task = {splits.task!r})")
    test = evaluate_named(model, splits)
    checkpoint = tf.train.Checkpoint(model=model).write(str(inputs.checkpoint_dir / "ckpt-final"))
    return TrainResult(model, tuple(history), _traces(model), test.get("accuracy"), Path(checkpoint), seconds,
                       counter.steps, jit, _details(config, splits, test, counter.steps, seconds))


def _epochs(logs: dict, task: str, steps: int) -> list[TaskEpoch]:
    name = primary(task).name
    count = len(logs.get("loss", []))
    per_epoch = steps // max(count, 1)

    def value(key: str, index: int) -> float | None:
        values = logs.get(key)
        return float(values[index]) if values is not None else None

    return [TaskEpoch(i + 1, value("loss", i), value("val_loss", i), value(f"val_{name}", i),
                      value("val_accuracy", i), per_epoch * (i + 1)) for i in range(count)]


def evaluate_named(model, splits, split: str = "test") -> dict[str, float]:
    """`core.tasks.task_metrics` of `model` on a whole split, streamed in batches of 512.

    Raises:
        DatasetError: a record fails to parse, a label outside the task's range, or an empty split.
    """
    import tensorflow as tf

    outputs, labels = [], []
    try:
        for batch, batch_labels in splits.dataset(split, 512):
            outputs.append(np.asarray(model(batch, training=False), np.float64))
            labels.append(batch_labels.numpy())
    except tf.errors.OpError as err:
        raise _data_error(splits, split, err) from None
    if not labels:
        raise DatasetError(f"{split} split ({splits.files[split][0]}, ...): no record to evaluate on")
    try:
        return task_metrics(splits.task, np.concatenate(outputs), np.concatenate(labels))
    except ValueError as err:
        raise DatasetError(f"{split} split: data.label {splits.label!r}: {err}") from None


def _data_error(splits, split: str, err) -> DatasetError:
    """One line: the split, its first file and TensorFlow's own cause (our label check's message when it fired)."""
    lines = [line.strip() for line in str(err.message).splitlines() if line.strip()]
    label = [line for line in lines if "data.label" in line]
    if label:  # our label check: its message and the values it saw
        return DatasetError(f"{split} split ({splits.files[split.split('/')[0]][0]}, ...): "
                            f"{label[0][label[0].index('data.label'):][:300]}")
    useful = [line for line in lines if not line.startswith(("Graph execution error", "Detected at node", "File ",
                                                              "[["))]
    first = split.split("/")[0]
    return DatasetError(f"{split} split ({splits.files[first][0]}, ...): {(useful or lines or [''])[0][:300]}")


def _details(config, splits, test: dict[str, float], steps: int, seconds: float) -> dict:
    name = primary(splits.task).name
    return {"task": splits.task, "metric": name, f"test_{name}": test[name], "test_metrics": test,
            "trainer": "keras_fit", "model_kind": config.model.kind, "optimizer": config.train.optimizer,
            "schedule": config.train.schedule, "mixed_precision": config.train.mixed_precision,
            "global_batch": config.data.batch_size, "steps_per_second": round(steps / max(seconds, 1e-9), 2),
            "inputs": [s.name for s in splits.specs], "data": splits.summary(), "partial_batch": PARTIAL_BATCH}
