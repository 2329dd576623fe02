"""`tflite` backend: `ai_edge_litert.interpreter.Interpreter` signature runners (never tf.lite)."""

from __future__ import annotations

import importlib.util
import re
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from tfship.core.contract import Signature, TensorSpec
from tfship.core.dtypes import dtype_name
from tfship.core.saved_model import read_signatures
from tfship.serving.runtimes.base import Runtime, RuntimeLoadError, RuntimeOptions, input_rejected
from tfship.serving.runtimes.tflite_tensors import run as tensor_run
from tfship.serving.runtimes.tflite_tensors import tensor_signatures

# LiteRT kernels' messages for an input value they refuse (GATHER: "gather index out of bounds").
_INDEX_ERROR = re.compile(r"index out of bounds|out of range|indices? .*(out of bounds|not in)", re.IGNORECASE)


class TfliteRuntime(Runtime):
    """Serves `model.tflite` (or `options.tflite_file`) through its signature runners.

    Each call resizes the inputs to the request's batch (the runner reallocates tensors), under a
    lock because one LiteRT interpreter is not thread-safe. Contract: `saved_model.pb`'s SignatureDefs
    for the signatures the file holds when present, else the runner's `shape_signature`s. A file without
    signature runners is served over its tensors as TF Serving serves it (`serving.runtimes.tflite_tensors`):
    then the model judges the shapes it is fed (`model_judges_shapes`).
    """

    name = "tflite"

    def __init__(self, version_dir: Path, options: RuntimeOptions | None = None) -> None:
        super().__init__(version_dir, options)
        self._interpreter = None
        self._runners: dict = {}
        self._signatures: dict[str, Signature] = {}
        self._lock = threading.Lock()
        self._last_error = ""
        self._tensors: dict = {}  # signature name -> TensorSignature, for files without signature runners

    @property
    def path(self) -> Path:
        """The `.tflite` file served."""
        return self.version_dir / self.options.tflite_file

    @classmethod
    def can_serve(cls, version_dir: Path) -> bool:
        return (Path(version_dir) / "model.tflite").is_file() and importlib.util.find_spec("ai_edge_litert") is not None

    def load(self) -> None:
        try:
            from ai_edge_litert.interpreter import Interpreter

            threads = self.options.intra_op_threads or None
            self._interpreter = Interpreter(model_path=str(self.path), num_threads=threads)
            self._runners = {k: self._interpreter.get_signature_runner(k)
                             for k in self._interpreter.get_signature_list()}
            for runner in self._runners.values():
                prime_dynamic_shapes(runner)
            if not self._runners:  # TF Serving's TfLiteSession: signatures over the model's tensors
                self._interpreter.allocate_tensors()
                self._tensors = tensor_signatures(self.path, self._interpreter)
        except Exception as err:
            raise RuntimeLoadError(f"cannot load {self.path}: {err}") from err
        self.model_judges_shapes = bool(self._tensors)
        self._signatures = {k: t.contract for k, t in self._tensors.items()} if self._tensors else self._contract()
        self.ready = True

    def _contract(self) -> dict[str, Signature]:
        declared = {}
        if (self.version_dir / "saved_model.pb").is_file():
            declared = read_signatures(self.version_dir, include_internal=True)
        out = {}
        for key, runner in self._runners.items():
            own = Signature(name=key, inputs=_specs(runner.get_input_details()),
                            outputs=_specs(runner.get_output_details()))
            match = declared.get(key)
            ok = match and set(match.inputs) == set(own.inputs) and set(match.outputs) == set(own.outputs)
            out[key] = match if ok else own
        return out

    def predict(self, inputs: Mapping[str, np.ndarray],
                signature_name: str = "serving_default") -> dict[str, np.ndarray]:
        if self._tensors:
            with self._lock:
                try:
                    return tensor_run(self._interpreter, self._tensors[signature_name], inputs)
                except (ValueError, RuntimeError) as err:  # a shape or value the model cannot take
                    raise input_rejected("LiteRT", inputs, self._new_error_text(str(err))) from err
        with self._lock:
            try:
                outputs = self._runners[signature_name](**inputs)
            except RuntimeError as err:  # LiteRT reports kernel failures as RuntimeError("... failed to invoke")
                text = self._new_error_text(str(err))
                if _INDEX_ERROR.search(text):
                    raise input_rejected("LiteRT", inputs, text) from err
                raise
            return {k: np.array(v, copy=True) for k, v in outputs.items()}

    def _new_error_text(self, text: str) -> str:
        """This call's part of LiteRT's error text (its error reporter keeps earlier calls' messages)."""
        previous, self._last_error = self._last_error, text
        return text[len(previous):] if previous and text.startswith(previous) else text

    def metadata(self) -> dict[str, Signature]:
        return dict(self._signatures)

    def unload(self) -> None:
        self._runners = {}
        self._tensors = {}
        self._interpreter = None
        super().unload()


PRIME_BATCH = 2


def prime_dynamic_shapes(runner, input_details: dict | None = None) -> None:
    """Run a signature once at batch `PRIME_BATCH` (zeros / empty strings) when every input has a dynamic
    dimension; the one copy of this LiteRT workaround (the server's runtime and `tflite.runner` both call it).

    A fresh interpreter starts at the `shape_signature` with -1 read as 1, and a first call at exactly that
    shape reallocates nothing, so ops whose output shape depends on data they have not seen yet (e.g.
    `HASHTABLE_FIND` of a string lookup, feeding a `RESHAPE`) keep a placeholder shape: a batch-1 call on a
    fresh interpreter fails ("num_input_elements != num_output_elements (4 != 16)") while the same call after
    any other batch size works. One call at another size makes every later call resize and reallocate.
    Errors here are ignored: the real call reports its own.

    Args:
        runner: a LiteRT signature runner (`Interpreter.get_signature_runner(key)`).
        input_details: `runner.get_input_details()` when the caller has it already.
    """
    details = runner.get_input_details() if input_details is None else input_details
    feed = {}
    for name, info in details.items():
        signature = [int(d) for d in info.get("shape_signature", info["shape"])]
        if -1 in signature:
            shape = tuple(PRIME_BATCH if d == -1 else d for d in signature)
            kind = np.dtype(info["dtype"]).kind
            feed[name] = np.full(shape, b"", dtype=object) if kind in "SOU" else np.zeros(shape, info["dtype"])
    if feed and len(feed) == len(details):
        try:
            runner(**feed)
        except (ValueError, RuntimeError):
            pass


def _specs(details: dict) -> dict[str, TensorSpec]:
    return {k: TensorSpec(dtype=dtype_name(d["dtype"]),
                          shape=tuple(None if s < 0 else int(s) for s in d["shape_signature"]),
                          tensor_name=d["name"]) for k, d in details.items()}
