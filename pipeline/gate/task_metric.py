"""The task metric the parity gate judges quantized artifacts by, for any contract.

* classification: accuracy (%) of a prediction output against integer labels. The prediction output
  is an integer index output `[B]` (taken as is), a float score output `[B, C]` (argmax over the
  last axis), or a one-column float output `[B, 1]` / `[B]`: a binary decision at its threshold
  (`validate.binary_threshold`; by default 0.5 when every SavedModel value lies in [0, 1], a sigmoid
  probability, else 0, a logit), never an argmax over one column. Higher is better; the gate allows a
  drop of N percentage points. 0/1 float labels with a one-column output are classes too.
* binary (a one-column output whose labels hold both classes): ROC AUC of the scores against the labels
  (`core.tasks.primary("binary")`, computed by `core.tasks.roc_auc`, a fraction), the metric `tfship query`
  and `promote` judge a binary task by; its drop is decided by `auc_drop.decide_auc_drop`. The decisions at
  the threshold still give agreement and flips. Name: `auc`.
* regression: mean absolute error of a float prediction output against float labels of the same
  shape. Lower is better; the gate allows an increase of a fraction of the labels' standard deviation
  (so the bound has the labels' unit).

Without labels, the SavedModel's own predictions are the labels (agreement with the reference), so
quantized artifacts are still judged by the task and never waved through.

`index_scores` finds index outputs (e.g. `class_id`, a top-k `indices`, an argsort) and the score output
each points into, from the reference outputs themselves, so comparing indices by the values they select
needs no naming convention.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tfship.core.errors import ParityError
from tfship.core.tasks import primary, roc_auc


@dataclass(frozen=True)
class TaskMetric:
    """How to score one artifact's outputs.

    kind: `classification` or `regression`; prediction: the output scored; labels: [N] int (classes) or
    [N, ...] float (targets); label_source: `labels` (user's) or `reference` (SavedModel predictions);
    label_std: standard deviation of float labels (regression bound unit), 1.0 for classification;
    threshold: the decision threshold of a one-column score output (None: argmax or an index output);
    auc: the one-column output is judged by ROC AUC (labels hold both classes), not by accuracy.
    """

    kind: str
    prediction: str
    labels: np.ndarray
    label_source: str
    label_std: float = 1.0
    threshold: float | None = None
    auc: bool = False

    @property
    def name(self) -> str:
        """`accuracy_%`, `auc` (`core.tasks.primary("binary").name`) or `mae`."""
        if self.auc:
            return primary("binary").name
        return "accuracy_%" if self.kind == "classification" else "mae"

    def scores_of(self, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """[N] float64 scores of the one-column prediction output (binary tasks)."""
        value = np.asarray(outputs[self.prediction], dtype=np.float64)
        return value.reshape(len(value))

    def predicted_class(self, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """[N] predicted classes (classification only)."""
        value = np.asarray(outputs[self.prediction])
        if self.threshold is not None and value.dtype.kind == "f":
            return (value.reshape(len(value)) > self.threshold).astype(np.int64)
        return value if value.dtype.kind in "iu" else np.argmax(value, axis=-1)

    def score_classes(self, predicted: np.ndarray) -> float:
        """Accuracy in % of [N] predicted classes against the labels (classification only)."""
        return 100.0 * float(np.mean(np.asarray(predicted) == self.labels))

    def score(self, outputs: Mapping[str, np.ndarray]) -> float:
        """Accuracy in % (classification), ROC AUC as a fraction (binary, `auc`) or mean absolute error in label
        units (regression).
        """
        if self.auc:
            return roc_auc(self.scores_of(outputs), self.labels)
        if self.kind == "classification":
            return self.score_classes(self.predicted_class(outputs))
        value = np.asarray(outputs[self.prediction], dtype=np.float64).reshape(self.labels.shape)
        return float(np.mean(np.abs(value - self.labels)))

    def loss_vs(self, reference_score: float, score: float) -> float:
        """How much worse `score` is than the reference's: points of accuracy, or MAE increase / label std."""
        if self.kind == "classification":
            return reference_score - score
        return (score - reference_score) / max(self.label_std, 1e-12)


def points_into(value: np.ndarray, scores: np.ndarray) -> bool:
    """Whether the integer output `value` indexes into the float [N, C] output `scores` of the same rows.

    [N]: the argmax (or argmin) of `scores`; [N, k] (k >= 2): distinct indices in [0, C) per row whose
    selected scores are sorted (top-k, or an argsort in either direction).
    """
    if scores.dtype.kind != "f" or scores.ndim != 2 or len(scores) != len(value) or scores.shape[1] < 2 \
            or value.dtype.kind not in "iu" or not len(value):
        return False
    if value.ndim == 1:
        return bool(np.array_equal(np.argmax(scores, axis=-1), value)
                    or np.array_equal(np.argmin(scores, axis=-1), value))
    if value.ndim != 2 or not 2 <= value.shape[1] <= scores.shape[1]:
        return False
    if value.min() < 0 or value.max() >= scores.shape[1]:
        return False
    ordered = np.sort(value, axis=1)
    if np.any(ordered[:, 1:] == ordered[:, :-1]):
        return False
    steps = np.diff(np.take_along_axis(scores, value.astype(np.int64), axis=1), axis=1)
    return bool(np.all(steps <= 0) or np.all(steps >= 0))


def pairs_with(value: np.ndarray, values: np.ndarray) -> bool:
    """Whether the integer [N, k] output `value` is the index half of a top-k whose float [N, k] output
    `values` holds the selected values (sorted along each row; the scores themselves are not an output).
    """
    if value.ndim != 2 or values.shape != value.shape or values.dtype.kind != "f" or value.dtype.kind not in "iu" \
            or value.shape[1] < 2 or not len(value) or value.min() < 0:
        return False
    ordered = np.sort(value, axis=1)
    steps = np.diff(values, axis=1)
    return bool(not np.any(ordered[:, 1:] == ordered[:, :-1]) and (np.all(steps <= 0) or np.all(steps >= 0)))


def index_values(reference: Mapping[str, np.ndarray]) -> dict[str, str]:
    """{index output: values output} for every top-k index output whose scores are not an output but whose
    selected values are (`pairs_with`), and which `index_scores` did not already pair.
    """
    found, scored = {}, index_scores(reference)
    for name, value in reference.items():
        value = np.asarray(value)
        if name in scored or value.dtype.kind not in "iu":
            continue
        for values_name, values in reference.items():
            if values_name != name and pairs_with(value, np.asarray(values)):
                found[name] = values_name
                break
    return found


def index_scores(reference: Mapping[str, np.ndarray]) -> dict[str, str]:
    """{index output: score output} for every integer output that indexes into a float [N, C] output of the
    reference (`points_into`: an argmax [N], a top-k or argsort [N, k]).
    """
    found = {}
    for name, value in reference.items():
        value = np.asarray(value)
        if value.dtype.kind not in "iu" or value.ndim not in (1, 2):
            continue
        for score_name, scores in reference.items():
            if score_name != name and points_into(value, np.asarray(scores)):
                found[name] = score_name
                break
    return found


def _classification_output(reference: Mapping[str, np.ndarray], preferred: str | None) -> str | None:
    if preferred:
        return preferred
    indices = [n for n, v in reference.items() if v.dtype.kind in "iu" and v.ndim == 1]
    if indices:
        return indices[0]
    scores = [n for n, v in reference.items() if v.dtype.kind == "f" and v.ndim == 2 and v.shape[1] > 1]
    binary = [n for n, v in reference.items() if one_column(v)]
    return scores[0] if scores else binary[0] if binary else None


def one_column(value: np.ndarray) -> bool:
    """Whether an output is one score per row: float [N, 1] or [N]."""
    value = np.asarray(value)
    return value.dtype.kind == "f" and (value.ndim == 1 or (value.ndim == 2 and value.shape[1] == 1))


def binary_threshold(value: np.ndarray, configured: float | None = None) -> float:
    """The decision threshold of a one-column output: `configured`, else 0.5 when every finite value lies in
    [0, 1] (a sigmoid probability), else 0.0 (a logit).
    """
    if configured is not None:
        return configured
    finite = np.asarray(value, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    return 0.5 if finite.size and np.all((finite >= 0.0) & (finite <= 1.0)) else 0.0


def _binary_labels(labels: np.ndarray | None, reference: Mapping[str, np.ndarray], prediction: str | None) -> bool:
    """Float labels that are all 0 or 1 while the output to score is one column: classes, not targets."""
    if labels is None or np.asarray(labels).dtype.kind != "f":
        return False
    name = prediction or _classification_output(reference, None)
    values = np.unique(np.asarray(labels))
    return name is not None and name in reference and one_column(reference[name]) \
        and bool(np.all(np.isin(values, (0.0, 1.0))))


def _regression_output(reference: Mapping[str, np.ndarray], labels: np.ndarray | None,
                       preferred: str | None) -> str | None:
    if preferred:
        return preferred
    for name, value in reference.items():
        if value.dtype.kind == "f" and (labels is None or value.size == labels.size):
            return name
    return None


def infer_task(reference: Mapping[str, np.ndarray], labels: np.ndarray | None, task: str = "auto",
               prediction: str | None = None, threshold: float | None = None) -> TaskMetric:
    """Pick the task metric from the declared setting, the labels' dtype and the reference outputs.

    Args:
        reference: the SavedModel's outputs on the validation inputs, by name.
        labels: [N] integer classes, [N, ...] float targets, or None (use the reference's predictions).
        task: `auto` (integer labels -> classification, float labels -> regression; no labels ->
            classification when an index or score output exists, else regression), `classification` or
            `regression`.
        prediction: the output to score; None picks the first index output, else the first float [N, C]
            output, else the first one-column float output (classification), or the first float output with
            as many values as the labels (regression).
        threshold: `validate.binary_threshold` (one-column outputs; None: `binary_threshold` picks 0.5 or 0).

    Raises:
        ParityError: no output fits the task, or the named output does not exist.
    """
    if task == "auto":
        if labels is not None:
            task = "classification" if np.asarray(labels).dtype.kind in "iub" or _binary_labels(
                labels, reference, prediction) else "regression"
        else:
            task = "classification" if _classification_output(reference, prediction) else "regression"
    name = (_classification_output(reference, prediction) if task == "classification"
            else _regression_output(reference, labels, prediction))
    if name is not None and name in reference and task == "classification" and one_column(reference[name]) \
            and labels is not None and not np.all(np.isin(np.unique(np.asarray(labels)), (0, 1))):
        name = None  # one score per row decides between two classes only
    if name is None or name not in reference:
        raise ParityError(f"validate: no output fits a {task} metric (prediction output {name!r}; outputs "
                          f"{ {k: (str(v.dtype), list(v.shape)) for k, v in reference.items()} }); set "
                          "validate.prediction_output")
    if task == "classification":
        source = "labels" if labels is not None else "reference"
        value = reference[name]
        cut = binary_threshold(value, threshold) if one_column(value) else None
        metric = TaskMetric("classification", name, np.zeros(len(value), np.int64), source, threshold=cut)
        truth = np.asarray(labels).astype(np.int64).reshape(-1) if labels is not None else \
            metric.predicted_class(reference)
        both = cut is not None and bool(np.any(truth == 0) and np.any(truth == 1))  # AUC needs both classes
        return TaskMetric("classification", name, truth, source, threshold=cut, auc=both)
    truth = np.asarray(labels if labels is not None else reference[name], dtype=np.float64)
    if truth.size != reference[name].size:
        raise ParityError(f"validate: labels hold {truth.size} values, output '{name}' {reference[name].size}")
    truth = truth.reshape(reference[name].shape)
    return TaskMetric("regression", name, truth, "labels" if labels is not None else "reference",
                      float(np.std(truth)) or 1.0)
