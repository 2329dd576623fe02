"""Validate stage: the parity gate between every artifact and the SavedModel, for any contract.

Outputs are matched by name, never by position, and judged by the one comparison
(`pipeline.gate.compare.compare_outputs`) with its tolerance family's table (`tolerance_for`), scaled to each
output's range (scale = max(1, max |SavedModel output|)), plus `validate.noise_multiplier` times the largest
difference the SavedModel shows against itself on that output (`reference_noise`: between the configured batch
sizes and across two identical calls), so the SavedModel's own noise never fails anything:

| family (`core.formats.ToleranceFamily`) | bound on every element of every float output |
|---|---|
| float32 (SavedModel, ONNX, TFLite float32) | `validate.float32.atol` * scale + `validate.float32.rtol` * |ref| |
| float16 | `validate.float16.atol` * scale + `validate.float16.rtol` * |ref| |
| dynamic_range | `validate.dynamic_range.atol` * scale |
| int8 | `validate.int8.atol` * scale |

The numbers are `pipeline.config_validate.FAMILY_DEFAULTS`, tabled in docs/pipeline.md (checked by a test). At most
`validate.<family>.outlier_fraction` of an output's elements may lie beyond the bound (quantized families).
A float [N, C] output whose bound is vacuous is judged by its decision too (top-1 agreement at least
`validate.<family>.min_top1_agreement`; too flat to judge beyond `validate.max_tie_share` ties).

Integer outputs are equal (index outputs judged by the values they select), strings equal; an output pinned at a
quantization limit the reference goes beyond is `saturated` and fails. Then the task metric
(`pipeline.gate.task_metric`): accuracy (AUC for a binary output, `pipeline.gate.auc_drop`) may drop at most
`validate.<family>.max_accuracy_drop_points`, decided with
confidence (`pipeline.gate.task_judgement`), or, regression, MAE and RMSE rise by at most
`regression_max_error_increase` label std (paired confidence bounds) and the 99th percentile of the per-row error
stays within a share of the SavedModel's own MAE (`pipeline.gate.regression_judgement`). For
classification, a row whose predicted class differs from the SavedModel's (a flip) is a *tie* when the
SavedModel's margin between the two classes is within twice the artifact's measured error bound on that score
output (the 99th percentile of |artifact - SavedModel|): ties are reported (`flips`, `tie_flips`) and do not count
as regressions, so one near-tie row of a 70-row set (1.43 points) does not decide the verdict; ties excusing more
than `validate.max_tie_share` of the rows make the scores too flat to judge (a failure). NaN/Inf or a missing
output fails.

Every artifact runs at every configured batch size, through the serving runtime that serves it
(`pipeline.conversion.artifacts.open_runner`). An artifact that fails is left out of the version with its reason; the
stage fails (`ParityError`) only when the SavedModel itself or an artifact in `convert.required` fails.
Per-output error histograms (counts in `ERROR_BIN_EDGES`) go to the report.
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict

import numpy as np

from tfship.core.contract import Signature
from tfship.core.errors import ParityError
from tfship.core.formats import ToleranceFamily
from tfship.pipeline.config import ValidateSection
from tfship.pipeline.conversion.artifacts import SAVED_MODEL, Artifact, Runner, open_runner
from tfship.pipeline.gate.compare import OutputParity, Tolerance, compare_outputs
from tfship.pipeline.gate.float64 import float64_outputs
from tfship.pipeline.gate.golden_size import golden_set
from tfship.pipeline.gate.noise import (
    ImplementationNoise,
    ReferenceNoise,
    implementation_noise,
    noise_hint,
    reference_noise,
    truth_errors,
)
from tfship.pipeline.gate.parity_report import ArtifactParity, ParityReport
from tfship.pipeline.gate.task_judgement import TIE_ERROR_QUANTILE, TaskJudgement, score_output, tie_flips
from tfship.pipeline.gate.task_judgement import max_loss as _max_loss
from tfship.pipeline.gate.task_metric import TaskMetric, index_scores, infer_task

__all__ = ["ArtifactParity", "ImplementationNoise", "ParityReport", "ReferenceNoise", "check_artifact", "noise_hint",
           "raise_if_failed", "reference_noise", "run_batched", "score_output", "tie_flips", "tolerance_for",
           "validate_artifacts", "TIE_ERROR_QUANTILE"]



def run_batched(runner: Runner, inputs: dict[str, np.ndarray], batch_size: int) -> dict[str, np.ndarray]:
    """Run `inputs` (all [N, ...]) through `runner` in chunks of `batch_size`; concatenate by name."""
    total = len(next(iter(inputs.values())))
    chunks: dict[str, list[np.ndarray]] = {}
    for start in range(0, total, batch_size):
        result = runner({name: value[start:start + batch_size] for name, value in inputs.items()})
        for name, value in result.items():
            chunks.setdefault(name, []).append(np.asarray(value))
    return {name: np.concatenate(parts, axis=0) for name, parts in chunks.items()}


def tolerance_for(mode: str, settings: ValidateSection) -> Tolerance:
    """The bound an artifact of tolerance family `mode` is held to: its `[validate.<family>]` table (module
    docstring), the shared reference-noise multiplier, and, for the float32 family (a second float32
    implementation), the implementation-noise multiplier; integer outputs of the other families may differ on
    100 % minus the family's top-1 floor of the rows.

    Raises:
        ValueError: `mode` is no tolerance family.
    """
    family = ToleranceFamily(mode)
    table, key = settings.family(family), f"validate.{family.value}"
    exact = family is ToleranceFamily.FLOAT32
    return Tolerance(table.atol, table.rtol, table.outlier_fraction, settings.noise_multiplier, family.value,
                     f"{key}.atol", table.min_top1_agreement, settings.max_tie_share,
                     settings.implementation_noise_multiplier if exact else 0.0,
                     None if exact else (100.0 - table.min_top1_agreement) / 100.0, settings.confidence)


def _worse(kept: OutputParity | None, new: OutputParity) -> OutputParity:
    """The worse of two rows for one output: a failure first, then the larger error."""
    if kept is None:
        return new
    return kept if (not kept.passed, kept.max_abs_error) >= (not new.passed, new.max_abs_error) else new


def _latency_ms(runner: Runner, inputs: dict[str, np.ndarray], repeats: int = 20) -> float:
    single = {name: value[:1] for name, value in inputs.items()}
    runner(single)
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        runner(single)
        timings.append(time.perf_counter() - started)
    return 1000.0 * float(np.median(timings))


def check_artifact(artifact: Artifact, runner: Runner, inputs: dict[str, np.ndarray], task: TaskMetric,
                   reference: dict[str, np.ndarray], reference_metric: float, contract: Signature,
                   settings: ValidateSection, noise: dict[str, ReferenceNoise] | None = None,
                   outputs_by_batch: dict[int, dict[str, np.ndarray]] | None = None,
                   implementation: dict[str, ImplementationNoise] | None = None,
                   truth: dict[str, np.ndarray] | None = None, is_reference: bool = False) -> ArtifactParity:
    """Run one artifact at every configured batch size and judge it against the reference outputs.

    Args:
        inputs: {input name: [N, ...]}; task: the metric (`task_metric.infer_task`); reference: the
            SavedModel's outputs on `inputs`; reference_metric: `task.score(reference)`.
        noise: the SavedModel's own noise per float output (`reference_noise`), allowed on top of each bound.
        outputs_by_batch: the artifact's outputs already computed per batch size (the SavedModel's own).
        implementation: the SavedModel's own float32 rounding error per float output (`implementation_noise`),
            allowed `validate.implementation_noise_multiplier` times on float32 artifacts; truth: the
            SavedModel's graph in float64 on `inputs` (`float64_errors` of the row), None: not measured.
        is_reference: `artifact` is the SavedModel itself: its value bounds and noise are checked, but no task
            decision is taken on it (it is what the others are judged against); the row is marked `reference`.
    """
    tolerance = tolerance_for(artifact.mode, settings)
    noise, implementation = noise or {}, implementation or {}
    scores = index_scores(reference)
    score_name = score_output(task, reference, scores)
    wanted = {name: reference[name] for name in contract.output_names()}
    rows: dict[str, OutputParity] = {}
    worst, errors = TaskJudgement(), None
    floor = settings.family(artifact.mode).min_top1_agreement
    allowed = (_max_loss(artifact, task, settings) / 100.0, (100.0 - floor) / 100.0)
    total = len(next(iter(inputs.values())))
    for batch_size in sorted({min(size, total) for size in settings.batch_sizes}):
        outputs = (outputs_by_batch or {}).get(batch_size) or run_batched(runner, inputs, batch_size)
        for row in compare_outputs(outputs, wanted, tolerance, scores, {n: v.max_abs for n, v in noise.items()},
                                   (score_name,) if score_name else (),
                                   {n: v.max_abs for n, v in implementation.items()}):
            rows[row.output] = _worse(rows.get(row.output), row)
        if truth is not None and batch_size == max(min(size, total) for size in settings.batch_sizes):
            errors = truth_errors(outputs, truth)
        if task.prediction not in outputs or (np.asarray(outputs[task.prediction]).dtype.kind == "f" and not np.all(
                np.isfinite(np.asarray(outputs[task.prediction], dtype=np.float64)))):
            continue  # already a failure of that output; the metric would be meaningless
        worst.score(task, outputs, reference, score_name, reference_metric, allowed, settings.confidence, settings)
    reasons = [row.describe() + (f"; {noise_hint(noise.get(row.output), tolerance, implementation.get(row.output))}"
                                 if "outside tolerance" in row.detail else "")
               for row in rows.values() if not row.passed]
    limit = _max_loss(artifact, task, settings)
    flat = any("too flat to judge" in row.detail for row in rows.values())
    if not flat and worst.ties is not None and worst.ties > settings.max_tie_share * total:
        reasons.append(f"too flat to judge: {worst.ties} of {total} rows change class within the artifact's error "
                       f"(ties, {100 * worst.ties / total:.1f} % of rows; at most {100 * settings.max_tie_share:g} % "
                       f"may be excused, validate.max_tie_share): output '{task.prediction}' does not separate "
                       "these rows well enough to tell a tie from a regression")
    if is_reference:  # judged against itself: nothing to decide, and no "undecided" either
        worst.drop = worst.flips_decision = None
        worst.flips = worst.ties = None
    else:
        reasons += worst.reasons(task, reference_metric, limit, settings.undecided)
    latency = _latency_ms(runner, inputs) if not any(np.isinf(r.max_abs_error) for r in rows.values()) else 0.0
    return ArtifactParity(artifact.name, artifact.kind, artifact.mode, artifact.size_bytes(), worst.metric,
                          worst.agreement, latency, tuple(rows[n] for n in contract.output_names()),
                          tuple(sorted(set(settings.batch_sizes))), not reasons, "; ".join(reasons),
                          worst.tie_metric, worst.flips, worst.ties, worst.bound, errors,
                          asdict(worst.drop) if worst.drop and not task.auc else None,
                          asdict(worst.flips_decision) if worst.flips_decision else None,
                          "" if is_reference else worst.undecided_notes(task),
                          asdict(worst.drop) if worst.drop and task.auc else None,
                          worst.regression.to_json() if worst.regression else None, is_reference)


def _not_loaded(artifact: Artifact, settings: ValidateSection, err: Exception) -> ArtifactParity:
    return ArtifactParity(artifact.name, artifact.kind, artifact.mode, artifact.size_bytes(), float("nan"), None, 0.0,
                          (), settings.batch_sizes, False, f"could not load: {type(err).__name__}: {err}")


def validate_artifacts(reference: Artifact, candidates: list[Artifact], contract: Signature,
                       inputs: dict[str, np.ndarray], labels: np.ndarray | None,
                       settings: ValidateSection, required: tuple[str, ...] = ()) -> ParityReport:
    """Judge every candidate artifact (and the reference itself, at every batch size) on held-out data.

    Args:
        reference: the SavedModel artifact.
        candidates: converted artifacts (ONNX, TFLite, ...).
        inputs: {input name: [N, ...]} held-out inputs (the contract's dtypes).
        labels: [N] integer classes, [N, ...] float targets, or None (the SavedModel's predictions
            become the labels); the task and scored output follow `settings.task` and
            `settings.prediction_output` (`task_metric.infer_task`).
        required: artifacts whose failure fails the gate (`convert.required`).

    Returns:
        The report (call `raise_if_failed` to gate on it).

    Raises:
        ParityError: no output of the contract fits the task metric.
    """
    reference_runner = open_runner(reference)
    total = len(next(iter(inputs.values())))
    by_batch = {size: run_batched(reference_runner, inputs, size)
                for size in sorted({min(size, total) for size in settings.batch_sizes})}
    largest = max(by_batch)
    reference_outputs = by_batch[largest]
    noise = reference_noise(by_batch, run_batched(reference_runner, inputs, largest))
    truth, why_not = float64_outputs(reference.path, inputs, largest)
    implementation = implementation_noise(reference_outputs, truth, why_not)
    task = infer_task(reference_outputs, labels, settings.task, settings.prediction_output, settings.binary_threshold)
    reference_metric = task.score(reference_outputs)
    rows = [check_artifact(reference, reference_runner, inputs, task, reference_outputs, reference_metric,
                           contract, settings, noise, by_batch, implementation, truth, is_reference=True)]
    del reference_runner  # one model's weights in memory at a time (bench/results/pipeline-latest.md)
    for artifact in candidates:
        gc.collect()  # the previous runner (and TensorFlow's cycles) before the next one loads
        try:
            runner = open_runner(artifact)
        except Exception as err:  # noqa: BLE001 - any loader failure is that artifact's verdict
            rows.append(_not_loaded(artifact, settings, err))
            continue
        rows.append(check_artifact(artifact, runner, inputs, task, reference_outputs, reference_metric, contract,
                                   settings, noise, None, implementation, truth))
        del runner
    return ParityReport(reference_metric, total, tuple(rows), task.name, task.prediction, task.label_source,
                        tuple(required), noise, implementation_noise=implementation,
                        golden_set=golden_set(total, {row.mode for row in rows}, task, settings))


def raise_if_failed(report: ParityReport) -> ParityReport:
    """Return the report when the SavedModel and every required artifact passed (others may be left out).

    Raises:
        ParityError: naming each failing required artifact, its worst output, max error and tolerance.
    """
    failed = [row for row in report.rows if not row.passed
              and (row.artifact == SAVED_MODEL or row.artifact in report.required)]
    if failed:
        raise ParityError("parity gate failed: " + " | ".join(
            f"{row.artifact} ({row.mode}, {row.size_bytes} bytes): {row.reason}" for row in failed))
    return report
