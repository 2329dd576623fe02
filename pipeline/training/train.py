"""Train stage: one `tf.GradientTape` loop for every model kind and task (`pipeline.training.train_step`), over
one endless, seeded tf.data iterator, K steps per trip to the host (`loop_blocks`), with evaluation, early
stopping, checkpoints, resume and TensorBoard.

Every built-in kind (cnn, mlp, text, tabular, recommender) and a user's `model.factory`, every task
(classification, binary, regression; `core.tasks`), one input or several named inputs, from every source
(the splits of `pipeline.data.splits.load_splits`) trains here; there is no second loop.

SIGINT / SIGTERM while training: a checkpoint at the end of the K-step block under way, then `StageError` (a
second signal stops at once). Under `multi_worker` the workers first meet and compare fingerprints
(`pipeline.training.rendezvous`), the loop runs in a thread watched by the main thread
(`pipeline.training.supervise`), all workers agree after every block whether to stop, and a collective
that loses a peer ends with one line naming it.

The step and the block are each traced exactly once per run (counted, reported, enforced). A
`CheckpointManager` saves the model, the optimizer (slots, step count, loss scale), the loop counters and the
data iterator position every `checkpoint_every_steps` steps, every `checkpoint_every_s` seconds (at a block's
end) and at the end; `resume=True` continues from the latest checkpoint, and with `deterministic = true` the
final weights equal those of an uninterrupted run, whatever `steps_per_execution` either run used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from tfship.core.errors import ConfigError, StageError
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
        inputs: config, splits (`pipeline.data.split_types.DatasetSplits`), folders and resume flag.
        progress: optional `rich.progress.Progress` to report steps on.

    Raises:
        StageError: a non-finite loss or gradient (naming the step and the first non-finite
            variable), a retraced step, a batch larger than the train split, or `resume` without
            a checkpoint.
        ConfigError: an invalid model, step kind or strategy setting.
    """
    from tfship.pipeline.training.distribute import training_runtime
    from tfship.pipeline.training.supervise import StopRequest, Watch, handling_signals, supervised

    train = inputs.config.train
    with training_runtime(train, inputs.config.run.seed), \
            handling_signals(StopRequest(interrupt_on_second=train.strategy != "multi_worker")) as stop:
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


def task_of(splits, config) -> str:
    """The splits' task (`DatasetSplits.task`), else the config's `model.task`."""
    return getattr(splits, "task", None) or config.model.task


def _check_early_stopping(train, task: str) -> None:
    if train.early_stopping_patience is not None and train.early_stopping_metric == "validation_accuracy" \
            and task == "regression":
        raise ConfigError("train.early_stopping_metric = 'validation_accuracy': model.task = 'regression' has no "
                          "accuracy; set 'validation_loss' or 'validation_metric' (the validation MAE)")


