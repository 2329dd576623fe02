"""TF Serving's REST answers as JSON text: its number formatting (`tensorflow_serving/util/json_tensor.cc`).

Floats and doubles are written as json_tensor.cc's `WriteDecimal` writes them: `absl::StrCat(value)` (printf
`%g`, six significant digits) when that reads back to the same value in the value's own type, else `%.9g`
(float, `max_digits10`) / `%.17g` (double); `.0` is appended when the text has neither `.` nor `e`; NaN and
±infinity are `NaN`, `Infinity`, `-Infinity`. So float32 1435774300 is `1.43577434e+09`, 0.2 is `0.2`, 4 is `4.0`,
9000000 is `9e+06`. (`half` outputs, which TF Serving cannot write at all, are written by the float rules.)

Since Python's `json` writes a float by `repr` (`1435774336.0`), formatted numbers travel as `RawJson`: text
`dumps` writes unquoted. Everything else is written by `json.dumps`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping

import numpy as np

from tfship.core.echo import echo
from tfship.core.errors import InvalidRequestError

# significant digits of the fallback for a value `%g` does not round-trip (std::numeric_limits<T>::max_digits10)
_MAX_DIGITS10 = {np.dtype(np.float16): 9, np.dtype(np.float32): 9, np.dtype(np.float64): 17}


class RawJson(str):
    """JSON text written as is by `dumps` (a formatted number or a nested list of them)."""


def decimal_texts(array: np.ndarray) -> np.ndarray:
    """TF Serving's `WriteDecimal` text of each value of a float array (same shape, dtype str).

    The round-trip test reads the `%g` text back in the array's own type (`absl::SimpleAtof` for float,
    `SimpleAtod` for double), as WriteDecimal does; float16 is read back as float32 (it is widened first).
    """
    values = np.asarray(array)
    wide = values.astype(np.float64)
    finite = np.isfinite(wide)
    texts = np.char.mod("%g", wide)
    back = texts.astype(np.float64)
    if values.dtype != np.float64:
        back = back.astype(np.float32)
        wide32 = wide.astype(np.float32)
        differs = finite & (back != wide32)
    else:
        differs = finite & (back != wide)
    if differs.any():
        digits = _MAX_DIGITS10.get(values.dtype, 17)
        texts = np.where(differs, np.char.mod(f"%.{digits}g", wide), texts)
    whole = finite & (np.char.find(texts, ".") < 0) & (np.char.find(texts, "e") < 0)
    if whole.any():
        texts = np.where(whole, np.char.add(texts, ".0"), texts)
    if not finite.all():
        texts = np.where(np.isnan(wide), "NaN", texts)
        texts = np.where(np.isposinf(wide), "Infinity", texts)
        texts = np.where(np.isneginf(wide), "-Infinity", texts)
    return texts


def nested_text(texts: np.ndarray) -> RawJson:
    """A JSON array (nested as `texts`' shape) of the texts, or the one text of a 0-d array."""
    if texts.ndim == 0:
        return RawJson(texts.item())
    if texts.size == 0:
        return RawJson(json.dumps(np.zeros(texts.shape).tolist(), separators=(",", ":")))
    level: np.ndarray = texts
    while level.ndim > 0:
        rows = level.reshape(-1, level.shape[-1])
        joined = np.array(["[" + ",".join(row) + "]" for row in rows.tolist()], dtype=object)
        level = joined.reshape(level.shape[:-1])
    return RawJson(level.item())


def float_json(array: np.ndarray) -> RawJson:
    """A float array (any shape) as TF Serving writes it."""
    return nested_text(decimal_texts(array))


def dumps(payload) -> str:
    """Compact JSON text of `payload` (dicts, lists, `RawJson`, and what `json.dumps` writes; NaN / ±infinity
    as the `NaN` / `Infinity` tokens TF Serving writes).
    """
    if isinstance(payload, RawJson):
        return payload
    if isinstance(payload, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dumps(v)}" for k, v in payload.items()) + "}"
    if isinstance(payload, list | tuple):
        return "[" + ",".join(dumps(v) for v in payload) + "]"
    return json.dumps(payload, separators=(",", ":"))


BYTES_SUFFIX = "_bytes"


def _json_values(name: str, array: np.ndarray):
    """Nested lists (or a scalar) of JSON values for a non-float `array`."""
    kind = array.dtype.kind
    if kind in "iub":
        return array.tolist()
    if kind in "OSU":
        as_b64 = name.endswith(BYTES_SUFFIX)
        flat = np.empty(array.size, dtype=object)
        flat[:] = [_string_json(v, as_b64) for v in array.reshape(-1).tolist()]
        return flat.reshape(array.shape).tolist()
    raise InvalidRequestError(f"output {echo(name)}: Failed to write JSON value for tensor type: {array.dtype} "
                              "(the REST API has no JSON form for it; use gRPC Predict)")


def _string_json(value, as_b64: bool):
    raw = value if isinstance(value, bytes) else str(value).encode()
    if not as_b64:
        try:
            return raw.decode()
        except UnicodeDecodeError:
            pass
    return {"b64": base64.b64encode(raw).decode()}


def _output_json(name: str, array: np.ndarray, rows: int | None):
    """`RawJson` of the whole output (`rows` None) or a list of one `RawJson` per row of dim 0."""
    if array.dtype.kind == "f":
        texts = decimal_texts(array)
        return nested_text(texts) if rows is None else [nested_text(texts[i]) for i in range(rows)]
    values = _json_values(name, array)
    if rows is None:
        return RawJson(json.dumps(values, separators=(",", ":")))
    return [RawJson(json.dumps(values[i], separators=(",", ":"))) for i in range(rows)]


def response_json(outputs: Mapping[str, np.ndarray], rows: bool, batch: int | None = None) -> dict:
    """`{"predictions": ...}` (row request) or `{"outputs": ...}` (columnar) for Predict outputs, to be written by
    `dumps` (json_tensor.cc MakeJsonFromTensors); one output drops its name.

    `batch`: the row request's number of instances; every output's dim 0 must equal it (None: the first
    output's dim 0, as TF Serving compares outputs with each other).

    Raises:
        InvalidRequestError: row format with a scalar output (`Tensor name: y has no shape information`)
            or outputs whose first dimensions differ (`Tensor name: y has inconsistent batch size: 1
            expecting: 5`); no outputs at all.
    """
    if not outputs:
        raise InvalidRequestError("Cannot convert empty tensor map to JSON")
    arrays = {k: np.asarray(v) for k, v in outputs.items()}
    if not rows:
        values = {k: _output_json(k, a, None) for k, a in arrays.items()}
        return {"outputs": next(iter(values.values())) if len(values) == 1 else values}
    for name, array in arrays.items():
        if array.ndim == 0:
            raise InvalidRequestError(f"Tensor name: {name} has no shape information (a scalar output cannot be "
                                      "split into rows; send the request in columnar format, 'inputs')")
        if batch is not None and array.shape[0] != batch:
            raise InvalidRequestError(f"Tensor name: {name} has inconsistent batch size: {array.shape[0]} expecting: "
                                      f"{batch} (send the request in columnar format, 'inputs', to get every output)")
        batch = array.shape[0] if batch is None else batch
    values = {k: _output_json(k, a, batch) for k, a in arrays.items()}
    assert batch is not None  # set by the loop over the (non-empty) outputs
    if len(values) == 1:
        return {"predictions": next(iter(values.values()))}
    return {"predictions": [{k: v[i] for k, v in values.items()} for i in range(batch)]}
