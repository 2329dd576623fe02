"""Validate stage: the parity gate between every artifact and the SavedModel.

Outputs are matched by name, never by position. Per mode (documented in the README):

* float32 (SavedModel, ONNX, TFLite float32): every element must satisfy
  |artifact - reference| <= atol * scale + rtol * |reference|, with scale = max(1, max |reference|)
  over that output (tolerances scaled to the output's range); integer outputs must be equal,
  except index outputs (`class_id`) where a differing index is accepted only when the reference
  scores at both indices are equal within the same tolerance (a tie);
* float16: the same rule with atol = rtol = `float16_tolerance` (1e-2);
* dynamic_range and int8: judged by the task metric (accuracy drop), max error reported.

Any artifact also fails on NaN/Inf outputs or an accuracy drop above its limit. Every artifact
is run at every configured batch size; a failure raises `ParityError` naming the artifact, the
worst output, its max error and the tolerance. Never a warning.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pipeline.config import ValidateSection
from pipeline.errors import ParityError
from pipeline.runners import Artifact, Runner, runner_for
from signatures.contract import SignatureContract

FLOAT_MODES = ("float32", "float16")
INDEX_SCORES = {"class_id": "logits"}  # index output -> the score output it is the argmax of


@dataclass(frozen=True)
class OutputParity:
    """One output of one artifact against the reference: max abs/rel error and the verdict."""

    output: str
    max_abs_error: float
    max_rel_error: float
    tolerance: str
    passed: bool
    detail: str = ""


@dataclass(frozen=True)
class ArtifactParity:
    """One artifact's verdict: accuracy (%), top-1 agreement with the reference (%), per-output rows."""

    artifact: str
    kind: str
    mode: str
    size_bytes: int
    accuracy: float
    top1_agreement: float
    latency_ms_batch1: float
    outputs: tuple[OutputParity, ...]
    batch_sizes: tuple[int, ...]
    passed: bool
    reason: str = ""


@dataclass(frozen=True)
class ParityReport:
    """Every artifact's parity against the SavedModel on the held-out test split."""

    reference_accuracy: float
    samples: int
    rows: tuple[ArtifactParity, ...]

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.rows)

    def to_json(self) -> dict[str, Any]:
        """JSON form for the manifest and report.json."""
        return {"passed": self.passed, "reference_accuracy": self.reference_accuracy, "samples": self.samples,
                "artifacts": [asdict(row) for row in self.rows]}


