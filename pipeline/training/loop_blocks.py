"""The host side of the training loop: K-step blocks (`train_step.StepFunctions.run_steps`), one trip to the host
each.

A block runs up to K steps in one call and ends early at the epoch's last step (evaluation, early stopping),
at a checkpoint step (`train.checkpoint_every_steps`) and at the run's last step, so epochs, checkpoints and
the stop all fall on the steps they would fall on one step at a time. After each block the host reads one
packed tensor (`train_step.BLOCK_FIELDS`) and, once per block: names a non-finite step, logs TensorBoard
scalars for every period the block crossed, moves the progress bar and lines, saves a checkpoint when
`train.checkpoint_every_s` has passed, beats the watchdog and asks whether to stop (a signal here, or under
`multi_worker` a vote of every worker, which also agrees the timed checkpoint and the next block's size:
`loop_stop.agree`). A stop therefore comes at most one block late, with a checkpoint.

K is `train.steps_per_execution`; `auto` starts at 1 (the first block traces and compiles) and then takes as
many steps as last took about `AUTO_BLOCK_S` seconds (at most `AUTO_MAX_STEPS`; under `multi_worker` the
slowest worker's time), re-measured every block, as
tf.keras' `steps_per_execution="auto"` tunes it; under `train.check_numerics` a block is one step, so the step
TensorFlow's report stops is named exactly. The input-wait share is the time the block spent in the
iterator's get-next (`tf.timestamp` on either side, summed on the device) over the block's wall time on the
host (`inputs.InputMeter`); the first block after a (re)start fills the pipeline and traces: not measured.
"""

from __future__ import annotations

import math
import time

import numpy as np

from tfship.core.errors import StageError
from tfship.pipeline.training import inputs as data_inputs
from tfship.pipeline.training.train_records import EpochMetrics
from tfship.pipeline.training.train_step import BLOCK_FIELDS

AUTO_BLOCK_S = 0.1
AUTO_MAX_STEPS = 1000


