"""Small SavedModels built on purpose for the TFLite tests, and their conversions (session-scoped).

Models are exported like the pipeline does (Keras `ExportArchive`, forward-only `serving_default` with
named inputs and a dict of named outputs).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_digits

from tfship.tflite.convert import TfliteConversionResult, convert_tflite
from tfship.tflite.modes import TfliteOptions

CONVERT_TIMEOUT_S = 240.0


def export(model_or_fn, tracked: keras.Model, input_signature: list[tf.TensorSpec], path: Path) -> Path:
    """Write `model_or_fn` as `serving_default` of a SavedModel at `path`."""
    archive = keras.export.ExportArchive()
    archive.track(tracked)
    archive.add_endpoint("serving_default", model_or_fn, input_signature=input_signature)
    archive.write_out(str(path), verbose=False)
    return path


@pytest.fixture(scope="session")
def reference() -> Callable[[Path, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """`reference(saved_model_dir, inputs)`: outputs of the SavedModel's `serving_default` (loaded once)."""
    loaded: dict[Path, object] = {}

    def run(saved_model_dir: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if saved_model_dir not in loaded:
            loaded[saved_model_dir] = tf.saved_model.load(str(saved_model_dir))
        signature = loaded[saved_model_dir].signatures["serving_default"]
        outputs = signature(**{name: tf.constant(value) for name, value in inputs.items()})
        return {name: value.numpy() for name, value in outputs.items()}

    return run


@pytest.fixture(scope="session")
def digits_data() -> dict[str, np.ndarray]:
    """sklearn digits as float32 images [N, 8, 8, 1] in [0, 1]: 1200 train, the rest test."""
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int64)
    return {"train_x": images[:1200], "train_y": labels[:1200],
            "test_x": images[1200:], "test_y": labels[1200:]}


@pytest.fixture(scope="session")
def digits_saved_model(tmp_path_factory, digits_data) -> Path:
    """A tiny trained CNN like the digits model: input `image` f32 [-1,8,8,1]; outputs `logits` f32
    [-1,10], `probabilities` f32 [-1,10], `class_id` int64 [-1]."""
    keras.utils.set_random_seed(7)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    model.fit(digits_data["train_x"], digits_data["train_y"], epochs=4, batch_size=64, verbose=0)

    def serve(image):
        logits = model(image, training=False)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits),
                "class_id": tf.argmax(logits, axis=-1)}

    spec = [tf.TensorSpec([None, 8, 8, 1], tf.float32, name="image")]
    return export(serve, model, spec, tmp_path_factory.mktemp("digits") / "saved_model")


@pytest.fixture(scope="session")
def overflow_saved_model(tmp_path_factory) -> Path:
    """Above float16's 65504: a kernel entry of 1e6 (layer `huge_dense`) and a graph constant 250000."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="huge_dense")])
    kernel, bias = model.get_layer("huge_dense").get_weights()
    kernel[1, 2] = 1.0e6
    model.get_layer("huge_dense").set_weights([kernel, bias])

    def serve(x):
        return {"y": model(x, training=False), "scaled": x * 250000.0}

    spec = [tf.TensorSpec([None, 4], tf.float32, name="x")]
    return export(serve, model, spec, tmp_path_factory.mktemp("overflow") / "saved_model")


@pytest.fixture(scope="session")
def multi_io_saved_model(tmp_path_factory) -> Path:
    """Inputs `wide` f32 [-1,6] and `narrow` f32 [-1,2]; outputs `zeta` [-1,3], `alpha` [-1,2],
    `middle` [-1,5] (declared out of alphabetical order, each a different shape)."""
    keras.utils.set_random_seed(5)
    wide, narrow = keras.Input((6,), name="wide"), keras.Input((2,), name="narrow")
    joined = keras.layers.Concatenate()([keras.layers.Dense(5, activation="tanh")(wide), narrow])
    model = keras.Model([wide, narrow], [keras.layers.Dense(3)(joined), keras.layers.Dense(5)(wide)])

    def serve(wide, narrow):
        zeta, middle = model([wide, narrow], training=False)
        return {"zeta": zeta, "alpha": narrow * 2.0 - 1.0, "middle": middle}

    spec = [tf.TensorSpec([None, 6], tf.float32, name="wide"),
            tf.TensorSpec([None, 2], tf.float32, name="narrow")]
    return export(serve, model, spec, tmp_path_factory.mktemp("multi_io") / "saved_model")


@pytest.fixture(scope="session")
def flex_saved_model(tmp_path_factory) -> Path:
    """`y = cumprod(x * w, axis=1)`: tf.Cumprod has no TFLite builtin and needs Flex (select TF ops)."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="scale")])

    def serve(x):
        return {"y": tf.math.cumprod(model(x, training=False), axis=1)}

    spec = [tf.TensorSpec([None, 4], tf.float32, name="x")]
    return export(serve, model, spec, tmp_path_factory.mktemp("flex") / "saved_model")


@pytest.fixture(scope="session")
def digits_variant(tmp_path_factory, digits_saved_model,
                   digits_data) -> Callable[[str], TfliteConversionResult]:
    """Convert the digits CNN once per variant key (`float32`, `float16`, `dynamic_range`, `int8`,
    `int8_io`) and cache the result for the session."""
    out = tmp_path_factory.mktemp("digits_tflite")
    cache: dict[str, TfliteConversionResult] = {}
    options = {
        "float32": TfliteOptions.from_mapping({"mode": "float32"}),
        "float16": TfliteOptions.from_mapping({"mode": "float16"}),
        "dynamic_range": TfliteOptions.from_mapping({"mode": "dynamic_range"}),
        "int8": TfliteOptions.from_mapping({"mode": "int8", "representative_samples": 200}),
        "int8_io": TfliteOptions.from_mapping({"mode": "int8", "int8_io": "int8"}),
    }

    def get(key: str) -> TfliteConversionResult:
        if key not in cache:
            cache[key] = convert_tflite(digits_saved_model, out / f"{key}.tflite", options[key],
                                        {"image": digits_data["train_x"][:300]}, CONVERT_TIMEOUT_S)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def activation_overflow_saved_model(tmp_path_factory) -> Path:
    """Small weights (all 100), small outputs, but an intermediate activation of 1.6e5 on inputs of 400:
    `hidden = relu(x @ w)` (layer `amplify`; the ReLU keeps the converter from folding the next scale into the
    weights), `y = hidden / 1000`; float16 holds the weights, not the activation."""
    inputs = keras.Input((4,), name="x")
    amplify = keras.layers.Dense(4, name="amplify", kernel_initializer=keras.initializers.Constant(100.0),
                                 use_bias=False, activation="relu")
    model = keras.Model(inputs, keras.layers.Rescaling(1e-3, name="shrink")(amplify(inputs)))

    def serve(x):
        return {"y": model(x, training=False)}

    spec = [tf.TensorSpec([None, 4], tf.float32, name="x")]
    return export(serve, model, spec, tmp_path_factory.mktemp("activation_overflow") / "saved_model")
