"""Convert stage: every enabled artifact kind (`pipeline.conversion.artifact_kinds`: ONNX, the TFLite modes), each
checked, none blocking the others.

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
from tfship.core.statuses import ConversionStatus
from tfship.pipeline.config import ConvertSection
from tfship.pipeline.conversion.artifact_kinds import tflite_filename
from tfship.pipeline.conversion.artifacts import Artifact, ConversionJob, VariantOutcome, artifact_kinds, enabled_kinds
from tfship.pipeline.conversion.large_models import saved_model_weight_bytes
from tfship.pipeline.conversion.memory_budget import MemoryPlan, memory_budget, own_rss_bytes, run_within_budget

__all__ = ["ConvertResult", "VariantOutcome", "convert_artifacts", "raise_if_required_missing", "tflite_filename"]


@dataclass(frozen=True)
class ConvertResult:
    """Artifacts produced (ready for the parity gate), every conversion's outcome, and the memory plan
    (`MemoryPlan.to_json()`: budget, predicted and measured peak per conversion; empty when none ran).
    """

    artifacts: tuple[Artifact, ...]
    outcomes: tuple[VariantOutcome, ...] = field(default_factory=tuple)
    memory: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> list[dict[str, Any]]:
        """Outcomes as JSON rows."""
        return [o.__dict__ for o in self.outcomes]


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
        for name in kind.files:
            remove_path(version_dir / name)
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
    outcomes = run_within_budget([kind.name for kind in kinds], lambda i: kinds[i].convert(job), plan,
                                 lambda outcome: outcome.peak_memory_bytes)
    outcomes = [replace(o, predicted_peak_bytes=row.predicted_bytes) for o, row in zip(outcomes, plan.rows)]
    artifacts = [kind.artifact(version_dir) for kind, outcome in zip(kinds, outcomes)
                 if outcome.status == ConversionStatus.PRODUCED]
    return ConvertResult(tuple(artifacts), tuple(outcomes), plan.to_json())


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
