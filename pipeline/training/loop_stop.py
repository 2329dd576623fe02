"""How the custom loop (`pipeline.training.train._Loop`) stops together: the per-step stop vote of the workers
and the one line naming a peer a collective lost.
"""

from __future__ import annotations

import signal
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


def stop_agreed(loop) -> bool:
    """Whether to stop after this step: a signal here (one process), or on any worker (multi_worker: every
    worker votes after every step, one tiny all-reduce, so all stop at the same step).
    """
    if loop.runtime.cluster is None:
        loop._stopped_by = loop.stop.signal_name
        return loop.stop.requested
    import tensorflow as tf

    if getattr(loop, "_vote", None) is None:
        strategy = loop.runtime.strategy

        @tf.function(input_signature=[tf.TensorSpec([loop.runtime.num_workers], tf.float32)])
        def vote(local):
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(local,)),
                                   axis=None)

        loop._vote = vote
    mine = np.zeros(loop.runtime.num_workers, np.float32)
    if loop.stop.requested:  # the vote carries the signal's number, so every worker can name it
        mine[loop.runtime.cluster.rank] = float(signal.Signals[loop.stop.signal_name].value)
    votes = loop._vote(tf.constant(mine)).numpy()
    if not votes.any():
        return False
    tasks = loop.runtime.cluster.tasks
    loop._stopped_by = " and ".join(f"{signal.Signals(int(votes[i])).name} on {tasks[i].name}"
                                    for i in np.flatnonzero(votes > 0))
    return True


def checkpoint_step(checkpoint_dir: Path) -> int | None:
    """The step of the latest checkpoint in `checkpoint_dir` (saved as `ckpt-<step>`), None when there is none."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(checkpoint_dir))
    return None if latest is None else int(latest.rsplit("-", 1)[1])
