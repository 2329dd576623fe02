"""Conversion: the SavedModel to ONNX (tf2onnx) and the TFLite variants, each in a child process, each checked."""