class BlockLoop:
    """Runs a `_Loop`'s blocks from a start step to its last step (see the module docstring)."""

    def __init__(self, loop, steps, board, history: list[EpochMetrics], task):
        self.loop, self.steps, self.board, self.history, self.task = loop, steps, board, history, task
        self.train = loop.train
        self.kind_metrics: dict[str, float] = {}
        self.blocks = 0
        self.block_steps: list[int] = []
        self.last_save = time.monotonic()
        self.logged_step: int | None = None

    def _size(self, step: int, seconds_per_step: float | None) -> int:
        """Steps in the next block after `step`: K, cut at the epoch's end, a checkpoint step and the last step."""
        setting = self.train.steps_per_execution
        if self.train.check_numerics:  # TensorFlow's report names no step: one step a block names it exactly
            wanted = 1
        elif setting == "auto":
            wanted = 1 if seconds_per_step is None else int(min(AUTO_MAX_STEPS, max(1, AUTO_BLOCK_S / max(
                seconds_per_step, 1e-9))))
        else:
            wanted = int(setting)
        per_epoch, every = self.loop.steps_per_epoch, self.train.checkpoint_every_steps
        limits = [wanted, self.loop.total_steps - step, per_epoch - step % per_epoch]
        if every:
            limits.append(every - step % every)
        return max(1, min(limits))

    def run(self, start: int) -> bool:
        """Train from step `start` to the last step; True when early stopping ended the run.

        Raises:
            StageError: a non-finite loss or gradient (its step and first variable named), a stop request
                (after saving a checkpoint), a failed input assertion or read (`DatasetError`).
        """
        import tensorflow as tf

        loop, steps = self.loop, self.steps
        step, seconds_per_step = start, None
        names = tuple(steps.kind.metric_names)
        while step < loop.total_steps:
            loop.watch.beat("step", step)
            count = self._size(step, seconds_per_step)
            began = time.perf_counter()
            packed = self._call(tf.constant(count, tf.int32), step)
            values = dict(zip(BLOCK_FIELDS, packed[:len(BLOCK_FIELDS)].tolist()))
            seconds = time.perf_counter() - began
            ran, previous, step = int(values["steps_run"]), step, int(values["step"])
            self.kind_metrics = {name: round(float(v), 6) for name, v in zip(names, packed[len(BLOCK_FIELDS):])}
            if self.blocks:  # the first block after a (re)start traces and fills the pipeline: not measured
                loop.meter.record(values["input_wait_s"], seconds, ran)
                seconds_per_step = seconds / max(ran, 1)
            else:
                seconds_per_step = AUTO_BLOCK_S / 4  # auto: the next block is 4 measured steps
            self.blocks += 1
            self.block_steps.append(ran)
            if values["bad_step"]:
                self._nonfinite(int(values["bad_step"]), values["loss"])
            mean_loss = values["sum_loss"] / max(values["sum_count"], 1.0)
            loop.lines.step(step, mean_loss, loop.meter)
            self._log(step, values, previous)
            if loop.progress is not None:
                loop.progress.update(self.task, completed=step, description=f"train step {step}/{loop.total_steps} "
                                     f"loss {mean_loss:.4f}{data_inputs.live_figures(loop.meter)}")
            if step % loop.steps_per_epoch == 0 and self._end_epoch(step, values):
                loop.say(f"early stopping at epoch {self.history[-1].epoch}: {self.train.early_stopping_metric} "
                         f"did not improve by {self.train.early_stopping_min_delta} for "
                         f"{self.train.early_stopping_patience} epochs")
                return True
            if step >= loop.total_steps:
                break
            every, path = self.train.checkpoint_every_steps, None
            if every and step % every == 0:
                path = self._save(step)
            loop.watch.beat("after_step", step)
            every_s = self.train.checkpoint_every_s
            agreed = loop.agree(bool(every_s and time.monotonic() - self.last_save >= every_s), seconds_per_step)
            seconds_per_step = agreed.seconds_per_step
            if (agreed.checkpoint or agreed.stop) and path is None:
                path = self._save(step)
            if agreed.stop:
                raise StageError(f"train: stopped by {loop._stopped_by} at step {step} of {loop.total_steps}: "
                                 f"checkpoint saved ({path}); continue with `tfship train --resume`")
        return False

    def _save(self, step: int):
        self.loop.watch.beat("checkpoint", step)
        path = self.loop.save(self.history)
        self.last_save = time.monotonic()
        return path

    def _call(self, count, step: int) -> np.ndarray:
        """One block; a failed input assertion, a streaming read error or check-numerics' report as one error."""
        import tensorflow as tf

        from tfship.pipeline.training.train_checks import numerics_guard

        try:
            with numerics_guard(self.train.check_numerics, step + 1):
                return self.steps.run_steps(self.loop.iterator, count).numpy()
        except tf.errors.OpError as err:
            raise data_inputs.input_error(err, self.loop.inputs) from None

    def _nonfinite(self, bad_step: int, loss: float) -> None:
        flags = self.steps.state.bad_flags.numpy()
        names = self.steps.variable_names
        bad = names[int(np.argmax(flags > 0))] if flags[:len(names)].any() else "none (the loss itself)"
        raise StageError(f"train: non-finite values at step {bad_step}: loss {loss}; first non-finite gradient: "
                         f"{bad}")

    def _log(self, step: int, values: dict, previous: int) -> None:
        if self.board.folder is None:
            return
        from tfship.pipeline.training.optim import current_learning_rate, loss_scale

        figure = "mae" if self.loop.task == "regression" else "accuracy"
        batch = float(self.loop.batch)
        self.board.step(step, {"loss": values["loss"], figure: values["hits"] / batch,
                               "learning_rate": current_learning_rate(self.loop.optimizer),
                               "gradient_global_norm": values["norm"], "loss_scale": loss_scale(self.loop.optimizer),
                               **self.kind_metrics, **data_inputs.board_scalars(self.loop.meter)},
                        self.loop.model.trainable_variables, since=previous)

    def _end_epoch(self, step: int, values: dict) -> bool:
        """Evaluate on the validation split, record the epoch, reset the sums; True when early stopping fires."""
        loop = self.loop
        figures = data_inputs.evaluate(self.steps, loop.inputs.splits.validation, loop.task)
        count = max(values["sum_count"], 1.0)
        train_figure = values["sum_hits"] / count
        metric = _primary(loop.task)
        regression = loop.task == "regression"
        self.history.append(EpochMetrics(
            step // loop.steps_per_epoch, values["sum_loss"] / count, None if regression else train_figure,
            figures.get("accuracy"), figures["loss"], step, metric, figures[metric],
            train_figure if regression else None))
        self.loop.sums.assign([0.0, 0.0, 0.0])
        self.board.epoch(step, {k: v for k, v in figures.items() if v is not None and math.isfinite(v)})
        patience = self.train.early_stopping_patience
        if patience is None:
            return False
        value = _watched(self.train.early_stopping_metric, loop.task, figures)
        best, bad_epochs = loop.early.numpy().tolist()
        if math.isnan(best) or value > best + self.train.early_stopping_min_delta:
            best, bad_epochs = value, 0.0
        else:
            bad_epochs += 1
        loop.early.assign([best, bad_epochs])
        return bad_epochs >= patience

    def summary(self) -> dict:
        """train.json's `steps_per_execution`: the setting, blocks run, steps per block (mean, last)."""
        steps = self.block_steps[1:] or self.block_steps
        return {"setting": self.train.steps_per_execution, "blocks": self.blocks,
                "mean_steps_per_block": round(float(np.mean(steps)), 2) if steps else 0.0,
                "last_block_steps": self.block_steps[-1] if self.block_steps else 0}


def _primary(task: str) -> str:
    from tfship.core.tasks import primary

    return primary(task).name


def _watched(setting: str, task: str, figures: dict) -> float:
    """The early-stopping value, higher is better: accuracy, minus the loss, or the task's metric (MAE negated)."""
    from tfship.core.tasks import primary

    if setting == "validation_accuracy":
        return figures["accuracy"]
    if setting == "validation_loss":
        return -figures["loss"]
    metric = primary(task)
    return figures[metric.name] if metric.higher_is_better else -figures[metric.name]
