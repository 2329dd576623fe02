"""Gates that fit the artifact: one comparison scaled to each output's range (serve-check included), bounded
value errors for quantized modes, saturation, near-tie flips on small sets, and single stages that record
their own failure. Real ONNX files (built with onnx.helper), real servers, real LiteRT."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.pipeline.exported import export_endpoint
from tfship.core.contract import Signature, TensorSpec
from tfship.pipeline.config import load_config
from tfship.pipeline.conversion.artifacts import Artifact
from tfship.pipeline.gate.compare import Tolerance, compare_outputs
from tfship.pipeline.gate.serve_check import ServeTarget, serve_check
from tfship.pipeline.gate.validate import tolerance_for, validate_artifacts


def _linear_onnx(folder: Path, weights: np.ndarray, bias: np.ndarray, argmax: bool = True) -> Path:
    """`<folder>/model.onnx`: logits = x @ weights + bias (float32 [-1, C]) and class_id = argmax (int64 [-1])."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["logits"])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", weights.shape[1]])]
    if argmax:
        nodes.append(helper.make_node("ArgMax", ["logits"], ["class_id"], axis=1, keepdims=0))
        outputs.append(helper.make_tensor_value_info("class_id", TensorProto.INT64, ["n"]))
    graph = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                               ["n", weights.shape[0]])],
                              outputs, [numpy_helper.from_array(weights.astype(np.float32), "w"),
                                        numpy_helper.from_array(bias.astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "model.onnx"))
    return folder / "model.onnx"


def test_serve_check_tolerance_follows_the_output_range(tmp_path):
    """A correct ONNX 1.3e-5 off on outputs around 12.6 passes (a flat 1e-5 would refuse it); 2e-3 off is
    left out naming the output, its error and the bound."""
    _linear_onnx(tmp_path / "repo" / "m" / "1", np.eye(3), np.full(3, 12.6), argmax=False)
    inputs = {"x": np.random.default_rng(0).uniform(-0.1, 0.1, (40, 3)).astype(np.float32)}
    served = inputs["x"] + np.float32(12.6)
    target = ServeTarget("onnx", "onnx", tolerance_for("float32", load_config().parity))
    close = serve_check(tmp_path / "repo", "m", 1, inputs, {"logits": served + 1.3e-5}, [target],
                        batch_sizes=(1, 7, 32))
    assert close.passed and close.artifacts["onnx"].requests == 3
    assert 1.2e-5 < close.artifacts["onnx"].max_abs_error < 1.5e-5
    far = serve_check(tmp_path / "repo", "m", 1, inputs, {"logits": served + 2e-3}, [target], required=("onnx",))
    assert not far.passed and set(far.left_out) == {"onnx"}
    assert "output 'logits'" in far.left_out["onnx"] and "atol 1e-05*12.7" in far.left_out["onnx"]


def test_quantized_modes_bound_every_float_output_by_its_range():
    """A dynamic-range output 0.75 off on values around 12 for 2,644 of 65,536 values fails its 2 % bound."""
    settings = load_config(None, {"validate.float32.atol": 1.0}).parity  # a loosened float32 atol changes nothing here
    rng = np.random.default_rng(1)
    want = rng.uniform(11.0, 12.5, (64, 1024)).astype(np.float32)
    got = want.copy()
    got.flat[rng.choice(want.size, 2644, replace=False)] += 0.75
    (row,) = compare_outputs({"attention": got}, {"attention": want}, tolerance_for("dynamic_range", settings))
    assert not row.passed and row.output == "attention" and "2644 of 65536 elements" in row.detail
    assert row.max_abs_error == pytest.approx(0.75, abs=1e-3) and row.tolerance.startswith("atol 0.02*12.5")
    (ok,) = compare_outputs({"attention": want + 0.1}, {"attention": want}, tolerance_for("dynamic_range", settings))
    assert ok.passed


def _contract(features: int, classes: int) -> Signature:
    return Signature.of("serving_default", (TensorSpec(name="x", dtype="float32", shape=(None, features)),),
                        (TensorSpec(name="logits", dtype="float32", shape=(None, classes)),
                         TensorSpec(name="class_id", dtype="int64", shape=(None,))))


