"""The zoo's architectures, built here with random weights (no downloads) and realistic BatchNorm statistics.

    python -m bench.zoo.members NAME FOLDER [ROUTE ...]

writes into FOLDER, for each export route asked (default: the member's routes):
- `keras`: `model.keras` (`model.save`),
- `export`: `export/` (Keras' standard `model.export()` SavedModel),
- `saved_model`: `saved_model/` (`tf.saved_model.save` of a `tf.Module`, for the module member),
and `data.npz`: `x`, the inputs (every member has one input; `tfship run` reads `x` for it), and `y`, the model's own top-1 class
(so every float artifact's accuracy is 100 % and a quantized one's drop is its own).

Vision members are `keras.applications` architectures with `weights=None`. Their inputs are synthetic
photographs: smooth colour fields (low-resolution noise upsampled) with blobs and fine texture, 0..255,
passed through the architecture's own `preprocess_input` where it has no preprocessing layer inside.
BatchNorm statistics are set from those images: every BatchNormalization layer's momentum is set to 0 for
one forward pass in training mode, so each layer's moving mean and variance become the batch statistics of
its own input (as a trained network's would be, instead of the initial 0 and 1), and the momentum is put
back. The text member adapts its TextVectorization layer on generated sentences.

Prints `RESULT {"params": ..., "inputs": [...], "routes": [...]}`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROUTES = ("keras", "export", "saved_model")


@dataclass(frozen=True)
class Member:
    """One zoo architecture: name, how it is built, its export routes, whether it is small enough for
    `make test` (seconds per conversion), rows of data, and a one-line description for the table."""

    name: str
    build: Callable[[int], tuple[object, dict[str, np.ndarray]]]
    routes: tuple[str, ...]
    small: bool
    rows: int
    about: str


def synthetic_photos(count: int, size: int, seed: int = 0) -> np.ndarray:
    """`count` RGB images [count, size, size, 3] float32 in 0..255: smooth colour fields, blobs, texture."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    low = rng.random((count, 4, 4, 3), dtype=np.float32)
    field = tf.image.resize(low, (size, size), method="bicubic").numpy()
    yy, xx = np.mgrid[0:size, 0:size] / size
    for i in range(count):
        for _ in range(3):
            cy, cx, radius = rng.random(3) * [1, 1, 0.3] + [0, 0, 0.05]
            mask = ((yy - cy) ** 2 + (xx - cx) ** 2) < radius**2
            field[i][mask] = rng.random(3)
    texture = rng.normal(0, 0.04, field.shape).astype(np.float32)
    return np.clip((field + texture) * 255.0, 0, 255).astype(np.float32)


def calibrate_batchnorm(model, inputs) -> int:
    """Set every BatchNormalization layer's moving statistics from one training-mode pass over `inputs`.

    Returns the number of BatchNormalization layers set.
    """
    import keras

    layers = [layer for layer in _all_layers(model) if isinstance(layer, keras.layers.BatchNormalization)]
    momenta = [layer.momentum for layer in layers]
    for layer in layers:
        layer.momentum = 0.0
    model(inputs, training=True)
    for layer, momentum in zip(layers, momenta):
        layer.momentum = momentum
    return len(layers)


def _all_layers(model):
    for layer in model.layers:
        yield layer
        if hasattr(layer, "layers"):
            yield from _all_layers(layer)


def _vision(factory: str, size: int, preprocess: str | None = None, **kwargs):
    def build(rows: int):
        import keras

        keras.utils.set_random_seed(0)
        model = getattr(keras.applications, factory)(weights=None, input_shape=(size, size, 3), **kwargs)
        images = synthetic_photos(rows, size)
        if preprocess:
            images = getattr(keras.applications, preprocess).preprocess_input(images)
        calibrate_batchnorm(model, images[: min(rows, 32)])
        return model, {"x": images.astype(np.float32)}

    return build


WORDS = ("the a model ships fast slow server client tensor graph export learns predicts returns good bad "
         "request answer batch memory onnx lite keras signature version quick brown fox jumps over lazy dog").split()


def _text_classifier(rows: int):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    sentences = np.array([" ".join(rng.choice(WORDS, rng.integers(3, 14))) for _ in range(max(rows, 256))])
    vectorize = keras.layers.TextVectorization(max_tokens=200, output_sequence_length=16)
    vectorize.adapt(tf.constant(sentences))
    text = keras.Input((1,), dtype="string", name="text")
    tokens = keras.layers.Reshape((16,))(vectorize(text))
    x = keras.layers.Embedding(200, 32)(tokens)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=16)(x, x)
    x = keras.layers.LayerNormalization()(x + attended)
    ffn = keras.layers.Dense(32)(keras.layers.Dense(64, activation="gelu")(x))
    x = keras.layers.LayerNormalization()(x + ffn)
    scores = keras.layers.Dense(4, activation="softmax", name="scores")(keras.layers.GlobalAveragePooling1D()(x))
    model = keras.Model(text, scores)
    return model, {"x": sentences[:rows].reshape(-1, 1)}


