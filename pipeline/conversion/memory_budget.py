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
    ratios: dict[str, float] = {}
    results: list[Any] = [None] * len(names)
    pending, running = list(range(len(names))), set()
    condition, started = threading.Condition(), time.monotonic()

    def predicted(i: int) -> int:
        return int(plan.rows[i].predicted_bytes * max(1.0, ratios.get(family(names[i]), 1.0)))

    def family_busy(i: int) -> bool:
        return family(names[i]) in serial_families and any(family(names[j]) == family(names[i]) for j in running)

    def fits(i: int) -> bool:
        if family_busy(i):
            return False
        if not running:
            return True
        if len(running) >= plan.workers:
            return False
        together = sum(predicted(j) for j in running) + predicted(i) + held_bytes()
        return not plan.room_bytes or together <= plan.room_bytes

    def work(i: int) -> None:
        try:
            results[i] = convert(i)
        finally:
            with condition:
                row = plan.rows[i]
                row.end_s = round(time.monotonic() - started, 2)
                row.measured_bytes = peak_of(results[i]) if results[i] is not None else 0
                if row.measured_bytes:
                    kind_family = family(names[i])
                    ratios[kind_family] = max(ratios.get(kind_family, 0.0), row.measured_bytes / row.predicted_bytes)
                running.discard(i)
                condition.notify_all()

    with ThreadPoolExecutor(max_workers=max(1, plan.workers)) as pool:
        futures = []
        with condition:
            while pending:
                ready = next((i for i in pending if fits(i)), None)
                if ready is None:
                    for i in pending:
                        if len(running) < plan.workers and not family_busy(i):
                            plan.rows[i].waited_for_memory = True
                    condition.wait()
                    continue
                pending.remove(ready)
                running.add(ready)
                plan.rows[ready].predicted_bytes = predicted(ready)
                plan.rows[ready].start_s = round(time.monotonic() - started, 2)
                futures.append(pool.submit(work, ready))
        for future in futures:
            future.result()
    return results



__all__ = ["DEFAULT_PEAK", "MIB", "Budget", "MemoryPlan", "PeakModel", "PlannedRow", "family", "memory_budget",
           "own_rss_bytes", "peak_model", "run_within_budget"]
