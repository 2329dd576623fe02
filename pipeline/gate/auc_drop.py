"""The AUC drop of a binary (one-column) output, decided with its uncertainty: DeLong's paired test.

A binary task is judged by ROC AUC (`core.tasks.primary("binary")`, the metric `tfship query` and `promote`
use). The artifact and the SavedModel score the *same* rows, so their AUCs are correlated; the difference
d = AUC(SavedModel) - AUC(artifact) (> 0: the artifact ranks worse) has the variance DeLong, DeLong and
Clarke-Pearson (1988, Biometrics 44:837) derive from the placement values of each row:

* for a positive row i: V10(i) = share of negatives it outranks (ties half); for a negative row j:
  V01(j) = share of positives that outrank it; AUC = mean V10 = mean V01 (`core.tasks.roc_auc`);
* with S10, S01 the 2x2 covariance matrices (SavedModel, artifact) of V10 over the m positives and of V01 over
  the n negatives: Var(d) = (S10[0,0] + S10[1,1] - 2 S10[0,1]) / m + (same for S01) / n.

The bounds are d -+ z * sqrt(Var(d)), z the standard normal quantile at 1 - (1 - c) / 2, so each end holds
with probability about c, as the accuracy rule's each-end bounds do (`confidence.decide_drop`). This is an
asymptotic (normal) interval, not an exact one: exact intervals for a paired AUC difference need the joint
law of all pair orderings. A file whose ranking equals the SavedModel's has d = 0 and Var(d) = 0, so it is
*passed* on any number of rows: the rows that disagree are what carries the uncertainty, not the row count.
Midranks follow Sun and Xu (2014, IEEE Signal Processing Letters 21:1389), the fast form of the same
estimator (the one R's pROC `roc.test(method = "delong")` computes).
"""

from __future__ import annotations

import math

import numpy as np

from tfship.core.tasks import roc_auc
from tfship.pipeline.gate.confidence import UNDECIDED, Decision, verdict_of

__all__ = ["DELONG", "decide_auc_drop", "delong_difference"]

DELONG = "DeLong paired AUC difference (normal approximation)"


def _midranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of `values` [K], ties given their average rank."""
    order = np.argsort(values, kind="mergesort")
    _, first, counts = np.unique(values[order], return_index=True, return_counts=True)
    ranks = np.empty(len(values), np.float64)
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)
    return ranks


def _placements(scores: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(V10 [m], V01 [n]): each positive's share of negatives below it, each negative's share of positives
    above it (ties half).
    """
    m, n = int(positive.sum()), int((~positive).sum())
    combined = _midranks(scores)
    v10 = (combined[positive] - _midranks(scores[positive])) / n
    v01 = 1.0 - (combined[~positive] - _midranks(scores[~positive])) / m
    return v10, v01


def delong_difference(reference: np.ndarray, candidate: np.ndarray, labels: np.ndarray
                      ) -> tuple[float, float, float]:
    """AUC(reference) - AUC(candidate) and its DeLong standard error, on the same rows.

    Args:
        reference, candidate: scores float [N] (or [N, 1]) of the SavedModel and the artifact.
        labels: 0/1 [N], both classes present.

    Returns:
        (reference AUC, candidate AUC, standard error of the difference); the error is NaN when a class holds
        fewer than 2 rows (its covariance is undefined).

    Raises:
        ValueError: labels other than 0/1, or one class only (`core.tasks.roc_auc`).
    """
    labels = np.asarray(labels).reshape(-1)
    reference = np.asarray(reference, np.float64).reshape(-1)
    candidate = np.asarray(candidate, np.float64).reshape(-1)
    first, second = roc_auc(reference, labels), roc_auc(candidate, labels)
    positive = labels == 1
    m, n = int(positive.sum()), int((~positive).sum())
    if m < 2 or n < 2:
        return first, second, float("nan")
    (r10, r01), (c10, c01) = _placements(reference, positive), _placements(candidate, positive)
    variance = np.var(r10 - c10, ddof=1) / m + np.var(r01 - c01, ddof=1) / n  # = the S10/S01 form above
    return first, second, float(math.sqrt(max(float(variance), 0.0)))


def decide_auc_drop(reference: np.ndarray, candidate: np.ndarray, labels: np.ndarray, allowed: float,
                    confidence: float) -> Decision:
    """Judge the AUC drop of `candidate` against `reference` (module docstring); shares as fractions of AUC
    (0.005 = 0.5 points). `rows_to_decide`, when undecided, assumes the same variance per row:
    N * (z * se / |allowed - d|)^2 rows.
    """
    from scipy.stats import norm  # here, not at import: the TF-free CLI imports the gate's modules

    first, second, error = delong_difference(reference, candidate, labels)
    rows, drop = len(np.asarray(labels).reshape(-1)), first - second
    if math.isnan(error):
        return Decision(UNDECIDED, drop, -1.0, 1.0, allowed, confidence, rows, None, DELONG)
    z = float(norm.ppf(1.0 - (1.0 - confidence) / 2.0))
    low, high = drop - z * error, drop + z * error
    verdict = verdict_of(low, high, allowed)
    needed = None
    if verdict == UNDECIDED and drop != allowed:
        needed = math.ceil(rows * (z * error / abs(allowed - drop)) ** 2)
    return Decision(verdict, drop, low, high, allowed, confidence, rows, needed, DELONG)
