"""The convert stage's memory budget: conversions run side by side only while their predicted peaks fit.

Budget: `convert.memory_budget_bytes`, or when 0 (default) `convert.memory_share` of the memory the kernel
says is available when the stage starts (`MemAvailable`). It covers the stage's whole process tree, so
the room left for converter children is the budget less this process's own resident memory.

Prediction: each conversion's peak resident memory is predicted from the SavedModel's weight bytes,
`base + per_weight_byte x weights`, the `peak` model of each format (`core.formats.ArtifactFormat.peak`, declared by
its package: `tflite/formats.py`, `onnx_format/formats.py`; fitted on ResNet50 and wide MLPs of 1 to 300 MB,
docs/benchmarks.md; `DEFAULT_PEAK` for a format not fitted). As conversions finish, their measured peaks (the
kernel's high-water mark of each child, `core.child_memory`) refine the prediction of the rest of the same
converter family (the format's `package`: onnx, tflite, tfjs): every later prediction is scaled by the largest
measured/predicted ratio seen in that family (never below 1).

Scheduling: in registration order, first fit: a conversion starts when fewer than `workers` run and its
prediction fits in the room beside those running; one that fits nowhere runs alone (it is never refused
for memory: the budget orders the work, it does not drop any). A family run by one warm child
(`serial_families`, `core.warm_children`: TFLite's modes share one TensorFlow start) has one conversion
running at a time, and the memory its idle warm children hold counts against the room (`held_bytes`).
Each outcome records its predicted and measured peak and whether it waited for memory;
`MemoryPlan.to_json()` is the record for the report.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tfship.core.child_memory import available_memory_bytes
from tfship.core.formats import DEFAULT_PEAK, MIB, PeakModel
from tfship.pipeline.conversion.registry import format_of


def peak_model(name: str) -> PeakModel:
    """The peak-memory model of the registered format `name` (`DEFAULT_PEAK` for a name not registered)."""
    spec = format_of(name)
    return spec.peak if spec is not None else DEFAULT_PEAK


def family(name: str) -> str:
    """The converter family of a format name (its package: `onnx`, `tflite`, `tfjs`), or the name itself."""
    spec = format_of(name)
    return spec.package if spec is not None else name


def own_rss_bytes() -> int:
    """This process's resident set size in bytes (0 when /proc cannot be read)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass(frozen=True)
class Budget:
    """The stage's memory budget in bytes and how it was chosen (`source`, for the report)."""

    bytes: int
    source: str


def memory_budget(settings) -> Budget:
    """`convert.memory_budget_bytes` when set, else `convert.memory_share` of MemAvailable (unknown: no limit)."""
    if settings.memory_budget_bytes:
        return Budget(settings.memory_budget_bytes, "convert.memory_budget_bytes")
    available = available_memory_bytes()
    if available is None:
        return Budget(0, "no limit: available memory unknown (no /proc/meminfo)")
    return Budget(int(settings.memory_share * available),
                  f"convert.memory_share {settings.memory_share:g} x {available / 2**30:.1f} GiB available")


@dataclass
class PlannedRow:
    """One conversion's line in the plan: predicted and measured peak (bytes), start/end seconds, waited."""

    name: str
    predicted_bytes: int
    measured_bytes: int = 0
    start_s: float = 0.0
    end_s: float = 0.0
    waited_for_memory: bool = False


@dataclass
class MemoryPlan:
    """The budget, the room for children, the weights it was predicted from, and one row per conversion."""

    budget: Budget
    parent_rss_bytes: int
    weight_bytes: int
    workers: int
    rows: list[PlannedRow] = field(default_factory=list)

    @property
    def room_bytes(self) -> int:
        """Bytes the converter children may use together (0: unlimited)."""
        return max(1, self.budget.bytes - self.parent_rss_bytes) if self.budget.bytes else 0

    def to_json(self) -> dict[str, Any]:
        """JSON-ready record (`convert_memory.json`)."""
        peak_together = _largest_overlap(self.rows)
        return {"budget_bytes": self.budget.bytes, "budget_source": self.budget.source,
                "parent_rss_bytes": self.parent_rss_bytes, "room_bytes": self.room_bytes,
                "weight_bytes": self.weight_bytes, "workers": self.workers,
                "children_peak_together_bytes": peak_together, "rows": [r.__dict__ for r in self.rows]}


def _largest_overlap(rows: Sequence[PlannedRow]) -> int:
    """Upper bound of the children's peak together: the largest sum of measured peaks of overlapping runs."""
    best = 0
    for row in rows:
        best = max(best, sum(o.measured_bytes for o in rows if o.start_s <= row.start_s < o.end_s or o is row))
    return best