def _small_set(near_tie_margin: float, rows: int = 70) -> dict[str, np.ndarray]:
    """`rows` rows of [a, b, c]: classes clearly apart (|a - b| >= 0.5) except row 0, where a - b = margin."""
    rng = np.random.default_rng(2)
    x = np.zeros((rows, 3), np.float32)
    x[:, 0] = rng.uniform(-1.0, 1.0, rows)
    x[:, 1] = x[:, 0] + rng.choice([-1.0, 1.0], rows) * rng.uniform(0.5, 1.5, rows)
    x[0, :2] = [0.3 + near_tie_margin, 0.3]
    return {"x": x}


def _judge(tmp_path: Path, inputs, weights: np.ndarray, bias: np.ndarray):
    reference = _linear_onnx(tmp_path / "reference", np.eye(3, 2), np.zeros(2))
    candidate = _linear_onnx(tmp_path / "candidate", weights, bias)
    labels = np.argmax(inputs["x"][:, :2], axis=1)  # the reference is right on every row
    report = validate_artifacts(Artifact("saved_model", "onnx", "float32", reference),
                                [Artifact("tflite_dynamic_range", "onnx", "dynamic_range", candidate)],
                                _contract(3, 2), inputs, labels, load_config().parity)
    return report.rows[1]


def test_near_tie_flip_on_seventy_rows_is_a_tie_not_a_regression(tmp_path):
    """One flip in 70 rows is 1.43 points (over the 1-point rule); its margin 0.004 is within twice the
    artifact's measured error bound (0.01), so it is a tie and the artifact passes, both counts reported."""
    row = _judge(tmp_path, _small_set(0.004), np.eye(3, 2), np.array([0.0, 0.01]))
    assert row.flips == 1 and row.tie_flips == 1 and row.error_bound == pytest.approx(0.01, rel=1e-3)
    assert row.metric == pytest.approx(100 * 69 / 70) and row.tie_adjusted_metric == 100.0
    assert row.passed, row.reason


def test_flip_beyond_the_error_bound_on_seventy_rows_is_a_regression(tmp_path):
    """A row-local error (feature c only on row 0, margin 1.0) flips one row: not a tie. One row of 70 cannot
    tell a 1-point drop from a 5-point one: the accuracy decision is undecided (bounds and the rows that would
    decide reported), and the logit off by 2 still refuses the file by its value bound."""
    inputs = _small_set(1.0)
    inputs["x"][0, 2] = 1.0
    weights = np.eye(3, 2)
    weights[2, 1] = 2.0
    row = _judge(tmp_path, inputs, weights, np.zeros(2))
    assert row.flips == 1 and row.tie_flips == 0 and not row.passed
    assert "output 'logits' max error 2 outside" in row.reason, row.reason
    decision = row.accuracy_decision
    assert decision["verdict"] == "undecided" and decision["rows"] == 70 and decision["rows_to_decide"] > 70
    assert decision["low"] < 0.01 < decision["high"] and "1.43 points" in row.undecided, row.undecided


def _log_softmax_saved_model(folder: Path) -> Path:
    """Input `x` f32 [-1, 4] -> `log_probs` = log_softmax(x @ w) with logits spread far beyond 16."""
    import keras
    import tensorflow as tf

    inputs = keras.Input((4,), name="x")
    dense = keras.layers.Dense(5, name="spread", kernel_initializer=keras.initializers.Constant(
        np.array([[12, -12, 6, -6, 0]] * 4, np.float32) / 2), use_bias=False)
    model = keras.Model(inputs, dense(inputs))
    return export_endpoint(model, folder, lambda x: {"log_probs": tf.nn.log_softmax(model(x, training=False))},
                           [tf.TensorSpec([None, 4], tf.float32, name="x")])


