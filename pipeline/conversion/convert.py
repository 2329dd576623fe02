"""Convert stage: ONNX (tf2onnx) and the TFLite variants, each checked, none blocking the others.

ONNX and TFLite float32 are required: if either cannot be produced the stage fails. The other
TFLite variants (float16, dynamic_range, int8) are produced when they can be; a refused or crashed
variant is reported with its reason and left out of the version.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core.contract import Signature
from core.errors import ConversionError, TfshipError
from pipeline.config import ConvertSection
from pipeline.conversion.large_models import tflite_refusal
from pipeline.conversion.onnx_convert import convert_to_onnx
from pipeline.gate.runners import Artifact
from signatures.recurrent import FUSED_LSTM_NOTE, TENSOR_LIST_FAILURE

REQUIRED_TFLITE_MODE = "float32"


def tflite_filename(mode: str) -> str:
    """`model.tflite` for float32 (the file servers pick by default), `model_<mode>.tflite` otherwise."""
    return "model.tflite" if mode == REQUIRED_TFLITE_MODE else f"model_{mode}.tflite"


@dataclass(frozen=True)
class VariantOutcome:
    """One conversion's outcome: status `produced`, `refused` or `crashed`, with the reason."""

    name: str
    status: str
    reason: str = ""
    path: str = ""
    size_bytes: int = 0
    seconds: float = 0.0
    reproduce_command: str = ""
    recipe: str = ""


@dataclass(frozen=True)
class ConvertResult:
    """Artifacts produced (ready for the parity gate) and every variant's outcome."""

    artifacts: tuple[Artifact, ...]
    outcomes: tuple[VariantOutcome, ...] = field(default_factory=tuple)

    def to_json(self) -> list[dict[str, Any]]:
        """Outcomes as JSON rows."""
        return [o.__dict__ for o in self.outcomes]


def conversion_workers(settings: ConvertSection, jobs: int) -> int:
    """Conversions run at once: `convert.max_workers`, 0 = the cores this process may use; at most `jobs`."""
    return max(1, min(jobs, settings.max_workers or len(os.sched_getaffinity(0))))


def convert_artifacts(version_dir: Path, contract: Signature, settings: ConvertSection,
                      calibration_inputs: dict[str, np.ndarray], sample: dict[str, np.ndarray],
                      tflite_sources: dict[str, Any] | None = None) -> ConvertResult:
    """Write `model.onnx` and the configured `model*.tflite` files next to the SavedModel.

    TFLite recipes (`signatures.recurrent`): each variant converts the SavedModel as exported (`default`);
    when the converter cannot lower a recurrent layer's TensorList ops and `tflite_sources["unrolled"]`
    names an unrolled copy's SavedModel, the variant is converted from that (`unrolled`). The recipe used,
    and every recipe tried with its error, are in the outcome (`recipe`, `reason`).

    Args:
        version_dir: folder holding the exported SavedModel; artifacts are written beside it.
        calibration_inputs: {input name: [N, ...]} drawn from the training split (int8's
            `representative_dataset`).
        sample: one real input batch used to run each artifact once before it counts.

    Raises:
        ConversionError: ONNX or TFLite float32 could not be produced (the others are only reported).
    """
    from tflite.convert import convert_tflite
    from tflite.modes import TfliteMode, TfliteOptions

    def onnx_variant() -> tuple[VariantOutcome, Artifact | None]:
        path = version_dir / "model.onnx"
        try:
            done = convert_to_onnx(version_dir, path, contract, settings.onnx_opset, sample, settings.timeout_seconds,
                                   settings.onnx_simplify, settings.size_limit_bytes)
        except TfshipError as err:
            return VariantOutcome("onnx", "refused", str(err)), None
        return (VariantOutcome("onnx", "produced", "", str(path), done.size_bytes, round(done.seconds, 2),
                               done.reproduce_command), Artifact("onnx", "onnx", "float32", path))

    def tflite_variant(mode: str) -> tuple[VariantOutcome, Artifact | None]:
        options = TfliteOptions(mode=TfliteMode(mode), representative_samples=settings.representative_samples,
                                allow_flex=settings.allow_flex)
        path = version_dir / tflite_filename(mode)
        refusal = tflite_refusal(version_dir, settings.size_limit_bytes)  # before any converter process starts
        if refusal:
            return VariantOutcome(f"tflite_{mode}", "refused", refusal), None
        done = convert_tflite(version_dir, path, options, calibration_inputs, settings.timeout_seconds)
        recipe, reason = "default", done.reason
        if done.status == "refused" and TENSOR_LIST_FAILURE in done.reason.lower():
            tried = [f"recipe 'default' (dynamic batch): {done.reason}"]
            unrolled = (tflite_sources or {}).get("unrolled")
            if unrolled:
                done = convert_tflite(Path(unrolled), path, options, calibration_inputs, settings.timeout_seconds)
                recipe = "unrolled"
                tried.append(f"recipe 'unrolled' (recurrent layers with unroll=True): {done.reason or 'produced'}")
            else:
                tried.append("recipe 'unrolled' not available: " + ((tflite_sources or {}).get("unrolled_reason")
                                                                     or "the model has no Keras recurrent layer"))
            tried.append(FUSED_LSTM_NOTE)
            reason = "" if done.status == "produced" else "; ".join(tried)
        outcome = VariantOutcome(f"tflite_{mode}", done.status, reason, str(done.path or ""), done.size_bytes,
                                 round(done.seconds, 2), done.reproduce_command, recipe)
        return outcome, (Artifact(f"tflite_{mode}", "tflite", mode, path) if done.status == "produced" else None)

    # Each conversion is its own child process: run them side by side, one per core.
    jobs = [onnx_variant] + [functools.partial(tflite_variant, mode) for mode in settings.tflite_modes]
    with ThreadPoolExecutor(max_workers=conversion_workers(settings, len(jobs))) as pool:
        finished = list(pool.map(lambda job: job(), jobs))
    outcomes = [outcome for outcome, _ in finished]
    artifacts = [artifact for _, artifact in finished if artifact is not None]
    produced = {o.name for o in outcomes if o.status == "produced"}
    missing = [name for name in ("onnx", f"tflite_{REQUIRED_TFLITE_MODE}") if name not in produced]
    if missing:
        reasons = "; ".join(f"{o.name}: {o.status}: {o.reason}" for o in outcomes if o.name in missing)
        raise ConversionError(f"convert: required artifacts not produced: {reasons}")
    return ConvertResult(tuple(artifacts), tuple(outcomes))
