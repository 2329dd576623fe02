"""`saved_model` backend: `tf.saved_model.load` and call the signature's concrete function."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from tfship.core.contract import Signature
from tfship.core.saved_model import SERVE_TAGS, read_signatures, serving_tags
from tfship.serving.runtimes.base import Runtime, RuntimeLoadError, RuntimeOptions, input_rejected


class SavedModelRuntime(Runtime):
    """Serves `saved_model.pb` + `variables/` with TensorFlow (imported only in `load()`).

    Metadata is read from `saved_model.pb` itself, exactly what TF Serving reports.
    """

    name = "saved_model"
    model_judges_shapes = True  # fed by name, as TF Serving's session: the graph decides what shapes it takes

    def __init__(self, version_dir: Path, options: RuntimeOptions | None = None) -> None:
        super().__init__(version_dir, options)
        self._loaded = None
        self._functions: dict = {}
        self._signatures: dict[str, Signature] = {}

    @classmethod
    def can_serve(cls, version_dir: Path) -> bool:
        return (Path(version_dir) / "saved_model.pb").is_file() and importlib.util.find_spec("tensorflow") is not None

    def load(self) -> None:
        try:
            import tensorflow as tf

            from tfship.serving.runtimes.tf_gpu import apply_gpu_memory_fraction

            apply_gpu_memory_fraction(self.options.gpu_memory_fraction)
            tags = self.options.saved_model_tags or SERVE_TAGS  # TF Serving's --saved_model_tags
            self._signatures = read_signatures(self.version_dir, tags, include_internal=True)
            self._loaded = tf.saved_model.load(str(self.version_dir), tags=serving_tags(self.version_dir, tags))
        except Exception as err:
            raise RuntimeLoadError(f"cannot load SavedModel {self.version_dir}: {err}") from err
        self._functions = dict(self._loaded.signatures)
        self.ready = True

    def predict(self, inputs: Mapping[str, np.ndarray],
                signature_name: str = "serving_default") -> dict[str, np.ndarray]:
        import tensorflow as tf

        fn = self._functions[signature_name]
        try:
            outputs = fn(**{k: tf.constant(v) for k, v in inputs.items()})
        except tf.errors.InvalidArgumentError as err:  # a value the graph refuses (TF Serving: INVALID_ARGUMENT)
            raise input_rejected("TensorFlow", inputs, err.message) from err
        except (TypeError, ValueError) as err:  # a shape or dtype the function's input signature refuses
            raise input_rejected("TensorFlow", inputs, err) from err
        return {k: v.numpy() for k, v in outputs.items()}

    def metadata(self) -> dict[str, Signature]:
        return dict(self._signatures)

    def unload(self) -> None:
        self._functions = {}
        self._loaded = None
        super().unload()
