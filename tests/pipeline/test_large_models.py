"""Models past the 2 GiB protobuf / FlatBuffer limits, exercised with a small model and a lowered limit.

`convert.size_limit_bytes` is lowered below a small SavedModel's weights: ONNX must take tf2onnx's
large-model path and come out as `model.onnx` + `model.onnx.data` that the checker, ONNX Runtime and the
serving `onnx` backend load by path, giving the SavedModel's answers; TFLite must be refused by name
before any converter process starts. At full size (> 2 GiB of weights) neither path was run here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfship.core.saved_model import saved_model_weight_bytes
from tfship.onnx_format.large_models import has_external_data, onnx_needs_external_data
from tfship.tflite.size_limit import FLATBUFFER_LIMIT_NAME, tflite_refusal


@pytest.fixture(scope="module")
def small_saved_model(tmp_path_factory) -> Path:
    """784 -> 64 -> 10 MLP SavedModel (`serving_default`: `x` float32 [-1, 784] -> `probabilities`)."""
    import tensorflow as tf

    folder = tmp_path_factory.mktemp("large") / "1"
    rng = np.random.default_rng(0)
    w1 = tf.Variable(rng.normal(size=(784, 64)).astype(np.float32) * 0.05)
    w2 = tf.Variable(rng.normal(size=(64, 10)).astype(np.float32) * 0.5)

    class Mlp(tf.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w2 = w1, w2

        @tf.function(input_signature=[tf.TensorSpec([None, 784], tf.float32, name="x")])
        def serve(self, x):
            return {"probabilities": tf.nn.softmax(tf.matmul(tf.nn.relu(tf.matmul(x, self.w1)), self.w2))}

    module = Mlp()
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})
    return folder


def test_limits_decide_before_converting(small_saved_model):
    weights = saved_model_weight_bytes(small_saved_model)
    assert weights > 784 * 64 * 4  # the variables are counted
    assert not onnx_needs_external_data(small_saved_model, 2**31 - 1)
    assert tflite_refusal(small_saved_model, 2**31 - 1) is None
    assert onnx_needs_external_data(small_saved_model, weights - 1)
    reason = tflite_refusal(small_saved_model, weights - 1)
    assert reason and str(weights) in reason and FLATBUFFER_LIMIT_NAME in reason and "not started" in reason


@pytest.mark.slow
def test_onnx_past_the_limit_is_written_and_served_with_external_data(small_saved_model, tmp_path):
    import tensorflow as tf

    from tfship.core.saved_model import read_signatures
    from tfship.onnx_format.convert import convert_to_onnx
    from tfship.serving.runtimes import REGISTRY, RuntimeOptions

    contract = read_signatures(small_saved_model)["serving_default"]
    x = np.random.default_rng(1).random((5, 784), dtype=np.float32)
    output = small_saved_model / "model.onnx"
    done = convert_to_onnx(small_saved_model, output, contract, 17, {"x": x}, 300.0, size_limit_bytes=1024)
    data = small_saved_model / "model.onnx.data"
    assert data.is_file() and has_external_data(output)
    assert output.stat().st_size < 784 * 64 * 4 < data.stat().st_size  # weights live in the data file
    assert done.size_bytes == output.stat().st_size + data.stat().st_size
    assert not [p.name for p in small_saved_model.iterdir() if p.name.startswith(".")]  # no staging left
    want = tf.saved_model.load(str(small_saved_model)).signatures["serving_default"](tf.constant(x))["probabilities"]
    runtime = REGISTRY.create("onnx", small_saved_model, RuntimeOptions(use_gpu=False))
    runtime.load()
    np.testing.assert_allclose(runtime.predict({"x": x})["probabilities"], want.numpy(), atol=1e-5)
