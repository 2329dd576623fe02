"""Two small models of different kinds, each exported as SavedModel + model.tflite + model.onnx, for tests that
drive every backend (saved_model, onnx, tflite) with the same requests.

* `cnn`: the digits contract with convolution and pooling, as the published digits CNN
  (pipeline/training/model.py's `_cnn_body`): `image` float32 [-1, 8, 8, 1] -> `logits` float32 [-1, 10],
  `probabilities` float32 [-1, 10], `class_id` int64 [-1]. TensorFlow runs its Conv2D and MaxPool with oneDNN on
  x86, whose kernels fail (AbortedError) rather than refuse on some wrong shapes.
* `recommender`: `history` int64 [-1, 20] (item ids in [0, ITEMS)) -> embedding -> mean over the history ->
  `score` float32 [-1, 1]. The mean pooling takes any history length, so the graph itself would answer a
  `[B, 30]` history that contradicts the fixed 20.
"""

from __future__ import annotations

from pathlib import Path

ITEMS = 50
HISTORY = 20


def _export(module, signature, version_dir: Path) -> None:
    import tensorflow as tf
    import tf2onnx

    tf.saved_model.save(module, str(version_dir), signatures={"serving_default": signature})
    converter = tf.lite.TFLiteConverter.from_saved_model(str(version_dir), signature_keys=["serving_default"])
    (version_dir / "model.tflite").write_bytes(converter.convert())
    tf2onnx.convert.from_function(signature, input_signature=signature.input_signature, opset=17,
                                  output_path=str(version_dir / "model.onnx"))


def build_cnn(version_dir: Path, seed: int = 0) -> Path:
    """Write the `cnn` model's version folder (three artifacts); returns `version_dir`."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ])

    class Module(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = [getattr(w, "value", w) for w in model.weights]  # tf.Variables, not Keras 3 wrappers

        @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.float32, name="image")])
        def serving_default(self, image):
            logits = model(image, training=False)
            return {"logits": logits, "probabilities": tf.nn.softmax(logits),
                    "class_id": tf.argmax(logits, axis=-1, output_type=tf.int64)}

    module = Module()
    _export(module, module.serving_default, version_dir)
    return version_dir


def build_recommender(version_dir: Path, seed: int = 0) -> Path:
    """Write the `recommender` model's version folder (three artifacts); returns `version_dir`."""
    import tensorflow as tf

    class Module(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = tf.Variable(tf.random.stateless_normal((ITEMS, 8), seed=(seed, 1)))
            self.head = tf.Variable(tf.random.stateless_normal((8, 1), seed=(seed, 2)))

        @tf.function(input_signature=[tf.TensorSpec([None, HISTORY], tf.int64, name="history")])
        def serving_default(self, history):
            pooled = tf.reduce_mean(tf.gather(self.table, history), axis=1)
            return {"score": tf.matmul(pooled, self.head)}

    module = Module()
    _export(module, module.serving_default, version_dir)
    return version_dir


BUILDERS = {"cnn": build_cnn, "recommender": build_recommender}


def write_repository(root: Path) -> Path:
    """Both models as version 1 under `root`, and `root/models.config` serving them; returns the config path."""
    for name, build in BUILDERS.items():
        build(root / name / "1")
    config = root / "models.config"
    config.write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{name}" base_path: "{root / name}" model_platform: "tensorflow" }}\n'
        for name in BUILDERS) + "}\n")
    return config
