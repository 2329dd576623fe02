"""A tiny SavedModel with typed inputs and awkward outputs, for the REST conformance and input-error tests.

Signatures:
- `serving_default`: `ids` int32 [-1, 3] -> `vectors` float32 [-1, 3, 4] = tf.gather(table[10, 4], ids)
  (an embedding lookup: an id outside [0, 10) is refused by the backend at run time).
- `flags`: `flag` bool [-1] -> `negated` bool [-1], `count` int32 [] (a scalar output).
- `mixed`: `x` float32 [-1, 2], `text` string [-1] -> `y` float32 [-1, 2] = 2x, `first` float32 [1, 2] = x[:1]
  (its first dimension is not the batch), `text_bytes` string [-1] and `echo` string [-1] (= text).
With `converted`, `serving_default` is also written as `model.tflite` and `model.onnx`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

TABLE = np.arange(40, dtype=np.float32).reshape(10, 4) / 10.0


def build_typed_model(version_dir: Path, converted: bool = True) -> None:
    """Save the typed model into `version_dir` (and its TFLite/ONNX forms of `serving_default`)."""
    import tensorflow as tf

    class Typed(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = tf.Variable(TABLE, trainable=False)

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int32, name="ids")])
        def serving_default(self, ids):
            return {"vectors": tf.gather(self.table, ids)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.bool, name="flag")])
        def flags(self, flag):
            return {"negated": tf.logical_not(flag), "count": tf.reduce_sum(tf.cast(flag, tf.int32))}

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x"),
                                      tf.TensorSpec([None], tf.string, name="text")])
        def mixed(self, x, text):
            return {"y": x * 2.0, "first": x[:1], "text_bytes": tf.identity(text), "echo": tf.identity(text)}

    module = Typed()
    tf.saved_model.save(module, str(version_dir), signatures={
        "serving_default": module.serving_default, "flags": module.flags, "mixed": module.mixed})
    if not converted:
        return
    converter = tf.lite.TFLiteConverter.from_saved_model(str(version_dir), signature_keys=["serving_default"])
    (Path(version_dir) / "model.tflite").write_bytes(converter.convert())
    import tf2onnx

    fn = module.serving_default
    tf2onnx.convert.from_function(fn, input_signature=fn.input_signature, opset=17,
                                  output_path=str(Path(version_dir) / "model.onnx"))
