"""The one LiteRT wrapper: a `.tflite` file's interpreter, its signature runners, one lock, one contract.

Both users of LiteRT go through `LiteRtModel`: the server's `tflite` backend (`serving.runtimes.tflite`,
raw tensors in the model's own dtypes, already checked by the data plane) and the conversion checks of
`tfship.tflite` (the worker's smoke run, the validate gate's parity: `run`, with request checks and float I/O
for quantized tensors). Imports only numpy and `ai_edge_litert` (never TensorFlow, never
`tf.lite.Interpreter`), so processes that do not load TensorFlow can use it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfship.core.errors import ContractError, ConversionError, InvalidRequestError
from tfship.serving.runtimes.tflite_tensors import TensorSignature
from tfship.serving.runtimes.tflite_tensors import run as run_tensors

DEFAULT_SIGNATURE = "serving_default"
PRIME_BATCH = 2
_QUANTIZED_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16))


class LiteRtCallError(RuntimeError):
    """LiteRT refused or failed one call; `text` is this call's part of LiteRT's message.

    LiteRT's error reporter keeps earlier calls' messages in front of the new one; `text` drops them.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


@dataclass(frozen=True)
class LiteRtTensor:
    """One signature input or output as LiteRT declares it.

    Attributes:
        name: the signature key (the SavedModel signature's input or output name, e.g. `image`).
        dtype: numpy dtype of the tensor inside the model (e.g. `float32`, `int8`, `int64`).
        shape_signature: declared shape; `-1` marks a dynamic dimension (the batch dimension after a
            conversion that kept it dynamic).
        tensor_name: the tensor's name inside the model (e.g. `serving_default_image:0`).
        scales: affine quantization scales of an int8/uint8/int16 tensor (one per tensor, or one per
            channel), else empty.
        zero_points: the zero points matching `scales`.
    """

    name: str
    dtype: np.dtype
    shape_signature: tuple[int, ...]
    tensor_name: str = ""
    scales: tuple[float, ...] = ()
    zero_points: tuple[int, ...] = ()

    @property
    def quantized(self) -> bool:
        """True when the tensor holds affine-quantized integers (`real = (q - zero_point) * scale`)."""
        return bool(self.scales)

    @property
    def scale(self) -> float | None:
        """The per-tensor quantization scale; None when not quantized.

        Raises:
            ContractError: the tensor is quantized per axis (float I/O supports per-tensor scales only).
        """
        return self._per_tensor()[0]

    @property
    def zero_point(self) -> int | None:
        """The per-tensor zero point; None when not quantized (raises as `scale`)."""
        return self._per_tensor()[1]

    def _per_tensor(self) -> tuple[float | None, int | None]:
        if not self.scales:
            return None, None
        if len(self.scales) != 1:
            raise ContractError(
                f"signature tensor {self.name!r} uses per-axis quantization ({len(self.scales)} scales); "
                "only per-tensor quantized inputs and outputs are supported")
        return self.scales[0], self.zero_points[0]


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
    scales = tuple(float(s) for s in np.asarray(params.get("scales", []), dtype=np.float64))
    zero_points = tuple(int(z) for z in np.asarray(params.get("zero_points", []), dtype=np.int64))
    if dtype not in _QUANTIZED_DTYPES or not scales:
        return LiteRtTensor(name, dtype, shape, details.get("name", ""))
    return LiteRtTensor(name, dtype, shape, details.get("name", ""), scales, zero_points)


