"""The float32 bound knows how far a second correct float32 implementation may stray: the SavedModel's own
float32 rounding error, measured against the same graph evaluated in float64, allowed
`validate.implementation_noise_multiplier` times. A mathematically identical model that sums in another order
is published; a model wrong by a weight scaled 1 + 1e-3 is still refused. Real SavedModels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfship.core.contract import Signature, TensorSpec
from tfship.pipeline.config import load_config
from tfship.pipeline.conversion.artifacts import Artifact
from tfship.pipeline.gate.float64 import float64_outputs
from tfship.pipeline.gate.parity_lines import judgement_lines
from tfship.pipeline.gate.parity_report import ParityReport
from tfship.pipeline.gate.validate import validate_artifacts

FEATURES = 4096


def _wave(folder: Path, weights: np.ndarray, halves: bool = False) -> Path:
    """`wave` = sin(100 * x @ w) (halves: the same sum taken as two half-length matmuls added: another
    summation order, the way another kernel library would block it)."""
    import tensorflow as tf

    class Wave(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(weights)

        @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32, name="x")])
        def serve(self, x):
            if halves:
                half = FEATURES // 2
                product = tf.matmul(x[:, :half], self.w[:half]) + tf.matmul(x[:, half:], self.w[half:])
            else:
                product = tf.matmul(x, self.w)
            return {"wave": tf.sin(100.0 * product)}

    module = Wave()
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})
    return folder


WAVE = Signature.of("serving_default", (TensorSpec(name="x", dtype="float32", shape=(None, FEATURES)),),
                    (TensorSpec(name="wave", dtype="float32", shape=(None, 16)),))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    rng = np.random.default_rng(0)
    weights = (rng.standard_normal((FEATURES, 16)) / 64).astype(np.float32)
    folder = tmp_path_factory.mktemp("implementation")
    x = rng.standard_normal((64, FEATURES)).astype(np.float32)
    return {"reference": _wave(folder / "reference", weights), "halves": _wave(folder / "halves", weights, True),
            "wrong": _wave(folder / "wrong", weights * np.float32(1.001)), "x": x}


def _judge(models, multiplier: float | None = None) -> ParityReport:
    settings = load_config().parity.model_copy(update={"batch_sizes": (64,)})  # no batch noise: one batch size
    if multiplier is not None:
        settings = settings.model_copy(update={"implementation_noise_multiplier": multiplier})
    return validate_artifacts(Artifact("saved_model", "saved_model", "float32", models["reference"]),
                              [Artifact("halves", "saved_model", "float32", models["halves"]),
                               Artifact("wrong", "saved_model", "float32", models["wrong"])],
                              WAVE, {"x": models["x"]}, None, settings)


def test_float64_evaluation_is_the_graph_widened(models):
    """The float64 graph answers in float64 and differs from the float32 SavedModel by its rounding only."""
    truth, why = float64_outputs(models["reference"], {"x": models["x"]}, 64)
    assert why == "" and truth["wave"].dtype == np.float64, why
    x64 = models["x"].astype(np.float64)
    import tensorflow as tf

    weights = tf.saved_model.load(str(models["reference"])).w.numpy().astype(np.float64)
    assert np.max(np.abs(truth["wave"] - np.sin(100.0 * x64 @ weights))) < 1e-9


def test_a_second_summation_order_is_published_and_a_real_fault_refused(models):
    """The split-sum model differs from the SavedModel beyond atol 1e-5 (no batch noise at one batch size) but
    within 4x the SavedModel's own float32 error against float64: published; weights x 1.001 refused naming
    the output; parity.json shows the noise, how it was measured, and each file's error against float64."""
    report = _judge(models)
    noise = report.implementation_noise["wave"]
    assert noise.max_abs > 1e-5 and "float64" in noise.method, noise
    halves, wrong = report.rows[1], report.rows[2]
    assert halves.outputs[0].max_abs_error > 1e-5 + report.noise["wave"].max_abs * 2, halves.outputs[0]
    assert halves.passed, halves.reason
    assert "implementation noise" in halves.outputs[0].tolerance, halves.outputs[0].tolerance
    assert not wrong.passed and wrong.reason.startswith("output 'wave'"), wrong.reason
    assert "float32 rounding error (against float64)" in wrong.reason, wrong.reason
    assert "validate.implementation_noise_multiplier" in wrong.reason, wrong.reason
    assert wrong.outputs[0].max_abs_error > 10 * 4 * noise.max_abs  # far beyond the bound, not a near miss
    record = report.to_json()
    assert record["implementation_noise"]["wave"]["max_abs"] == noise.max_abs
    assert 0 < record["artifacts"][1]["float64_errors"]["wave"] < 4 * noise.max_abs
    again = ParityReport.from_json(record)
    assert again.implementation_noise == report.implementation_noise
    lines = "\n".join(judgement_lines(record))  # report.md's parity judgement
    assert "### Parity judgement" in lines and "| wave |" in lines and "float64" in lines, lines
    assert "implementation noise" in lines and "| wrong | wave |" in lines and "FAIL" in lines, lines


def test_without_the_implementation_term_the_second_order_is_refused(models):
    """Multiplier 0 (the old bound: atol/rtol and batch noise only) refuses the correct split-sum model: the
    measured term is what publishes it."""
    report = _judge(models, multiplier=0.0)
    assert not report.rows[1].passed and "outside tolerance" in report.rows[1].reason, report.rows[1]


def test_a_graph_without_float64_kernels_is_reported_not_measured(tmp_path):
    """FusedBatchNormV3 has no float64 kernel: the evaluation says why, and the noise is 'not measured'."""
    import tensorflow as tf

    class Norm(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2, 2, 3], tf.float32, name="x")])
        def serve(self, x):
            ones, zeros = tf.ones([3]), tf.zeros([3])
            y, _, _ = tf.compat.v1.nn.fused_batch_norm(x, ones, zeros, zeros, ones, is_training=False)
            return {"y": y}

    module = Norm()
    tf.saved_model.save(module, str(tmp_path / "norm"), signatures={"serving_default": module.serve})
    truth, why = float64_outputs(tmp_path / "norm", {"x": np.ones((2, 2, 2, 3), np.float32)}, 2)
    assert truth is None and "does not run in float64" in why, why
