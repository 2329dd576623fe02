"""ONNX conversion of TensorFlow's `Erfc` and the reasons a failed conversion gives.

- Exact GELU (`keras.activations.gelu(approximate=False)`, ConvNeXt's) lowers to `Erfc`, which tf2onnx 1.17
  cannot convert; `onnx_format.tf2onnx_lean` writes it as `1 - Erf(x)`. A Dense + exact GELU model's
  ONNX file is proven against its SavedModel by the parity gate's own comparison and float32 tolerance.
- A conversion that fails names the artifact's own file, never its temporary staging name
  (`.model.<hex>.onnx`), in the error and in the left-out reason's first line.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfship.core.errors import ConversionError
from tfship.core.saved_model import read_signatures
from tfship.onnx_format.convert import convert_to_onnx
from tfship.pipeline.config import ValidateSection
from tfship.pipeline.conversion.artifacts import SAVED_MODEL, Artifact, open_runner
from tfship.pipeline.gate.compare import compare_outputs, failures
from tfship.pipeline.gate.validate import tolerance_for
from tfship.pipeline.orchestration.reasons import first_line

OPSET = 17


def _exact_gelu_saved_model(folder):
    import keras

    keras.utils.set_random_seed(3)
    inputs = keras.Input((4,), name="x")
    gelu = keras.layers.Activation(lambda t: keras.activations.gelu(t, approximate=False), name="exact_gelu")
    model = keras.Model(inputs, gelu(keras.layers.Dense(6, name="dense")(inputs)))
    model.export(str(folder), verbose=False)
    return folder


def test_exact_gelu_converts_through_erfc_and_matches_the_saved_model(tmp_path):
    import onnx

    saved_model = _exact_gelu_saved_model(tmp_path / "gelu")
    contract = read_signatures(saved_model)["serving_default"]
    # wide inputs: GELU's far negative side is where erfc is tiny and 1 - erf(x) loses its digits
    inputs = {"x": (np.random.default_rng(4).standard_normal((64, 4)) * 6).astype(np.float32)}
    done = convert_to_onnx(saved_model, tmp_path / "gelu" / "model.onnx", contract, OPSET,
                           {"x": inputs["x"][:8]}, timeout_s=300)
    ops = [node.op_type for node in onnx.load(str(done.path)).graph.node]
    assert "Erf" in ops and "Erfc" not in ops, ops
    reference = open_runner(Artifact(SAVED_MODEL, "saved_model", "float32", saved_model))(inputs)
    converted = open_runner(Artifact("onnx", "onnx", "float32", done.path))(inputs)
    assert float(np.min(reference[next(iter(reference))])) < -0.1  # GELU's negative lobe is exercised
    rows = compare_outputs(converted, reference, tolerance_for("float32", ValidateSection()))
    assert not failures(rows), failures(rows)


class _Unconvertible(tf.Module):
    """x f32 [-1, 3] -> lgamma(x) f32 [-1, 3]: `Lgamma` has no tf2onnx handler."""

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def serve(self, x):
        return {"y": tf.math.lgamma(x)}


@pytest.mark.parametrize("stem", ["model", "model.score"])
def test_a_failed_conversion_names_the_artifact_never_its_staging_file(tmp_path, stem):
    module = _Unconvertible()
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures={"serving_default": module.serve})
    contract = read_signatures(tmp_path / "sm")["serving_default"]
    with pytest.raises(ConversionError) as caught:
        convert_to_onnx(tmp_path / "sm", tmp_path / "sm" / f"{stem}.onnx", contract, OPSET,
                        {"x": np.ones((2, 3), np.float32)}, timeout_s=300)
    message = str(caught.value)
    assert "Lgamma" in message and f"{stem}.onnx" in message and f".{stem}." not in message, message
    line = first_line(f"refused: {message}")
    assert line.startswith(f"refused: {stem}.onnx: ") and "Lgamma" in line and "/" not in line, line
    assert not list((tmp_path / "sm").glob(".*")), "staging files are removed"


@pytest.mark.parametrize("text", [
    "onnx: /tmp/run/artifacts/.model.score.0a1b2c3d.onnx: onnx.checker failed",
    "onnx: /tmp/run/artifacts/.model.0a1b2c3d.slim.onnx: onnx.checker failed"])
def test_first_line_turns_temporary_names_back_into_the_artifacts(text):
    line = first_line(text)
    assert not any(part.startswith(".model") for part in line.split()), line
    assert line.startswith("onnx: model."), line
