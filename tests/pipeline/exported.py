"""Write a test model as a SavedModel with one `serving_default` endpoint, as Keras' export route does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def export_endpoint(model, folder: Path, endpoint: Callable, input_signature: list) -> Path:
    """`model` tracked and `endpoint` (tensors -> {output name: tensor}) served as `serving_default` with
    `input_signature` (`tf.TensorSpec`s), written to `folder` (returned)."""
    import keras

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", endpoint, input_signature=input_signature)
    archive.write_out(str(folder), verbose=False)
    return folder
