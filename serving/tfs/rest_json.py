"""TF Serving's REST JSON <-> numpy, following `tensorflow_serving/util/json_tensor.cc` (no TensorFlow).

Requests: `instances` (row format; one value or one object per row) or `inputs` (columnar; one value
or an object naming the inputs). Each leaf must be of the JSON type the signature's dtype takes:
float/double/half take numbers (also `NaN`, `Infinity`), integer dtypes take whole JSON numbers inside
the dtype's range (`1.7` or `3000000000` for int32 are refused), bool takes `true`/`false`, string
takes a string or `{"b64": "..."}`. Anything else is INVALID_ARGUMENT with TF Serving's wording,
prefixed by the input it concerns: `input 'x': JSON Value: 1.7 Type: Number is not of expected type: int32`.

Responses: row requests answer `{"predictions": ...}` and need every output to share dim 0 (a scalar
output or one with another first dimension is INVALID_ARGUMENT naming it); columnar requests answer
`{"outputs": ...}`. One output drops its name. Outputs whose alias ends in `_bytes` are written as
`{"b64": ...}`; other strings as text (tfship deviation: bytes that are not UTF-8 are written as
`{"b64": ...}` too, where TF Serving would write invalid JSON). Floats are written as TF Serving's
WriteDecimal writes them (`serving.tfs.json_write`, which holds the answer side).
"""

from __future__ import annotations

import base64
import binascii

import numpy as np

try:
    import orjson
except ImportError:  # optional: the standard parser gives the same results, slower
    orjson = None

from tfship.core.contract import Signature
from tfship.core.echo import clip, echo, echo_json, echo_list, json_kind
from tfship.core.errors import InvalidRequestError
from tfship.serving.dataplane import json_numbers
from tfship.serving.dataplane.json_numbers import OutOfRangeNumber
from tfship.serving.dataplane.tensors import MAX_RANK
from tfship.serving.tfs.json_write import BYTES_SUFFIX, response_json  # noqa: F401 (the answer side, re-exported)

_DEBUG_CHARS = 256  # TF Serving's kMaxJsonDebugStringBytes

