"""Run any tfship artifact the same way: a callable from named inputs to named outputs.

These are the pipeline's differential-test runners (SavedModel through TensorFlow, ONNX through
onnxruntime, TFLite through LiteRT). Each maps {input name: array with the batch on axis 0} to
{output name: array}; outputs are always keyed by name, never by position.

String tensors cross every runner as numpy unicode arrays (`dtype.kind == "U"`): TensorFlow's bytes
and onnxruntime's object arrays of `str` are converted on the way in and out, so outputs compare
equal across backends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

Runner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Artifact:
    """One servable file or folder.

    kind: `saved_model`, `onnx` or `tflite`; mode: `float32`, `float16`, `dynamic_range` or `int8`.
    """

    name: str
    kind: str
    mode: str
    path: Path

    def size_bytes(self) -> int:
        """Bytes on disk (for a SavedModel: saved_model.pb plus variables/)."""
        if self.path.is_file():
            return self.path.stat().st_size
        files = [self.path / "saved_model.pb", *sorted((self.path / "variables").glob("*"))]
        return sum(f.stat().st_size for f in files if f.is_file())


def as_text(value: np.ndarray) -> np.ndarray:
    """Bytes / object / unicode arrays as a numpy unicode array (UTF-8 decoded); other arrays unchanged."""
    value = np.asarray(value)
    if value.dtype.kind not in "OSU":
        return value
    flat = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in value.ravel()]
    return np.array(flat, dtype=str).reshape(value.shape)


def saved_model_runner(path: Path, signature: str = "serving_default") -> Runner:
    """Call a SavedModel signature through TensorFlow (the reference for every comparison)."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(path))
    function = loaded.signatures[signature]

    def run(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = function(**{name: tf.constant(value) for name, value in inputs.items()})
        return {name: as_text(tensor.numpy()) for name, tensor in result.items()}

    run.keepalive = loaded  # the signature function needs its object graph alive
    return run


def onnx_runner(path: Path) -> Runner:
    """Run an ONNX model through onnxruntime's CPU execution provider, outputs by name."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]

    def run(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {k: as_text(v).astype(object) if np.asarray(v).dtype.kind in "OSU" else v for k, v in inputs.items()}
        return {name: as_text(value) for name, value in zip(names, session.run(names, feed))}

    return run


def tflite_runner(path: Path) -> Runner:
    """Run a .tflite through LiteRT's `serving_default` signature runner (int8 outputs dequantized)."""
    from tflite.runner import LiteRtRunner

    return LiteRtRunner(path).run


def runner_for(artifact: Artifact) -> Runner:
    """The runner for an artifact's kind."""
    factories = {"saved_model": saved_model_runner, "onnx": onnx_runner, "tflite": tflite_runner}
    return factories[artifact.kind](artifact.path)
