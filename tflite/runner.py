"""Run a `.tflite` artifact's signature in LiteRT, with float I/O for callers.

Imports only numpy and `ai_edge_litert` (never TensorFlow, never `tf.lite.Interpreter`), so the serving
backend and the validate stage can use it in processes that do not load TensorFlow.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from ai_edge_litert.interpreter import Interpreter

from tfship.core.errors import ContractError, ConversionError, InvalidRequestError
from tfship.serving.runtimes.tflite import prime_dynamic_shapes

DEFAULT_SIGNATURE = "serving_default"
_QUANTIZED_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16))


@dataclass(frozen=True)
class LiteRtTensor:
    """One signature input or output as LiteRT declares it.

    Attributes:
        name: the signature key (the SavedModel signature's input or output name, e.g. `image`).
        dtype: numpy dtype of the tensor inside the model (e.g. `float32`, `int8`, `int64`).
        shape_signature: declared shape; `-1` marks a dynamic dimension (the batch dimension after a
            conversion that kept it dynamic).
        scale: quantization scale for int8/uint8/int16 tensors, else None.
        zero_point: quantization zero point for int8/uint8/int16 tensors, else None.
    """

    name: str
    dtype: np.dtype
    shape_signature: tuple[int, ...]
    scale: float | None = None
    zero_point: int | None = None

    @property
    def quantized(self) -> bool:
        """True when the tensor holds affine-quantized integers (`real = (q - zero_point) * scale`)."""
        return self.scale is not None


@dataclass(frozen=True)
class LiteRtContract:
    """The names, dtypes and shapes of one signature, inputs and outputs sorted by name."""

    signature_key: str
    inputs: tuple[LiteRtTensor, ...]
    outputs: tuple[LiteRtTensor, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        """Input names in sorted order."""
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        """Output names in sorted order."""
        return tuple(t.name for t in self.outputs)


def _tensor(name: str, details: dict) -> LiteRtTensor:
    dtype = np.dtype(details["dtype"])
    shape = tuple(int(d) for d in details.get("shape_signature", details["shape"]))
    params = details.get("quantization_parameters", {})
    scales = np.asarray(params.get("scales", []), dtype=np.float64)
    zero_points = np.asarray(params.get("zero_points", []), dtype=np.int64)
    if dtype not in _QUANTIZED_DTYPES or scales.size == 0:
        return LiteRtTensor(name, dtype, shape)
    if scales.size != 1:
        raise ContractError(
            f"signature tensor {name!r} uses per-axis quantization ({scales.size} scales); "
            "only per-tensor quantized inputs and outputs are supported")
    return LiteRtTensor(name, dtype, shape, float(scales[0]), int(zero_points[0]))


def _as_utf8_bytes(name: str, value: np.ndarray) -> np.ndarray:
    """A string input as a numpy bytes array (UTF-8), whether it arrived as `str`, `bytes` or objects of either.

    LiteRT declares string tensors as `numpy.bytes_` (`|S0`); TensorFlow encodes `str` as UTF-8, so the same
    text gives the same bytes in both.

    Raises:
        InvalidRequestError: an element is neither `str` nor `bytes` (e.g. a number in a text input).
    """
    if value.dtype.kind == "S":
        return np.ascontiguousarray(value)
    flat = []
    for item in value.ravel():
        if isinstance(item, bytes):
            flat.append(item)
        elif isinstance(item, str):
            flat.append(item.encode("utf-8"))
        else:
            raise InvalidRequestError(f"input {name!r} is a string tensor; got an element of type "
                                      f"{type(item).__name__} ({item!r}); send str or bytes")
    return np.array(flat, dtype=np.bytes_).reshape(value.shape) if flat else value.astype(np.bytes_)


class LiteRtRunner:
    """One LiteRT interpreter bound to one signature of a `.tflite` file.

    Threading: the underlying interpreter is not thread-safe; `run` holds an internal lock, so one runner
    may be shared by threads but serves one call at a time. For parallel inference create one runner per
    thread (each has its own interpreter and tensor arena).

    Args:
        path: the `.tflite` file.
        num_threads: CPU threads for LiteRT kernels (`Interpreter(num_threads=...)`); None lets LiteRT
            choose.
        signature_key: the signature to run; `serving_default` unless given.

    Raises:
        ConversionError: the file is missing or LiteRT cannot load it.
        ContractError: the signature does not exist, or an I/O tensor uses per-axis quantization.
    """

    def __init__(self, path: Path | str, num_threads: int | None = None,
                 signature_key: str = DEFAULT_SIGNATURE) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ConversionError(f"TFLite file {str(self.path)!r} does not exist")
        try:
            self._interpreter = Interpreter(model_path=str(self.path), num_threads=num_threads)
        except (ValueError, RuntimeError) as err:
            raise ConversionError(f"LiteRT cannot load {str(self.path)!r}: {err}") from err
        signatures = self._interpreter.get_signature_list()
        if signature_key not in signatures:
            raise ContractError(
                f"{str(self.path)!r} has no signature {signature_key!r}; it has {sorted(signatures)}")
        self._runner = self._interpreter.get_signature_runner(signature_key)
        self._contract = LiteRtContract(
            signature_key,
            tuple(_tensor(n, d) for n, d in sorted(self._runner.get_input_details().items())),
            tuple(_tensor(n, d) for n, d in sorted(self._runner.get_output_details().items())),
        )
        self._inputs = {t.name: t for t in self._contract.inputs}
        self._lock = threading.Lock()
        prime_dynamic_shapes(self._runner, self._runner.get_input_details())

    def contract(self) -> LiteRtContract:
        """Names, numpy dtypes, `shape_signature` (-1 = dynamic) and quantization of every I/O tensor."""
        return self._contract

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the signature once on a batch.

        Inputs are resized to the shapes given (LiteRT `ResizeInputTensor` + `AllocateTensors`, as
        `SignatureRunner.__call__` does), so any batch size works where the batch dimension is -1.
        String inputs (LiteRT `|S0`) take numpy `str`, `bytes` or object arrays of either (sent as UTF-8).
        Float inputs fed to an int8/uint8 model input are quantized with that input's scale and zero
        point (`q = round(x / scale) + zero_point`, clipped to the integer range). Quantized outputs are
        dequantized with their own scale and zero point to float32 (`(q - zero_point) * scale`), so float
        outputs always come back as float32; integer outputs (e.g. int64 class ids) are returned as is.

        Args:
            inputs: exactly the signature's input names, each an array whose rank and fixed dimensions
                match `shape_signature`.

        Returns:
            Output name → array; the leading dimension follows the input batch.

        Raises:
            InvalidRequestError: a missing or extra input name, a rank or fixed-dimension mismatch, or a
                dtype that cannot be cast to the input's dtype.
            ConversionError: LiteRT failed to allocate or invoke.
        """
        feed = self._prepare(inputs)
        with self._lock:
            try:
                raw = self._runner(**feed)
            except (ValueError, RuntimeError) as err:
                raise ConversionError(f"LiteRT failed to run {str(self.path)!r}: {err}") from err
        return {t.name: self._decode(t, raw[t.name]) for t in self._contract.outputs}

    def _prepare(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = sorted(set(self._inputs) - set(inputs))
        extra = sorted(set(inputs) - set(self._inputs))
        if missing or extra:
            raise InvalidRequestError(
                f"inputs must be exactly {sorted(self._inputs)}; missing {missing}, unexpected {extra}")
        return {name: self._encode(self._inputs[name], np.asarray(value)) for name, value in inputs.items()}

    @staticmethod
    def _encode(spec: LiteRtTensor, value: np.ndarray) -> np.ndarray:
        expected = spec.shape_signature
        if value.ndim != len(expected) or any(
                want not in (-1, got) for want, got in zip(expected, value.shape, strict=True)):
            raise InvalidRequestError(
                f"input {spec.name!r} has shape {list(value.shape)}; expected {list(expected)} (-1 = any)")
        if spec.dtype.kind in "SOU":
            return _as_utf8_bytes(spec.name, value)
        if value.dtype.kind in "SOU":
            raise InvalidRequestError(f"input {spec.name!r} holds text ({value.dtype}); expected numbers of "
                                      f"dtype {spec.dtype}")
        if spec.quantized and value.dtype.kind == "f":
            info = np.iinfo(spec.dtype)
            quantized = np.round(value.astype(np.float64) / spec.scale) + spec.zero_point
            return np.clip(quantized, info.min, info.max).astype(spec.dtype)
        if value.dtype == spec.dtype:
            return np.ascontiguousarray(value)
        if not np.can_cast(value.dtype, spec.dtype, casting="same_kind"):
            raise InvalidRequestError(
                f"input {spec.name!r} has dtype {value.dtype}; expected {spec.dtype} (or a castable one)")
        return np.ascontiguousarray(value.astype(spec.dtype))

    @staticmethod
    def _decode(spec: LiteRtTensor, value: np.ndarray) -> np.ndarray:
        if spec.quantized:
            return ((value.astype(np.float32) - np.float32(spec.zero_point)) * np.float32(spec.scale))
        return np.array(value, copy=True)
