"""Regression is judged like the other tasks: the paired MAE and RMSE changes with confidence bounds, and the 99th
percentile of the per-row |artifact - SavedModel| held to a tenth of the SavedModel's own MAE. A linear model
fitted to scikit-learn's bundled diabetes data (442 rows, targets 25-346) is the reference, as an ONNX file
through ONNX Runtime; candidates are the same model with a planted error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.stats import ttest_rel

from tfship.core.contract import Signature, TensorSpec
from tfship.pipeline.config import load_config
from tfship.pipeline.conversion.artifacts import Artifact
from tfship.pipeline.gate.regression_judgement import decide_regression, paired_change, row_share_verdict
from tfship.pipeline.gate.validate import validate_artifacts
from tfship.pipeline.orchestration.report import verdict_text

from .test_gates import _linear_onnx

PLANTED = 20.0  # label units, within int8's value bound (10 % of the output's range, about 31 here)


def _diabetes(away: bool = False) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """Inputs (10 features and a trigger column: 1 on every 30th row, or, `away`, the sign of the fit's residual
    on every row, so a weight on it moves each prediction away from its label), float labels [N, 1],
    least-squares weights [11, 1] (the trigger's weight 0) and bias [1]."""
    from sklearn.datasets import load_diabetes

    features, target = load_diabetes(return_X_y=True)
    design = np.hstack([features, np.ones((len(features), 1))])
    solution = np.linalg.lstsq(design, target, rcond=None)[0]
    residual = design @ solution - target
    trigger = (np.sign(residual) if away else (np.arange(len(features)) % 30 == 0).astype(np.float64))[:, None]
    x = np.hstack([features, trigger]).astype(np.float32)
    weights = np.vstack([solution[:-1, None], [[0.0]]])
    return {"x": x}, target[:, None].astype(np.float32), weights, solution[-1:]


def _judge(tmp_path: Path, candidate_weights: np.ndarray, away: bool = False):
    inputs, labels, weights, bias = _diabetes(away)
    reference = _linear_onnx(tmp_path / "reference", weights, bias, argmax=False)
    candidate = _linear_onnx(tmp_path / "candidate", candidate_weights, bias, argmax=False)
    contract = Signature.of("serving_default", (TensorSpec(name="x", dtype="float32", shape=(None, 11)),),
                            (TensorSpec(name="logits", dtype="float32", shape=(None, 1)),))
    report = validate_artifacts(Artifact("saved_model", "onnx", "float32", reference),
                                [Artifact("tflite_int8", "onnx", "int8", candidate)], contract, inputs, labels,
                                load_config().parity)
    return report


def test_paired_bounds_are_scipys_paired_t_interval():
    """The MAE change's bounds are the two-sided 95 % interval of a paired t-test on the absolute errors."""
    rng = np.random.default_rng(0)
    labels = rng.normal(0.0, 1.0, (200, 1))
    reference, candidate = labels + rng.normal(0, 0.5, labels.shape), labels + rng.normal(0, 0.6, labels.shape)
    change = paired_change(reference, candidate, labels, 0.1, 0.95)
    interval = ttest_rel(np.abs(candidate - labels)[:, 0], np.abs(reference - labels)[:, 0]).confidence_interval(0.95)
    assert (change.low, change.high) == pytest.approx((interval.low, interval.high), rel=1e-9)


def test_a_row_wrong_by_a_planted_amount_is_refused_where_the_right_candidate_passes(tmp_path):
    """15 of 442 rows off by +20 (within int8's value bound, MAE barely moves): refused by the per-row rule,
    naming the percentile, the bound and what it is made of. The same model with weights off by 0.1 % passes
    every rule on the same rows, and the SavedModel's row is the reference."""
    _, _, weights, _ = _diabetes()
    wrong = weights.copy()
    wrong[-1, 0] = PLANTED
    refused = _judge(tmp_path / "wrong", wrong)
    reference_row, row = refused.rows
    assert reference_row.reference and reference_row.passed and verdict_text(reference_row.__dict__) == "reference"
    assert all(o.passed for o in row.outputs), row.outputs  # the value bound lets it through
    decision = row.regression_decision
    assert decision["row_error"] == pytest.approx(PLANTED, rel=1e-4) and decision["row_bound"] < PLANTED / 2
    assert decision["mae"]["estimate"] < decision["mae"]["allowed"], decision["mae"]  # the average hides it
    assert not row.passed and "99th percentile of |artifact - SavedModel| 20 over the bound" in row.reason, row.reason
    assert "SavedModel's own MAE" in row.reason and "validate.regression_row_error_share" in row.reason

    close = weights * (1.0 + 1e-3 * np.random.default_rng(1).standard_normal(weights.shape))
    passed = _judge(tmp_path / "right", close).rows[1]
    assert passed.passed, passed.reason
    right = passed.regression_decision
    assert right["mae"]["verdict"] == right["rmse"]["verdict"] == "passed" and right["row_error"] < right["row_bound"]
    assert right["rmse"]["reference"] == pytest.approx(refused.rows[1].regression_decision["rmse"]["reference"])


def test_a_worse_candidate_is_refused_on_its_mae_and_rmse_change(tmp_path):
    """Every prediction 6 further from its label (a fifth of the value bound): MAE and RMSE rise beyond 0.02 label
    std (about 1.5) with their lower bounds above it."""
    _, _, weights, _ = _diabetes()
    worse = weights.copy()
    worse[-1, 0] = 6.0
    row = _judge(tmp_path, worse, away=True).rows[1]
    decision = row.regression_decision
    assert decision["mae"]["verdict"] == "refused" and decision["mae"]["low"] > decision["mae"]["allowed"]
    assert decision["rmse"]["verdict"] == "refused", decision["rmse"]
    assert "MAE on output 'logits'" in row.reason and "RMSE on output 'logits'" in row.reason, row.reason


def test_without_labels_the_row_bound_is_a_share_of_the_labels_spread():
    """No labels: the SavedModel's predictions are the labels, its own MAE is 0, the bound is 0.1 x their std."""
    truth = np.linspace(0.0, 10.0, 400)[:, None]
    decision = decide_regression(truth, truth + 0.01, truth, float(np.std(truth)), 0.02, 0.99, 0.1, 0.95)
    assert decision.row_bound == pytest.approx(0.1 * np.std(truth)) and decision.verdict == "passed"


def test_the_per_row_rule_is_a_binomial_statement_that_few_rows_cannot_make():
    """The 99th percentile within the bound is proved only by enough rows: none of 106 rows over it is undecided
    (368 rows would decide: 0.99^368 < 0.025), none of 400 passes; 3 of 200 over is undecided, 10 of 200
    refuses (more than 1 in 100 at 95 %), whatever the point estimate of the percentile says."""
    truth = np.linspace(0.0, 10.0, 106)[:, None]
    few = decide_regression(truth, truth + 0.01, truth, float(np.std(truth)), 0.02, 0.99, 0.1, 0.95)
    assert (few.row_verdict, few.rows_over_bound, few.row_rows_to_decide) == ("undecided", 0, 368)
    assert few.verdict == "undecided" and "106 rows cannot show at 95 % confidence" in few.describe("y")[0]
    assert row_share_verdict(0, 400, 0.01, 0.975) == ("passed", None)
    verdict, needed = row_share_verdict(3, 200, 0.01, 0.975)
    assert verdict == "undecided" and needed is not None and needed > 200
    assert row_share_verdict(10, 200, 0.01, 0.975) == ("refused", None)
    truth = np.linspace(0.0, 10.0, 200)[:, None]
    moved = truth + 0.01
    moved[::20] += 5.0  # 10 of 200 rows moved by half the labels' range
    refused = decide_regression(truth, moved, truth, float(np.std(truth)), 0.02, 0.99, 0.1, 0.95)
    assert refused.row_verdict == "refused" and refused.rows_over_bound == 10
    assert "10 of 200 rows over it: refused" in refused.describe_rows("y")
    assert row_share_verdict(1, 50, 0.0, 0.975) == ("refused", None)  # quantile 1: every row within
