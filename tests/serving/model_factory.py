"""Builds the tiny digits-contract models the serving tests serve (SavedModel, TFLite, ONNX, warmup).

Contract (same as the pipeline's digits model): signature `serving_default`, input `image` float32
[-1, 8, 8, 1]; outputs `logits` float32 [-1, 10], `probabilities` float32 [-1, 10], `class_id` int64 [-1].
A second signature `scale` (input `x` float32 [-1, 3] -> `y` float32 [-1, 3]) exercises signature_name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def build_saved_model(version_dir: Path, seed: int = 0, bias: float = 0.0, onnx: bool = True,
                      tflite: bool = True) -> None:
    """Save a tiny keras model behind forward-only signatures into `version_dir` (SavedModel layout).

    With `onnx`, also write `model.onnx` for `serving_default` with tf2onnx (names = signature keys); with
    `tflite`, `model.tflite` (float32, dynamic batch, `serving_default` runner).
    """
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(10),
    ])

    class Module(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            # Track the backing tf.Variables, not Keras 3's wrappers (whose initializer keeps the
            # TFLite converter from freezing them: the artifact would read uninitialised variables).
            self.weights = [getattr(w, "value", w) for w in model.weights]
            self.bias = float(bias)

        @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.float32, name="image")])
        def serving_default(self, image):
            logits = model(image, training=False) + self.bias
            return {
                "logits": logits,
                "probabilities": tf.nn.softmax(logits),
                "class_id": tf.argmax(logits, axis=-1, output_type=tf.int64),
            }

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def scale(self, x):
            return {"y": x * 2.0 + self.bias}

    module = Module()
    tf.saved_model.save(module, str(version_dir),
                        signatures={"serving_default": module.serving_default, "scale": module.scale})
    if tflite:
        converter = tf.lite.TFLiteConverter.from_saved_model(str(version_dir), signature_keys=["serving_default"])
        (version_dir / "model.tflite").write_bytes(converter.convert())
    if onnx:
        import tf2onnx

        fn = module.serving_default
        tf2onnx.convert.from_function(fn, input_signature=fn.input_signature, opset=17,
                                      output_path=str(version_dir / "model.onnx"))


def write_warmup(version_dir: Path, batch: int = 2) -> None:
    """Write `assets.extra/tf_serving_warmup_requests` (TFRecord of PredictionLog, TF Serving format)."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = "serving_default"
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(np.zeros((batch, 8, 8, 1), np.float32)))
    log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
    (version_dir / "assets.extra").mkdir(exist_ok=True)
    with tf.io.TFRecordWriter(str(version_dir / "assets.extra" / "tf_serving_warmup_requests")) as writer:
        writer.write(log.SerializeToString())


def build_version(version_dir: Path, seed: int = 0, bias: float = 0.0) -> Path:
    """Build one complete version folder: SavedModel + model.tflite + model.onnx + warmup."""
    build_saved_model(version_dir, seed=seed, bias=bias)
    write_warmup(version_dir)
    return version_dir
