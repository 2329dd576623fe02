"""How the training loop (`pipeline.training.train._Loop`) stops together: the per-block agreement of the workers
(stop, timed checkpoint, the next block's size) and the one line naming a peer a collective lost.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def lost_peer(loop, err) -> str:
    """One line naming the task a collective lost (from TensorFlow's message, else by probing the peers)."""
    import re

    from tfship.pipeline.training.cluster import describe_unreachable

    cluster = loop.runtime.cluster
    named = {(m.group(1), int(m.group(2))) for m in re.finditer(r"/job:(\w+)/replica:\d+/task:(\d+)", str(err))}
    lost = [t for t in cluster.peers if (t.job, t.index) in named]
    unreachable = describe_unreachable(tuple(lost) or cluster.peers)
    who = "; ".join(unreachable) if unreachable else ", ".join(f"{t.name} at {t.address}" for t in lost) \
        or "a peer (every peer's port still answers)"
    lines = [line.strip() for line in str(err.message).splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(("Graph execution error", "Detected at node",
                                                               "File ", "[[", "Additional GRPC"))]
    first = (useful or lines or [""])[0][:160]
    last = checkpoint_step(loop.inputs.checkpoint_dir)
    resume = (f"the last checkpoint is step {last}" if last is not None else "no checkpoint was written yet")
    return (f"train: lost {who} at step {loop.watch.step + 1} ({type(err).__name__}: {first}); {resume}: "
            "restart every worker (with --resume to continue from it)")


@dataclass(frozen=True)
class Agreement:
    """What every worker does after a block: stop (`stop`), save a timed checkpoint (`checkpoint`), and the step
    time the next block's size is chosen from (`seconds_per_step`, None before any block was measured).
    """

    stop: bool
    checkpoint: bool
    seconds_per_step: float | None


def agree(loop, checkpoint_due: bool, seconds_per_step: float | None) -> Agreement:
    """After a block: a signal here, this process's checkpoint timer and its measured step time (one process), or
    every worker's (multi_worker: one tiny all-reduce per block; any worker's signal or due timer counts, the
    slowest worker's step time sizes the next block), so all workers stop, save and size their blocks alike.
    A signal's name is kept in `loop._stopped_by`.
    """
    if loop.runtime.cluster is None:
        loop._stopped_by = loop.stop.signal_name
        return Agreement(loop.stop.requested, checkpoint_due, seconds_per_step)
    import tensorflow as tf

    workers = loop.runtime.num_workers
    if getattr(loop, "_vote", None) is None:
        strategy = loop.runtime.strategy

        @tf.function(input_signature=[tf.TensorSpec([3 * workers], tf.float32)])
        def vote(local):
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(local,)),
                                   axis=None)

        loop._vote = vote
    mine = np.zeros(3 * workers, np.float32)
    rank = loop.runtime.cluster.rank
    if loop.stop.requested:  # the vote carries the signal's number, so every worker can name it
        mine[rank] = float(signal.Signals[loop.stop.signal_name].value)
    mine[workers + rank] = seconds_per_step if seconds_per_step is not None else -1.0
    mine[2 * workers + rank] = float(checkpoint_due)
    votes = loop._vote(tf.constant(mine)).numpy()
    signals, times, due = votes[:workers], votes[workers:2 * workers], votes[2 * workers:]
    tasks = loop.runtime.cluster.tasks
    loop._stopped_by = " and ".join(f"{signal.Signals(int(signals[i])).name} on {tasks[i].name}"
                                    for i in np.flatnonzero(signals > 0))
    measured = None if (times < 0).any() else float(times.max())
    return Agreement(bool(signals.any()), bool(due.any()), measured)


def checkpoint_step(checkpoint_dir: Path) -> int | None:
    """The step of the latest checkpoint in `checkpoint_dir` (saved as `ckpt-<step>`), None when there is none."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(checkpoint_dir))
    return None if latest is None else int(latest.rsplit("-", 1)[1])
