"""The input side of the training loop: the training dataset of a split (in memory or streamed), the probe
batch, streamed evaluation, and the input meter (records/s and the share of step time spent waiting for
the next batch), shown live and written to train.json and TensorBoard.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tfship.core.errors import DatasetError


def is_streamed(split) -> bool:
    """Whether `split` is a `StreamSplit` (tf.data over files) rather than in-memory arrays."""
    return hasattr(split, "dataset") and hasattr(split, "files")


def training_dataset(split, data, batch_size: int, seed: int, shard: tuple[int, int] | None = None):
    """The endless, seeded, shuffled training stream of (inputs [B, ...], labels int64 [B]), drop_remainder."""
    from tfship.pipeline.data.splits import make_dataset

    if is_streamed(split):
        return split.dataset(batch_size, training=True, seed=seed, shuffle_buffer=data.shuffle_buffer, repeat=True,
                             shard=shard)
    return make_dataset(split, batch_size, training=True, seed=seed, shuffle_buffer=data.shuffle_buffer,
                        cache=data.cache, repeat=True)


def _unbatched_specs(element_spec, input_name: str | None = None):
    """(inputs spec, labels spec) of a batched dataset with the batch dimension None (one spec or a dict)."""
    import tensorflow as tf

    inputs, labels = element_spec

    def free(spec, name=None):
        return tf.TensorSpec([None, *spec.shape[1:]], spec.dtype, name=name)

    if isinstance(inputs, dict):
        inputs = {key: free(spec, key) for key, spec in inputs.items()}
    else:
        inputs = free(inputs, input_name)
    return inputs, free(labels, "label")


def training_iterator(runtime, splits, config, global_batch: int, start_step: int, task: str = "classification"):
    """(iterator, step input signature, evaluation input spec) of the train split under `runtime`.

    One process: the endless dataset's iterator (checkpointed with the model: its position survives a
    resume). A distributed in-memory split is batched with the global batch and split per replica by
    tf.distribute (AutoShardPolicy.DATA); a distributed streamed split reads per worker
    (`distributed_stream`). The data position of a distributed run is its step: the same seeded, repeated
    stream from the start, less the batches already trained on (a distributed iterator is not checkpointable).
    The specs come from the dataset itself: one TensorSpec, or a dict of them for named inputs.
    """
    import tensorflow as tf

    train = splits.train
    if runtime.kind != "default" and is_streamed(train):
        distributed = distributed_stream(runtime, train, config, global_batch, start_step, task)
        eval_spec, _ = _unbatched_specs(train.dataset(1, training=False, seed=0).element_spec, splits.input_name)
        return iter(distributed), list(distributed.element_spec), eval_spec
    per_call = config.data.batch_size if runtime.kind == "default" else global_batch
    dataset = training_dataset(train, config.data, per_call, config.run.seed)
    if runtime.kind != "default" and start_step:
        dataset = dataset.skip(start_step)
    if config.train.assert_inputs:
        from tfship.pipeline.training.train_checks import input_assertions

        dataset = dataset.map(input_assertions(task, len(splits.class_names), dataset.element_spec))
    eval_spec, label_spec = _unbatched_specs(dataset.element_spec, splits.input_name)
    if runtime.kind == "default":
        return iter(dataset), [eval_spec, label_spec], eval_spec
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    distributed = runtime.strategy.experimental_distribute_dataset(dataset.with_options(options))
    return iter(distributed), list(distributed.element_spec), eval_spec


def distributed_stream(runtime, split, config, global_batch: int, start_step: int, task: str = "classification"):
    """A streamed train split under a tf.distribute strategy: `distribute_datasets_from_function`, each input
    pipeline (one per worker) reading its own shard of the files (`StreamSplit.dataset(shard=...)`: by file
    when there are at least as many files as workers, else by record with a warning), batched per replica,
    so no record is trained on by two workers. A resumed run skips the batches its steps consumed.
    """
    import tensorflow as tf

    def per_worker(context):
        per_replica = context.get_per_replica_batch_size(global_batch)
        dataset = split.dataset(per_replica, training=True, seed=config.run.seed,
                                shuffle_buffer=config.data.shuffle_buffer, repeat=True,
                                shard=(context.num_input_pipelines, context.input_pipeline_id))
        local_replicas = max(1, runtime.replicas // max(context.num_input_pipelines, 1))
        if start_step:
            dataset = dataset.skip(start_step * local_replicas)
        if config.train.assert_inputs:
            from tfship.pipeline.training.train_checks import input_assertions

            dataset = dataset.map(input_assertions(task, len(split.class_names), dataset.element_spec))
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return dataset.with_options(options)

    return runtime.strategy.distribute_datasets_from_function(per_worker)


def probe_batch(runtime, splits, config, global_batch: int, task: str = "classification"):
    """One (inputs, labels) batch for the step's first call and the XLA probe, from the training pipeline itself
    (so its structure and dtypes are the step's): per-replica values under a distribution strategy, read the
    way `training_iterator` reads them (a streamed split per worker, in memory split per replica).
    """
    if runtime.kind == "default":
        return next(iter(training_dataset(splits.train, config.data, config.data.batch_size, 0)))
    if is_streamed(splits.train):
        return next(iter(distributed_stream(runtime, splits.train, config, global_batch, 0, task)))
    import tensorflow as tf

    from tfship.pipeline.data.splits import make_dataset

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = make_dataset(splits.train, global_batch, training=True, seed=0).with_options(options)
    return next(iter(runtime.strategy.experimental_distribute_dataset(dataset)))


def evaluate(steps, split, task: str = "classification", batch_size: int = 512) -> dict[str, float]:
    """`train_step.task_figures` of the model over a whole split (a streamed split batch by batch): the loss
    (cross-entropy, binary cross-entropy or squared error) and the task's metrics (accuracy; AUC and accuracy;
    MAE and RMSE).

    Raises:
        DatasetError: a record of a streamed split fails to read or parse (the file changed since the scan), or
            the split holds no row.
    """
    from tfship.pipeline.training.train_step import task_figures

    try:
        if not is_streamed(split):
            return steps.figures(split.images, split.labels, batch_size)
        import tensorflow as tf

        outputs, labels = [], []
        try:
            for inputs, batch_labels in split.dataset(batch_size, training=False, seed=0):
                outputs.append(steps.outputs(inputs))
                labels.append(batch_labels.numpy())
        except tf.errors.OpError as err:
            raise stream_error(split, err) from None
        if not labels:
            raise ValueError("no rows to evaluate on")
        return task_figures(task, np.concatenate(outputs), np.concatenate(labels))
    except ValueError as err:
        raise DatasetError(f"the {getattr(split, 'name', 'evaluation')} split: {err}") from None


def stream_error(split, err) -> DatasetError:
    """A `DatasetError` for a read or parse failure while streaming (`StreamSplit.read_error`)."""
    return split.read_error(err)


@dataclass
class InputMeter:
    """Input-wait share and records/s of the training loop.

    `wait` is the time the K-step blocks spent in the iterator's get-next (measured on the device with
    `tf.timestamp`); `busy` the blocks' wall time on the host (the steps, the get-nexts and the one read-back).
    The input-wait share is wait / busy: 0 when the prefetched pipeline keeps ahead; None when not `timed`.
    """

    batch: int
    timed: bool = True  # False under train.deterministic (op determinism refuses tf.timestamp)
    wait_s: float = 0.0
    busy_s: float = 0.0
    steps: int = 0
    window: list = field(default_factory=lambda: [0.0, 0.0, 0])

    def record(self, wait_s: float, busy_s: float, steps: int = 1) -> None:
        """Add one block of `steps` steps: `wait_s` in get-next, `busy_s` in all."""
        self.wait_s += wait_s
        self.busy_s += busy_s
        self.steps += steps
        self.window = [self.window[0] + wait_s, self.window[1] + busy_s, self.window[2] + steps]

    def take_window(self) -> tuple[float, float | None]:
        """(records/s, input-wait share; None when not timed) since the last call (the live figures)."""
        wait, busy, steps = self.window
        self.window = [0.0, 0.0, 0]
        return steps * self.batch / max(busy, 1e-9), (wait / max(busy, 1e-9) if self.timed else None)

    def summary(self) -> dict:
        """train.json's `input`: records/s and input-wait share over the whole run (blocks after the first);
        the share is None when the wait was not timed (`train.deterministic`).
        """
        return {"records_per_second": round(self.steps * self.batch / max(self.busy_s, 1e-9), 1),
                "input_wait_share": round(self.wait_s / max(self.busy_s, 1e-9), 4) if self.timed else None,
                "input_wait_seconds": round(self.wait_s, 3) if self.timed else None,
                "step_seconds": round(self.busy_s, 3), "steps_measured": self.steps,
                "input_wait_measured_by": "tf.timestamp around each get-next, summed on the device, over the "
                                          "blocks' wall time" if self.timed else
                                          "not measured: train.deterministic (op determinism refuses tf.timestamp)"}


class ProgressLines:
    """A progress line every `every_s` seconds when stderr is no terminal (pod logs, CI): step, epoch, loss,
    records/s, input-wait share, ETA. On a terminal the rich progress bar shows the same.
    """

    def __init__(self, total_steps: int, steps_per_epoch: int, every_s: float,
                 say: Callable[[str], None] | None = None, enabled: bool | None = None):
        self.total, self.per_epoch, self.every = total_steps, steps_per_epoch, every_s
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.enabled = (not sys.stderr.isatty()) if enabled is None else enabled
        self.started = self.last = time.monotonic()
        self.start_step: int | None = None

    def step(self, step: int, loss: float, meter: InputMeter) -> None:
        if self.start_step is None:
            self.start_step = step - 1
        now = time.monotonic()
        if not self.enabled or (now - self.last < self.every and step != self.total):
            return
        self.last = now
        rate, wait = meter.take_window()
        done = step - self.start_step
        eta = (now - self.started) / max(done, 1) * (self.total - step)
        epoch = math.ceil(step / max(self.per_epoch, 1))
        shown = f"{wait:.1%}" if wait is not None else "n/a"
        self.say(f"train: step {step}/{self.total} epoch {epoch} loss {loss:.4f} {rate:,.0f} records/s "
                 f"input wait {shown} ETA {_clock(eta)}")


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def live_figures(meter: InputMeter) -> str:
    """The progress bar's input figures so far in the run (" 12,345 rec/s wait 3%"); empty before any step."""
    if not meter.steps:
        return ""
    summary = meter.summary()
    share = summary["input_wait_share"]
    return f" {summary['records_per_second']:,.0f} rec/s" + (f" wait {share:.0%}" if share is not None else "")


