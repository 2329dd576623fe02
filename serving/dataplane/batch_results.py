"""Delivering batch results: settle each request's future once its batch ran, and join the parts of a
request that was split over several batches (outputs concatenated along dim 0, or the first error).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any

import numpy as np

from tfship.core.errors import DeadlineExceededError


def settle(settled: list[tuple[Any, dict | None, BaseException | None]]) -> None:
    """Hand out a batch's results: thread futures directly, event-loop waiters in one call_soon_threadsafe per loop.

    `settled` holds (task, outputs by name or None, error or None); a task has `.future`
    (concurrent.futures) or `.waiter` (an asyncio future).
    """
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for task, result, error in settled:
        if task.waiter is not None:
            by_loop.setdefault(task.waiter.get_loop(), []).append((task.waiter, result, error))
        elif error is not None:
            task.future.set_exception(error)
        else:
            task.future.set_result(result)
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(deliver, items)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def deliver(items: list) -> None:
    """On the event loop: settle the waiters of one batch (cancelled ones are skipped)."""
    for waiter, result, error in items:
        if waiter.done():
            continue
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(result)


def join_parts(parts: list[Future]) -> Future:
    """One future for the parts of a split request: outputs concatenated along dim 0, or the first error."""
    joined: Future = Future()
    joined.set_running_or_notify_cancel()
    left = [len(parts)]
    lock = threading.Lock()

    def done(_part: Future) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        if any(p.cancelled() for p in parts):
            joined.set_exception(DeadlineExceededError("a part of the split request was cancelled"))
            return
        errors = [p.exception() for p in parts if p.exception() is not None]
        if errors:
            joined.set_exception(errors[0])
        else:
            results = [p.result() for p in parts]
            joined.set_result({k: np.concatenate([r[k] for r in results]) if results[0][k].ndim else results[0][k]
                               for k in results[0]})

    for part in parts:
        part.add_done_callback(done)
    return joined
