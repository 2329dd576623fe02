"""Process-level training runtime: the tf.distribute strategy, determinism and eager debugging.

`training_runtime(config)` is entered once per training run by the train stage's entry point; it
applies the process-wide switches the config asks for and restores them when training ends, so
nothing leaks into the code that runs after it (export, other tests).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tfship.pipeline.config import TrainSection


@dataclass(frozen=True)
class Runtime:
    """The strategy training runs under and whether this process writes results (the chief)."""

    strategy: Any  # a tf.distribute.Strategy (the TensorFlow stub declares no Strategy class)
    kind: str
    is_chief: bool
    worker_index: int
    num_workers: int
    cluster: object = None  # pipeline.training.cluster.Cluster under multi_worker

    @property
    def replicas(self) -> int:
        """Replicas in sync across the cluster (devices x workers)."""
        return int(self.strategy.num_replicas_in_sync)


def make_strategy(kind: str, cluster_timeout_s: float = 300.0) -> Runtime:
    """Build the strategy: `default` (one device), `mirrored` (all local GPUs, else the CPU) or
    `multi_worker` (MultiWorkerMirroredStrategy over the cluster in TF_CONFIG, ring all-reduce).

    For `multi_worker`, TF_CONFIG is read again (`pipeline.training.cluster`; `train_model` has validated it and
    met the other workers, `pipeline.training.rendezvous`), and TensorFlow's coordination service is configured
    to give up registering after `cluster_timeout_s` seconds (TensorFlow's default is an hour) and to wait at
    most 10 s for peers at exit.
    Building it blocks until every task has connected: call it from the supervised training thread
    (`pipeline.training.supervise`).

    Raises:
        ConfigError: multi_worker without a usable TF_CONFIG (the message names the task and address).
    """
    import tensorflow as tf

    if kind == "default":
        return Runtime(tf.distribute.get_strategy(), kind, True, 0, 1)
    if kind == "mirrored":
        return Runtime(tf.distribute.MirroredStrategy(), kind, True, 0, 1)
    from tfship.pipeline.training.cluster import read_cluster

    cluster = read_cluster()  # validated, met and agreed on already (train_model)
    configure_coordination(cluster, cluster_timeout_s)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    return Runtime(strategy, kind, cluster.is_chief, cluster.me.index, cluster.size, cluster)


def configure_coordination(cluster, cluster_timeout_s: float) -> None:
    """Configure TensorFlow's coordination service as MultiWorkerMirroredStrategy would, with bounded waits:
    registration gives up after `cluster_timeout_s` (plus a margin, so our own watchdog names the missing task
    first), the shutdown barrier after 10 s.
    """
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.eager import context

    if context.context().coordination_service is not None:
        return
    leader = f"/job:{cluster.chief.job}/replica:0/task:{cluster.chief.index}"
    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=len(addresses))
            for job, addresses in cluster.jobs.items()]
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=leader, coordinated_jobs=jobs,
        cluster_register_timeout_in_ms=int((cluster_timeout_s + 30) * 1000),
        shutdown_barrier_timeout_in_ms=10_000)


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
            return np.asarray(np.mean([np.asarray(v) for v in locals_], axis=0))
    to_numpy = getattr(value, "numpy", None)
    return np.asarray(to_numpy() if to_numpy is not None else value)


def read_float(value) -> float:
    """`read_value` of a scalar as a Python float (raises ValueError for a non-scalar)."""
    array = read_value(value)
    if array.size != 1:
        raise ValueError(f"expected a scalar, got shape {list(array.shape)}")
    return float(array.reshape(()))
