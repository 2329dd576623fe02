"""Factories for `tfship run --model tests.pipeline.user_models:<name>` (export-only mode tests)."""

from __future__ import annotations

import keras
import numpy as np


class ArgMax(keras.layers.Layer):
    """int64 argmax over the last axis through `tf.math.argmax` (Keras' own `ops.argmax` adds a Bitcast /
    BitwiseAnd tie-break that neither tf2onnx nor the TFLite builtins convert)."""

    def call(self, scores):
        import tensorflow as tf

        return tf.math.argmax(scores, axis=-1, output_type=tf.int64)

    def compute_output_spec(self, scores):
        return keras.KerasTensor(scores.shape[:-1], dtype="int64")


def two_input_classifier():
    """Inputs `pixels` float32 [-1, 16] and `count` int64 [-1, 1]; dict heads `scores` [-1, 3] and
    `class_id` int64 [-1]; the weights make class = argmax of three pixel sums (trained-like, no training)."""
    keras.utils.set_random_seed(1)
    pixels = keras.Input((16,), name="pixels")
    count = keras.Input((1,), name="count", dtype="int64")
    joined = keras.layers.Concatenate(name="join")([pixels, keras.ops.cast(count, "float32")])
    hidden = keras.layers.Dense(24, activation="relu", name="hidden")(joined)
    scores = keras.layers.Dense(3, name="scores_dense")(hidden)
    class_id = ArgMax(name="class_id")(scores)
    return keras.Model({"pixels": pixels, "count": count}, {"scores": scores, "class_id": class_id})


class _ForcedBatchNorm(keras.layers.BatchNormalization):
    def call(self, inputs, training=None):
        return super().call(inputs, training=True)


def forced_batch_norm():
    """One input `pixels` [-1, 16]; a BatchNormalization subclass forced into training mode."""
    pixels = keras.Input((16,), name="pixels")
    hidden = _ForcedBatchNorm(name="stuck_bn")(keras.layers.Dense(8, name="hidden")(pixels))
    return keras.Model(pixels, keras.layers.Dense(3, name="scores")(hidden))


def write_classification_npz(path, rows: int = 96, seed: int = 0):
    """`pixels`, `count` and `y` (labels from `two_input_classifier` itself, so accuracy is 100%)."""
    rng = np.random.default_rng(seed)
    pixels = rng.random((rows, 16), dtype=np.float32)
    count = rng.integers(0, 4, (rows, 1)).astype(np.int64)
    labels = np.asarray(two_input_classifier()({"pixels": pixels, "count": count})["class_id"]).astype(np.int64)
    np.savez(path, pixels=pixels, count=count, y=labels)
    return path


class Erf(keras.layers.Layer):
    """`tf.math.erf`: no TFLite builtin (needs Flex), fine for TensorFlow and ONNX (tf2onnx's `Erf`)."""

    def call(self, values):
        import tensorflow as tf

        return tf.math.erf(values)


def flex_classifier():
    """Input `x` float32 [-1, 4]; heads `scores` [-1, 3] and `class_id` int64 [-1]; an erf in the middle makes
    every TFLite conversion need Flex ops (left out), while the SavedModel and ONNX are fine."""
    keras.utils.set_random_seed(2)
    x = keras.Input((4,), name="x")
    scores = keras.layers.Dense(3, name="scores_dense")(Erf(name="erf")(keras.layers.Dense(4, name="mix")(x)))
    return keras.Model(x, {"scores": scores, "class_id": ArgMax(name="class_id")(scores)})


def write_flex_npz(path, rows: int = 70, seed: int = 0):
    """70 rows of `x` and `y` (labels from `flex_classifier` itself)."""
    x = np.random.default_rng(seed).uniform(-1.0, 1.0, (rows, 4)).astype(np.float32)
    labels = np.asarray(flex_classifier()(x)["class_id"]).astype(np.int64)
    np.savez(path, x=x, y=labels)
    return path
