"""Built-in model factories (Keras 3 functional models)."""

from __future__ import annotations

from pipeline.config import ModelSection

NUM_DIGIT_CLASSES = 10


def build_cnn(config: ModelSection, input_shape: tuple[int, ...], num_classes: int, seed: int):
    """A small CNN classifier: input float32 [B, *input_shape] -> logits float32 [B, num_classes].

    Layers are named so the export and the audit can name them. Conv blocks use 'same' padding and a
    2x2 max-pool only while the spatial size allows it.
    """
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input(shape=input_shape, name="image", dtype="float32")
    hidden = inputs
    size = min(input_shape[0], input_shape[1])
    for index, filters in enumerate(config.filters):
        hidden = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"conv{index}")(hidden)
        if size >= 4:
            hidden = keras.layers.MaxPooling2D(2, name=f"pool{index}")(hidden)
            size //= 2
    hidden = keras.layers.Flatten(name="flatten")(hidden)
    hidden = keras.layers.Dense(config.dense_units, activation="relu", name="hidden")(hidden)
    if config.dropout > 0:
        hidden = keras.layers.Dropout(config.dropout, name="dropout")(hidden)
    logits = keras.layers.Dense(num_classes, name="logits")(hidden)
    return keras.Model(inputs, logits, name="digits_cnn")
