"""TFLite's 2 GiB file limit, decided before the converter starts.

A TFLite FlatBuffer stops at 2 GiB (32-bit offsets) and the converter has no external-weights form, so a
SavedModel whose weights exceed `convert.size_limit_bytes` is refused by name without starting a converter
process (the ONNX converter writes such a model with external data instead, `onnx_format.large_models`).
"""

from __future__ import annotations

from pathlib import Path

from tfship.core.saved_model import saved_model_weight_bytes

FLATBUFFER_LIMIT_NAME = ("TFLite's FlatBuffer format stops at 2 GiB (32-bit offsets; LiteRT has no "
                         "external-weights form)")


def tflite_refusal(saved_model_dir: Path, limit_bytes: int) -> str | None:
    """The refusal reason when the weights would put a `.tflite` file past `limit_bytes`, else None."""
    weights = saved_model_weight_bytes(saved_model_dir)
    if weights <= limit_bytes:
        return None
    return (f"model too large for TFLite: its weights take {weights} bytes, above the {limit_bytes}-byte limit "
            f"(convert.size_limit_bytes); {FLATBUFFER_LIMIT_NAME}. The converter was not started; serve the "
            "SavedModel or the ONNX file (written with external data) instead")


__all__ = ["FLATBUFFER_LIMIT_NAME", "tflite_refusal"]
