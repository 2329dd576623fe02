"""Accuracy drops and flipped decisions are decided with confidence: exact binomial (Clopper-Pearson) bounds,
three verdicts (refused, passed, undecided), the rows that would decide. A real 5-point drop on 500 rows is
refused; one flip on 32 rows is undecided and published by default (`validate.undecided`), left out when asked.
Real ONNX files through ONNX Runtime; the bounds are checked against scipy's own binomial test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest

from tfship.pipeline.config import load_config
from tfship.pipeline.conversion.artifacts import Artifact
from tfship.pipeline.gate.confidence import clopper_pearson, decide_drop, decide_share
from tfship.pipeline.gate.validate import validate_artifacts

from .test_gates import _contract, _linear_onnx


@pytest.mark.parametrize(("successes", "trials"), [(0, 32), (1, 32), (25, 500), (190, 500), (500, 500)])
def test_clopper_pearson_matches_scipys_exact_binomial_interval(successes, trials):
    """Each one-sided bound at 97.5 % is an end of scipy's two-sided exact 95 % interval."""
    low, high = clopper_pearson(successes, trials, 0.975)
    reference = binomtest(successes, trials).proportion_ci(confidence_level=0.95, method="exact")
    assert (low, high) == pytest.approx((reference.low, reference.high), abs=1e-12)


def test_drop_verdicts_on_both_sides_of_the_allowance():
    """5 points on 500 rows: refused. 1 row of 32: undecided with the rows that would decide. No flip on 360
    rows: undecided (736 rows are needed to show <= 0.5 points at 95 %); on 800 rows: passed."""
    refused = decide_drop(25, 0, 500, 0.005, 0.95)
    assert refused.verdict == "refused" and refused.low > 0.005, refused
    one_row = decide_drop(1, 0, 32, 0.005, 0.95)
    assert one_row.verdict == "undecided" and one_row.low < 0.005 < one_row.high and one_row.rows_to_decide > 32
    assert "undecided" in one_row.describe("accuracy drop") and "rows would decide" in one_row.describe("drop")
    assert decide_drop(0, 0, 360, 0.005, 0.95).rows_to_decide == 736
    assert decide_drop(0, 0, 800, 0.005, 0.95).verdict == "passed"
    assert decide_share(190, 500, 0.10, 0.95).verdict == "refused"  # 38 % flips against a 10 % allowance


CLASSES = 10


def _flipping_set(rows: int, flipped: int) -> dict[str, np.ndarray]:
    """`rows` rows of 10 logits and a trigger: class 0 ahead of class 1 by 0.5..1.5, the others far behind;
    the trigger is 1 on the first `flipped` rows (a candidate weighting it by 2 towards class 1 flips exactly
    those, and changes nothing else: its error is one logit of `flipped` rows)."""
    rng = np.random.default_rng(3)
    x = np.zeros((rows, CLASSES + 1), np.float32)
    base = rng.uniform(-1.0, 1.0, rows)
    x[:, 0] = base + rng.uniform(0.5, 1.5, rows)
    x[:, 1] = base
    x[:, 2:CLASSES] = base[:, None] - 2.0 - rng.uniform(0.0, 1.0, (rows, CLASSES - 2))
    x[:flipped, CLASSES] = 1.0
    return {"x": x}


def _judge(tmp_path: Path, inputs: dict[str, np.ndarray], **settings):
    reference = _linear_onnx(tmp_path / "reference", np.eye(CLASSES + 1, CLASSES), np.zeros(CLASSES))
    weights = np.eye(CLASSES + 1, CLASSES)
    weights[CLASSES, 1] = 2.0
    candidate = _linear_onnx(tmp_path / "candidate", weights, np.zeros(CLASSES))
    parity = load_config(None, {"validate.int8.atol": 10.0}).parity.model_copy(update=settings)  # bound vacuous
    labels = np.zeros(len(inputs["x"]), np.int64)  # the reference is right on every row
    report = validate_artifacts(Artifact("saved_model", "onnx", "float32", reference),
                                [Artifact("tflite_int8", "onnx", "int8", candidate)], _contract(CLASSES + 1, CLASSES),
                                inputs, labels, parity)
    return report.rows[1]


def test_a_five_point_drop_on_500_rows_is_refused_whatever_the_value_tolerance(tmp_path):
    row = _judge(tmp_path, _flipping_set(500, 25))
    assert row.flips == 25 and row.tie_flips == 0 and not row.passed
    assert row.accuracy_decision["verdict"] == "refused" and row.accuracy_decision["low"] > 0.01, row
    assert "accuracy drop on output 'class_id' 5.00 points" in row.reason and "refused" in row.reason, row.reason


