"""Conversion: the SavedModel to ONNX (tf2onnx) and the TFLite variants, each in a child process, each checked."""

from tfship.pipeline.conversion import artifact_kinds as _builtin_kinds  # noqa: F401 - registers the built-in kinds
