"""`tflite` backend: a `.tflite` file served through `serving.runtimes.litert.LiteRtModel` (never tf.lite)."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from tfship.core.contract import Signature, TensorSpec
from tfship.core.dtypes import dtype_name
from tfship.core.saved_model import read_signatures
from tfship.serving.runtimes.base import Runtime, RuntimeLoadError, RuntimeOptions, input_rejected
from tfship.serving.runtimes.litert import LiteRtCallError, LiteRtContract, LiteRtModel, LiteRtTensor
from tfship.serving.runtimes.tflite_check import tflite_problems
from tfship.serving.runtimes.tflite_tensors import tensor_signatures

# LiteRT kernels' messages for an input value they refuse (GATHER: "gather index out of bounds").
_INDEX_ERROR = re.compile(r"index out of bounds|out of range|indices? .*(out of bounds|not in)", re.IGNORECASE)


class TfliteRuntime(Runtime):
    """Serves `model.tflite` (or `options.tflite_file`) through its signature runners.

    Each call resizes the inputs to the request's batch (the runner reallocates tensors), under the
    `LiteRtModel`'s lock because one LiteRT interpreter is not thread-safe. Contract: `saved_model.pb`'s
    SignatureDefs for the signatures the file holds when present, else the runners' `shape_signature`s. A file
    without signature runners is served over its tensors as TF Serving serves it
    (`serving.runtimes.tflite_tensors`): then the model judges the shapes it is fed (`model_judges_shapes`).
    """

    name = "tflite"
    artifact_files = ("*.tflite",)  # any published TFLite file (`--artifact tflite_int8`: model_int8.tflite)

    def __init__(self, version_dir: Path, options: RuntimeOptions | None = None) -> None:
        super().__init__(version_dir, options)
        self._model: LiteRtModel | None = None
        self._signatures: dict[str, Signature] = {}
        self._tensors: dict = {}  # signature name -> TensorSignature, for files without signature runners

    @property
    def path(self) -> Path:
        """The `.tflite` file served."""
        return self.version_dir / self.options.tflite_file

    @classmethod
    def can_serve(cls, version_dir: Path) -> bool:
        return (Path(version_dir) / "model.tflite").is_file() and importlib.util.find_spec("ai_edge_litert") is not None

    def load(self) -> None:
        """Check the file (`serving.runtimes.tflite_check`: a TFLite flatbuffer, builtin ops or allowed custom ones),
        then build its interpreter.

        Raises:
            RuntimeLoadError: the file is refused (one line: why) or LiteRT cannot load it.
        """
        try:
            problems = tflite_problems(self.path, self.options.allow_ops)
        except OSError as err:
            raise RuntimeLoadError(f"cannot load {self.path}: {err}") from err
        if problems:
            raise RuntimeLoadError(f"refused {self.path}: {'; '.join(problems)}")
        try:
            self._model = LiteRtModel(self.path, num_threads=self.options.intra_op_threads or None)
            if not self._model.signature_keys:  # TF Serving's TfLiteSession: signatures over the model's tensors
                self._tensors = tensor_signatures(self.path, self._model.interpreter)
        except Exception as err:
            raise RuntimeLoadError(f"cannot load {self.path}: {err}") from err
        self.model_judges_shapes = self.resizes_inputs = bool(self._tensors)
        self._signatures = {k: t.contract for k, t in self._tensors.items()} if self._tensors else self._contract()
        self.ready = True

    def _contract(self) -> dict[str, Signature]:
        declared = {}
        if (self.version_dir / "saved_model.pb").is_file():
            declared = read_signatures(self.version_dir, include_internal=True)
        out = {}
        model = self._model
        assert model is not None  # called by load()
        for key in model.signature_keys:
            own = _signature(model.contract(key))
            match = declared.get(key)
            ok = match and set(match.inputs) == set(own.inputs) and set(match.outputs) == set(own.outputs)
            out[key] = match if ok else own
        return out

    def predict(self, inputs: Mapping[str, np.ndarray],
                signature_name: str = "serving_default") -> dict[str, np.ndarray]:
        model = self._model
        assert model is not None, "load() first"
        try:
            if self._tensors:
                return model.run_over_tensors(self._tensors[signature_name], inputs)
            return model.run_raw(inputs, signature_name)
        except LiteRtCallError as err:
            # Over tensors the model judges shapes, so any refusal is the input's; with signature runners
            # only a kernel's index refusal is (the data plane checked shapes and dtypes).
            if self._tensors or _INDEX_ERROR.search(err.text):
                raise input_rejected("LiteRT", inputs, err.text) from err
            raise

    def metadata(self) -> dict[str, Signature]:
        return dict(self._signatures)

    def unload(self) -> None:
        self._tensors = {}
        self._model = None
        super().unload()


def _signature(contract: LiteRtContract) -> Signature:
    return Signature(name=contract.signature_key, inputs=_specs(contract.inputs), outputs=_specs(contract.outputs))


def _specs(tensors: tuple[LiteRtTensor, ...]) -> dict[str, TensorSpec]:
    return {t.name: TensorSpec(dtype=dtype_name(t.dtype), shape=tuple(None if s < 0 else int(s) for s in
                                                                     t.shape_signature),
                               tensor_name=t.tensor_name) for t in tensors}
