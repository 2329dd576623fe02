"""Validate stage: the parity gate between every artifact and the SavedModel, for any contract.

Outputs are matched by name, never by position, and judged by the one comparison
(`pipeline.gate.compare.compare_outputs`) with the artifact's mode's tolerance (`tolerance_for`), scaled to each
output's range (scale = max(1, max |SavedModel output|)), plus `validate.noise_multiplier` times the largest
difference the SavedModel shows against itself on that output (`reference_noise`: between the configured batch
sizes and across two identical calls), so the SavedModel's own noise never fails anything:

| mode | bound on every element of every float output |
|---|---|
| float32 (SavedModel, ONNX, TFLite float32) | `validate.atol` * scale + `validate.rtol` * |ref| |
| float16 | `validate.float16_tolerance` (as atol and rtol) |
| dynamic_range | `validate.dynamic_range_tolerance` * scale |
| int8 | `validate.int8_tolerance` * scale |

The numbers are `pipeline.config.ValidateSection`'s defaults, tabled in docs/pipeline.md (checked by a test).
Quantized modes: at most `validate.quantized_outlier_fraction` of an output's elements may lie beyond the bound.
A float [N, C] output whose bound is vacuous is judged by its decision too (top-1 agreement at least
`validate.min_top1_agreement[mode]`; too flat to judge beyond `validate.max_tie_share` ties).

Integer outputs are equal (index outputs judged by the values they select), strings equal; an output pinned at a
quantization limit the reference goes beyond is `saturated` and fails. Then the task metric
(`pipeline.gate.task_metric`): accuracy may drop at most `max_accuracy_drop_points` (float modes) or
`quantized_max_accuracy_drop_points` (quantized), or MAE rise by `regression_max_error_increase` label std. For
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
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from tfship.core.contract import Signature
from tfship.core.errors import ParityError
from tfship.pipeline.config import ValidateSection
from tfship.pipeline.conversion.artifacts import FLOAT_MODES, SAVED_MODEL, Artifact, Runner, open_runner
from tfship.pipeline.gate.compare import ERROR_BIN_EDGES, OutputParity, Tolerance, compare_outputs
from tfship.pipeline.gate.task_metric import TaskMetric, index_scores, infer_task

TIE_ERROR_QUANTILE = 0.99


@dataclass(frozen=True)
class ArtifactParity:
    """One artifact's verdict.

    metric: the task metric measured (worst over batch sizes); tie_adjusted_metric: the same with tie
    flips counted as agreeing with the SavedModel (what the verdict uses); top1_agreement: % of rows whose
    predicted class equals the SavedModel's (None for regression); flips / tie_flips: rows whose class
    differs, and how many of them are ties; error_bound: the measured error bound used for ties;
    latency_ms_batch1: median ms per call at batch 1; outputs: per-output rows.
    """

    artifact: str
    kind: str
    mode: str
    size_bytes: int
    metric: float
    top1_agreement: float | None
    latency_ms_batch1: float
    outputs: tuple[OutputParity, ...]
    batch_sizes: tuple[int, ...]
    passed: bool
    reason: str = ""
    tie_adjusted_metric: float | None = None
    flips: int | None = None
    tie_flips: int | None = None
    error_bound: float | None = None


@dataclass(frozen=True)
class ParityReport:
    """Every artifact's parity against the SavedModel on held-out data.

    metric: `accuracy_%` or `mae`; metric_output: the output scored; label_source: `labels` or
    `reference` (no labels given: the SavedModel's predictions are the labels); required: artifacts whose
    failure fails the stage (`convert.required`; the SavedModel always); noise: the SavedModel's own
    largest difference per float output (`reference_noise`), allowed on top of every bound; signatures:
    {artifact: {signature: {passed, reason, ...}}} for the signatures besides `serving_default`
    (`with_other_signatures`); signature_noise: {signature: {float output: the SavedModel's own noise on it}}.

    `to_json` is the validate stage's record (`parity.json`); `from_json` reads it back.
    """

    reference_metric: float
    samples: int
    rows: tuple[ArtifactParity, ...]
    metric: str = "accuracy_%"
    metric_output: str = ""
    label_source: str = "labels"
    required: tuple[str, ...] = ()
    noise: dict[str, ReferenceNoise] = field(default_factory=dict)
    signatures: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    signature_noise: dict[str, dict[str, ReferenceNoise]] = field(default_factory=dict)

    def row(self, artifact: str) -> ArtifactParity | None:
        """The row of `artifact`, or None when the gate did not check it."""
        return next((row for row in self.rows if row.artifact == artifact), None)

    def with_other_signatures(self, verdicts: dict[str, dict[str, dict[str, Any]]],
                              noise: dict[str, dict[str, ReferenceNoise]] | None = None) -> ParityReport:
        """This report with the other signatures' verdicts and the SavedModel's own noise on each
        (`pipeline.gate.signatures.validate_other_signatures`): an artifact whose other signature missed fails
        its row (the reason names each signature), so it is left out, and the gate fails when that artifact is
        required. A signature file of its own that missed was set aside (`set_aside`): the rest of its
        artifact stays.
        """
        rows = []
        for row in self.rows:
            missed = [f"signature '{name}': {v['reason']}" for name, v in verdicts.get(row.artifact, {}).items()
                      if not v["passed"] and not v.get("set_aside")]
            rows.append(replace(row, passed=False, reason="; ".join(missed)) if missed and row.passed else row)
        return replace(self, rows=tuple(rows), signatures=verdicts, signature_noise=dict(noise or {}))

    @property
    def passed(self) -> bool:
        """The gate's verdict: the SavedModel and every required artifact passed."""
        return all(row.passed for row in self.rows if row.artifact == SAVED_MODEL or row.artifact in self.required)

    @property
    def left_out(self) -> dict[str, str]:
        """{artifact: reason} for every optional artifact that failed (left out of the version)."""
        return {row.artifact: row.reason for row in self.rows if not row.passed}

    @property
    def reference_accuracy(self) -> float | None:
        """The SavedModel's accuracy (%) for classification, else None."""
        return self.reference_metric if self.metric == "accuracy_%" else None

    def to_json(self) -> dict[str, Any]:
        """JSON form for the manifest and report.json (`error_bin_edges` are the histogram bins)."""
        return {"passed": self.passed, "left_out": self.left_out, "required": list(self.required),
                "metric": self.metric, "metric_output": self.metric_output,
                "label_source": self.label_source, "reference_metric": self.reference_metric,
                "reference_accuracy": self.reference_accuracy, "samples": self.samples,
                "resolution": 100.0 / self.samples if self.metric == "accuracy_%" and self.samples else None,
                "error_bin_edges": [e if e != float("inf") else None for e in ERROR_BIN_EDGES],
                "reference_noise": {name: asdict(value) for name, value in self.noise.items()},
                "artifacts": [asdict(row) for row in self.rows], "signatures": self.signatures,
                "signature_noise": {name: {output: asdict(value) for output, value in outputs.items()}
                                    for name, outputs in self.signature_noise.items()}}

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> ParityReport:
        """Inverse of `to_json` (`parity.json`).

        Raises:
            KeyError, TypeError: `payload` is not a parity record.
        """
        rows = tuple(replace(ArtifactParity(**row), batch_sizes=tuple(row["batch_sizes"]), outputs=tuple(
            OutputParity(**(output | {"error_histogram": tuple(output.get("error_histogram", ()))}))
            for output in row["outputs"])) for row in payload["artifacts"])
        noise = {name: ReferenceNoise(value["max_abs"], tuple(value["batch_sizes"]))
                 for name, value in payload.get("reference_noise", {}).items()}
        signature_noise = {name: {output: ReferenceNoise(value["max_abs"], tuple(value["batch_sizes"]))
                                  for output, value in outputs.items()}
                           for name, outputs in payload.get("signature_noise", {}).items()}
        return cls(payload["reference_metric"], payload["samples"], rows, payload["metric"], payload["metric_output"],
                   payload["label_source"], tuple(payload["required"]), noise, payload.get("signatures", {}),
                   signature_noise)


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
    """The bound an artifact of `mode` is held to (table in the module docstring), with the setting that
    loosens it, the reference-noise multiplier and the mode's top-1 floor for vacuously bounded outputs.
    """
    common = {"noise_multiplier": settings.noise_multiplier, "mode": mode, "max_tie_share": settings.max_tie_share,
              "min_top1_agreement": settings.min_top1_agreement.get(mode)}
    if mode == "float16":
        return Tolerance(settings.float16_tolerance, settings.float16_tolerance,
                         setting="validate.float16_tolerance", **common)
    if mode == "dynamic_range":
        return Tolerance(settings.dynamic_range_tolerance, 0.0, settings.quantized_outlier_fraction,
                         setting="validate.dynamic_range_tolerance", **common)
    if mode == "int8":
        return Tolerance(settings.int8_tolerance, 0.0, settings.quantized_outlier_fraction,
                         setting="validate.int8_tolerance", **common)
    return Tolerance(settings.atol, settings.rtol, setting="validate.atol", **common)


@dataclass(frozen=True)
class ReferenceNoise:
    """The largest difference the SavedModel shows against itself on one float output.

    max_abs: largest |SavedModel at batch a - SavedModel at batch b| over the configured batch sizes and a
    repeated call at the largest one (the output's unit); batch_sizes: the pair (a, b) where it was largest
    (equal sizes: two identical calls).
    """

    max_abs: float
    batch_sizes: tuple[int, int]

    def describe(self) -> str:
        """e.g. `the SavedModel itself differs by up to 1.5e-05 between batch 1 and batch 40`."""
        a, b = self.batch_sizes
        where = f"between batch {a} and batch {b}" if a != b else f"between two identical calls at batch {a}"
        return f"the SavedModel itself differs by up to {self.max_abs:.2g} {where}"


def reference_noise(by_batch: dict[int, dict[str, np.ndarray]],
                    repeat: dict[str, np.ndarray] | None = None) -> dict[str, ReferenceNoise]:
    """{float output: `ReferenceNoise`} from the SavedModel's outputs at each batch size (same rows) and a
    repeated call at the largest batch size; the largest batch size's outputs are the reference.
    """
    largest = max(by_batch)
    base = by_batch[largest]
    runs = [(size, outputs) for size, outputs in sorted(by_batch.items()) if size != largest]
    runs += [(largest, repeat)] if repeat is not None else []
    noise = {}
    for name, value in base.items():
        value = np.asarray(value)
        if value.dtype.kind != "f":
            continue
        worst = ReferenceNoise(0.0, (largest, largest))
        for size, outputs in runs:
            other = np.asarray(outputs[name], dtype=np.float64)
            if other.shape != value.shape or not np.all(np.isfinite(other)) or not np.all(np.isfinite(value)):
                continue
            gap = float(np.max(np.abs(other - value.astype(np.float64)))) if value.size else 0.0
            if gap > worst.max_abs:
                worst = ReferenceNoise(gap, (size, largest))
        noise[name] = worst
    return noise


def noise_hint(noise: ReferenceNoise | None, tolerance: Tolerance) -> str:
    """What to change when a float output misses its bound: the reference's own noise and the setting."""
    current = tolerance.atol
    measured = noise is not None and noise.max_abs > 0
    text = (f"{noise.describe()}, allowed {tolerance.noise_multiplier:g}x on top of the bound" if measured
            else "the SavedModel shows no difference against itself on it")
    return (f"{text}; to accept a larger difference raise {tolerance.setting or 'validate.atol'} (now {current:g})"
            + (" or validate.noise_multiplier" if measured else ""))


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


def _max_loss(artifact: Artifact, task: TaskMetric, settings: ValidateSection) -> float:
    if task.kind == "regression":
        return settings.regression_max_error_increase
    return settings.max_accuracy_drop_points if artifact.mode in FLOAT_MODES \
        else settings.quantized_max_accuracy_drop_points


def _loss_text(task: TaskMetric, reference_metric: float, metric: float, limit: float, ties: int | None) -> str:
    if task.kind == "classification":
        return (f"accuracy {metric:.2f}% (tie flips excluded: {ties or 0}) is {reference_metric - metric:.2f} points "
                f"below the SavedModel's {reference_metric:.2f}% on output '{task.prediction}' (allowed {limit:g})")
    return (f"MAE {metric:.4g} on output '{task.prediction}' exceeds the SavedModel's {reference_metric:.4g} by "
            f"{task.loss_vs(reference_metric, metric):.3g} label std (allowed {limit:g})")


def score_output(task: TaskMetric, reference: dict[str, np.ndarray], scores: dict[str, str]) -> str | None:
    """The float [N, C] output whose argmax is the task's prediction (itself, or the index output's scores)."""
    value = reference[task.prediction]
    if value.dtype.kind == "f" and value.ndim == 2:
        return task.prediction
    return scores.get(task.prediction)


def tie_flips(task: TaskMetric, outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray],
              score_name: str | None) -> tuple[np.ndarray, np.ndarray, float | None]:
    """Rows whose predicted class differs from the SavedModel's, which of them are ties, and the bound.

    A flip is a tie when the SavedModel's score margin between its class and the artifact's is at most
    twice the artifact's measured error bound on `score_name` (the 99th percentile of |artifact - SavedModel|
    over that output): both scores may move by that much.

    Returns:
        (flips [N] bool, ties [N] bool, error bound or None when there is no score output).
    """
    got, want = task.predicted_class(outputs), task.predicted_class(reference)
    flips = got != want
    ties = np.zeros_like(flips)
    if score_name is None or score_name not in outputs:
        return flips, ties, None
    scores = np.asarray(reference[score_name], dtype=np.float64)
    error = np.abs(np.asarray(outputs[score_name], dtype=np.float64) - scores)
    bound = float(np.quantile(error, TIE_ERROR_QUANTILE)) if error.size else 0.0
    rows = np.nonzero(flips)[0]
    ties[rows] = scores[rows, want[rows]] - scores[rows, got[rows]] <= 2.0 * bound
    return flips, ties, bound


@dataclass
class _Worst:
    """The worst task-metric figures over the batch sizes."""

    loss: float = -float("inf")
    metric: float = float("nan")
    tie_metric: float | None = None
    agreement: float | None = None
    flips: int | None = None
    ties: int | None = None
    bound: float | None = None


def _score(task: TaskMetric, outputs, reference, score_name, reference_metric: float, worst: _Worst) -> None:
    metric = task.score(outputs)
    if task.kind != "classification":
        if task.loss_vs(reference_metric, metric) > worst.loss:
            worst.loss, worst.metric = task.loss_vs(reference_metric, metric), metric
        return
    flips, ties, bound = tie_flips(task, outputs, reference, score_name)
    predicted = task.predicted_class(outputs).copy()
    predicted[ties] = task.predicted_class(reference)[ties]
    adjusted = task.score_classes(predicted)
    agreement = 100.0 * float(np.mean(~flips))
    worst.agreement = agreement if worst.agreement is None else min(worst.agreement, agreement)
    if task.loss_vs(reference_metric, adjusted) > worst.loss:
        worst.loss, worst.metric, worst.tie_metric = task.loss_vs(reference_metric, adjusted), metric, adjusted
        worst.flips, worst.ties, worst.bound = int(flips.sum()), int(ties.sum()), bound


def check_artifact(artifact: Artifact, runner: Runner, inputs: dict[str, np.ndarray], task: TaskMetric,
                   reference: dict[str, np.ndarray], reference_metric: float, contract: Signature,
                   settings: ValidateSection, noise: dict[str, ReferenceNoise] | None = None,
                   outputs_by_batch: dict[int, dict[str, np.ndarray]] | None = None) -> ArtifactParity:
    """Run one artifact at every configured batch size and judge it against the reference outputs.

    Args:
        inputs: {input name: [N, ...]}; task: the metric (`task_metric.infer_task`); reference: the
            SavedModel's outputs on `inputs`; reference_metric: `task.score(reference)`.
        noise: the SavedModel's own noise per float output (`reference_noise`), allowed on top of each bound.
        outputs_by_batch: the artifact's outputs already computed per batch size (the SavedModel's own).
    """
    tolerance = tolerance_for(artifact.mode, settings)
    noise = noise or {}
    scores = index_scores(reference)
    score_name = score_output(task, reference, scores)
    wanted = {name: reference[name] for name in contract.output_names()}
    rows: dict[str, OutputParity] = {}
    worst = _Worst()
    total = len(next(iter(inputs.values())))
    for batch_size in sorted({min(size, total) for size in settings.batch_sizes}):
        outputs = (outputs_by_batch or {}).get(batch_size) or run_batched(runner, inputs, batch_size)
        for row in compare_outputs(outputs, wanted, tolerance, scores, {n: v.max_abs for n, v in noise.items()},
                                   (score_name,) if score_name else ()):
            rows[row.output] = _worse(rows.get(row.output), row)
        if task.prediction not in outputs or (np.asarray(outputs[task.prediction]).dtype.kind == "f" and not np.all(
                np.isfinite(np.asarray(outputs[task.prediction], dtype=np.float64)))):
            continue  # already a failure of that output; the metric would be meaningless
        _score(task, outputs, reference, score_name, reference_metric, worst)
    reasons = [row.describe() + (f"; {noise_hint(noise.get(row.output), tolerance)}"
                                 if "outside tolerance" in row.detail else "")
               for row in rows.values() if not row.passed]
    limit = _max_loss(artifact, task, settings)
    flat = any("too flat to judge" in row.detail for row in rows.values())
    if not flat and worst.ties is not None and worst.ties > settings.max_tie_share * total:
        reasons.append(f"too flat to judge: {worst.ties} of {total} rows change class within the artifact's error "
                       f"(ties, {100 * worst.ties / total:.1f} % of rows; at most {100 * settings.max_tie_share:g} % "
                       f"may be excused, validate.max_tie_share): output '{task.prediction}' does not separate "
                       "these rows well enough to tell a tie from a regression")
    if worst.loss > limit:
        reasons.append(_loss_text(task, reference_metric, worst.tie_metric if worst.tie_metric is not None
                                  else worst.metric, limit, worst.ties))
    latency = _latency_ms(runner, inputs) if not any(np.isinf(r.max_abs_error) for r in rows.values()) else 0.0
    return ArtifactParity(artifact.name, artifact.kind, artifact.mode, artifact.size_bytes(), worst.metric,
                          worst.agreement, latency, tuple(rows[n] for n in contract.output_names()),
                          tuple(sorted(set(settings.batch_sizes))), not reasons, "; ".join(reasons),
                          worst.tie_metric, worst.flips, worst.ties, worst.bound)


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
    task = infer_task(reference_outputs, labels, settings.task, settings.prediction_output)
    reference_metric = task.score(reference_outputs)
    rows = [check_artifact(reference, reference_runner, inputs, task, reference_outputs, reference_metric,
                           contract, settings, noise, by_batch)]
    del reference_runner  # one model's weights in memory at a time (bench/results/pipeline-latest.md)
    for artifact in candidates:
        gc.collect()  # the previous runner (and TensorFlow's cycles) before the next one loads
        try:
            runner = open_runner(artifact)
        except Exception as err:  # noqa: BLE001 - any loader failure is that artifact's verdict
            rows.append(_not_loaded(artifact, settings, err))
            continue
        rows.append(check_artifact(artifact, runner, inputs, task, reference_outputs, reference_metric, contract,
                                   settings, noise))
        del runner
    return ParityReport(reference_metric, total, tuple(rows), task.name, task.prediction, task.label_source,
                        tuple(required), noise)


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
