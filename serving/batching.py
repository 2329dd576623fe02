"""Dynamic batching by composition: `Batched(runtime)` merges concurrent requests into one backend call.

Knobs carry TF Serving's names and meaning (BatchingParameters). Requests for the same signature and
the same non-batch shapes are concatenated along dim 0, optionally padded up to the next
`allowed_batch_sizes` entry, run once, and the outputs split back exactly per request. A batch that
fails fails every request in it. A worker that finds nothing else queued dispatches at once (no added
latency for a lone request); it waits up to `batch_timeout_micros` for more only while other batches
are running, i.e. under load.
"""

from __future__ import annotations

import collections
import re
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.errors import ConfigError, DeadlineExceededError, InvalidRequestError, ResourceExhaustedError
from serving.contract import Signature
from serving.runtimes.base import Runtime


@dataclass(frozen=True)
class BatchingParameters:
    """TF Serving's batching knobs.

    Attributes:
        max_batch_size: most rows in one backend call.
        batch_timeout_micros: longest a batch waits to fill while other batches run, microseconds.
        max_enqueued_batches: queue capacity, in batches of `max_batch_size` rows; beyond it RESOURCE_EXHAUSTED.
        num_batch_threads: batches run concurrently.
        allowed_batch_sizes: if set, batches are padded to the next size (last must equal max_batch_size).
        pad_variable_length_inputs: zero-pad non-batch dims so requests of different lengths merge.
        enable_large_batch_splitting: split a request above max_batch_size (else INVALID_ARGUMENT).
    """

    max_batch_size: int = 32
    batch_timeout_micros: int = 1000
    max_enqueued_batches: int = 100
    num_batch_threads: int = 2
    allowed_batch_sizes: tuple[int, ...] = ()
    pad_variable_length_inputs: bool = False
    enable_large_batch_splitting: bool = True

    def __post_init__(self) -> None:
        if min(self.max_batch_size, self.max_enqueued_batches, self.num_batch_threads) < 1 \
                or self.batch_timeout_micros < 0:
            raise ConfigError(f"batching parameters must be positive: {self}")
        sizes = self.allowed_batch_sizes
        if sizes and (list(sizes) != sorted(set(sizes)) or sizes[-1] != self.max_batch_size or sizes[0] < 1):
            raise ConfigError(f"allowed_batch_sizes {list(sizes)} must increase and end with max_batch_size "
                              f"{self.max_batch_size} (TF Serving's rule)")

    @classmethod
    def from_text(cls, text: str, source: str = "<text>") -> BatchingParameters:
        """Parse TF Serving's BatchingParameters text format (`max_batch_size { value: 128 }`, ...)."""
        values: dict = {}
        body = re.sub(r"#.*", "", text)
        for name, value in re.findall(r"(\w+)\s*\{\s*value\s*:\s*([^\s}]+)\s*\}", body):
            values[name] = value
        body = re.sub(r"\w+\s*\{[^}]*\}", "", body)
        for name, value in re.findall(r"(\w+)\s*:\s*(\S+)", body):
            if name == "allowed_batch_sizes":
                values.setdefault(name, []).append(value)
            else:
                values[name] = value
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{source}: unknown batching parameter(s) {unknown}; known: {sorted(known)}")
        try:
            kwargs = {k: (tuple(int(x) for x in v) if k == "allowed_batch_sizes"
                          else v.lower() == "true" if k in ("pad_variable_length_inputs", "enable_large_batch_splitting")
                          else int(v)) for k, v in values.items()}
        except ValueError as err:
            raise ConfigError(f"{source}: bad batching parameter value: {err}") from err
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: Path) -> BatchingParameters:
        """Read `--batching_parameters_file`; raises `ConfigError` naming the file."""
        try:
            return cls.from_text(Path(path).read_text(), str(path))
        except OSError as err:
            raise ConfigError(f"cannot read batching parameters file {path}: {err}") from err


@dataclass(eq=False)  # identity semantics: tasks hold arrays
class _Task:
    inputs: Mapping[str, np.ndarray]
    rows: int
    key: tuple
    deadline: float | None
    future: Future = field(default_factory=Future)


