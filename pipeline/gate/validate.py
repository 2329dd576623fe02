"""Validate stage: the parity gate between every artifact and the SavedModel, for any contract.

Outputs are matched by name, never by position. Per mode:

* float32 (SavedModel, ONNX, TFLite float32): every element must satisfy
  |artifact - reference| <= atol * scale + rtol * |reference|, with scale = max(1, max |reference|)
  over that output (tolerances scaled to the output's range; defaults atol = rtol = 1e-5);
  integer and string outputs must be equal, except index outputs (an integer [N] output that is the
  argmax of a float [N, C] output, found from the reference: `task_metric.index_scores`) where a
  differing index is accepted only when the reference scores at both indices are equal within the
  same tolerance (a tie);
* float16: the same rule with atol = rtol = `float16_tolerance` (1e-2);
* dynamic_range and int8: judged by the task metric (`pipeline.gate.task_metric`: accuracy drop of at most
  `quantized_max_accuracy_drop_points` (1 point), or an MAE increase of at most
  `regression_max_error_increase` label standard deviations); the max error of every output is
  reported. int8 outputs are dequantized by the LiteRT runner before comparison.

Any artifact also fails on NaN/Inf outputs, a missing output, or a task-metric loss above its limit
(float modes: `max_accuracy_drop_points`). Every artifact is run at every configured batch size (1,
an odd size, the largest; dynamic-batch TFLite inputs are resized by LiteRT); a failure raises
`ParityError` naming the artifact, the worst output, its max error and the tolerance. Never a warning.
Per-output error histograms (counts in `ERROR_BIN_EDGES`) go to the report.
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from core.contract import Signature
from core.errors import ParityError
from pipeline.config import ValidateSection
from pipeline.gate.runners import Artifact, Runner, runner_for
from pipeline.gate.task_metric import TaskMetric, index_scores, infer_task

FLOAT_MODES = ("float32", "float16")
# Absolute-error histogram bins: [0, 1e-9), [1e-9, 1e-8), ..., [1e1, inf).
ERROR_BIN_EDGES = (0.0, *(10.0 ** e for e in range(-9, 2)), float("inf"))


@dataclass(frozen=True)
class OutputParity:
    """One output of one artifact against the reference: max abs/rel error and the verdict."""

    output: str
    max_abs_error: float
    max_rel_error: float
    tolerance: str
    passed: bool
    detail: str = ""
    error_histogram: tuple[int, ...] = ()
    exact: bool = False  # an integer or string output: compared for equality, errors are counts


@dataclass(frozen=True)
class ArtifactParity:
    """One artifact's verdict: task metric (worst over batch sizes), agreement with the reference's
    predictions (%, classification; None for regression), latency at batch 1 (ms), per-output rows.
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