# numpy dtype name -> TF Serving's DataTypeString (what its messages call the type).
_TF_TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "half", "string": "string", "bool": "bool"}
_INT_RANGES = {name: (int(np.iinfo(name).min), int(np.iinfo(name).max))
               for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")}


def debug_string(value) -> str:
    """Compact JSON of `value`, cut at 256 characters (TF Serving's JsonValueToDebugString); bounded in cost and
    depth whatever the value's size or nesting (`core.echo.echo_json`).
    """
    return echo_json(value, _DEBUG_CHARS)


def json_type(value) -> str:
    """TF Serving's name for a JSON value's type (`Null`, `True`, `False`, `Number`, `String`, `Array`, `Object`):
    `core.echo.json_kind` capitalised, with a boolean named by its value.
    """
    if isinstance(value, bool):
        return "True" if value else "False"
    return json_kind(value).capitalize()


def _loads(raw: bytes):
    """Orjson (about 10x faster on numeric arrays: a quarter of a REST server's time went to `json.loads`,
    bench/results/serve-profile.md); whatever orjson refuses (NaN/Infinity tokens, integers past 64 bits,
    non-UTF-8, syntax errors) goes to the standard parser, which accepts or words the error as before.
    """
    if orjson is not None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json_numbers.loads(raw)  # literals beyond float64 marked, refused where a float input gets them


def parse_body(raw: bytes) -> dict:
    """Parse a request body; NaN/Infinity tokens are accepted as TF Serving does.

    Raises:
        InvalidRequestError: empty body, JSON syntax error (with its offset), a body that is not an
            object or nests too deeply.
    """
    if not raw.strip():
        raise InvalidRequestError("JSON Parse error: The document is empty")
    try:
        body = _loads(raw)
    except json_numbers.PARSE_ERRORS as err:
        raise InvalidRequestError(f"JSON Parse error: {json_numbers.parse_error_reason(err)}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError(f"JSON Value: {debug_string(body)} Is not object")
    return body


def signature_name(body: dict) -> str:
    """`signature_name` of a body (`serving_default` when absent or empty); must be a JSON string."""
    name = body.get("signature_name")
    if name is not None and not isinstance(name, str):
        raise InvalidRequestError(f"JSON Value: {debug_string(name)} not formatted correctly. "
                                  "'signature_name' key must be a string value.")
    return name or "serving_default"


def _type_error(value, dtype: str) -> InvalidRequestError:
    return InvalidRequestError(f"JSON Value: {debug_string(value)} Type: {json_type(value)} is not of expected "
                               f"type: {_TF_TYPE_NAMES.get(dtype, dtype)}")


def _dense_shape(value) -> list[int]:
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def _flatten(value, level: int, shape: list[int], out: list, kinds: set) -> None:
    """Collect the leaves of `value` in row-major order, checking every list has the size of its level; `kinds`
    gathers the leaves' types (one pass: `_typed_leaves` judges them without visiting the leaves again).
    """
    if not isinstance(value, list):
        if level != len(shape):
            raise InvalidRequestError(f"JSON Value: {debug_string(value)} found at incorrect level: {level + 1} in "
                                      f"the JSON DOM. Expected at level: {len(shape)}")
        out.append(value)
        kinds.add(type(value))
        return
    if level >= len(shape):
        raise InvalidRequestError(f"Encountered list at unexpected level: {level} expected < {len(shape)}")
    if len(value) != shape[level]:
        raise InvalidRequestError(f"Encountered list at unexpected size: {len(value)} at level: {level} "
                                  f"expected size: {shape[level]}")
    if level == len(shape) - 1:
        found = set(map(type, value))  # the leaves' types gathered by C, not a Python test per leaf
        if not any(issubclass(kind, list) for kind in found):
            out.extend(value)
            kinds |= found
            return
    if level == len(shape) - 2:  # lists of leaves: checked inline (one call per list costs more than the check)
        size = shape[level + 1]
        for item in value:
            if type(item) is list and len(item) == size:
                found = set(map(type, item))
                if list not in found:
                    out.extend(item)
                    kinds |= found
                    continue
            _flatten(item, level + 1, shape, out, kinds)
        return
    for item in value:
        _flatten(item, level + 1, shape, out, kinds)


def b64_decode(text: str) -> bytes:
    """The bytes of a `{"b64": text}` value as TF Serving decodes it (absl::Base64Unescape): the standard alphabet,
    `=` padding optional (`aGk` is `hi`); raises `binascii.Error` / `ValueError` for anything else.
    """
    missing = -len(text) % 4
    if missing == 3:
        raise ValueError("a base64 text cannot be 1 character past a multiple of 4")
    return base64.b64decode(text if "=" in text else text + "=" * missing, validate=True)


def _string_leaf(value) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dict):
        if set(value) != {"b64"} or not isinstance(value["b64"], str):
            raise InvalidRequestError(f"JSON Value: {debug_string(value)} not formatted correctly for base64 data")
        try:
            return b64_decode(value["b64"])
        except (binascii.Error, ValueError) as err:
            raise InvalidRequestError("Unable to base64 decode") from err
    raise _type_error(value, "string")


_NUMBER_KINDS = frozenset({int, float, OutOfRangeNumber})


def _typed_leaves(leaves: list, dtype: str, kinds: set) -> np.ndarray:
    """Numpy array of `dtype` from JSON leaves (`kinds`: their types); raises the first leaf's type error."""
    if dtype == "string":
        return np.array([_string_leaf(v) for v in leaves] or [], dtype=object)
    if dtype == "bool":
        if kinds <= {bool}:
            return np.array(leaves, dtype=bool)
        raise _type_error(next(v for v in leaves if type(v) is not bool), dtype)
    if dtype in _INT_RANGES:
        low, high = _INT_RANGES[dtype]
        if kinds <= {int}:
            if leaves and (min(leaves) < low or max(leaves) > high):
                raise _type_error(next(v for v in leaves if not low <= v <= high), dtype)
            return np.array(leaves, dtype=dtype)
        raise _type_error(next(v for v in leaves if type(v) is not int), dtype)
    if dtype in ("float16", "float32", "float64"):
        if kinds <= _NUMBER_KINDS:
            try:
                with np.errstate(over="ignore"):
                    array = np.array(leaves, dtype=dtype)
            except OverflowError:  # an integer literal beyond any float
                big = next(v for v in leaves if type(v) is int and abs(v) > 2 ** 1023)
                bad = (0, clip(str(big), 40))
            else:
                bad = json_numbers.first_out_of_range(leaves, array)
            if bad is not None:
                raise InvalidRequestError(f"value {bad[1]} is outside the finite range of "
                                          f"{_TF_TYPE_NAMES.get(dtype, dtype)} (write Infinity to mean infinity)")
            return array
        raise _type_error(next(v for v in leaves if type(v) not in (int, float)), dtype)
    raise InvalidRequestError(f"Conversion of JSON Value: {debug_string(leaves[:1])} to type: {dtype} "
                              "is not supported by the REST API")


def decode_tensor(name: str, value, dtype: str) -> np.ndarray:
    """One input's JSON value as an array of the signature's `dtype` (shape from the nesting).

    Raises:
        InvalidRequestError: ragged lists, a leaf of the wrong JSON type or out of the dtype's range,
            bad base64; the message starts with `input '<name>':`.
    """
    try:
        shape = _dense_shape(value)
        if len(shape) > MAX_RANK:  # numpy's limit (gRPC refuses the same rank)
            raise InvalidRequestError(f"value is nested {len(shape)} lists deep; a tensor has at most {MAX_RANK} "
                                      "dims")
        leaves: list = []
        kinds: set = set()
        _flatten(value, 0, shape, leaves, kinds)
        return _typed_leaves(leaves, dtype, kinds).reshape(shape)
    except InvalidRequestError as err:
        raise InvalidRequestError(f"input {echo(name)}: {err}") from err
    except RecursionError as err:
        raise InvalidRequestError(f"input {echo(name)}: value is nested too deeply") from err


def _is_named_object(value) -> bool:
    return isinstance(value, dict) and not (set(value) == {"b64"})


def _leaf_count(value) -> int:
    return sum(_leaf_count(v) for v in value) if isinstance(value, list) else 1


def _shape_text(shape: list[int]) -> str:
    return f"[{','.join(map(str, shape))}]"


def _row_mismatch(values: list, keyed: str) -> str | None:
    """TF Serving's words for the first instance whose size or shape differs from instance 0's
    (json_tensor.cc AddInstanceItem: `Expecting tensor size: N but got: M`, `Expecting shape [..] but got: [..]`),
    or None when every instance has instance 0's shape (the fault is elsewhere).
    """
    first_shape, first_size = _dense_shape(values[0]), _leaf_count(values[0])
    for index, value in enumerate(values[1:], 1):
        shape, size = _dense_shape(value), _leaf_count(value)
        if size != first_size:
            fault = f"Expecting tensor size: {first_size} but got: {size}"
        elif shape != first_shape:
            fault = f"Expecting shape {_shape_text(first_shape)} but got: {_shape_text(shape)}"
        else:
            continue
        return f"Failed to process element: {index}{keyed} of 'instances' list. Error: {fault}"
    return None


def _row_tensor(name: str, values: list, dtype: str, keyed: bool) -> np.ndarray:
    """`decode_tensor` of one input's instances; instances of different sizes or shapes are refused with TF
    Serving's `Expecting tensor size` / `Expecting shape` (tfship adds the input's name).
    """
    try:
        return decode_tensor(name, values, dtype)
    except InvalidRequestError as err:
        try:
            mismatch = _row_mismatch(values, f" key: {clip(name)}" if keyed else "")
        except RecursionError:
            mismatch = None
        if mismatch is None:
            raise
        raise InvalidRequestError(f"input {echo(name)}: {mismatch}") from err


def _expected_inputs(signature: Signature) -> str:
    return ", ".join(f"{k}: {s.describe()}" for k, s in sorted(signature.inputs.items()))


def _row_inputs(rows: list, signature: Signature) -> dict[str, np.ndarray]:
    """json_tensor.cc FillTensorMapFromInstancesList: plain values for a one-input signature, else one object
    per instance whose keys are exactly the signature's inputs (an unknown key is refused, unlike `inputs`).
    """
    if not _is_named_object(rows[0]):
        if len(signature.inputs) != 1:
            raise InvalidRequestError("instances is a plain list, but expecting list of objects as multiple input "
                                      f"tensors required as per signature {signature.name!r}: "
                                      f"{sorted(signature.inputs)}")
        if any(_is_named_object(r) for r in rows):
            index = next(i for i, r in enumerate(rows) if _is_named_object(r))
            raise InvalidRequestError(f"Expecting value/list but got object at item {index} of input list")
        (name,) = signature.inputs
        return {name: _row_tensor(name, rows, signature.inputs[name].dtype, keyed=False)}
    names = set(signature.inputs)
    for index, row in enumerate(rows):
        if not _is_named_object(row):
            raise InvalidRequestError(f"Expecting object but got list at item {index} of input list")
        unknown = next((key for key in row if key not in names), None)
        if unknown is not None:
            raise InvalidRequestError(f"Failed to process element: {index} key: {clip(unknown)} of 'instances' list. "
                                      f"Error: JSON object: does not have named input: {clip(unknown)}; signature "
                                      f"{signature.name!r} inputs: {{{_expected_inputs(signature)}}}")
        if set(row) != names:
            raise InvalidRequestError(f"Failed to process element: {index} of 'instances' list. JSON object: "
                                      f"{debug_string(row)} keys must be equal to: {','.join(sorted(names))}")
    return {name: _row_tensor(name, [r[name] for r in rows], spec.dtype, keyed=True)
            for name, spec in signature.inputs.items()}


def _columnar_inputs(data, signature: Signature) -> dict[str, np.ndarray]:
    """json_tensor.cc FillTensorMapFromInputsMap: a plain value (or one `{"b64": ...}`) for a one-input signature,
    else an object read by the signature's input names only: keys it does not name are ignored, as TF Serving
    ignores them; a missing one is `Missing named input: x in 'inputs' object.`
    """
    if not _is_named_object(data):
        if len(signature.inputs) != 1:
            raise InvalidRequestError("inputs is a plain value/list, but expecting an object as multiple input "
                                      f"tensors required as per signature {signature.name!r}: "
                                      f"{sorted(signature.inputs)}")
        (name,) = signature.inputs
        return {name: decode_tensor(name, data, signature.inputs[name].dtype)}
    inputs = {}
    for name, spec in signature.inputs.items():
        if name not in data:
            ignored = sorted(set(data) - set(signature.inputs))
            hint = f"; keys not in the signature are ignored: {echo_list(ignored)}" if ignored else ""
            raise InvalidRequestError(f"Missing named input: {name} in 'inputs' object. (signature {signature.name!r} "
                                      f"inputs: {{{_expected_inputs(signature)}}}{hint})")
        inputs[name] = decode_tensor(name, data[name], spec.dtype)
    return inputs


def request_inputs(body: dict, signature: Signature) -> tuple[dict[str, np.ndarray], bool]:
    """Input arrays of a predict body and whether it used the row (`instances`) format.

    Raises:
        InvalidRequestError: both or neither of `instances`/`inputs`, `instances` not a non-empty list,
            rows that disagree, an unknown input name, or a value the dtype does not take.
    """
    if "instances" in body and "inputs" in body:
        raise InvalidRequestError(f"JSON Value: {debug_string(body)} Not formatted correctly expecting only one of "
                                  "'inputs' or 'instances' keys to exist")
    if "instances" in body:
        rows = body["instances"]
        if not isinstance(rows, list):
            raise InvalidRequestError(f"JSON Value: {debug_string(rows)} Expecting 'instances' to be an list/array")
        if not rows:
            raise InvalidRequestError("JSON Value: [] No values in 'instances' array")
        return _row_inputs(rows, signature), True
    if "inputs" in body:
        return _columnar_inputs(body["inputs"], signature), False
    raise InvalidRequestError("Missing 'inputs' or 'instances' key")