def _gru(rows: int):
    import keras

    keras.utils.set_random_seed(0)
    series = keras.Input((None, 8), name="series")
    hidden = keras.layers.GRU(16)(series)
    model = keras.Model(series, keras.layers.Dense(3, activation="softmax", name="scores")(hidden))
    t = np.linspace(0, 4 * np.pi, 12, dtype=np.float32)
    phases = np.random.default_rng(0).random((rows, 1, 8), dtype=np.float32) * 6
    return model, {"x": np.sin(t[None, :, None] + phases).astype(np.float32)}


def _two_signature_module(rows: int):
    import tensorflow as tf

    rng = np.random.default_rng(0)

    class TwoSignatures(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(rng.normal(size=(6, 5)).astype(np.float32))
            self.b = tf.Variable(rng.normal(size=(5,)).astype(np.float32) * 0.1)

        @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32, name="x")])
        def serve(self, x):
            return {"probabilities": tf.nn.softmax(tf.matmul(x, self.w) + self.b)}

        @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.float32, name="x")])
        def score(self, x):
            return {"score": tf.reduce_sum(tf.matmul(x, self.w), axis=1, keepdims=True)}

    return TwoSignatures(), {"x": rng.normal(size=(rows, 6)).astype(np.float32)}


MEMBERS: dict[str, Member] = {m.name: m for m in (
    Member("mobilenetv3small_tiny", _vision("MobileNetV3Small", 32, alpha=0.75, classes=10), ("keras", "export"),
           True, 32, "MobileNetV3Small, alpha 0.75, 32x32 input, 10 classes (hard-swish, squeeze-excite)"),
    Member("gru", _gru, ("keras", "export"), True, 64, "GRU(16) over a variable time axis [B, None, 8]"),
    Member("two_signatures", _two_signature_module, ("saved_model",), True, 64,
           "tf.Module with signatures serving_default and score"),
    Member("text_transformer", _text_classifier, ("keras", "export"), True, 64,
           "Transformer text classifier on raw strings (TextVectorization inside, attention, GELU)"),
    Member("mobilenetv3small", _vision("MobileNetV3Small", 224), ("keras", "export"), False, 48,
           "keras.applications MobileNetV3Small, 224x224, 1000 classes"),
    Member("efficientnetb0", _vision("EfficientNetB0", 224), ("keras", "export"), False, 48,
           "keras.applications EfficientNetB0 (swish), 224x224"),
    Member("resnet50", _vision("ResNet50", 224, "resnet50"), ("keras", "export"), False, 48,
           "keras.applications ResNet50, 224x224"),
    Member("densenet121", _vision("DenseNet121", 224, "densenet"), ("keras", "export"), False, 48,
           "keras.applications DenseNet121, 224x224"),
    Member("convnexttiny", _vision("ConvNeXtTiny", 224), ("keras", "export"), False, 32,
           "keras.applications ConvNeXtTiny (GELU, LayerNorm), 224x224"),
)}


def _own_labels(model, inputs: dict[str, np.ndarray]) -> np.ndarray:
    import tensorflow as tf

    if hasattr(model, "predict"):
        (feed,) = inputs.values()
        out = model.predict(tf.constant(feed) if feed.dtype.kind == "U" else feed, verbose=0, batch_size=16)
    else:
        out = model.serve(tf.constant(next(iter(inputs.values()))))["probabilities"].numpy()
    out = next(iter(out.values())) if isinstance(out, dict) else out
    return np.argmax(np.asarray(out), axis=-1).astype(np.int64)


def build_member(name: str, folder: Path, routes: tuple[str, ...] | None = None) -> dict:
    """Write member `name`'s routes and `data.npz` into `folder`; returns {params, inputs, routes}.

    Raises:
        KeyError: no member of that name (the known names are `MEMBERS`).
    """
    import tensorflow as tf

    member = MEMBERS[name]
    routes = tuple(r for r in (routes or member.routes) if r in member.routes)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model, inputs = member.build(member.rows)
    labels = _own_labels(model, inputs)
    if "keras" in routes:
        model.save(folder / "model.keras")
    if "export" in routes:
        model.export(str(folder / "export"), verbose=False)
    if "saved_model" in routes:
        tf.saved_model.save(model, str(folder / "saved_model"),
                            signatures={"serving_default": model.serve, "score": model.score})
    np.savez(folder / "data.npz", **inputs, y=labels)
    params = int(sum(int(np.prod(v.shape)) for v in (model.weights if hasattr(model, "weights")
                                                     else model.variables)))
    return {"params": params, "inputs": sorted(inputs), "routes": list(routes)}


if __name__ == "__main__":
    result = build_member(sys.argv[1], Path(sys.argv[2]), tuple(sys.argv[3:]) or None)
    print("RESULT " + json.dumps(result))
