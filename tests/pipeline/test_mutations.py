"""The float32 bound, widened by measured implementation noise, still catches faults just above it. Three
architecture kinds (a conv net with BatchNorm, a Transformer block, an MLP), each converted to TFLite float32
unmodified (published) and with one fault injected (refused, naming the output):

* one weight tensor scaled by 1 + 1e-3;
* one bias dropped (set to zero);
* two output channels of a layer swapped (its kernel columns and bias entries; the next layer is unchanged);
* an activation replaced (ReLU by leaky ReLU 0.01 in the conv net and the MLP; exact GELU by its tanh
  approximation in the Transformer).

Injection point: the Keras model's weights (or activation) are changed, then that model is exported and
converted by TensorFlow's own TFLite converter, exactly as an unmodified file is: the faulty file is a real
converted file whose graph carries the fault. The margin printed (and quoted in docs/pipeline.md) is the
smallest caught fault's error over the largest correct error, both in units of each output's bound.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfship.core.saved_model import read_signatures
from tfship.pipeline.config import load_config
from tfship.pipeline.conversion.artifacts import Artifact
from tfship.pipeline.gate.validate import validate_artifacts

ROWS = 64


def _biases(model, rng) -> None:
    """Trained-looking biases (Keras starts them at zero, which would make dropping one a no-op)."""
    for layer in model.layers:
        for weight in getattr(layer, "weights", []):
            if weight.path.endswith("bias"):
                weight.assign(rng.normal(0.0, 0.1, weight.shape).astype(np.float32))


def _conv_net():
    import keras

    inputs = keras.Input((16, 16, 3), name="image")
    x = keras.layers.Conv2D(8, 3, name="conv1")(inputs)
    x = keras.layers.BatchNormalization(name="bn1")(x)
    x = keras.layers.Activation("relu", name="act1")(x)
    x = keras.layers.Conv2D(16, 3, name="conv2")(x)
    x = keras.layers.BatchNormalization(name="bn2")(x)
    x = keras.layers.Activation("relu", name="act2")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(10, name="head")(x))
    rng = np.random.default_rng(1)
    for name in ("bn1", "bn2"):  # moving statistics as after training
        gamma, beta, mean, variance = model.get_layer(name).get_weights()
        model.get_layer(name).set_weights([rng.uniform(0.5, 1.5, gamma.shape), rng.normal(0, 0.1, beta.shape),
                                           rng.normal(0, 0.2, mean.shape), rng.uniform(0.5, 2.0, variance.shape)])
    return model, {"image": rng.normal(size=(ROWS, 16, 16, 3)).astype(np.float32)}, {
        "scale": "conv2", "bias": "conv1", "swap": "conv1", "activation": ("act1", "leaky")}


def _transformer():
    import keras

    inputs = keras.Input((8, 16), name="sequence")
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8, name="attention")(inputs, inputs)
    x = keras.layers.LayerNormalization(name="norm1")(inputs + attended)
    hidden = keras.layers.Dense(32, activation="gelu", name="ffn1")(x)
    x = keras.layers.LayerNormalization(name="norm2")(x + keras.layers.Dense(16, name="ffn2")(hidden))
    model = keras.Model(inputs, keras.layers.Dense(4, name="head")(keras.layers.GlobalAveragePooling1D()(x)))
    rng = np.random.default_rng(2)
    return model, {"sequence": rng.normal(size=(ROWS, 8, 16)).astype(np.float32)}, {
        "scale": "ffn2", "bias": "ffn1", "swap": "ffn1", "activation": ("ffn1", "tanh_gelu")}


def _mlp():
    import keras

    inputs = keras.Input((20,), name="features")
    x = keras.layers.Dense(64, activation="relu", name="dense1")(inputs)
    x = keras.layers.Dense(64, activation="relu", name="dense2")(x)
    model = keras.Model(inputs, keras.layers.Dense(5, name="head")(x))
    rng = np.random.default_rng(3)
    return model, {"features": rng.normal(size=(ROWS, 20)).astype(np.float32)}, {
        "scale": "dense2", "bias": "dense1", "swap": "dense1", "activation": ("dense2", "leaky")}


def _mutate(model, fault: str, where) -> None:
    import keras

    if fault == "scale":
        kernel, *rest = model.get_layer(where).get_weights()
        model.get_layer(where).set_weights([kernel * np.float32(1.0 + 1e-3), *rest])
    elif fault == "bias":
        kernel, bias = model.get_layer(where).get_weights()
        model.get_layer(where).set_weights([kernel, np.zeros_like(bias)])
    elif fault == "swap":
        kernel, bias = model.get_layer(where).get_weights()
        kernel[..., [0, 1]], bias[[0, 1]] = kernel[..., [1, 0]], bias[[1, 0]]
        model.get_layer(where).set_weights([kernel, bias])
    else:
        layer, kind = where
        model.get_layer(layer).activation = (
            (lambda x: keras.activations.leaky_relu(x, negative_slope=0.01)) if kind == "leaky"
            else (lambda x: keras.activations.gelu(x, approximate=True)))


def _export_and_convert(model, folder: Path) -> tuple[Path, Path]:
    """(SavedModel, TFLite float32 converted from it by TensorFlow's converter)."""
    import keras
    import tensorflow as tf

    spec = [tf.TensorSpec([None, *model.inputs[0].shape[1:]], tf.float32, name=model.inputs[0].name)]
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", lambda x: {"scores": model(x, training=False)}, input_signature=spec)
    archive.write_out(str(folder), verbose=False)
    converted = tf.lite.TFLiteConverter.from_saved_model(str(folder)).convert()
    (folder / "model.tflite").write_bytes(converted)
    return folder, folder / "model.tflite"


FAULTS = ("scale", "bias", "swap", "activation")


@pytest.mark.slow
@pytest.mark.parametrize("architecture", [_conv_net, _transformer, _mlp], ids=["conv_bn", "transformer", "mlp"])
def test_faults_just_above_float32_noise_are_refused_and_correct_files_published(architecture, tmp_path):
    import keras

    keras.utils.set_random_seed(0)
    model, inputs, places = architecture()
    _biases(model, np.random.default_rng(9))
    reference, correct = _export_and_convert(model, tmp_path / "reference")
    originals = [layer.get_weights() for layer in model.layers]
    candidates = [Artifact("tflite_float32", "tflite", "float32", correct)]
    for fault in FAULTS:
        _mutate(model, fault, places[fault])
        _, faulty = _export_and_convert(model, tmp_path / fault)
        candidates.append(Artifact(f"fault_{fault}", "tflite", "float32", faulty))
        model = architecture()[0]  # a fresh copy for the next fault, same weights as the reference
        for layer, weights in zip(model.layers, originals, strict=True):
            layer.set_weights(weights)
    report = validate_artifacts(Artifact("saved_model", "saved_model", "float32", reference), candidates,
                                read_signatures(reference)["serving_default"], inputs, None, load_config().parity)
    rows = {row.artifact: row for row in report.rows}
    assert rows["tflite_float32"].passed, rows["tflite_float32"].reason
    for fault in FAULTS:
        row = rows[f"fault_{fault}"]
        assert not row.passed and "output 'scores'" in row.reason, (fault, row.reason)
    bound = _bound(report)
    correct_error = max(rows[name].outputs[0].max_abs_error for name in ("saved_model", "tflite_float32"))
    fault_errors = {f: rows[f"fault_{f}"].outputs[0].max_abs_error for f in FAULTS}
    caught, correct_share = min(fault_errors.values()) / bound, correct_error / bound
    print(f"\n{architecture.__name__[1:]}: bound {bound:.3g} (implementation noise "
          f"{report.implementation_noise['scores'].max_abs:.2g}); largest correct error {correct_error:.3g} "
          f"({correct_share:.3g} x bound); faults: " + ", ".join(
              f"{f} {v:.3g} ({v / bound:.3g} x)" for f, v in fault_errors.items())
          + f"; margin (smallest fault / largest correct error) {caught / correct_share:.3g}")
    assert caught > 1.0 > correct_share


def _bound(report) -> float:
    """The largest absolute bound on `scores` (atol * scale + rtol * max|r| + the noise terms), from its row."""
    settings = load_config().parity
    noise = report.noise["scores"].max_abs
    implementation = report.implementation_noise["scores"].max_abs
    scale = float(report.rows[0].outputs[0].tolerance.split("*")[1].split()[0])
    return (settings.float32.atol * scale + settings.float32.rtol * scale + settings.noise_multiplier * noise
            + settings.implementation_noise_multiplier * implementation)
