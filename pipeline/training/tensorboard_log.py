"""TensorBoard events for the training loop: scalars every N steps, weight histograms every M steps.

Events go to `<run>/tensorboard/train` (per-step scalars) and `<run>/tensorboard/validation`
(per-epoch metrics); `make tensorboard` serves `runs/`. Writing needs only TensorFlow: the events
are `tf.summary.write` records carrying the `scalars` / `histograms` plugin metadata TensorBoard
reads, so the `tensorboard` package is needed only to view them (`make tensorboard` installs it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HISTOGRAM_BINS = 30


def _metadata(plugin: str) -> bytes:
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata()
    metadata.plugin_data.plugin_name = plugin
    return metadata.SerializeToString()


def write_scalar(name: str, value: float, step: int) -> None:
    """One scalar event (float32) in the default summary writer."""
    import tensorflow as tf

    tf.summary.write(name, tf.constant(value, tf.float32), step=step, metadata=_metadata("scalars"))


def write_histogram(name: str, values: np.ndarray, step: int) -> None:
    """One histogram event: float64 [bins, 3] rows of (left edge, right edge, count)."""
    import tensorflow as tf

    flat = np.asarray(values, np.float64).ravel()
    counts, edges = np.histogram(flat, bins=HISTOGRAM_BINS if flat.size else 1)
    buckets = np.stack([edges[:-1], edges[1:], counts.astype(np.float64)], axis=1)
    tf.summary.write(name, tf.constant(buckets, tf.float64), step=step, metadata=_metadata("histograms"))


class TensorBoardLog:
    """Writes tf.summary events; a disabled log (no folder) ignores every call.

    Args:
        folder: `<run>/tensorboard`, or None to write nothing (non-chief workers, tensorboard = false).
        scalar_every: scalar period in steps.
        histogram_every: histogram period in steps.
    """

    def __init__(self, folder: Path | None, scalar_every: int, histogram_every: int):
        import tensorflow as tf

        self.folder = folder
        self.scalar_every = scalar_every
        self.histogram_every = histogram_every
        self._train = tf.summary.create_file_writer(str(folder / "train")) if folder else None
        self._validation = tf.summary.create_file_writer(str(folder / "validation")) if folder else None

    def step(self, step: int, scalars: dict[str, float], variables=(), since: int | None = None) -> None:
        """Log `scalars` (loss, accuracy, lr, gradient global norm, loss scale) at 1-based `step` when
        it falls on the period, and histograms of `variables` (Keras variables, with `.path`).

        `since`: the step the last call logged (a K-step block ends at `step`): a period that fell anywhere in
        (since, step] is logged once, at `step`, with the block's last values.

        Every value is read through the strategy (`distribute.read_value`): numbers, tensors, Keras
        variables and mirrored / per-replica values all log the same way.
        """
        from tfship.pipeline.training.distribute import read_float, read_value

        if self._train is None:
            return
        before = step - 1 if since is None else since
        with self._train.as_default(step=step):
            if step // self.scalar_every > before // self.scalar_every:
                for name, value in scalars.items():
                    write_scalar(name, read_float(value), step)
            if step // self.histogram_every > before // self.histogram_every:
                for variable in variables:
                    write_histogram(variable.path, read_value(variable), step)

    def epoch(self, step: int, metrics: dict[str, float]) -> None:
        """Log per-epoch validation metrics at `step`."""
        if self._validation is None:
            return
        from tfship.pipeline.training.distribute import read_float

        with self._validation.as_default(step=step):
            for name, value in metrics.items():
                write_scalar(name, read_float(value), step)
        self._validation.flush()
        assert self._train is not None  # both writers exist, or neither
        self._train.flush()

    def close(self) -> None:
        """Flush and close the writers."""
        for writer in (self._train, self._validation):
            if writer is not None:
                writer.close()
