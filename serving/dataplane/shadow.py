"""Shadow traffic: a sampled share of a model's live Predict requests also runs on a candidate version, and
each pair of answers is compared with the gate's rules (`core.parity`) into a running report
(`serving.dataplane.shadow_report`).

The primary's answer is never changed by its shadow, and the request waits for none of the shadow's work:
  * the data plane hands the finished pair over with `Shadows.offer` (a random draw, two dict copies and a
    non-blocking `put_nowait`: 5-10 µs measured, `make bench-shadow-tracing`), after the primary's answer is
    computed; nothing of the shadow runs on a transport loop or on the predict threads. What a shadow still
    costs the primary is CPU (its model call and the comparison run in this process), set by the rate;
  * shadow work has its own bounded queue (`queue_size` pairs and `queue_bytes` of their arrays): a full
    queue drops the request, counted as `queue_full`; its own worker threads (`workers`) and its own
    model-call threads, so a shadow that hangs holds at most `workers` threads, never a primary's;
  * a shadow call ends at the primary's deadline (the client's, else --default-deadline-s) or after `timeout_s`,
    whichever comes first:
    a pair whose deadline passed while queued is dropped (`deadline_passed`), a call still running then is
    abandoned and counted as DEADLINE_EXCEEDED.

The target is a version number or a label (`canary`), resolved for every pair, so moving the label moves the
shadow. A pair whose shadow resolves to the version that answered the primary is not compared (`same_version`).
Each process writes its report to `<report_dir>/<model>.<pid>.json` (atomically, at most once a second, and when
it stops); the JSON endpoint and `tfship shadow-report` merge every file of that folder into one report
(`read_reports`), so a `--num-processes` server shows one report whichever worker answers.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path

from tfship.core.errors import ConfigError, TfshipError
from tfship.core.files import write_json_atomic
from tfship.core.parity import PairBound, compare_pair
from tfship.core.processes import pid_alive
from tfship.serving.dataplane.shadow_report import ShadowReport, merge
from tfship.serving.dataplane.types import ModelRef

log = logging.getLogger(__name__)
WRITE_EVERY_S = 1.0


@dataclass(frozen=True)
class ShadowOptions:
    """How shadowing runs. rate: share of requests shadowed, in [0, 1]; queue_size: pairs waiting at most;
    queue_bytes: bytes of their inputs and outputs waiting at most (numeric arrays' buffers);
    workers: shadow calls at once; timeout_s: a shadow call's limit (the primary's deadline may end it sooner), s;
    keep_inputs: the worst-disagreement sample keeps inputs; bound: the value bound (the gate's float32 family
    by default); report_dir: where each process writes its part; remove_report_dir: the folder is the server's
    own (the default `<temp>/tfship-shadow/<port>/`): each process removes its part at `close`, and the last one
    the folder (and an empty `tfship-shadow` above it).
    """

    rate: float = 0.1
    queue_size: int = 64
    queue_bytes: int = 256 << 20
    workers: int = 1
    timeout_s: float = 10.0
    keep_inputs: bool = False
    bound: PairBound = PairBound()
    report_dir: Path | None = None
    remove_report_dir: bool = False


def parse_shadow(text: str) -> tuple[str, ModelRef]:
    """`MODEL=TARGET` (TARGET: a version number or a label such as `canary`) as (model, shadow reference).

    Raises:
        ConfigError: not MODEL=TARGET, or an empty part (names the value).
    """
    model, sep, target = text.partition("=")
    model, target = model.strip(), target.strip()
    if not sep or not model or not target:
        raise ConfigError(f"--shadow {text!r}: expected MODEL=VERSION or MODEL=LABEL (e.g. digits=canary)")
    if target.isdigit():
        if int(target) <= 0:
            raise ConfigError(f"--shadow {text!r}: version must be positive")
        return model, ModelRef(model, version=int(target))
    return model, ModelRef(model, label=target)


@dataclass
class _Pair:
    primary_version: int
    signature: str
    inputs: dict
    outputs: dict
    primary_s: float
    deadline: float
    size: int  # bytes of the arrays held


class Shadows:
    """Every shadowed model of one server process: the queue, the workers, the reports and their files.

    Args:
        manager: the server's `ModelManager` (`hold` / `release` from any thread).
        targets: {model: shadow reference} (`parse_shadow`).
        options: `ShadowOptions`.
    """

    def __init__(self, manager, targets: dict[str, ModelRef], options: ShadowOptions) -> None:
        self._manager, self._targets, self.options = manager, dict(targets), options
        self.reports = {m: ShadowReport(m, str(t.version if t.version is not None else t.label), options.keep_inputs)
                        for m, t in targets.items()}
        self._queue: queue.Queue = queue.Queue(maxsize=max(options.queue_size, 1))
        self._queued_bytes, self._bytes_lock = 0, threading.Lock()
        self._calls = ThreadPoolExecutor(max(options.workers, 1), thread_name_prefix="tfship-shadow-call")
        self._random = random.Random()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, name=f"tfship-shadow-{i}", daemon=True)
                         for i in range(max(options.workers, 1))]
        self._threads.append(threading.Thread(target=self._write_forever, name="tfship-shadow-writer", daemon=True))
        self._written: dict[str, int] = {}
        if options.report_dir is not None:
            options.report_dir.mkdir(parents=True, exist_ok=True)
            remove_dead_parts(options.report_dir)
        for thread in self._threads:
            thread.start()

    def offer(self, model: str, primary_version: int, signature: str, inputs, outputs, primary_s: float,
              deadline: float | None) -> None:
        """Shadow this finished primary call if `model` has a shadow and the draw selects it; never blocks.

        Args:
            inputs, outputs: the primary's arrays by name (not copied: neither side changes them).
            primary_s: the primary's model-call time, seconds.  deadline: `time.monotonic()` seconds or None.
        """
        report = self.reports.get(model)
        if report is None or self._random.random() >= self.options.rate:
            return
        end = time.monotonic() + self.options.timeout_s
        end = end if deadline is None else min(end, deadline)
        size = sum(a.nbytes for a in inputs.values()) + sum(a.nbytes for a in outputs.values())
        with self._bytes_lock:
            if self._queued_bytes + size > self.options.queue_bytes:
                report.record_dropped("queue_full")
                return
            self._queued_bytes += size
        try:
            self._queue.put_nowait((model, _Pair(primary_version, signature, dict(inputs), dict(outputs), primary_s,
                                                 end, size)))
        except queue.Full:
            self._unqueue(size)
            report.record_dropped("queue_full")

    def _unqueue(self, size: int) -> None:
        with self._bytes_lock:
            self._queued_bytes -= size

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                model, pair = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            self._unqueue(pair.size)
            try:
                self._shadow(model, pair)
            except Exception:  # a bug here must never stop shadowing, nor reach a primary
                log.exception("shadow of model %s failed unexpectedly", model)
                self.reports[model].record_error("INTERNAL")

    def _shadow(self, model: str, pair: _Pair) -> None:
        report = self.reports[model]
        if time.monotonic() >= pair.deadline:
            report.record_dropped("deadline_passed")
            return
        try:
            served = self._manager.hold(self._targets[model])
        except TfshipError as err:
            report.record_error(err.grpc_code)
            return
        try:
            if served.version == pair.primary_version:
                report.record_dropped("same_version")
                return
            started = time.perf_counter()
            call = self._calls.submit(served.runtime.predict, pair.inputs, pair.signature)
            try:
                outputs = call.result(timeout=max(pair.deadline - time.monotonic(), 0.0))
            except FutureTimeout:
                call.cancel()  # a call still running is abandoned: its thread is the shadow's own
                report.record_error("DEADLINE_EXCEEDED")
                return
            except TfshipError as err:
                report.record_error(err.grpc_code)
                return
            except Exception:  # noqa: BLE001 - a model's own failure is a shadow error, counted, never raised
                report.record_error("INTERNAL")
                return
            shadow_s = time.perf_counter() - started
        finally:
            self._manager.release(served)
        compared = compare_pair(outputs, pair.outputs, self.options.bound)
        report.record_pair(compared, pair.primary_version, served.version, pair.primary_s, shadow_s, pair.inputs)

    def report(self, model: str) -> dict:
        """The model's report: this process's, merged with the other processes' parts in `report_dir`.

        Raises:
            KeyError: `model` has no shadow here.
        """
        own = self.reports[model].to_json()
        if self.options.report_dir is None:
            return own
        others = [p for p in read_parts(self.options.report_dir, model) if p.get("pid") != os.getpid()]
        return merge([own, *others]) if others else own

    def _write_forever(self) -> None:
        while not self._stop.wait(WRITE_EVERY_S):
            self.write()

    def write(self) -> None:
        """Write each report that changed to `<report_dir>/<model>.<pid>.json` (atomic)."""
        if self.options.report_dir is None:
            return
        for model, report in self.reports.items():
            if self._written.get(model) == report.changed and model in self._written:
                continue
            self._written[model] = report.changed
            try:
                write_json_atomic(self.options.report_dir / f"{model}.{os.getpid()}.json",
                                  {**report.to_json(), "pid": os.getpid()})
            except OSError as err:
                log.warning("cannot write the shadow report of %s to %s: %s", model, self.options.report_dir, err)

    def close(self) -> None:
        """Stop the workers (a call still running is abandoned) and write the reports a last time, or, with
        `remove_report_dir`, remove this process's parts and the folder once no other part is left in it.
        """
        self._stop.set()
        self._calls.shutdown(wait=False, cancel_futures=True)
        if self.options.remove_report_dir and self.options.report_dir is not None:
            self._threads[-1].join(timeout=WRITE_EVERY_S * 2)  # the writer: no part written after its removal
            remove_own_parts(self.options.report_dir)
        else:
            self.write()


def read_parts(report_dir: Path, model: str) -> list[dict]:
    """Every process's part of `model`'s report in `report_dir` (files that do not parse are skipped)."""
    import json

    parts = []
    for path in sorted(Path(report_dir).glob(f"{model}.*.json")):
        try:
            part = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(part, dict) and part.get("model") == model:
            parts.append(part)
    return parts


def read_reports(report_dir: Path, model: str) -> dict:
    """One report of `model` from every part in `report_dir`.

    Raises:
        ConfigError: no part of `model`'s report in `report_dir` (names both).
    """
    parts = read_parts(report_dir, model)
    if not parts:
        raise ConfigError(f"no shadow report of model {model!r} in {report_dir} (files {model}.<pid>.json)")
    return merge(parts)


def remove_dead_parts(report_dir: Path) -> None:
    """Remove parts written by processes no longer alive (a previous run's): a report is one run's."""
    for path in Path(report_dir).glob("*.*.json"):
        pid = path.name.rsplit(".", 2)[-2]
        if pid.isdigit() and not pid_alive(int(pid)):
            path.unlink(missing_ok=True)


def remove_own_parts(report_dir: Path) -> None:
    """Remove this process's report parts from `report_dir`, then the folder and its parent if they are empty
    (another worker's part, or a file of someone else's, keeps them).
    """
    report_dir = Path(report_dir)
    for path in report_dir.glob(f"*.{os.getpid()}.json"):
        path.unlink(missing_ok=True)
    for folder in (report_dir, report_dir.parent):
        try:
            folder.rmdir()
        except OSError:  # not empty (or gone): kept
            return