def test_one_flip_on_32_rows_is_undecided_published_by_default_left_out_when_asked(tmp_path):
    row = _judge(tmp_path, _flipping_set(32, 1))
    assert row.passed, row.reason
    assert row.accuracy_decision["verdict"] == "undecided" and row.accuracy_decision["rows_to_decide"] > 32
    assert "3.12 points" in row.undecided and "rows would decide" in row.undecided, row.undecided
    strict = _judge(tmp_path / "strict", _flipping_set(32, 1), undecided="leave_out")
    assert not strict.passed and "validate.undecided = 'leave_out'" in strict.reason, strict.reason


def _counting_onnx(path: Path, weights: np.ndarray, bias: np.ndarray) -> Path:
    """scores = x @ w + b (float32 [N, 4]) and positives = how many scores are > 0 (int64 [N]): an integer head
    derived from floats."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["scores"]),
             helper.make_node("Greater", ["scores", "zero"], ["above"]),
             helper.make_node("Cast", ["above"], ["flags"], to=TensorProto.INT64),
             helper.make_node("ReduceSum", ["flags", "axis"], ["positives"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "counting", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("positives", TensorProto.INT64, ["n"])],
        [numpy_helper.from_array(weights.astype(np.float32), "w"), numpy_helper.from_array(bias.astype(np.float32), "b"),
         numpy_helper.from_array(np.zeros((), np.float32), "zero"), numpy_helper.from_array(np.array([1]), "axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def test_an_integer_head_is_judged_by_agreement_in_quantized_files(tmp_path):
    """A count of positive scores in an int8 file: weight errors of 0.01 move the count on the few rows near
    zero (published; a float32 file with the same difference is refused, bit for bit); a bias shift moving
    it on ~40 % of the rows is refused, naming the output."""
    from tfship.core.contract import Signature, TensorSpec

    rng = np.random.default_rng(6)
    weights = rng.normal(size=(4, 4))
    x = {"x": rng.normal(size=(500, 4)).astype(np.float32)}
    contract = Signature.of("serving_default", (TensorSpec(name="x", dtype="float32", shape=(None, 4)),),
                            (TensorSpec(name="scores", dtype="float32", shape=(None, 4)),
                             TensorSpec(name="positives", dtype="int64", shape=(None,))))
    reference = _counting_onnx(tmp_path / "reference" / "model.onnx", weights, np.zeros(4))
    near = _counting_onnx(tmp_path / "near" / "model.onnx", weights + 0.01 * rng.normal(size=(4, 4)), np.zeros(4))
    shifted = _counting_onnx(tmp_path / "shifted" / "model.onnx", weights, np.full(4, 0.6))
    parity = load_config(None, {"validate.int8.atol": 10.0}).parity.model_copy(
        update={"task": "regression", "prediction_output": "scores"})
    report = validate_artifacts(Artifact("saved_model", "onnx", "float32", reference),
                                [Artifact("tflite_int8", "onnx", "int8", near),
                                 Artifact("int8_shifted", "onnx", "int8", shifted),
                                 Artifact("float32_near", "onnx", "float32", near)], contract, x, None, parity)
    rows = {row.artifact: row for row in report.rows}
    counts = {name: rows[name].outputs[1] for name in rows}
    assert 0 < counts["tflite_int8"].error_histogram[10] < 25, counts["tflite_int8"]  # a few rows move by one
    assert rows["tflite_int8"].passed, rows["tflite_int8"].reason
    assert not rows["int8_shifted"].passed and "output 'positives'" in rows["int8_shifted"].reason
    assert "refused" in rows["int8_shifted"].reason and "rows differing" in rows["int8_shifted"].reason
    assert not rows["float32_near"].passed and "values differ" in counts["float32_near"].detail


def test_multi_label_decisions_can_fail_within_a_loose_value_bound():
    """A sigmoid [N, 6] output: an int8 file within its 0.1 value bound that moves label 0 across 0.5 on most
    rows is refused by its decisions; one off by 1e-3 everywhere passes."""
    from tfship.pipeline.gate.compare import compare_outputs
    from tfship.pipeline.gate.validate import tolerance_for

    rng = np.random.default_rng(4)
    want = rng.uniform(0.0, 1.0, (500, 6)).astype(np.float32)
    want[:, 0] = rng.uniform(0.46, 0.54, 500)
    flipped = want.copy()
    flipped[:, 0] = 1.0 - want[:, 0]  # every label-0 decision crosses 0.5, by at most 0.08 < 0.1
    tolerance = tolerance_for("int8", load_config().parity)
    (bad,) = compare_outputs({"labels": flipped}, {"labels": want}, tolerance)
    assert not bad.passed and "multi-label decisions at 0.5" in bad.detail and "refused" in bad.detail, bad
    assert "elements outside" not in bad.detail  # the value bound alone would have passed it
    (good,) = compare_outputs({"labels": want + np.float32(1e-3)}, {"labels": want}, tolerance)
    assert good.passed, good.detail
