"""JSON numbers as both REST APIs read them: a literal outside a float dtype's finite range is refused.

`json.loads` turns `1e309` into infinity and numpy turns `1e39` into float32 infinity, silently: the model
would be fed ±Infinity the client never wrote. `loads` marks literals beyond float64 (`OutOfRangeNumber`,
value ±inf, keeping the text), and `first_out_of_range` finds a value that is infinite in the decoded array
but was not written as `Infinity` (TF Serving's explicit `NaN` / `Infinity` / `-Infinity` tokens stay
accepted). TF Serving's REST API (`serving.tfs.rest_json`) and the Open Inference Protocol's
(`serving.kserve.codec`) both refuse such a value with INVALID_ARGUMENT naming the input and the literal.
"""

from __future__ import annotations

import json
import math
import re
import sys

import numpy as np

try:
    import orjson
except ImportError:  # optional: the standard parser gives the same results, slower
    orjson = None

from tfship.core.echo import clip


class OutOfRangeNumber(float):
    """A JSON number literal beyond float64's range (`1e309`): value ±inf, `text` the literal as written."""

    text: str

    def __new__(cls, text: str) -> OutOfRangeNumber:
        number = super().__new__(cls, float(text))
        number.text = text
        return number

    def __repr__(self) -> str:
        return self.text[:40]


def parse_float(text: str) -> float:
    """`json.loads`'s `parse_float`: the literal's float, or an `OutOfRangeNumber` when it overflows float64."""
    value = float(text)
    return OutOfRangeNumber(text) if math.isinf(value) else value


def parse_error_reason(error: Exception) -> str:
    """A client's words for why its JSON body did not parse (both REST APIs), naming no Python internals.

    `error`: what `loads` raised (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError).
    """
    if isinstance(error, UnicodeDecodeError):
        return f"body is not UTF-8 at offset: {error.start}"
    if isinstance(error, json.JSONDecodeError):
        return f"{error.msg} at offset: {error.pos}"
    if isinstance(error, RecursionError):
        return "the document is nested too deeply"
    if "digits" in str(error):  # Python's int-string limit (CVE-2020-10735), worded for the client
        return f"an integer literal has more than {sys.get_int_max_str_digits()} digits"
    return clip(str(error))


PARSE_ERRORS = (ValueError, RecursionError)  # what `loads` raises for a body that is not JSON it can hold


class LoneSurrogateError(ValueError):
    """A UTF-16 surrogate escape (D800-DFFF) with no partner: RapidJSON (TF Serving's parser) refuses it with
    kParseErrorStringUnicodeSurrogateInvalid; `json.loads` would keep it as a string no UTF-8 can encode.
    """


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # the escape's text, before decoding (bytes or str)
_SURROGATE = re.compile("[\ud800-\udfff]")  # a decoded surrogate left alone (pairs decode to one code point)


def loads(raw: bytes | str):
    """`json.loads` with literals beyond float64 marked (`OutOfRangeNumber`).

    Raises:
        LoneSurrogateError: a string or key holds an unpaired UTF-16 surrogate escape ("The surrogate pair in
            string is invalid.", RapidJSON's words).
        ValueError, RecursionError: as `json.loads`.
    """
    parsed = json.loads(raw, parse_float=parse_float)
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    if _SURROGATE_ESCAPE.search(text) and _holds_lone_surrogate(parsed):
        raise LoneSurrogateError("The surrogate pair in string is invalid. (an unpaired \\uD800-\\uDFFF escape)")
    return parsed


# Digits -> "0", "." kept, every other byte -> ",": a JSON integer literal of 19 digits or more (one orjson reads
# as a float: past int64 / uint64) shows as ",0000000000000000000" (a fraction's digits follow a ".").
_DIGIT_RUNS = bytes(48 if 48 <= byte <= 57 else 46 if byte == 46 else 44 for byte in range(256))
_LONG_INTEGER = b"," + b"0" * 19


def loads_exact(raw: bytes):
    """`loads` (the same values, the same errors), through orjson (about 10x faster on numeric arrays) when it
    reads the document as `loads` does: not for what orjson refuses (NaN/Infinity tokens, literals beyond
    float64, lone surrogates, non-UTF-8, syntax errors; `loads` then accepts or words the error) nor for a
    document holding an integer literal of 19 digits or more (orjson reads those past 64 bits as floats).

    Raises:
        As `loads`.
    """
    if orjson is not None and _LONG_INTEGER not in raw.translate(_DIGIT_RUNS) and not raw[:19].isdigit():
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return loads(raw)


def _holds_lone_surrogate(value) -> bool:
    """Whether any string or key in the decoded document holds a surrogate code point (iterative: no recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def first_out_of_range(values: list, array: np.ndarray) -> tuple[int, str] | None:
    """(index, literal) of the first of `values` (flat, row-major) that `array` (their decoded form, any float
    dtype, same order) holds as ±inf although the client did not write `Infinity`: an `OutOfRangeNumber`, or a
    finite number the dtype cannot hold (`1e39` in float32). None when every value is represented.
    """
    flat = array.reshape(-1)
    infinite = np.isinf(flat)
    if not infinite.any():
        return None
    for index in np.flatnonzero(infinite):
        value = values[index]
        if isinstance(value, OutOfRangeNumber):
            return int(index), value.text[:40]
        if math.isfinite(value):
            return int(index), repr(value)
    return None
