"""Training tasks and their metrics, in NumPy: one definition for train.json, the report and `promote`.

* classification: logits or scores float [N, C], labels int [N] in [0, C). Metric: accuracy (fraction,
  higher is better); loss: softmax cross-entropy (nats).
* binary: one logit float [N] or [N, 1] (a sigmoid's input; a probability output in [0, 1] is scored the
  same, AUC depends only on the order), labels 0/1 [N]. Metric: ROC AUC (higher is better, 0.5 is chance),
  computed as the Mann-Whitney U statistic with ties counted half (the same value as
  `sklearn.metrics.roc_auc_score`); also the accuracy of the decision at logit 0 (probability 0.5).
* regression: predictions float [N] or [N, 1] (or [N, K] with labels [N, K]), float labels. Metric: mean
  absolute error in the labels' unit (lower is better); also RMSE.

`task_metrics` gives every figure; `primary` names the one each task is judged by, and `worse_by` says how
much worse a candidate is than a reference on it (positive: worse), so a caller compares tasks alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TASKS = ("classification", "binary", "regression")


@dataclass(frozen=True)
class PrimaryMetric:
    """The metric a task is judged by: its name in train.json and whether a larger value is better."""

    name: str
    higher_is_better: bool


PRIMARY = {"classification": PrimaryMetric("accuracy", True), "binary": PrimaryMetric("auc", True),
           "regression": PrimaryMetric("mae", False)}


def primary(task: str) -> PrimaryMetric:
    """The judged metric of `task`.

    Raises:
        ValueError: an unknown task (the known ones named).
    """
    if task not in PRIMARY:
        raise ValueError(f"task {task!r}: expected one of {list(TASKS)}")
    return PRIMARY[task]


def worse_by(task: str, candidate: float, reference: float) -> float:
    """How much worse `candidate` is than `reference` on `task`'s primary metric (>0 worse, <0 better)."""
    return reference - candidate if primary(task).higher_is_better else candidate - reference


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC of `scores` [N] against 0/1 `labels` [N]: P(score of a positive > score of a negative), ties
    counted half (Mann-Whitney U / (positives * negatives), average ranks for ties).

    Raises:
        ValueError: labels other than 0/1, or only one class present (AUC undefined).
    """
    scores = np.asarray(scores, np.float64).reshape(-1)
    labels = np.asarray(labels).reshape(-1)
    if not np.isin(labels, (0, 1)).all():
        raise ValueError(f"binary labels must be 0 or 1; got {sorted(set(labels.tolist()))[:5]}")
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        raise ValueError("AUC needs both classes among the labels")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), np.float64)
    sorted_scores = scores[order]
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    average = first + (counts + 1) / 2.0  # 1-based average rank of each tie group
    ranks[order] = np.repeat(average, counts)
    u_statistic = ranks[labels == 1].sum() - positives * (positives + 1) / 2.0
    return float(u_statistic / (positives * negatives))


def _probability_rows(outputs: np.ndarray) -> bool:
    """Whether [N, C] scores are already probabilities: every value in [0, 1] and every row summing to 1 within
    float32 rounding over C terms (C * 2**-23, at least 1e-5).
    """
    tolerance = max(1e-5, outputs.shape[1] * 2.0 ** -23)
    return bool(np.all((outputs >= 0.0) & (outputs <= 1.0)) and np.all(np.abs(outputs.sum(axis=1) - 1.0) <= tolerance))


def task_metrics(task: str, outputs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Every figure of `task` for model `outputs` against `labels` (shapes in the module docstring).

    Returns:
        classification: {"accuracy", "loss"} (loss: mean cross-entropy, nats, of the softmax of logits or of
        the given probability rows); binary: {"auc", "accuracy", "loss"} (loss: mean binary
        cross-entropy of the logits, nats; omitted for probability outputs); regression: {"mae", "rmse",
        "loss"} (loss: mean squared error).

    Raises:
        ValueError: an unknown task, or outputs whose shape does not fit the task and labels.
    """
    primary(task)
    outputs = np.asarray(outputs, np.float64)
    labels = np.asarray(labels)
    if task == "classification":
        if outputs.ndim != 2 or outputs.shape[0] != len(labels):
            raise ValueError(f"classification outputs must be [N, C] for {len(labels)} labels; got {outputs.shape}")
        if len(labels) and (labels.min() < 0 or labels.max() >= outputs.shape[1]):
            raise ValueError(f"class labels must lie in [0, {outputs.shape[1]}) for {outputs.shape[1]} scores; got "
                             f"{int(labels.min())}..{int(labels.max())}")
        if _probability_rows(outputs):  # a softmax's output: its own log, not a second softmax
            log_probs = np.log(np.clip(outputs, np.finfo(np.float32).tiny, None))
        else:
            shifted = outputs - outputs.max(axis=1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return {"accuracy": float(np.mean(outputs.argmax(axis=1) == labels)),
                "loss": float(-log_probs[np.arange(len(labels)), labels.astype(np.int64)].mean())}
    if task == "binary":
        logits = _one_column(outputs, len(labels), task)
        probability_output = bool(np.all((logits >= 0.0) & (logits <= 1.0)))
        threshold = 0.5 if probability_output else 0.0
        figures = {"auc": roc_auc(logits, labels),
                   "accuracy": float(np.mean((logits > threshold).astype(np.int64) == labels.reshape(-1)))}
        if not probability_output:  # softplus form of the sigmoid cross-entropy, stable for large |logit|
            y = labels.reshape(-1).astype(np.float64)
            figures["loss"] = float(np.mean(np.maximum(logits, 0) - logits * y + np.log1p(np.exp(-np.abs(logits)))))
        return figures
    target = labels.astype(np.float64)
    predicted = outputs.reshape(target.shape) if outputs.size == target.size else None
    if predicted is None:
        raise ValueError(f"regression outputs {outputs.shape} do not match labels {target.shape}")
    error = predicted - target
    return {"mae": float(np.mean(np.abs(error))), "rmse": float(np.sqrt(np.mean(error**2))),
            "loss": float(np.mean(error**2))}


def _one_column(outputs: np.ndarray, rows: int, task: str) -> np.ndarray:
    if outputs.shape not in ((rows,), (rows, 1)):
        raise ValueError(f"{task} outputs must be one column [N] or [N, 1] for {rows} labels; got {outputs.shape}")
    return outputs.reshape(rows)
