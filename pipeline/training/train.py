"""Train stage: a custom `tf.GradientTape` loop (`pipeline.training.train_step`) over one endless, seeded
tf.data iterator, with evaluation, early stopping, checkpoints, resume and TensorBoard.

SIGINT / SIGTERM while training: a checkpoint after the step under way, then `StageError` (a second signal
stops at once). Under `multi_worker` the workers first meet and compare fingerprints
(`pipeline.training.rendezvous`), the loop runs in a thread watched by the main thread
(`pipeline.training.supervise`), all workers agree after every step whether to stop, and a collective
that loses a peer ends with one line naming it.

The step is traced exactly once per run (counted, reported, enforced). A `CheckpointManager`
saves the model, the optimizer (slots, step count, loss scale), the loop counters and the data
iterator position every `checkpoint_every_steps` steps and at the end; `resume=True` continues
from the latest checkpoint, and with `deterministic = true` the final weights equal those of an
uninterrupted run.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np

from tfship.core.errors import StageError
from tfship.pipeline.data.splits import make_dataset
from tfship.pipeline.training import inputs as data_inputs
from tfship.pipeline.training.loop_stop import checkpoint_step as _checkpoint_step
from tfship.pipeline.training.train_records import (  # noqa: F401  (re-exported: callers import them from here)
    PARTIAL_BATCH,
    EpochMetrics,
    TrainInputs,
    TrainResult,
)


def train_model(inputs: TrainInputs, progress=None) -> TrainResult:
    """Train the configured model on the train split under the configured runtime.

    Args:
        inputs: config, splits (inputs [N, ...], labels int64 [N]), folders and resume flag.
        progress: optional `rich.progress.Progress` to report steps on.

    Raises:
        StageError: a non-finite loss or gradient (naming the step and the first non-finite
            variable), a retraced step, a batch larger than the train split, or `resume` without
            a checkpoint.
        ConfigError: an invalid model or strategy setting.
    """
    from tfship.pipeline.training.distribute import training_runtime
    from tfship.pipeline.training.supervise import StopRequest, Watch, handling_signals, supervised

    train = inputs.config.train
    with training_runtime(train, inputs.config.run.seed), \
            handling_signals(StopRequest(interrupt_on_second=train.strategy != "multi_worker")) as stop:
        from tfship.pipeline.training.named_data import NamedSplits

        if isinstance(inputs.splits, NamedSplits):  # named inputs, any task: Keras fit (named_train)
            from tfship.pipeline.training.named_train import train_named

            return train_named(inputs, progress)
        if train.strategy != "multi_worker":
            return _Loop(inputs, progress, stop).run()
        from tfship.pipeline.training.agreement import fingerprints
        from tfship.pipeline.training.cluster import check_own_address, read_cluster
        from tfship.pipeline.training.rendezvous import meet

        cluster, watch = read_cluster(), Watch()
        check_own_address(cluster)
        start = _checkpoint_step(inputs.checkpoint_dir) if inputs.resume else 0
        values = fingerprints(inputs.config, cluster.jobs, inputs.splits, start if start is not None else -1)
        meet(cluster, values, train.cluster_timeout_s, stop, _console_line(inputs.log))
        return supervised(lambda: _Loop(inputs, progress, stop, watch).run(), cluster, watch, stop,
                          train.cluster_timeout_s, _console_line(inputs.log))


def _console_line(log: Callable[[str], None] | None) -> Callable[[str], None]:
    if log is not None:
        return log
    import sys

    return lambda line: print(line, file=sys.stderr, flush=True)


class _Loop:
    """One training run: builds everything under the strategy scope, then steps."""

    def __init__(self, inputs: TrainInputs, progress, stop=None, watch=None):
        import tensorflow as tf

        from tfship.pipeline.training.distribute import make_strategy
        from tfship.pipeline.training.model import build_model
        from tfship.pipeline.training.optim import build_optimizer, total_optimizer_updates
        from tfship.pipeline.training.supervise import StopRequest, Watch

        self.inputs, self.progress, self.notes = inputs, progress, []
        self.stop, self.watch = stop or StopRequest(), watch or Watch()
        config, splits = inputs.config, inputs.splits
        self.train = config.train
        self.runtime = make_strategy(config.train.strategy, config.train.cluster_timeout_s)
        self.start_step = 0
        if inputs.resume:
            found = _checkpoint_step(inputs.checkpoint_dir)
            if found is None:
                raise StageError(f"train --resume: no checkpoint in {inputs.checkpoint_dir}")
            self.start_step = found
        self.watch.beat("building")
        self.batch = config.data.batch_size * max(self.runtime.num_workers, self.runtime.replicas)
        self.steps_per_epoch = len(splits.train) // self.batch
        if self.steps_per_epoch == 0:
            raise StageError(f"train: global batch {self.batch} (data.batch_size x workers) is larger than the "
                             f"train split ({len(splits.train)} samples)")
        self.total_steps = min(self.steps_per_epoch * config.train.epochs, config.train.max_steps or 1 << 62)
        with self.runtime.strategy.scope():
            self.model = build_model(
                config.model, tuple(splits.train.images.shape[1:]), len(splits.class_names), config.run.seed,
                input_name=splits.input_name, input_dtype=str(splits.train.images.dtype),
                train_inputs=splits.train.images if config.model.normalize else None,
                precision=config.train.mixed_precision)
            self.optimizer = build_optimizer(
                config.train, total_optimizer_updates(self.total_steps, config.train.accumulation_steps))
            from tfship.pipeline.training.freeze import freeze_layers
            from tfship.pipeline.training.step_kinds import build_step_kind

            self.frozen = freeze_layers(self.model, config.train.freeze)  # before the optimizer: no slots for them
            self.step_kind = build_step_kind(config.train.step, len(splits.class_names))
            # Create the slot variables up front: a tf.function that creates variables is traced twice.
            self.optimizer.build(self.model.trainable_variables)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.sums = tf.Variable([0.0, 0.0, 0.0], dtype=tf.float64, trainable=False, name="epoch_sums")
            self.early = tf.Variable([math.nan, 0.0], dtype=tf.float64, trainable=False, name="early_stopping")
        self.iterator, self.signature, self.eval_spec = data_inputs.training_iterator(
            self.runtime, splits, config, self.batch, self.start_step)
        tracked = {"model": self.model, "optimizer": self.optimizer, "step": self.step, "sums": self.sums,
                   "early": self.early}
        # Dropout RNG states are no Keras weights: checkpoint them too, so a resumed run draws the same masks.
        rng = {f"{layer.name}": layer.seed_generator.state.value for layer in self.model.layers
               if getattr(layer, "seed_generator", None) is not None}
        if rng:
            tracked["rng"] = tf.train.Checkpoint(**rng)
        if self.runtime.kind == "default":
            tracked["iterator"] = self.iterator
        self.checkpoint = tf.train.Checkpoint(**tracked)
        self.manager = tf.train.CheckpointManager(self.checkpoint, str(inputs.checkpoint_dir),
                                                  max_to_keep=config.train.keep_checkpoints, step_counter=self.step)

    def say(self, line: str) -> None:
        self.notes.append(line)
        if self.inputs.log is not None:
            self.inputs.log(line)

    def _history_path(self) -> Path:
        return self.inputs.checkpoint_dir / "history.json"

    def _save(self, history: list[EpochMetrics]) -> Path:
        path = Path(self.manager.save(checkpoint_number=int(self.step.numpy())))
        if self.runtime.is_chief:
            from tfship.core.files import write_json_atomic

            write_json_atomic(self._history_path(), {"step": int(self.step.numpy()),
                                                     "history": [asdict(h) for h in history]})
        self.say(f"checkpoint saved: step {int(self.step.numpy())} -> {path}")
        return path

    def _restore(self) -> list[EpochMetrics]:
        latest = self.manager.latest_checkpoint
        if latest is None:
            raise StageError(f"train --resume: no checkpoint in {self.inputs.checkpoint_dir}")
        self.checkpoint.restore(latest).assert_existing_objects_matched()
        step = int(self.step.numpy())
        if step != self.start_step:
            raise StageError(f"train --resume: {latest} holds step {step}, not the {self.start_step} its name says")
        saved = json.loads(self._history_path().read_text()) if self._history_path().is_file() else {"history": []}
        history = [EpochMetrics(**h) for h in saved["history"] if h["step"] <= step]
        self.say(f"resumed from {latest} at step {step} of {self.total_steps}")
        return history

    def _build_step(self):
        from tfship.pipeline.training.train_step import StepFunctions, XlaChoice, choose_step

        setting = self.train.jit_compile
        if self.runtime.kind != "default" and setting is not False:
            setting = False
            forced = f"XLA off under the {self.runtime.kind} strategy (the step's all-reduce runs outside XLA)"
        elif self.train.check_numerics and setting is not False:
            setting, forced = False, "XLA off under check_numerics (its CheckNumerics ops run outside XLA)"
        else:
            forced = None

        def build(jit: bool):
            return StepFunctions(self.model, self.optimizer, self.runtime.strategy, jit_compile=jit,
                                 signature=self.signature, eval_spec=self.eval_spec, global_batch=self.batch,
                                 kind=self.step_kind)

        if self.train.run_eagerly:
            return build(False), XlaChoice(False, "run_eagerly: tf.function runs eagerly (debug), no trace, no XLA")
        if self.runtime.kind == "default":
            batch = data_inputs.probe_batch(self.inputs.splits.train, self.batch)
        else:
            batch = next(iter(self.runtime.strategy.experimental_distribute_dataset(
                make_dataset(self.inputs.splits.train, self.batch, training=True, seed=0))))
        state = [*self.model.variables, *self.optimizer.variables]
        steps, choice = choose_step(build, batch, setting, self.train.xla_probe_steps, state)
        if forced:
            choice = XlaChoice(False, forced)
        self.say(choice.reason)
        return steps, choice

    def run(self) -> TrainResult:
        if self.runtime.cluster is None:
            return self._run()
        import tensorflow as tf

        try:
            result = self._run()
        except tf.errors.OpError as err:
            raise StageError(self._lost_peer(err)) from None
        self.watch.beat("done")
        return result

    def _lost_peer(self, err) -> str:
        from tfship.pipeline.training.loop_stop import lost_peer

        return lost_peer(self, err)

    def _run(self) -> TrainResult:
        from tfship.pipeline.training.tensorboard_log import TensorBoardLog

        history = self._restore() if self.inputs.resume else []
        start = int(self.step.numpy())
        from tfship.pipeline.training.train_checks import numerics_checked_tracing, numerics_guard

        # The first call of the step runs a real step (then restored): errors name step start + 1.
        self.watch.beat("step", start)
        with numerics_guard(self.train.check_numerics, start + 1), numerics_checked_tracing(self.train.check_numerics):
            steps, choice = self._build_step()
        folder = self.inputs.tensorboard_dir if self.train.tensorboard and self.runtime.is_chief else None
        board = TensorBoardLog(folder, self.train.log_every_steps, self.train.histogram_every_steps)
        task = self.progress.add_task("train", total=self.total_steps, completed=start) if self.progress else None
        started = time.perf_counter()
        self.kind_metrics: dict[str, float] = {}
        self.meter = data_inputs.InputMeter(self.batch)
        self.lines = data_inputs.ProgressLines(self.total_steps, self.steps_per_epoch, self.train.progress_every_s,
                                               self.inputs.log)
        stopped_early = self._steps(steps, board, history, task, start)
        seconds = time.perf_counter() - started
        checkpoint_path = self._save(history)
        board.close()
        if not self.train.run_eagerly and steps.traces != 1:
            raise StageError(f"train: the train step was traced {steps.traces} times; expected exactly 1")
        details = {"xla": asdict(choice), "optimizer": self.train.optimizer, "schedule": self.train.schedule,
                   "mixed_precision": self.train.mixed_precision, "strategy": self.runtime.kind,
                   "replicas": self.runtime.replicas, "global_batch": self.batch,
                   "accumulation_steps": self.train.accumulation_steps,
                   "optimizer_updates": int(self.optimizer.iterations.numpy()),
                   "deterministic": self.train.deterministic,
                   "stopped_early": stopped_early, "resumed_from_step": start if self.inputs.resume else None,
                   "steps_per_second": round((int(self.step.numpy()) - start) / max(seconds, 1e-9), 2),
                   "notes": list(self.notes), "step_kind": {"kind": steps.kind.name, "last": self.kind_metrics},
                   "frozen": self._frozen_summary(), "sparse_gradients": steps.sparse_gradients,
                   "sparse_update_ops": steps.sparse_update_ops() if not self.train.run_eagerly else [],
                   "debug": {"check_numerics": self.train.check_numerics, "assert_inputs": self.train.assert_inputs,
                             "run_eagerly": self.train.run_eagerly},
                   "input": self.meter.summary() | data_inputs.skipped_records(self.inputs.splits)}
        if self.inputs.splits.stream:  # class names, counts and the scan, kept in the run folder (train.json)
            details["data"] = self.inputs.splits.summary()
        from tfship.pipeline.training.model import without_recompute

        details["recompute"] = list(self.inputs.config.model.recompute)
        test_accuracy = data_inputs.evaluate(steps, self.inputs.splits.test)[1]
        return TrainResult(without_recompute(self.model), tuple(history), steps.traces, test_accuracy,
                           checkpoint_path, seconds,
                           int(self.step.numpy()), choice.jit_compile, details)

    def _steps(self, steps, board, history: list[EpochMetrics], task, start: int) -> bool:
        from tfship.pipeline.training.optim import current_learning_rate, loss_scale

        sums = self.sums.numpy().tolist()
        float16 = self.train.mixed_precision == "mixed_float16"
        for step in range(start + 1, self.total_steps + 1):
            self.watch.beat("step", step - 1)
            began = time.perf_counter()
            images, labels = data_inputs.next_batch(self.iterator, self.inputs, self.train)
            fetched = time.perf_counter()
            loss, correct, norm, nonfinite, metrics = self._call_step(steps, images, labels, step)
            self.kind_metrics = {name: round(float(value), 6) for name, value in metrics.items()}
            loss_value, flags = float(loss), nonfinite.numpy()
            if step > start + 1:  # the first step after a (re)start fills the pipeline: not measured
                self.meter.record(fetched - began, time.perf_counter() - began)
            self.lines.step(step, loss_value, self.meter)
            if not math.isfinite(loss_value) or (flags.any() and not float16):
                bad = steps.variable_names[int(np.argmax(flags > 0))] if flags.any() else "none (the loss itself)"
                raise StageError(f"train: non-finite values at step {step}: loss {loss_value}; first non-finite "
                                 f"gradient: {bad}")
            sums = [sums[0] + loss_value * self.batch, sums[1] + float(correct), sums[2] + self.batch]
            self.step.assign(step)
            if step % self.train.log_every_steps == 0 and board.folder is not None:
                board.step(step, {"loss": loss_value, "accuracy": float(correct) / self.batch,
                                  "learning_rate": current_learning_rate(self.optimizer),
                                  "gradient_global_norm": float(norm), "loss_scale": loss_scale(self.optimizer),
                                  **self.kind_metrics, **data_inputs.board_scalars(self.meter)},
                           self.model.trainable_variables)
            if self.progress is not None:
                self.progress.update(task, advance=1, description=f"train step {step}/{self.total_steps} "
                                     f"loss {sums[0] / sums[2]:.4f}{data_inputs.live_figures(self.meter)}")
            stop = False
            if step % self.steps_per_epoch == 0:
                stop = self._end_epoch(steps, board, history, sums, step)
                sums = [0.0, 0.0, 0.0]
            self.sums.assign(sums)
            every = self.train.checkpoint_every_steps
            if stop:
                self.say(f"early stopping at epoch {history[-1].epoch}: {self.train.early_stopping_metric} did not "
                         f"improve by {self.train.early_stopping_min_delta} for "
                         f"{self.train.early_stopping_patience} epochs")
                return True
            if every and step % every == 0 and step < self.total_steps:
                self.watch.beat("checkpoint", step)
                self._save(history)
            self.watch.beat("after_step", step)
            if step < self.total_steps and self._stop_agreed():
                self.watch.beat("checkpoint", step)
                path = self._save(history)
                raise StageError(f"train: stopped by {self._stopped_by} at step {step} of {self.total_steps}: "
                                 f"checkpoint saved ({path}); continue with `tfship train --resume`")
        return False

    def _stop_agreed(self) -> bool:
        """Whether to stop after this step (`loop_stop.stop_agreed`)."""
        from tfship.pipeline.training.loop_stop import stop_agreed

        return stop_agreed(self)

    def _frozen_summary(self) -> dict:
        from tfship.pipeline.training.freeze import frozen_weights, slots_for

        weights = frozen_weights(self.model, self.frozen)
        return {"layers": self.frozen, "weights": [w.path for w in weights],
                "optimizer_slots_for_frozen_weights": slots_for(self.optimizer, weights),
                "optimizer_variables": len(self.optimizer.variables)}

    def _call_step(self, steps, images, labels, step: int):
        from tfship.pipeline.training.train_checks import numerics_guard

        with numerics_guard(self.train.check_numerics, step):
            return steps.train_step(images, labels)

    def _end_epoch(self, steps, board, history: list[EpochMetrics], sums, step: int) -> bool:
        val_loss, val_accuracy = data_inputs.evaluate(steps, self.inputs.splits.validation)
        metrics = EpochMetrics(step // self.steps_per_epoch, sums[0] / sums[2], sums[1] / sums[2], val_accuracy,
                               val_loss, step)
        history.append(metrics)
        board.epoch(step, {"accuracy": val_accuracy, "loss": val_loss})
        patience = self.train.early_stopping_patience
        if patience is None:
            return False
        value = val_accuracy if self.train.early_stopping_metric == "validation_accuracy" else -val_loss
        best, bad_epochs = self.early.numpy().tolist()
        if math.isnan(best) or value > best + self.train.early_stopping_min_delta:
            best, bad_epochs = value, 0.0
        else:
            bad_epochs += 1
        self.early.assign([best, bad_epochs])
        return bad_epochs >= patience
