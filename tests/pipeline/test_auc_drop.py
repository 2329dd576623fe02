"""The binary AUC drop decided by DeLong's paired test (`pipeline.gate.auc_drop`), measured against
scikit-learn's `roc_auc_score` and a paired bootstrap of it, and the golden-set size the count decisions need
(`pipeline.gate.golden_size`), against the closed form ln(1 - c') / ln(1 - allowed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tfship.pipeline.config import load_config
from tfship.pipeline.gate.auc_drop import decide_auc_drop, delong_difference
from tfship.pipeline.gate.golden_size import golden_set
from tfship.pipeline.gate.task_metric import infer_task


def _scores(rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, rows)
    reference = np.round(labels + rng.normal(size=rows), 1)  # rounded: ties, counted half
    return rng, labels, reference


def test_delong_agrees_with_sklearn_and_a_paired_bootstrap():
    """Both AUCs equal scikit-learn's (ties included); the standard error of the difference is within 10 % of
    the standard deviation of 2,000 paired bootstrap resamples of scikit-learn's AUC difference."""
    from sklearn.metrics import roc_auc_score

    rng, labels, reference = _scores(400)
    candidate = np.round(reference + 0.6 * rng.normal(size=400), 1)
    first, second, error = delong_difference(reference, candidate, labels)
    assert first == pytest.approx(roc_auc_score(labels, reference), abs=1e-12)
    assert second == pytest.approx(roc_auc_score(labels, candidate), abs=1e-12)
    draws = []
    for _ in range(2000):
        pick = rng.integers(0, 400, 400)
        draws.append(roc_auc_score(labels[pick], reference[pick]) - roc_auc_score(labels[pick], candidate[pick]))
    assert error == pytest.approx(float(np.std(draws, ddof=1)), rel=0.10), (error, np.std(draws, ddof=1))


def test_auc_drop_verdicts_both_sides():
    """A noisy ranking is refused (lower bound above 0.5 points), the same ranking passed on any number of
    rows (no disagreement, no uncertainty), a small noisy set undecided with the rows that would decide."""
    rng, labels, reference = _scores(400, seed=1)
    refused = decide_auc_drop(reference, reference + 1.5 * rng.normal(size=400), labels, 0.005, 0.95)
    assert refused.verdict == "refused" and refused.low > 0.005, refused
    same = decide_auc_drop(reference[:20], 2.0 * reference[:20] + 1.0, labels[:20], 0.005, 0.95)  # same order
    assert same.verdict == "passed" and same.estimate == 0.0 and same.high == 0.0, same
    small = decide_auc_drop(reference[:40], reference[:40] + 0.3 * rng.normal(size=40), labels[:40], 0.005, 0.95)
    assert small.verdict == "undecided" and small.low < 0.005 < small.high and small.rows_to_decide > 40, small
    one_positive = decide_auc_drop(np.arange(5.0), np.arange(5.0)[::-1], np.array([0, 0, 0, 0, 1]), 0.005, 0.95)
    assert one_positive.verdict == "undecided" and math.isnan(delong_difference(
        np.arange(5.0), np.arange(5.0), np.array([0, 0, 0, 0, 1]))[2])  # no covariance from one row


def test_golden_set_size_follows_the_exact_rule():
    """736 rows decide the default 0.5-point drop with no row lost (95 %, each end at 97.5 %); 368 the
    quantized 1 point; 29 the int8 flips (10 %); fewer rows get a note naming the number, enough rows none."""
    settings = load_config().parity
    classification = infer_task({"logits": np.eye(3)[[0, 1, 2, 0]].astype(np.float32)}, None)
    assert math.ceil(math.log(0.025) / math.log(0.995)) == 736
    small = golden_set(360, {"float32", "float16"}, classification, settings)
    assert small["needed"] == 736 and not small["enough"], small
    assert small["decisions"]["accuracy drop (float16)"]["rows"] == 736
    assert small["decisions"]["flipped decisions (float32)"]["rows"] == math.ceil(math.log(0.05) / math.log(0.99))
    assert "360 held-out rows; 736 rows would decide" in small["note"] and "hold out at least 736" in small["note"]
    enough = golden_set(736, {"float32", "float16"}, classification, settings)
    assert enough["enough"] and enough["needed"] == 736 and enough["note"] == "", enough
    quantized = golden_set(100, {"int8"}, classification, settings)["decisions"]
    assert quantized["accuracy drop (int8)"]["rows"] == 368 and quantized["flipped decisions (int8)"]["rows"] == 29
    regression = infer_task({"y": np.ones((4, 1), np.float32)}, np.full((4, 1), 0.3, np.float32))
    assert regression.kind == "regression" and golden_set(4, {"int8"}, regression, settings)["enough"]  # MAE: a point estimate, no count decision
