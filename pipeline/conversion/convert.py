"""Convert stage: every enabled artifact format (`pipeline.conversion.registry`: ONNX, the TFLite and TF.js modes),
each checked, none blocking the others.

Each conversion is an outcome of its own (`produced`, `refused` or `crashed`, with the reason). Only
the kinds listed in `convert.required` stop the run when they are not produced; every other kind that
is not produced is left out of the version with its reason (the SavedModel is always required).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tfship.core.contract import Signature
from tfship.core.errors import ConversionError
from tfship.core.saved_model import saved_model_weight_bytes
from tfship.core.warm_children import warm_children
from tfship.pipeline.config import ConvertSection
from tfship.pipeline.conversion.artifacts import (
    ConversionJob,
    ConversionStatus,
    VariantOutcome,
    artifact_kinds,
    enabled_kinds,
)
from tfship.pipeline.conversion.memory_budget import MemoryPlan, memory_budget, own_rss_bytes, run_within_budget

__all__ = ["ConvertResult", "VariantOutcome", "convert_artifacts", "raise_if_required_missing"]


@dataclass(frozen=True)
class ConvertResult:
    """The convert stage's record: every conversion's outcome, and the memory plan (`MemoryPlan.to_json()`:
    budget, predicted and measured peak per conversion; empty when none ran, None when not recorded).

    `to_json` is `convert.json` (one row per conversion); the memory plan is `convert_memory.json`.
    """

    outcomes: tuple[VariantOutcome, ...] = field(default_factory=tuple)
    memory: dict[str, Any] | None = field(default_factory=dict)

    @property
    def produced(self) -> tuple[str, ...]:
        """Names of the kinds whose file was produced (ready for the parity gate), in conversion order."""
        return tuple(o.name for o in self.outcomes if o.status == ConversionStatus.PRODUCED)

    def to_json(self) -> list[dict[str, Any]]:
        """Outcomes as JSON rows (`convert.json`)."""
        return [dict(o.__dict__) for o in self.outcomes]

    @classmethod
    def from_json(cls, rows: list[dict[str, Any]], memory: dict[str, Any] | None = None) -> ConvertResult:
        """Inverse of `to_json` (and the memory plan, when recorded).

        Raises:
            TypeError, KeyError: a row is not a `VariantOutcome`.
        """
        return cls(tuple(VariantOutcome(**_outcome_fields(row)) for row in rows), memory)


def _outcome_fields(row: dict[str, Any]) -> dict[str, Any]:
    """A `convert.json` row as `VariantOutcome` keyword arguments (its warnings a tuple again)."""
    return row | {"warnings": tuple(row.get("warnings", ()))}


def remove_path(path: Path) -> None:
    """Delete a file or a folder artifact (TF.js) if it exists."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def remove_stale_artifacts(version_dir: Path) -> None:
    """Delete every registered kind's file (and temp files of a killed conversion) before converting again,
    so nothing from an earlier conversion can pass for this one's.
    """
    for kind in artifact_kinds().values():
        for name in kind.files:  # names or glob patterns (`model.*.onnx`)
            for path in version_dir.glob(name):
                remove_path(path)
    for leftover in version_dir.glob(".*"):  # a killed conversion's temp files and folders (TF.js)
        remove_path(leftover)


def conversion_workers(settings: ConvertSection, jobs: int) -> int:
    """Conversions run at once: `convert.max_workers`, 0 = the cores this process may use; at most `jobs`."""
    return max(1, min(jobs, settings.max_workers or len(os.sched_getaffinity(0))))


def convert_artifacts(version_dir: Path, contract: Signature, settings: ConvertSection,
                      calibration_inputs: dict[str, np.ndarray], sample: dict[str, np.ndarray],
                      tflite_sources: dict[str, Any] | None = None) -> ConvertResult:
    """Write every enabled kind's file next to the SavedModel (conversions run side by side, at most
    `convert.max_workers` at once and only while their predicted peak memory fits the stage's budget,
    `pipeline.conversion.memory_budget`).

    TFLite recipes (`signatures.recurrent`): each variant converts the SavedModel as exported (`default`);
    when the converter cannot lower a recurrent layer's TensorList ops and `tflite_sources["unrolled"]`
    names an unrolled copy's SavedModel, the variant is converted from that (`unrolled`). The recipe used,
    and every recipe tried with its error, are in the outcome (`recipe`, `reason`).

    Args:
        version_dir: folder holding the exported SavedModel; artifacts are written beside it.
        calibration_inputs: {input name: [N, ...]} drawn from the training split (int8's
            `representative_dataset`).
        sample: one real input batch used to run each artifact once before it counts.

    Returns:
        Every outcome; never raises for a conversion that fails (see `raise_if_required_missing`).
    """
    remove_stale_artifacts(version_dir)
    job = ConversionJob(version_dir, contract, settings, calibration_inputs, sample, dict(tflite_sources or {}))
    kinds = enabled_kinds(settings)
    plan = MemoryPlan(memory_budget(settings), own_rss_bytes(), saved_model_weight_bytes(version_dir),
                      conversion_workers(settings, len(kinds)))
    # A package whose formats share one warm child (TFLite's modes: one TensorFlow start) converts one at a time.
    serial = {kind.package for kind in kinds if kind.warm_child}
    with warm_children() as warm:
        outcomes = run_within_budget([kind.name for kind in kinds], lambda i: kinds[i].convert(job), plan,
                                     lambda outcome: outcome.peak_memory_bytes, serial, warm.idle_rss_bytes)
    outcomes = [replace(o, predicted_peak_bytes=row.predicted_bytes) for o, row in zip(outcomes, plan.rows)]
    return ConvertResult(tuple(outcomes), plan.to_json())


def raise_if_required_missing(result: ConvertResult, required: tuple[str, ...]) -> ConvertResult:
    """Return `result` when every kind in `required` (`convert.required`) was produced.

    Raises:
        ConversionError: naming each required kind that was not produced, its status and reason.
    """
    missing = [o for o in result.outcomes if o.status != ConversionStatus.PRODUCED and o.name in required]
    if missing:
        reasons = "; ".join(f"{o.name}: {o.status}: {o.reason}" for o in missing)
        raise ConversionError(f"convert: required artifacts not produced (convert.required): {reasons}")
    return result
