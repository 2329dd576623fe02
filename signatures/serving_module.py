"""The `tf.Module` a SavedModel is written from (`signatures.export`, `signatures.keras_export`), its tracked
attributes declared. Imports TensorFlow: import it where TensorFlow is loaded already (inside the builders).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class ServingModule(tf.Module):
    """A `tf.Module` whose attributes the builders set (each builder sets its own; the rest stay unset). A plain
    user object in the SavedModel, as `tf.Module` itself (the class is not recorded).

    Attributes:
        serving_default: the built-in classifier's serving `tf.function`.
        model_weights: the Keras model's backing `tf.Variable`s (not Keras' wrappers).
        captured_variables: the variables the traced signature functions capture.
        lookup_resources: the Keras model's lookup tables and their asset files.
        kept_variables, resources: a re-exported SavedModel's variables and resources its signatures reach.
        dropped_variables: the re-exported SavedModel's variable names no signature uses.
        signature_names: the signatures, the contract's first (each an attribute of that name).
    """

    serving_default: Any
    model_weights: list[Any]
    captured_variables: list[Any]
    lookup_resources: list[Any]
    kept_variables: list[Any]
    resources: list[Any]
    dropped_variables: tuple[str, ...]
    signature_names: tuple[str, ...]
