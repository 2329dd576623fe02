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
import functools
import json
import math
import struct
from collections.abc import Mapping

import numpy as np

from tfship.core.echo import echo
from tfship.core.errors import InvalidRequestError

# significant digits of the fallback for a value `%g` does not round-trip (std::numeric_limits<T>::max_digits10)
_MAX_DIGITS10 = {np.dtype(np.float16): 9, np.dtype(np.float32): 9, np.dtype(np.float64): 17}


class RawJson(str):
    """JSON text written as is by `dumps` (a formatted number or a nested list of them)."""


_FORMATS_CACHED = 4096  # `%g,%g,...` format strings kept for outputs up to this many values
_FEW = 64  # up to this many values, formatted one by one in Python (numpy's per-call cost is larger)
_FLOAT32 = struct.Struct("<f")


@functools.lru_cache(maxsize=64)
def _cached_format(spec: str, count: int) -> str:
    return ",".join([spec] * count)


def _format_all(spec: str, values: list[float]) -> list[str]:
    """`spec % v` for each of `values` (Python floats), by one `%` over a tuple: no Python code per value."""
    count = len(values)
    if not count:
        return []
    fmt = _cached_format(spec, count) if count <= _FORMATS_CACHED else ",".join([spec] * count)
    return (fmt % tuple(values)).split(",")


def _whole(text: str) -> str:
    return text if "." in text or "e" in text else text + ".0"


def _few_texts(items: list[float], double: bool, fallback: str) -> list[str]:
    """`flat_decimal_texts` of a few values, one Python step each (cheaper than numpy's calls below `_FEW`);
    float16 / float32 values widen to float64 exactly, so the round trip compares the text's float32 (as
    numpy's `astype(np.float32)` rounds it: `struct`'s `f`, infinity beyond its range) with the value itself.
    """
    texts, pack, unpack, inf = [], _FLOAT32.pack, _FLOAT32.unpack, math.inf
    for value in items:
        if value != value:
            texts.append("NaN")
            continue
        if value == inf or value == -inf:
            texts.append("Infinity" if value > 0 else "-Infinity")
            continue
        text = "%g" % value
        back = float(text)
        if not double:
            try:
                back = unpack(pack(back))[0]
            except OverflowError:
                back = inf
        if back != value:
            text = fallback % value
        texts.append(text if "." in text or "e" in text else text + ".0")
    return texts


def flat_decimal_texts(array: np.ndarray) -> list[str]:
    """TF Serving's `WriteDecimal` text of each value of a float array, flattened row-major (a list of str).

    The round-trip test reads the `%g` text back in the array's own type (`absl::SimpleAtof` for float,
    `SimpleAtod` for double), as WriteDecimal does; float16 is read back as float32 (it is widened first).
    Cost: two C-level `%` passes and one numpy parse; Python code only for the values that need the `%.9g` /
    `%.17g` fallback, the whole numbers (`.0`) and NaN / ±infinity.
    """
    values = np.asarray(array)
    wide = values.astype(np.float64).reshape(-1)
    items = wide.tolist()
    if len(items) <= _FEW:
        return _few_texts(items, values.dtype == np.float64, f"%.{_MAX_DIGITS10.get(values.dtype, 17)}g")
    texts = np.array(_format_all("%g", items), dtype=object)
    back = texts.astype(np.float64)
    finite = np.isfinite(wide)
    if values.dtype != np.float64:
        differs = finite & (back.astype(np.float32) != wide.astype(np.float32))
    else:
        differs = finite & (back != wide)
    if differs.any():
        indices = np.flatnonzero(differs)
        fallback = _format_all(f"%.{_MAX_DIGITS10.get(values.dtype, 17)}g", wide[indices].tolist())
        texts[indices] = fallback
        back[indices] = np.array(fallback, dtype=np.float64)
    # a text without `.` and `e` is an integer literal, which reads back whole: only those can need `.0`
    for index in np.flatnonzero(finite & (back == np.trunc(back))).tolist():
        texts[index] = _whole(texts[index])
    if not finite.all():
        for index in np.flatnonzero(~finite).tolist():
            value = items[index]
            texts[index] = "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"
    return texts.tolist()


def decimal_texts(array: np.ndarray) -> np.ndarray:
    """`flat_decimal_texts` as an array of `array`'s shape (dtype str)."""
    values = np.asarray(array)
    return np.array(flat_decimal_texts(values), dtype=str).reshape(values.shape)


def _nested(texts: list[str], shape: tuple[int, ...]) -> str:
    """A JSON array nested as `shape` of the flat `texts` (row-major), or the one text of shape `()`."""
    if not shape:
        return texts[0]
    if 0 in shape:
        return json.dumps(np.zeros(shape).tolist(), separators=(",", ":"))
    level = texts
    for dim in reversed(shape):
        level = ["[" + ",".join(level[i:i + dim]) + "]" for i in range(0, len(level), dim)]
    return level[0]


def nested_text(texts: np.ndarray) -> RawJson:
    """A JSON array (nested as `texts`' shape) of the texts, or the one text of a 0-d array."""
    texts = np.asarray(texts)
    return RawJson(_nested(texts.reshape(-1).tolist(), texts.shape))


def float_json(array: np.ndarray) -> RawJson:
    """A float array (any shape) as TF Serving writes it."""
    array = np.asarray(array)
    return RawJson(_nested(flat_decimal_texts(array), array.shape))


@functools.lru_cache(maxsize=1024)
def _key_json(key: str) -> str:
    """A key's JSON text (`predictions`, the signature's output names: a few, written again and again)."""
    return json.dumps(key)


def dumps(payload) -> str:
    """Compact JSON text of `payload` (dicts, lists, `RawJson`, and what `json.dumps` writes; NaN / ±infinity
    as the `NaN` / `Infinity` tokens TF Serving writes).
    """
    if isinstance(payload, RawJson):
        return payload
    if isinstance(payload, dict):
        return "{" + ",".join(f"{_key_json(str(k))}:{dumps(v)}" for k, v in payload.items()) + "}"
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
        texts = flat_decimal_texts(array)
        if rows is None:
            return RawJson(_nested(texts, array.shape))
        per_row, row_shape = (len(texts) // rows if rows else 0), array.shape[1:]
        return [RawJson(_nested(texts[i * per_row:(i + 1) * per_row], row_shape)) for i in range(rows)]
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
