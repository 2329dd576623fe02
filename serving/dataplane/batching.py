"""Dynamic batching by composition: `Batched(runtime)` merges concurrent requests into one backend call.

Knobs carry TF Serving's names and meaning (BatchingParameters). Requests for the same signature and the same non-batch
shapes are concatenated along dim 0, optionally padded up to the next `allowed_batch_sizes` entry, run once, and the
outputs split back exactly per request. A batch that fails fails every request in it.

When to dispatch: a worker waits up to `batch_timeout_micros` for its batch to fill while another batch is running, or
while fewer requests are queued or running than were in flight at once lately (the peak over `PEAK_WINDOW_S`: under a
steady concurrency, the peers of this request are about to arrive). A lone request (nothing else in flight lately) is
dispatched at once, so it gets no added latency.

Two entry points: `predict()` blocks the calling thread; `predict_async()` (the `Runtime` interface's
async call, overridden here) awaits the result on the event loop (no executor thread parked per queued
request, so the queue is bounded by `max_enqueued_batches`, not by a thread pool).
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tfship.core.contract import Signature
from tfship.core.errors import DeadlineExceededError, InvalidRequestError, ResourceExhaustedError
from tfship.serving.affinity import lower_thread_priority
from tfship.serving.dataplane.batch_results import join_parts, settle
from tfship.serving.dataplane.batching_parameters import BatchingParameters
from tfship.serving.operations import tracing
from tfship.serving.runtimes.base import Rows, Runtime

__all__ = ["PEAK_WINDOW_S", "Batched", "BatchingParameters"]

PEAK_WINDOW_S = 0.05  # how long a burst of concurrent requests keeps batches waiting for their peers


@dataclass(eq=False)  # identity semantics: tasks hold arrays
class _Task:
    inputs: Mapping[str, np.ndarray]
    rows: int | None  # None: no batch dimension, runs alone
    key: tuple
    deadline: float | None
    future: Future | None = field(default_factory=Future)  # for threads (`predict`, `submit`)
    waiter: asyncio.Future | None = None  # for the event loop (`predict_async`): settled in one hop per batch
    trace: tuple | None = field(default_factory=tracing.queued)  # (request's trace context, queued at ns); off: None

    def start(self) -> bool:
        """At dispatch: False if the caller gave up (cancelled) while queued; else the request can no longer be."""
        if self.waiter is not None:
            return not self.waiter.cancelled()  # a late cancel is harmless: delivery skips done waiters
        assert self.future is not None  # a task has its waiter or its future
        return self.future.set_running_or_notify_cancel()


class Batched(Runtime):
    """Wraps a loaded runtime; `predict()` blocks (and `predict_async()` awaits) until its rows come back
    from a merged call.

    Args:
        runtime: the loaded backend (its `load()` has been called).
        params: `BatchingParameters`.
        metrics: optional `serving.operations.metrics.Metrics` (batch size histogram, queue depth).
        nice: the batch threads' nice value (`--batch-thread-nice`, 0..19; 0: as every thread, `affinity`).
    """

    name = "batched"

    def __init__(self, runtime: Runtime, params: BatchingParameters | None = None, metrics=None, nice: int = 0) -> None:
        super().__init__(runtime.version_dir, runtime.options)
        self.inner = runtime
        self.params = params = params or BatchingParameters()
        self._metrics = metrics
        self._label = runtime.version_dir.parent.name
        self._depth = metrics.queue_depth.labels(self._label) if metrics is not None else None
        self._sizes = metrics.batch_size.labels(self._label) if metrics is not None else None
        self._queue: collections.deque[_Task] = collections.deque()
        self._queued_rows = 0
        self._busy = 0  # batches running
        self._running = 0  # requests in running batches
        self._inflight = 0  # requests queued, running, or whose caller has not taken the result yet
        self._peak = 0  # most requests in flight at once lately (PEAK_WINDOW_S): the expected concurrency
        self._peak_since = 0.0
        self._idle = 0  # workers waiting for work
        self._filling = 0  # workers waiting for their batch to fill
        self._gathered = self._gathered_rows = 0  # requests (rows) those workers hold
        self._closed = False
        self._cond = threading.Condition()
        self._threads = [threading.Thread(target=self._worker, args=(nice,), name=f"tfship-batch-{i}", daemon=True)
                         for i in range(params.num_batch_threads)]
        for thread in self._threads:
            thread.start()
        self.ready = runtime.ready

    @classmethod
    def can_serve(cls, version_dir: Path) -> bool:
        return False  # never chosen by `auto`: it wraps another runtime

    def load(self) -> None:
        self.inner.load()
        self.ready = self.inner.ready

    def metadata(self) -> dict[str, Signature]:
        return self.inner.metadata()

    @property
    def backend(self) -> str:
        """The wrapped runtime's backend name (batching is not a backend)."""
        return self.inner.backend

    @property
    def published(self):
        """The wrapped runtime's published artifact under `--artifact` (`Runtime.published`), else None."""
        return getattr(self.inner, "published", None)

    @property
    def model_judges_shapes(self) -> bool:
        """As the wrapped runtime (`Runtime.model_judges_shapes`)."""
        return self.inner.model_judges_shapes

    @property
    def resizes_inputs(self) -> bool:
        """As the wrapped runtime (`Runtime.resizes_inputs`)."""
        return self.inner.resizes_inputs

    @property
    def declares_ranks(self) -> bool:
        """As the wrapped runtime (`Runtime.declares_ranks`)."""
        return getattr(self.inner, "declares_ranks", False)

    def stop(self) -> None:
        """Stop the batch threads after the queued requests ran; the wrapped runtime stays loaded."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    def unload(self) -> None:
        """Stop batching, then unload the wrapped runtime."""
        self.stop()
        self.inner.unload()
        super().unload()

    def predict(self, inputs: Mapping[str, np.ndarray],
                signature_name: str = "serving_default") -> dict[str, np.ndarray]:
        """Queue the request, wait for its slice of a merged call (same contract as the wrapped runtime).

        Raises:
            InvalidRequestError: more rows than max_batch_size with splitting disabled.
            ResourceExhaustedError: the queue holds max_enqueued_batches batches already.
            Any error of the wrapped runtime's batch call.
        """
        future, parts = self.submit(inputs, signature_name, rows=Rows.of(inputs))
        try:
            return future.result()
        finally:
            self._release(parts)

    async def predict_async(self, inputs: Mapping[str, np.ndarray], signature_name: str = "serving_default", *,
                            rows: Rows, deadline: float | None = None,
                            executor: Executor | None = None) -> dict[str, np.ndarray]:
        """`predict()` for the event loop: queue the request and await its slice (no thread waits on it).

        `executor` is not used (the batch threads run the model). Cancelling the awaiting task drops the
        request if its batch has not started yet.

        Raises:
            DeadlineExceededError: `deadline` (`time.monotonic()` seconds) passed while the request was queued.
            Otherwise as `predict()`.
        """
        if rows.common is not None and rows.common > self.params.max_batch_size:  # split: rare, via a thread future
            future, parts = self.submit(inputs, signature_name, deadline, rows=rows)
            try:
                return await asyncio.wrap_future(future)
            finally:
                self._release(parts)
        waiter = asyncio.get_running_loop().create_future()
        self._enqueue(_Task(inputs, rows.common, self._key(inputs, signature_name, rows.common), deadline, None,
                            waiter))
        try:
            return await waiter
        finally:
            self._release(1)

    def submit(self, inputs: Mapping[str, np.ndarray], signature_name: str = "serving_default",
               deadline: float | None = None, *, rows: Rows) -> tuple[Future, int]:
        """Queue a request; returns its result future and the number of queued parts (for `_release`).

        A request above max_batch_size is split into parts (when allowed) whose results are concatenated.
        `rows`: the request's count (`Rows`); only `rows.common` matters here.
        """
        common = rows.common
        limit = self.params.max_batch_size
        if common is None or common <= limit:
            return self._put(_Task(inputs, common, self._key(inputs, signature_name, common), deadline)), 1
        if not self.params.enable_large_batch_splitting:
            raise InvalidRequestError(f"batch of {common} rows exceeds max_batch_size {limit}")
        capacity = self.params.max_enqueued_batches * limit
        if common > capacity:  # could never fit, even in an empty queue: the client's error, not a busy server
            raise InvalidRequestError(f"batch of {common} rows exceeds the per-request limit of {capacity} rows "
                                      f"(max_enqueued_batches={self.params.max_enqueued_batches} x "
                                      f"max_batch_size={limit}); send smaller requests")
        parts = [{k: v[i:i + limit] for k, v in inputs.items()} for i in range(0, common, limit)]
        futures: list[Future] = []
        try:
            for i, part in enumerate(parts):
                part_rows = min(limit, common - i * limit)  # every part keeps the common dim 0
                futures.append(self._put(_Task(part, part_rows, self._key(part, signature_name, 1), deadline)))
        except ResourceExhaustedError:
            self._release(len(futures))  # the parts already queued run, unawaited
            raise
        return join_parts(futures), len(futures)

    def _key(self, inputs: Mapping[str, np.ndarray], signature_name: str, rows: int | None) -> tuple:
        if rows is None:
            return (signature_name, object())  # unique: never merged with another request
        if self.params.pad_variable_length_inputs:
            return (signature_name, ())
        return (signature_name, tuple(sorted((k, v.shape[1:], v.dtype.str) for k, v in inputs.items())))

    def _put(self, task: _Task) -> Future:  # a thread's task (`submit`): queued; its result future
        self._enqueue(task)
        assert task.future is not None  # made with it (the event loop's task has a waiter instead)
        return task.future

    def _enqueue(self, task: _Task) -> None:
        rows = task.rows or 0
        with self._cond:
            capacity = self.params.max_enqueued_batches * self.params.max_batch_size
            if self._queued_rows + rows > capacity:
                raise ResourceExhaustedError(f"batch queue full: {self._queued_rows} rows queued, capacity "
                                             f"{capacity} (max_enqueued_batches={self.params.max_enqueued_batches})")
            self._queue.append(task)
            self._queued_rows += rows
            self._inflight += 1
            if self._inflight > self._peak:
                self._peak = self._inflight
            self._gauge()
            if self._filling:  # wake the filling worker only once waiting is pointless (saves a GIL hand-off)
                if self._filled():
                    self._cond.notify_all()
            elif self._idle:  # a busy worker looks at the queue when its batch is done
                self._cond.notify()

    def _release(self, parts: int) -> None:
        """The caller has taken its result: its requests no longer count as in flight."""
        with self._cond:
            self._inflight -= parts

    def _filled(self) -> bool:
        """Called with the lock held: no reason left to wait (every in-flight request is queued or running)."""
        return (len(self._queue) + self._running + self._gathered >= self._peak
                or self._queued_rows + self._gathered_rows >= self.params.max_batch_size)

    def _gauge(self) -> None:
        if self._depth is not None:
            self._depth.set(len(self._queue))

    def _take(self, batch: list[_Task], key) -> int:
        """Move queued tasks with `key` into `batch` while they fit; returns the rows now in `batch`."""
        total = sum(t.rows or 0 for t in batch)
        if batch and batch[0].rows is None:
            return total
        kept: collections.deque[_Task] = collections.deque()
        while self._queue:
            task = self._queue.popleft()
            if task.key == key and total + (task.rows or 0) <= self.params.max_batch_size:
                self._queued_rows -= task.rows or 0
                batch.append(task)
                total += task.rows or 0
            else:
                kept.append(task)
        self._queue = kept
        return total

    def _worker(self, nice: int = 0) -> None:
        lower_thread_priority(nice)  # on a core shared with the loop: the loop decodes while a batch runs
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._idle += 1
                    try:
                        self._cond.wait()
                    finally:
                        self._idle -= 1
                if self._closed and not self._queue:
                    return
                batch = self._collect()
                if self._queue and self._idle:  # other keys left behind: another worker may take them
                    self._cond.notify()
                self._busy += 1
                self._running += len(batch)
                self._gauge()
            try:
                self._run(batch, batch[0].key[0])
            finally:
                with self._cond:
                    self._busy -= 1
                    self._running -= len(batch)

    def _collect(self) -> list[_Task]:
        """With the lock held and a task queued: take the next batch, waiting up to the timeout for it to fill."""
        key = self._queue[0].key
        batch: list[_Task] = []
        rows = self._take(batch, key)
        if batch[0].rows is None:
            return batch
        now = time.monotonic()
        if now - self._peak_since > PEAK_WINDOW_S:  # forget old bursts: a lone request is not held back
            self._peak, self._peak_since = self._inflight, now
        deadline = now + self.params.batch_timeout_micros / 1e6
        self._filling += 1
        try:
            while rows < self.params.max_batch_size and not self._closed:
                expected = self._peak - self._running - self._gathered - len(batch) - len(self._queue)
                if not self._busy and expected <= 0:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._gathered += len(batch)
                self._gathered_rows += rows
                try:
                    self._cond.wait(left)
                finally:
                    self._gathered -= len(batch)
                    self._gathered_rows -= rows
                rows = self._take(batch, key)
        finally:
            self._filling -= 1
        return batch

    def _run(self, batch: list[_Task], signature_name: str) -> None:
        now = time.monotonic()
        live, settled = [], []
        for task in batch:
            if not task.start():
                continue
            if task.deadline is not None and now >= task.deadline:
                expired = DeadlineExceededError("deadline exceeded while waiting in the batch queue")
                settled.append((task, None, expired))
            else:
                live.append(task)
        try:
            if not live:
                return
            if live[0].rows is None:  # no batch dimension: run alone, unchanged
                try:
                    settled.append((live[0], self.inner.predict(live[0].inputs, signature_name), None))
                except BaseException as err:  # noqa: BLE001 - the caller gets the error, whatever it is
                    settled.append((live[0], None, err))
                return
            batch_span = None
            try:
                merged, total = self._merge(live)
                if self._sizes is not None:
                    self._sizes.observe(total)
                batch_span = tracing.start_batch([task.trace for task in live], total)  # linked both ways
                outputs = self.inner.predict(merged, signature_name)
                offset = 0
                for task in live:
                    settled.append((task, {k: (v[offset:offset + task.rows] if v.ndim and v.shape[0] == total else v)
                                           for k, v in outputs.items()}, None))
                    offset += task.rows
            except BaseException as err:  # noqa: BLE001 - every waiting request gets the batch's error, whatever it is
                settled += [(task, None, err) for task in live]
            finally:
                tracing.end(batch_span)
        finally:
            settle(settled)

    def _merge(self, tasks: list[_Task]) -> tuple[dict[str, np.ndarray], int]:
        rows = sum(t.rows or 0 for t in tasks)  # every merged task has a batch dimension (`_take`)
        target = next((s for s in self.params.allowed_batch_sizes if s >= rows), rows)
        if len(tasks) == 1 and target == rows:
            return dict(tasks[0].inputs), rows
        merged = {}
        for key in tasks[0].inputs:
            parts = [t.inputs[key] for t in tasks]
            if self.params.pad_variable_length_inputs:
                parts = _pad_to_common_shape(parts)
            array = np.concatenate(parts)
            if target > rows:  # pad with copies of the last row, sliced off again by the split
                array = np.concatenate([array, np.repeat(array[-1:], target - rows, axis=0)])
            merged[key] = array
        return merged, target


def _pad_to_common_shape(parts: list[np.ndarray]) -> list[np.ndarray]:
    """Zero-pad every non-batch dim to the largest among `parts` (TF Serving's pad_variable_length_inputs)."""
    target = np.max([p.shape[1:] for p in parts], axis=0)
    return [np.pad(p, [(0, 0)] + [(0, int(t) - s) for t, s in zip(target, p.shape[1:])]) for p in parts]
