"""Process-level training runtime: the tf.distribute strategy, determinism and eager debugging.

`training_runtime(config)` is entered once per training run by the train stage's entry point; it
applies the process-wide switches the config asks for and restores them when training ends, so
nothing leaks into the code that runs after it (export, other tests).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

from tfship.core.errors import ConfigError
from tfship.pipeline.config import TrainSection


@dataclass(frozen=True)
class Runtime:
    """The strategy training runs under and whether this process writes results (the chief)."""

    strategy: object
    kind: str
    is_chief: bool
    worker_index: int
    num_workers: int

    @property
    def replicas(self) -> int:
        """Replicas in sync across the cluster (devices x workers)."""
        return int(self.strategy.num_replicas_in_sync)


def _cluster() -> tuple[bool, int, int]:
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise ConfigError("train.strategy = 'multi_worker' needs the TF_CONFIG environment variable "
                          '(e.g. {"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}); '
                          "on one machine, `tfship train --workers N` starts the workers with their TF_CONFIG")
    try:
        tf_config = json.loads(raw)
        workers = tf_config["cluster"]["worker"]
        task = tf_config["task"]
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"TF_CONFIG: expected cluster.worker and task; got {raw!r}") from err
    index = int(task.get("index", 0))
    chief = task.get("type") == "chief" or ("chief" not in tf_config["cluster"] and index == 0)
    return chief, index, len(workers) + len(tf_config["cluster"].get("chief", []))


def make_strategy(kind: str) -> Runtime:
    """Build the strategy: `default` (one device), `mirrored` (all local GPUs, else the CPU) or
    `multi_worker` (MultiWorkerMirroredStrategy over the cluster in TF_CONFIG, ring all-reduce).

    Raises:
        ConfigError: multi_worker without a usable TF_CONFIG.
    """
    import tensorflow as tf

    if kind == "default":
        return Runtime(tf.distribute.get_strategy(), kind, True, 0, 1)
    if kind == "mirrored":
        return Runtime(tf.distribute.MirroredStrategy(), kind, True, 0, 1)
    chief, index, workers = _cluster()
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    return Runtime(strategy, kind, chief, index, workers)


@contextlib.contextmanager
def training_runtime(config: TrainSection, seed: int) -> Iterator[None]:
    """Apply the run's process-wide switches for the duration of training, then restore them.

    `deterministic`: seeds Python, NumPy and TensorFlow (`keras.utils.set_random_seed`) and turns on
    `tf.config.experimental.enable_op_determinism`. `run_eagerly`: `tf.config.run_functions_eagerly(True)`.
    """
    import keras
    import tensorflow as tf
    from tensorflow.python.framework import config as tf_config

    was_deterministic = tf_config.is_op_determinism_enabled()
    was_eager = tf.config.functions_run_eagerly()
    keras.utils.set_random_seed(seed)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    if config.run_eagerly:
        tf.config.run_functions_eagerly(True)
    try:
        yield
    finally:
        tf.config.run_functions_eagerly(was_eager)
        if config.deterministic and not was_deterministic:
            tf_config.disable_op_determinism()


def read_value(value):
    """A host copy (numpy) of a value that a `tf.distribute` strategy may hold.

    Accepts Python numbers, numpy arrays, tensors, Keras variables (read through their backing variable) and
    distributed values: a mirrored variable (`MirroredVariable`, `SyncOnReadVariable`) is read in cross-replica
    context (every replica holds the same value; sync-on-read variables are aggregated by their own rule), and a
    `PerReplica` value is averaged over this worker's replicas. Everything logged or printed during training
    goes through here, so `float()` never meets a distributed value (`TypeError ... 'MirroredVariable'`).

    Returns:
        `numpy.ndarray` (0-d for a scalar).
    """
    import numpy as np
    import tensorflow as tf

    value = getattr(value, "value", value) if not isinstance(value, (tf.Tensor, np.ndarray)) else value
    if isinstance(value, tf.distribute.DistributedValues):
        if isinstance(value, tf.Variable):
            value = value.read_value()
        else:
            locals_ = tf.distribute.get_strategy().experimental_local_results(value)
            value = np.mean([np.asarray(v) for v in locals_], axis=0)
    return np.asarray(value.numpy() if hasattr(value, "numpy") else value)


def read_float(value) -> float:
    """`read_value` of a scalar as a Python float (raises ValueError for a non-scalar)."""
    array = read_value(value)
    if array.size != 1:
        raise ValueError(f"expected a scalar, got shape {list(array.shape)}")
    return float(array.reshape(()))