def board_scalars(meter: InputMeter) -> dict[str, float]:
    """TensorBoard's input scalars: records/s and input-wait share so far (`InputMeter.summary`)."""
    summary = meter.summary()
    if not meter.steps:
        return {}
    share = summary["input_wait_share"]
    return {"input/records_per_second": summary["records_per_second"]} | (
        {"input/input_wait_share": share} if share is not None else {})


def skipped_records(splits) -> dict:
    """train.json's count of records skipped under `data.skip_corrupt` (0 for in-memory sources)."""
    scan = (getattr(splits, "stream", None) or {}).get("scan")
    if not scan:
        return {"skipped_records": 0}
    skipped = scan["skipped"]
    return {"skipped_records": int(skipped["malformed_records"]) + int(skipped["corrupt_frames"]),
            "skipped": skipped}


def input_error(err, inputs) -> Exception:
    """What a block's `tf.errors.OpError` means: a failed `assert_inputs` check or a streaming read error as one
    `DatasetError`, anything else unchanged.

    Returns:
        DatasetError "train.assert_inputs: <check>: feature <name>, <where the record came from>", a read /
        parse failure of a streamed split, or `err` itself.
    """
    text = str(getattr(err, "message", err))
    if "assert_inputs:" in text:
        from tfship.pipeline.training.input_errors import assert_inputs_error

        return assert_inputs_error(text, inputs)
    if is_streamed(inputs.splits.train) and "IteratorGetNext" in text:  # raised by the data, not by the step
        return stream_error(inputs.splits.train, err)
    return err