class _Schedule:
    """The shared state of one `run_within_budget` call; every method but `work` runs under `condition`.

    `running` holds the indices started and not yet finished; `ratios` the largest measured/predicted peak
    ratio seen per converter family; `results` the outcomes by index (None until finished).
    """

    def __init__(self, names: Sequence[str], convert: Callable[[int], Any], plan: MemoryPlan,
                 peak_of: Callable[[Any], int], serial_families: Collection[str],
                 held_bytes: Callable[[], int]) -> None:
        self.names, self.convert, self.plan, self.peak_of = names, convert, plan, peak_of
        self.serial_families, self.held_bytes = serial_families, held_bytes
        self.ratios: dict[str, float] = {}
        self.results: list[Any] = [None] * len(names)
        self.running: set[int] = set()
        self.condition, self.started = threading.Condition(), time.monotonic()

    def predicted(self, i: int) -> int:
        """Conversion i's predicted peak bytes, scaled by its family's largest measured/predicted ratio."""
        return int(self.plan.rows[i].predicted_bytes * max(1.0, self.ratios.get(family(self.names[i]), 1.0)))

    def family_busy(self, i: int) -> bool:
        """Whether conversion i belongs to a serial family one of whose conversions runs now."""
        kind_family = family(self.names[i])
        return kind_family in self.serial_families and any(family(self.names[j]) == kind_family
                                                            for j in self.running)

    def fits(self, i: int) -> bool:
        """Whether conversion i may start now (first fit; alone it always fits)."""
        if self.family_busy(i):
            return False
        if not self.running:
            return True
        if len(self.running) >= self.plan.workers:
            return False
        together = sum(self.predicted(j) for j in self.running) + self.predicted(i) + self.held_bytes()
        return not self.plan.room_bytes or together <= self.plan.room_bytes

    def mark_waiting_for_memory(self, pending: Sequence[int]) -> None:
        """Flag the pending conversions that only memory holds back (a worker is free, their family idle)."""
        for i in pending:
            if len(self.running) < self.plan.workers and not self.family_busy(i):
                self.plan.rows[i].waited_for_memory = True

    def start(self, i: int) -> None:
        """Record conversion i as running: its prediction at start and its start second."""
        self.running.add(i)
        self.plan.rows[i].predicted_bytes = self.predicted(i)
        self.plan.rows[i].start_s = round(time.monotonic() - self.started, 2)

    def work(self, i: int) -> None:
        """Run conversion i (in a pool thread), then record its end, its measured peak and its family's ratio."""
        try:
            self.results[i] = self.convert(i)
        finally:
            with self.condition:
                row = self.plan.rows[i]
                row.end_s = round(time.monotonic() - self.started, 2)
                row.measured_bytes = self.peak_of(self.results[i]) if self.results[i] is not None else 0
                if row.measured_bytes:
                    kind_family = family(self.names[i])
                    self.ratios[kind_family] = max(self.ratios.get(kind_family, 0.0),
                                                   row.measured_bytes / row.predicted_bytes)
                self.running.discard(i)
                self.condition.notify_all()


def run_within_budget(names: Sequence[str], convert: Callable[[int], Any], plan: MemoryPlan,
                      peak_of: Callable[[Any], int], serial_families: Collection[str] = (),
                      held_bytes: Callable[[], int] = lambda: 0) -> list[Any]:
    """Run `convert(i)` for every index of `names` under the plan (see the module docstring).

    Args:
        names: artifact format names, in registration order.
        convert: runs conversion i and returns its outcome (never raises for a failed conversion).
        plan: the budget and weights; its rows are filled in here.
        peak_of: the measured peak bytes of an outcome (0 when unknown).
        serial_families: families whose conversions run one at a time (their warm child runs them in turn,
            `core.warm_children`); first fit skips such a conversion while one of its family runs.
        held_bytes: bytes held beside the running conversions (idle warm children), counted against the room.

    Returns:
        The outcomes in the order of `names`.
    """
    models = [peak_model(name) for name in names]
    plan.rows = [PlannedRow(name, m.predict(plan.weight_bytes)) for name, m in zip(names, models)]
    schedule = _Schedule(names, convert, plan, peak_of, serial_families, held_bytes)
    pending = list(range(len(names)))
    with ThreadPoolExecutor(max_workers=max(1, plan.workers)) as pool:
        futures = []
        with schedule.condition:
            while pending:
                ready = next((i for i in pending if schedule.fits(i)), None)
                if ready is None:
                    schedule.mark_waiting_for_memory(pending)
                    schedule.condition.wait()
                    continue
                pending.remove(ready)
                schedule.start(ready)
                futures.append(pool.submit(schedule.work, ready))
        for future in futures:
            future.result()
    return schedule.results


__all__ = ["DEFAULT_PEAK", "MIB", "Budget", "MemoryPlan", "PeakModel", "PlannedRow", "family", "memory_budget",
           "own_rss_bytes", "peak_model", "run_within_budget"]