def run_batched(runner: Runner, inputs: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
    """Run `inputs` (all [N, ...]) through `runner` in chunks of `batch_size`; concatenate by name."""
    total = len(next(iter(inputs.values())))
    chunks: dict[str, list[np.ndarray]] = {}
    for start in range(0, total, batch_size):
        result = runner({name: value[start:start + batch_size] for name, value in inputs.items()})
        for name, value in result.items():
            chunks.setdefault(name, []).append(np.asarray(value))
    return {name: np.concatenate(parts, axis=0) for name, parts in chunks.items()}


def _tolerances(mode: str, settings: ValidateSection) -> tuple[float, float] | None:
    if mode == "float32":
        return settings.atol, settings.rtol
    if mode == "float16":
        return settings.float16_tolerance, settings.float16_tolerance
    return None


def compare_output(name: str, got: np.ndarray, want: np.ndarray, reference: dict[str, np.ndarray],
                   tolerance: tuple[float, float] | None) -> OutputParity:
    """Compare one named output with the reference's.

    Args:
        got, want: the artifact's and the reference's arrays for `name`, same shape [N, ...].
        reference: every reference output (for tie-aware index comparison).
        tolerance: (atol, rtol) for a hard gate, or None to only report the error.
    """
    if got.shape != want.shape:
        return OutputParity(name, float("inf"), float("inf"), "shape", False,
                            f"shape {list(got.shape)}, expected {list(want.shape)}")
    if np.issubdtype(want.dtype, np.floating):
        if not np.all(np.isfinite(got)):
            return OutputParity(name, float("nan"), float("nan"), "finite", False, "NaN or Inf in output")
        error = np.abs(got.astype(np.float64) - want.astype(np.float64))
        rel = float(np.max(error / np.maximum(np.abs(want), 1e-12))) if error.size else 0.0
        max_abs = float(error.max()) if error.size else 0.0
        if tolerance is None:
            return OutputParity(name, max_abs, rel, "reported (metric-gated)", True)
        atol, rtol = tolerance
        scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
        bad = error > atol * scale + rtol * np.abs(want)
        detail = f"{int(bad.sum())} of {bad.size} elements outside tolerance" if bad.any() else ""
        return OutputParity(name, max_abs, rel, f"atol {atol:g}*{scale:.3g} + rtol {rtol:g}", not bad.any(), detail)
    differ = got != want
    max_abs = float(np.max(np.abs(got.astype(np.int64) - want.astype(np.int64)))) if got.size else 0.0
    if tolerance is None:
        return OutputParity(name, max_abs, 0.0, "reported (metric-gated)", True,
                            f"{int(differ.sum())} of {differ.size} differ" if differ.any() else "")
    unexplained = int(differ.sum())
    score_name = INDEX_SCORES.get(name)
    if differ.any() and score_name in reference and want.ndim == 1:
        scores = reference[score_name]
        atol, rtol = tolerance
        rows = np.nonzero(differ)[0]
        at_got = scores[rows, got[rows]]
        at_want = scores[rows, want[rows]]
        ties = np.abs(at_got - at_want) <= atol * max(1.0, float(np.max(np.abs(scores)))) + rtol * np.abs(at_want)
        unexplained = int((~ties).sum())
    detail = f"{unexplained} of {differ.size} indices differ (ties excluded)" if unexplained else ""
    return OutputParity(name, max_abs, 0.0, "exact (tie-aware)" if score_name else "exact", unexplained == 0, detail)


def _worse(kept: OutputParity | None, new: OutputParity) -> OutputParity:
    """The worse of two rows for one output: a failure first, then the larger error."""
    if kept is None:
        return new
    return kept if (not kept.passed, kept.max_abs_error) >= (not new.passed, new.max_abs_error) else new


def _accuracy(outputs: dict[str, np.ndarray], labels: np.ndarray) -> float:
    predicted = outputs["class_id"] if "class_id" in outputs else np.argmax(outputs["logits"], axis=-1)
    return 100.0 * float(np.mean(predicted == labels))


def _latency_ms(runner: Runner, inputs: dict[str, np.ndarray], repeats: int = 20) -> float:
    single = {name: value[:1] for name, value in inputs.items()}
    runner(single)
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        runner(single)
        timings.append(time.perf_counter() - started)
    return 1000.0 * float(np.median(timings))


def check_artifact(artifact: Artifact, runner: Runner, inputs: dict[str, np.ndarray], labels: np.ndarray,
                   reference: dict[str, np.ndarray], reference_accuracy: float, contract: SignatureContract,
                   settings: ValidateSection) -> ArtifactParity:
    """Run one artifact at every configured batch size and judge it against the reference outputs."""
    tolerance = _tolerances(artifact.mode, settings)
    max_drop = (settings.max_accuracy_drop_points if artifact.mode in FLOAT_MODES
                else settings.quantized_max_accuracy_drop_points)
    rows: dict[str, OutputParity] = {}
    accuracy, agreement = 100.0, 100.0
    for batch_size in sorted(set(settings.batch_sizes)):
        outputs = run_batched(runner, inputs, batch_size)
        missing = [name for name in contract.output_names() if name not in outputs]
        if missing:
            return ArtifactParity(artifact.name, artifact.kind, artifact.mode, artifact.size_bytes(), 0.0, 0.0, 0.0,
                                  (), settings.batch_sizes, False,
                                  f"outputs {missing} missing; artifact returned {sorted(outputs)}")
        for name in contract.output_names():
            row = compare_output(name, outputs[name], reference[name], reference, tolerance)
            rows[name] = _worse(rows.get(name), row)
        accuracy = min(accuracy, _accuracy(outputs, labels))
        agreement = min(agreement, 100.0 * float(np.mean(outputs["class_id"] == reference["class_id"])))
    reasons = [f"output '{r.output}' max error {r.max_abs_error:.3g} outside {r.tolerance}"
               + (f" ({r.detail})" if r.detail else "") for r in rows.values() if not r.passed]
    if reference_accuracy - accuracy > max_drop:
        reasons.append(f"accuracy {accuracy:.2f}% is {reference_accuracy - accuracy:.2f} points below the "
                       f"SavedModel's {reference_accuracy:.2f}% (allowed {max_drop:g})")
    return ArtifactParity(artifact.name, artifact.kind, artifact.mode, artifact.size_bytes(), accuracy, agreement,
                          _latency_ms(runner, inputs), tuple(rows[n] for n in contract.output_names()),
                          tuple(sorted(set(settings.batch_sizes))), not reasons, "; ".join(reasons))


def validate_artifacts(reference: Artifact, candidates: list[Artifact], contract: SignatureContract,
                       inputs: dict[str, np.ndarray], labels: np.ndarray, settings: ValidateSection) -> ParityReport:
    """Judge every candidate artifact (and the reference itself, at every batch size) on held-out data.

    Args:
        reference: the SavedModel artifact.
        candidates: ONNX and TFLite artifacts.
        inputs: {input name: [N, ...]} held-out test inputs; labels: int64 [N].

    Returns:
        The report (call `raise_if_failed` to gate on it).
    """
    reference_runner = runner_for(reference)
    reference_outputs = run_batched(reference_runner, inputs, max(settings.batch_sizes))
    reference_accuracy = _accuracy(reference_outputs, labels)
    rows = [check_artifact(reference, reference_runner, inputs, labels, reference_outputs, reference_accuracy,
                           contract, settings)]
    for artifact in candidates:
        try:
            runner = runner_for(artifact)
        except Exception as err:  # noqa: BLE001 - any loader failure is that artifact's verdict
            rows.append(ArtifactParity(artifact.name, artifact.kind, artifact.mode, artifact.size_bytes(), 0.0, 0.0,
                                       0.0, (), settings.batch_sizes, False, f"could not load: {err}"))
            continue
        rows.append(check_artifact(artifact, runner, inputs, labels, reference_outputs, reference_accuracy, contract,
                                   settings))
    return ParityReport(reference_accuracy, int(labels.shape[0]), tuple(rows))


def raise_if_failed(report: ParityReport) -> ParityReport:
    """Return the report when every artifact passed.

    Raises:
        ParityError: naming each failing artifact, its worst output, max error and tolerance.
    """
    failed = [row for row in report.rows if not row.passed]
    if failed:
        raise ParityError("parity gate failed: " + " | ".join(f"{row.artifact} ({row.mode}): {row.reason}"
                                                              for row in failed))
    return report