class _Loop:
    """One training run: builds everything under the strategy scope, then runs K-step blocks."""

    def __init__(self, inputs: TrainInputs, progress, stop=None, watch=None):
        import tensorflow as tf

        from tfship.pipeline.training.distribute import make_strategy
        from tfship.pipeline.training.optim import build_optimizer, total_optimizer_updates
        from tfship.pipeline.training.supervise import StopRequest, Watch
        from tfship.pipeline.training.train_step import LoopState

        self.inputs, self.progress, self.notes = inputs, progress, []
        self.stop, self.watch = stop or StopRequest(), watch or Watch()
        config, splits = inputs.config, inputs.splits
        self.train = config.train
        self.task = task_of(splits, config)
        _check_early_stopping(self.train, self.task)
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
            from tfship.pipeline.training.model import build_task_model

            self.model = build_task_model(config, splits)
            self.optimizer = build_optimizer(
                config.train, total_optimizer_updates(self.total_steps, config.train.accumulation_steps))
            from tfship.pipeline.training.freeze import freeze_layers
            from tfship.pipeline.training.step_kind_build import build_step_kind

            self.frozen = freeze_layers(self.model, config.train.freeze)  # before the optimizer: no slots for them
            self.step_kind = build_step_kind(config.train.step, len(splits.class_names), self.task)
            # Create the slot variables up front: a tf.function that creates variables is traced twice.
            self.optimizer.build(self.model.trainable_variables)
            self.state = LoopState(len(self.model.trainable_variables))
            self.step, self.sums = self.state.step, self.state.sums
            self.early = tf.Variable(tf.constant([math.nan, 0.0], tf.float64), trainable=False, name="early_stopping")
        self.iterator, self.signature, self.eval_spec = data_inputs.training_iterator(
            self.runtime, splits, config, self.batch, self.start_step, self.task)
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
        self.saved = {"count": 0, "last": None, "last_step": None}

    def say(self, line: str, keep: bool = True) -> None:
        """Log `line`; `keep`: also into train.json's `notes` (bounded: once-per-run events only)."""
        if keep:
            self.notes.append(line)
        if self.inputs.log is not None:
            self.inputs.log(line)

    def _history_path(self) -> Path:
        return self.inputs.checkpoint_dir / "history.json"

    def save(self, history: list[EpochMetrics]) -> Path:
        """Save a checkpoint at the current step (and, on the chief, the epoch history beside it)."""
        step = int(self.step.numpy())
        path = Path(self.manager.save(checkpoint_number=step))
        if self.runtime.is_chief:
            from tfship.core.files import write_json_atomic

            write_json_atomic(self._history_path(), {"step": step, "history": [asdict(h) for h in history]})
        self.saved = {"count": self.saved["count"] + 1, "last": str(path), "last_step": step}
        self.say(f"checkpoint saved: step {step} -> {path}", keep=False)
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
                                 kind=self.step_kind, task=self.task, state=self.state,
                                 check_gradients=self.train.mixed_precision != "mixed_float16",
                                 time_inputs=not self.train.deterministic)

        if self.train.run_eagerly:
            return build(False), XlaChoice(False, "run_eagerly: tf.function runs eagerly (debug), no trace, no XLA")
        batch = data_inputs.probe_batch(self.runtime, self.inputs.splits, self.inputs.config, self.batch, self.task)
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
        import time

        from tfship.pipeline.training.loop_blocks import BlockLoop
        from tfship.pipeline.training.tensorboard_log import TensorBoardLog
        from tfship.pipeline.training.train_checks import numerics_checked_tracing, numerics_guard

        history = self._restore() if self.inputs.resume else []
        start = int(self.step.numpy())
        # The first call of the step runs a real step (then restored): errors name step start + 1.
        self.watch.beat("step", start)
        with numerics_guard(self.train.check_numerics, start + 1), numerics_checked_tracing(self.train.check_numerics):
            steps, choice = self._build_step()
        folder = self.inputs.tensorboard_dir if self.train.tensorboard and self.runtime.is_chief else None
        board = TensorBoardLog(folder, self.train.log_every_steps, self.train.histogram_every_steps)
        task = self.progress.add_task("train", total=self.total_steps, completed=start) if self.progress else None
        started = time.perf_counter()
        self.meter = data_inputs.InputMeter(self.batch, timed=not self.train.deterministic)
        self.lines = data_inputs.ProgressLines(self.total_steps, self.steps_per_epoch, self.train.progress_every_s,
                                               self.inputs.log)
        blocks = BlockLoop(self, steps, board, history, task)
        stopped_early = blocks.run(start)
        seconds = time.perf_counter() - started
        checkpoint_path = self.save(history)
        board.close()
        if not self.train.run_eagerly and (steps.traces != 1 or steps.block_traces != 1):
            raise StageError(f"train: the train step was traced {steps.traces} times and its K-step block "
                             f"{steps.block_traces} times; expected exactly 1 each")
        from tfship.pipeline.training.train_summary import summarise

        return summarise(self, steps, choice, blocks, history, start, seconds, stopped_early, checkpoint_path)

    def agree(self, checkpoint_due: bool, seconds_per_step: float | None):
        """What every worker does after this block (`loop_stop.agree`)."""
        from tfship.pipeline.training.loop_stop import agree

        return agree(self, checkpoint_due, seconds_per_step)

    def frozen_summary(self) -> dict:
        from tfship.pipeline.training.freeze import frozen_weights, slots_for

        weights = frozen_weights(self.model, self.frozen)
        return {"layers": self.frozen, "weights": [w.path for w in weights],
                "optimizer_slots_for_frozen_weights": slots_for(self.optimizer, weights),
                "optimizer_variables": len(self.optimizer.variables)}