class LiteRtModel:
    """One LiteRT interpreter over a `.tflite` file, with every signature runner it has.

    Threading: a LiteRT interpreter is not thread-safe; every call holds the model's one lock, so a model may
    be shared by threads but serves one call at a time. For parallel inference create one model per thread.
    A file without signature runners (`signature_keys` empty) has its tensors allocated and is run over them
    (`run_over_tensors`), as TF Serving's TfLiteSession runs it.

    Args:
        path: the `.tflite` file.
        num_threads: CPU threads for LiteRT kernels (`Interpreter(num_threads=...)`); None lets LiteRT choose.

    Raises:
        ConversionError: the file is missing or LiteRT cannot load it.
    """

    def __init__(self, path: Path | str, num_threads: int | None = None) -> None:
        # deferred: the serving registry imports this module on installs without LiteRT (`can_serve` says no)
        from ai_edge_litert.interpreter import Interpreter

        self.path = Path(path)
        if not self.path.is_file():
            raise ConversionError(f"TFLite file {str(self.path)!r} does not exist")
        try:
            self.interpreter = Interpreter(model_path=str(self.path), num_threads=num_threads)
            self._runners = {key: self.interpreter.get_signature_runner(key)
                             for key in self.interpreter.get_signature_list()}
            if not self._runners:
                self.interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as err:
            raise ConversionError(f"LiteRT cannot load {str(self.path)!r}: {err}") from err
        self._contracts = {key: LiteRtContract(
            key, tuple(_tensor(n, d) for n, d in sorted(runner.get_input_details().items())),
            tuple(_tensor(n, d) for n, d in sorted(runner.get_output_details().items())))
            for key, runner in self._runners.items()}
        self._lock = threading.Lock()
        self._last_error = ""
        for runner in self._runners.values():
            prime_dynamic_shapes(runner)

    @property
    def signature_keys(self) -> tuple[str, ...]:
        """The file's signature runner keys, sorted (empty for a file without signature runners)."""
        return tuple(sorted(self._runners))

    def contract(self, signature_key: str = DEFAULT_SIGNATURE) -> LiteRtContract:
        """Names, numpy dtypes, `shape_signature` (-1 = dynamic) and quantization of every I/O tensor.

        Raises:
            ContractError: the file has no signature `signature_key`.
        """
        if signature_key not in self._contracts:
            raise ContractError(f"{str(self.path)!r} has no signature {signature_key!r}; "
                                f"it has {sorted(self._contracts)}")
        return self._contracts[signature_key]

    def run_raw(self, inputs: Mapping[str, np.ndarray],
                signature_key: str = DEFAULT_SIGNATURE) -> dict[str, np.ndarray]:
        """Run one signature on inputs already in the model's dtypes and names (the server's data plane
        checked them against the contract); outputs come back in the model's dtypes, copied.

        Inputs are resized to the shapes given (`SignatureRunner.__call__` resizes and reallocates).

        Raises:
            LiteRtCallError: LiteRT refused a shape or value, or a kernel failed.
        """
        runner = self._runners[signature_key]
        with self._lock:
            try:
                outputs = runner(**inputs)
            except (ValueError, RuntimeError) as err:  # LiteRT: RuntimeError("... failed to invoke")
                raise LiteRtCallError(self._new_error_text(str(err))) from err
            return {k: np.array(v, copy=True) for k, v in outputs.items()}

    def run_over_tensors(self, signature: TensorSignature,
                         inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run a file without signature runners over its tensors (`serving.runtimes.tflite_tensors`).

        Raises:
            LiteRtCallError: LiteRT refused a shape or value, or a kernel failed.
        """
        with self._lock:
            try:
                return run_tensors(self.interpreter, signature, inputs)
            except (ValueError, RuntimeError) as err:
                raise LiteRtCallError(self._new_error_text(str(err))) from err

    def run(self, inputs: Mapping[str, np.ndarray],
            signature_key: str = DEFAULT_SIGNATURE) -> dict[str, np.ndarray]:
        """Run one signature on a checked batch with float I/O (the conversion checks' call).

        Inputs are resized to the shapes given, so any batch size works where the batch dimension is -1.
        String inputs (LiteRT `|S0`) take numpy `str`, `bytes` or object arrays of either (sent as UTF-8).
        Float inputs fed to an int8/uint8 model input are quantized with that input's scale and zero
        point (`q = round(x / scale) + zero_point`, clipped to the integer range). Quantized outputs are
        dequantized with their own scale and zero point to float32 (`(q - zero_point) * scale`), so float
        outputs always come back as float32; integer outputs (e.g. int64 class ids) are returned as is.

        Args:
            inputs: exactly the signature's input names, each an array whose rank and fixed dimensions
                match `shape_signature`.
            signature_key: the signature to run.

        Returns:
            Output name -> array; the leading dimension follows the input batch.

        Raises:
            InvalidRequestError: a missing or extra input name, a rank or fixed-dimension mismatch, or a
                dtype that cannot be cast to the input's dtype.
            ContractError: no such signature, or a quantized I/O tensor uses per-axis quantization.
            ConversionError: LiteRT failed to allocate or invoke.
        """
        contract = self.contract(signature_key)
        feed = _prepare(contract, inputs)
        try:
            raw = self.run_raw(feed, signature_key)
        except LiteRtCallError as err:
            raise ConversionError(f"LiteRT failed to run {str(self.path)!r}: {err.text}") from err
        return {t.name: _decode(t, raw[t.name]) for t in contract.outputs}

    def _new_error_text(self, text: str) -> str:
        """This call's part of LiteRT's error text (its error reporter keeps earlier calls' messages)."""
        previous, self._last_error = self._last_error, text
        text = text[len(previous):] if previous and text.startswith(previous) else text
        # LiteRT's reporter appends "Node number N (OP) failed ..." to a kernel's message with no separator
        return re.sub(r"(?<=[^\s.;:])(?=Node number \d)", "; ", text)


def prime_dynamic_shapes(runner, input_details: dict | None = None) -> None:
    """Run a signature once at batch `PRIME_BATCH` (zeros / empty strings) when every input has a dynamic
    dimension; `LiteRtModel` does it for every signature runner it opens.

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


def _prepare(contract: LiteRtContract, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    specs = {t.name: t for t in contract.inputs}
    missing = sorted(set(specs) - set(inputs))
    extra = sorted(set(inputs) - set(specs))
    if missing or extra:
        raise InvalidRequestError(
            f"inputs must be exactly {sorted(specs)}; missing {missing}, unexpected {extra}")
    return {name: _encode(specs[name], np.asarray(value)) for name, value in inputs.items()}


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
        info, scale, zero_point = np.iinfo(spec.dtype), spec.scale, spec.zero_point
        assert scale is not None and zero_point is not None  # a quantized tensor has them (per-axis: refused)
        quantized = np.round(value.astype(np.float64) / scale) + zero_point
        return np.clip(quantized, info.min, info.max).astype(spec.dtype)
    if value.dtype == spec.dtype:
        return np.ascontiguousarray(value)
    if not np.can_cast(value.dtype, spec.dtype, casting="same_kind"):
        raise InvalidRequestError(
            f"input {spec.name!r} has dtype {value.dtype}; expected {spec.dtype} (or a castable one)")
    return np.ascontiguousarray(value.astype(spec.dtype))


def _decode(spec: LiteRtTensor, value: np.ndarray) -> np.ndarray:
    if spec.quantized:
        return (value.astype(np.float32) - np.float32(spec.zero_point)) * np.float32(spec.scale)
    return value


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