class Batched(Runtime):
    """Wraps a loaded runtime; `predict()` blocks until its rows come back from a merged call.

    Args:
        runtime: the loaded backend (its `load()` has been called).
        params: `BatchingParameters`.
        metrics: optional `serving.metrics.Metrics` (batch size histogram, queue depth).
    """

    name = "batched"

    def __init__(self, runtime: Runtime, params: BatchingParameters = BatchingParameters(), metrics=None) -> None:
        super().__init__(runtime.version_dir, runtime.options)
        self.inner = runtime
        self.params = params
        self._metrics = metrics
        self._label = runtime.version_dir.parent.name
        self._queue: collections.deque[_Task] = collections.deque()
        self._queued_rows = 0
        self._busy = 0
        self._closed = False
        self._cond = threading.Condition()
        self._threads = [threading.Thread(target=self._worker, name=f"tfship-batch-{i}", daemon=True)
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

    def predict(self, inputs: Mapping[str, np.ndarray], signature_name: str = "serving_default",
                *, deadline: float | None = None) -> dict[str, np.ndarray]:
        """Queue the request, wait for its slice of a merged call (same contract as the wrapped runtime).

        Raises:
            InvalidRequestError: more rows than max_batch_size with splitting disabled.
            ResourceExhaustedError: the queue holds max_enqueued_batches batches already.
            DeadlineExceededError: the deadline passed while queued.
            Any error of the wrapped runtime's batch call.
        """
        rows = _rows(inputs)
        if rows is None:  # nothing to batch along
            return self.inner.predict(inputs, signature_name, deadline=deadline)
        limit = self.params.max_batch_size
        if rows > limit:
            if not self.params.enable_large_batch_splitting:
                raise InvalidRequestError(f"batch of {rows} rows exceeds max_batch_size {limit}")
            parts = [self._submit({k: v[i:i + limit] for k, v in inputs.items()}, signature_name, deadline)
                     for i in range(0, rows, limit)]
            results = [p.result() for p in parts]
            return {k: np.concatenate([r[k] for r in results]) if results[0][k].ndim else results[0][k]
                    for k in results[0]}
        return self._submit(inputs, signature_name, deadline).result()

    def _submit(self, inputs, signature_name: str, deadline: float | None) -> Future:
        rows = _rows(inputs)
        shapes = () if self.params.pad_variable_length_inputs else \
            tuple(sorted((k, v.shape[1:], v.dtype.str) for k, v in inputs.items()))
        task = _Task(inputs, rows, (signature_name, shapes), deadline)
        with self._cond:
            capacity = self.params.max_enqueued_batches * self.params.max_batch_size
            if self._queued_rows + rows > capacity:
                raise ResourceExhaustedError(f"batch queue full: {self._queued_rows} rows queued, capacity "
                                             f"{capacity} (max_enqueued_batches={self.params.max_enqueued_batches})")
            self._queue.append(task)
            self._queued_rows += rows
            self._gauge()
            self._cond.notify()
        return task.future

    def _gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.queue_depth.labels(self._label).set(len(self._queue))

    def _take(self, batch: list[_Task], key) -> int:
        """Move queued tasks with `key` into `batch` while they fit; returns the rows taken."""
        taken, total = 0, sum(t.rows for t in batch)
        for task in list(self._queue):
            if task.key == key and total + task.rows <= self.params.max_batch_size:
                self._queue.remove(task)
                self._queued_rows -= task.rows
                batch.append(task)
                total += task.rows
                taken += task.rows
        return taken

    def _worker(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed and not self._queue:
                    return
                key = self._queue[0].key
                batch: list[_Task] = []
                self._take(batch, key)
                deadline = time.monotonic() + self.params.batch_timeout_micros / 1e6
                while (self._busy and sum(t.rows for t in batch) < self.params.max_batch_size
                       and time.monotonic() < deadline and not self._closed):
                    self._cond.wait(deadline - time.monotonic())
                    self._take(batch, key)
                self._busy += 1
                self._gauge()
            try:
                self._run(batch, key[0])
            finally:
                with self._cond:
                    self._busy -= 1

    def _run(self, batch: list[_Task], signature_name: str) -> None:
        now = time.monotonic()
        live = []
        for task in batch:
            if task.deadline is not None and now >= task.deadline:
                task.future.set_exception(DeadlineExceededError("deadline exceeded while waiting in the batch queue"))
            else:
                live.append(task)
        if not live:
            return
        try:
            merged, total = self._merge(live)
            if self._metrics is not None:
                self._metrics.batch_size.labels(self._label).observe(total)
            outputs = self.inner.predict(merged, signature_name)
            offset = 0
            for task in live:
                task.future.set_result({k: (v[offset:offset + task.rows] if v.ndim and v.shape[0] == total else v)
                                        for k, v in outputs.items()})
                offset += task.rows
        except BaseException as err:  # noqa: BLE001 - every waiting request gets the batch's error, whatever it is
            for task in live:
                if not task.future.done():
                    task.future.set_exception(err)

    def _merge(self, tasks: list[_Task]) -> tuple[dict[str, np.ndarray], int]:
        rows = sum(t.rows for t in tasks)
        target = next((s for s in self.params.allowed_batch_sizes if s >= rows), rows)
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


def _rows(inputs: Mapping[str, np.ndarray]) -> int | None:
    sizes = {int(v.shape[0]) for v in inputs.values() if np.ndim(v) > 0}
    return sizes.pop() if len(sizes) == 1 else None


def _pad_to_common_shape(parts: list[np.ndarray]) -> list[np.ndarray]:
    """Zero-pad every non-batch dim to the largest among `parts` (TF Serving's pad_variable_length_inputs)."""
    target = np.max([p.shape[1:] for p in parts], axis=0)
    return [np.pad(p, [(0, 0)] + [(0, int(t) - s) for t, s in zip(target, p.shape[1:])]) for p in parts]