@pytest.mark.slow
def test_int8_log_softmax_saturation_is_named_even_with_perfect_top1(tmp_path):
    from tfship.tflite.convert import convert_tflite
    from tfship.tflite.modes import TfliteMode, TfliteOptions

    saved_model = _log_softmax_saved_model(tmp_path / "sm")
    x = np.random.default_rng(3).uniform(0.2, 1.0, (64, 4)).astype(np.float32)
    done = convert_tflite(saved_model, tmp_path / "q" / "model_int8.tflite", TfliteOptions(TfliteMode.INT8),
                          {"x": x}, 240.0)
    assert done.status == "produced", done.reason
    contract = Signature.of("serving_default", (TensorSpec(name="x", dtype="float32", shape=(None, 4)),),
                            (TensorSpec(name="log_probs", dtype="float32", shape=(None, 5)),))
    settings = load_config(None, {"validate.int8.atol": 10.0}).parity  # even a very loose bound
    report = validate_artifacts(Artifact("saved_model", "saved_model", "float32", saved_model),
                                [Artifact("tflite_int8", "tflite", "int8", done.path)], contract, {"x": x}, None,
                                settings)
    row = report.rows[1]
    assert row.top1_agreement == 100.0 and not row.passed
    assert "output 'log_probs'" in row.reason and "saturated" in row.reason and "-15.9375" in row.reason, row.reason
    assert report.passed and report.left_out.keys() == {"tflite_int8"}  # optional: left out, the gate goes on


def test_string_tensors_reach_onnx_as_text_through_the_serving_runtime(tmp_path):
    """The gate feeds strings as the server does (object arrays of UTF-8 bytes); the ONNX runtime hands
    ONNX Runtime text, so an identity model answers the same words (not "b'...'")."""
    from tfship.pipeline.conversion.artifacts import open_runner

    graph = helper.make_graph([helper.make_node("Identity", ["city"], ["echo"])], "echo",
                              [helper.make_tensor_value_info("city", TensorProto.STRING, ["n", 1])],
                              [helper.make_tensor_value_info("echo", TensorProto.STRING, ["n", 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (tmp_path / "v").mkdir()
    onnx.save(model, str(tmp_path / "v" / "model.onnx"))
    runner = open_runner(Artifact("onnx", "onnx", "float32", tmp_path / "v" / "model.onnx"))
    words = np.array([["Zürich"], ["Oslo"]])
    (row,) = compare_outputs(runner({"city": words}), {"echo": words}, Tolerance(1e-5, 1e-5))
    assert row.passed and row.exact, row.detail


def test_rounding_at_the_edge_of_a_quantized_range_is_not_a_saturation():
    """An int8 softmax reads 0.9996 and 0.9999 back as 255/256 (within one step of its grid) and a few logits
    a little below the calibrated range come back at its edge: not saturated; log-probabilities down to -26
    read back as -15.9375 are."""
    probabilities = np.array([[0.9996, 0.0004], [0.9999, 0.0001], [0.6, 0.4]], np.float32)
    on_grid = np.array([[255, 0], [255, 0], [154, 102]], np.float32) / 256
    (row,) = compare_outputs({"p": on_grid}, {"p": probabilities}, Tolerance(0.1, 0.0))
    assert row.passed, row.detail
    logits = np.linspace(-10.1, 10.7, 300).astype(np.float32).reshape(100, 3)  # three held-out values a little
    clipped = np.maximum(np.round(logits / 0.08) * 0.08, -9.44)                 # below the calibrated range
    (row,) = compare_outputs({"logits": clipped}, {"logits": logits}, Tolerance(0.1, 0.0))
    assert row.passed, row.detail  # clipped by 0.66 of a 10.7 range: the value bound judges it, within 10 %
    log_probs = np.array([[-1e-3, -26.0, -6.5], [-5e-3, -20.8, -5.2]], np.float32)
    pinned = np.array([[0.0, -15.9375, -6.375], [0.0, -15.9375, -5.25]], np.float32)
    (row,) = compare_outputs({"log_probs": pinned}, {"log_probs": log_probs}, Tolerance(10.0, 0.0))
    assert not row.passed and "saturated" in row.detail and "exactly -15.9375" in row.detail