@dataclass(frozen=True)
class ParityReport:
    """Every artifact's parity against the SavedModel on held-out data.

    metric: `accuracy_%` or `mae`; metric_output: the output scored; label_source: `labels` or
    `reference` (no labels given: the SavedModel's predictions are the labels).
    """

    reference_metric: float
    samples: int
    rows: tuple[ArtifactParity, ...]
    metric: str = "accuracy_%"
    metric_output: str = ""
    label_source: str = "labels"

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.rows)

    @property
    def reference_accuracy(self) -> float | None:
        """The SavedModel's accuracy (%) for classification, else None."""
        return self.reference_metric if self.metric == "accuracy_%" else None

    def to_json(self) -> dict[str, Any]:
        """JSON form for the manifest and report.json (`error_bin_edges` are the histogram bins)."""
        return {"passed": self.passed, "metric": self.metric, "metric_output": self.metric_output,
                "label_source": self.label_source, "reference_metric": self.reference_metric,
                "reference_accuracy": self.reference_accuracy, "samples": self.samples,
                "error_bin_edges": [e if e != float("inf") else None for e in ERROR_BIN_EDGES],
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


def error_histogram(error: np.ndarray) -> tuple[int, ...]:
    """Counts of absolute errors in the `ERROR_BIN_EDGES` bins."""
    counts, _ = np.histogram(np.asarray(error, dtype=np.float64).ravel(), bins=np.array(ERROR_BIN_EDGES))
    return tuple(int(c) for c in counts)


def compare_output(name: str, got: np.ndarray, want: np.ndarray, reference: dict[str, np.ndarray],
                   tolerance: tuple[float, float] | None, scores: dict[str, str] | None = None) -> OutputParity:
    """Compare one named output with the reference's.

    Args:
        got, want: the artifact's and the reference's arrays for `name`, same shape [N, ...].
        reference: every reference output (for tie-aware index comparison).
        tolerance: (atol, rtol) for a hard gate, or None to only report the error.
        scores: {index output: score output} (`task_metric.index_scores`); None detects it from `reference`.
    """
    if got.shape != want.shape:
        return OutputParity(name, float("inf"), float("inf"), "shape", False,
                            f"shape {list(got.shape)}, expected {list(want.shape)}")
    if want.dtype.kind in "USO" or got.dtype.kind in "USO":
        differ = np.asarray(got).astype(str) != np.asarray(want).astype(str)
        ok = tolerance is None or not differ.any()
        return OutputParity(name, float(differ.sum()), 0.0, "exact (strings)", ok,
                            f"{int(differ.sum())} of {differ.size} strings differ" if differ.any() else "",
                            exact=True)
    if np.issubdtype(want.dtype, np.floating):
        if not np.all(np.isfinite(got)):
            return OutputParity(name, float("nan"), float("nan"), "finite", False, "NaN or Inf in output")
        error = np.abs(got.astype(np.float64) - want.astype(np.float64))
        rel = float(np.max(error / np.maximum(np.abs(want), 1e-12))) if error.size else 0.0
        max_abs = float(error.max()) if error.size else 0.0
        if tolerance is None:
            return OutputParity(name, max_abs, rel, "reported (metric-gated)", True, "", error_histogram(error))
        atol, rtol = tolerance
        scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
        bad = error > atol * scale + rtol * np.abs(want)
        detail = f"{int(bad.sum())} of {bad.size} elements outside tolerance" if bad.any() else ""
        return OutputParity(name, max_abs, rel, f"atol {atol:g}*{scale:.3g} + rtol {rtol:g}", not bad.any(), detail,
                            error_histogram(error))
    differ = got != want
    int_error = np.abs(got.astype(np.int64) - want.astype(np.int64))
    max_abs = float(np.max(int_error)) if got.size else 0.0
    if tolerance is None:
        return OutputParity(name, max_abs, 0.0, "reported (metric-gated)", True,
                            f"{int(differ.sum())} of {differ.size} differ" if differ.any() else "",
                            error_histogram(int_error), exact=True)
    unexplained = int(differ.sum())
    score_name = (index_scores(reference) if scores is None else scores).get(name)
    if differ.any() and score_name in reference and want.ndim == 1:
        scores = reference[score_name]
        atol, rtol = tolerance
        rows = np.nonzero(differ)[0]
        at_got = scores[rows, got[rows]]
        at_want = scores[rows, want[rows]]
        ties = np.abs(at_got - at_want) <= atol * max(1.0, float(np.max(np.abs(scores)))) + rtol * np.abs(at_want)
        unexplained = int((~ties).sum())
    detail = f"{unexplained} of {differ.size} indices differ (ties excluded)" if unexplained else ""
    return OutputParity(name, max_abs, 0.0, "exact (tie-aware)" if score_name else "exact", unexplained == 0, detail,
                        error_histogram(int_error), exact=True)


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


def _loss_text(task: TaskMetric, reference_metric: float, metric: float, limit: float) -> str:
    if task.kind == "classification":
        return (f"accuracy {metric:.2f}% is {reference_metric - metric:.2f} points below the SavedModel's "
                f"{reference_metric:.2f}% on output '{task.prediction}' (allowed {limit:g})")
    return (f"MAE {metric:.4g} on output '{task.prediction}' exceeds the SavedModel's {reference_metric:.4g} by "
            f"{task.loss_vs(reference_metric, metric):.3g} label std (allowed {limit:g})")


def check_artifact(artifact: Artifact, runner: Runner, inputs: dict[str, np.ndarray], task: TaskMetric,
                   reference: dict[str, np.ndarray], reference_metric: float, contract: Signature,
                   settings: ValidateSection) -> ArtifactParity:
    """Run one artifact at every configured batch size and judge it against the reference outputs.

    Args:
        inputs: {input name: [N, ...]}; task: the metric (`task_metric.infer_task`); reference: the
            SavedModel's outputs on `inputs`; reference_metric: `task.score(reference)`.
    """
    tolerance = _tolerances(artifact.mode, settings)
    scores = index_scores(reference)
    rows: dict[str, OutputParity] = {}
    worst_loss, metric, agreement = -float("inf"), reference_metric, None
    total = len(next(iter(inputs.values())))
    for batch_size in sorted({min(size, total) for size in settings.batch_sizes}):
        outputs = run_batched(runner, inputs, batch_size)
        missing = [name for name in contract.output_names() if name not in outputs]
        if missing:
            return ArtifactParity(artifact.name, artifact.kind, artifact.mode, artifact.size_bytes(), float("nan"),
                                  None, 0.0, (), settings.batch_sizes, False,
                                  f"outputs {missing} missing; artifact returned {sorted(outputs)}")
        for name in contract.output_names():
            row = compare_output(name, outputs[name], reference[name], reference, tolerance, scores)
            rows[name] = _worse(rows.get(name), row)
        if not np.all(np.isfinite(np.asarray(outputs[task.prediction], dtype=np.float64))):
            continue  # already a failure of that output; the metric would be meaningless
        score = task.score(outputs)
        if task.loss_vs(reference_metric, score) > worst_loss:
            worst_loss, metric = task.loss_vs(reference_metric, score), score
        if task.kind == "classification":
            agree = 100.0 * float(np.mean(task.predicted_class(outputs) == task.predicted_class(reference)))
            agreement = agree if agreement is None else min(agreement, agree)
    reasons = [f"output '{r.output}' max error {r.max_abs_error:.3g} outside {r.tolerance}"
               + (f" ({r.detail})" if r.detail else "") for r in rows.values() if not r.passed]
    limit = _max_loss(artifact, task, settings)
    if worst_loss > limit:
        reasons.append(_loss_text(task, reference_metric, metric, limit))
    return ArtifactParity(artifact.name, artifact.kind, artifact.mode, artifact.size_bytes(), metric, agreement,
                          _latency_ms(runner, inputs), tuple(rows[n] for n in contract.output_names()),
                          tuple(sorted(set(settings.batch_sizes))), not reasons, "; ".join(reasons))


def validate_artifacts(reference: Artifact, candidates: list[Artifact], contract: Signature,
                       inputs: dict[str, np.ndarray], labels: np.ndarray | None,
                       settings: ValidateSection) -> ParityReport:
    """Judge every candidate artifact (and the reference itself, at every batch size) on held-out data.

    Args:
        reference: the SavedModel artifact.
        candidates: ONNX and TFLite artifacts.
        inputs: {input name: [N, ...]} held-out inputs (the contract's dtypes).
        labels: [N] integer classes, [N, ...] float targets, or None (the SavedModel's predictions
            become the labels); the task and scored output follow `settings.task` and
            `settings.prediction_output` (`task_metric.infer_task`).

    Returns:
        The report (call `raise_if_failed` to gate on it).

    Raises:
        ParityError: no output of the contract fits the task metric.
    """
    reference_runner = runner_for(reference)
    reference_outputs = run_batched(reference_runner, inputs, max(settings.batch_sizes))
    task = infer_task(reference_outputs, labels, settings.task, settings.prediction_output)
    reference_metric = task.score(reference_outputs)
    rows = [check_artifact(reference, reference_runner, inputs, task, reference_outputs, reference_metric,
                           contract, settings)]
    del reference_runner  # one model's weights in memory at a time (bench/results/pipeline-latest.md)
    for artifact in candidates:
        gc.collect()  # the previous runner (and TensorFlow's cycles) before the next one loads
        try:
            runner = runner_for(artifact)
        except Exception as err:  # noqa: BLE001 - any loader failure is that artifact's verdict
            rows.append(ArtifactParity(artifact.name, artifact.kind, artifact.mode, artifact.size_bytes(),
                                       float("nan"), None, 0.0, (), settings.batch_sizes, False,
                                       f"could not load: {err}"))
            continue
        rows.append(check_artifact(artifact, runner, inputs, task, reference_outputs, reference_metric, contract,
                                   settings))
        del runner
    return ParityReport(reference_metric, len(next(iter(inputs.values()))), tuple(rows), task.name,
                        task.prediction, task.label_source)


def raise_if_failed(report: ParityReport) -> ParityReport:
    """Return the report when every artifact passed.

    Raises:
        ParityError: naming each failing artifact, its worst output, max error and tolerance.
    """
    failed = [row for row in report.rows if not row.passed]
    if failed:
        raise ParityError("parity gate failed: " + " | ".join(
            f"{row.artifact} ({row.mode}, {row.size_bytes} bytes): {row.reason}" for row in failed))
    return report
