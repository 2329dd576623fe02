"""Open Inference Protocol (KServe V2) tensors <-> numpy arrays, for gRPC and REST alike (no TensorFlow).

Three request encodings decode here, each checked before anything large is allocated:
  * typed `InferTensorContents` (gRPC): the one `*_contents` field of the datatype, values range-checked;
  * raw bytes (gRPC `raw_input_contents`, Triton's HTTP binary tensor extension): row-major little-endian
    values; BYTES elements each preceded by a 4-byte little-endian length;
  * JSON `data` (REST): flat or nested lists, each value type- and range-checked against the datatype.
Every decoder raises `InvalidRequestError` naming the input, the datatype and what was wrong, and
`ResourceExhaustedError` when the shape decodes to more than `--max-message-bytes`. Unlike TF Serving's
TensorProto, a V2 tensor never broadcasts: the value count must equal the shape's element count.
"""

from __future__ import annotations

import struct

import numpy as np

from tfship.core.dtypes import dtype_name
from tfship.core.echo import clip, echo, echo_json, json_kind
from tfship.core.errors import InvalidRequestError, UnimplementedError
from tfship.serving.dataplane.json_numbers import OutOfRangeNumber, first_out_of_range
from tfship.serving.dataplane.tensors import check_shape

# KServe V2 datatype -> numpy dtype (BYTES: object arrays of bytes). BF16 is not served (no numpy dtype).
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "INT8": np.dtype(np.int8), "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64), "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16), "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
# tfship's dtype names (`core.dtypes.dtype_name`, signature specs) -> datatype.
_BY_DTYPE_NAME = {("string" if dt.kind == "O" else dt.name): name for name, dt in DATATYPES.items()}
# The InferTensorContents field carrying each datatype (FP16 has none: raw contents only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
_ALL_CONTENTS_FIELDS = tuple(sorted(set(CONTENTS_FIELD.values())))
_LENGTH = struct.Struct("<I")
# The JSON value types each kind of REST `data` takes (exact types: a bool is no integer).
_STRING, _BOOL, _INT = frozenset({str}), frozenset({bool}), frozenset({int})
_NUMBER = frozenset({int, float, OutOfRangeNumber})


def datatype_for(dtype: np.dtype | str) -> str:
    """The V2 datatype of a numpy dtype or tfship dtype name (`float32` -> `FP32`, `string` -> `BYTES`).

    Raises:
        UnimplementedError: the dtype has no V2 datatype (e.g. complex64, bfloat16).
    """
    name = dtype if isinstance(dtype, str) else dtype_name(dtype)
    found = _BY_DTYPE_NAME.get(name)
    if found is None:
        raise UnimplementedError(f"dtype {name} has no Open Inference Protocol datatype; supported: "
                                 f"{sorted(_BY_DTYPE_NAME)}")
    return found


def numpy_dtype(datatype: str, name: str) -> np.dtype:
    """Numpy dtype for input `name`'s `datatype`; `InvalidRequestError` naming the supported ones otherwise."""
    found = DATATYPES.get(datatype)
    if found is None:
        raise InvalidRequestError(f"input {echo(name)}: datatype {echo(datatype)} is not supported; supported: "
                                  f"{', '.join(DATATYPES)}")
    return found


def element_count(name: str, shape, datatype: str, max_bytes: int) -> int:
    """Elements of `shape` after checking its rank (at most 64), every dim in [0, 2^31) and the decoded size.

    Raises:
        InvalidRequestError: more than 64 dims (numpy's limit), a negative or absurd dim.
        ResourceExhaustedError: elements x item size (8 bytes per BYTES element) above `max_bytes` (the
            server's `--max-message-bytes`).
    """
    return check_shape(name, shape, DATATYPES[datatype].itemsize, max_bytes, "shape", datatype)


def from_raw(name: str, datatype: str, shape, data: bytes, max_bytes: int) -> np.ndarray:
    """Decode raw tensor bytes (row-major, little-endian; BYTES length-prefixed) into an array of `shape`.

    Raises:
        InvalidRequestError: unknown datatype, bad shape, byte count that disagrees with the shape, a BOOL
            byte other than 0/1, a BYTES length running past the end.  ResourceExhaustedError: see
            `element_count`.
    """
    dtype = numpy_dtype(datatype, name)
    count = element_count(name, shape, datatype, max_bytes)
    dims = tuple(int(d) for d in shape)
    if datatype == "BYTES":
        return deserialize_bytes(name, data, count).reshape(dims)
    if len(data) != count * dtype.itemsize:
        raise InvalidRequestError(f"input {echo(name)}: shape {list(dims)} of {datatype} needs "
                                  f"{count * dtype.itemsize} bytes of raw contents, got {len(data)}")
    if datatype == "BOOL":
        octets = np.frombuffer(data, dtype=np.uint8)
        if octets.size and octets.max() > 1:
            raise InvalidRequestError(f"input {echo(name)}: BOOL raw contents must be bytes 0 or 1, got "
                                      f"{int(octets.max())}")
        return octets.view(np.bool_).reshape(dims)
    return np.frombuffer(data, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(dims)


def deserialize_bytes(name: str, data: bytes, count: int) -> np.ndarray:
    """`count` BYTES elements, each a 4-byte little-endian length then that many bytes, filling `data` exactly."""
    values, offset, end = [], 0, len(data)
    for index in range(count):
        if offset + 4 > end:
            raise InvalidRequestError(f"input {echo(name)}: BYTES raw contents end after {index} of {count} elements")
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += 4
        if offset + length > end:
            raise InvalidRequestError(f"input {echo(name)}: BYTES element {index} declares {length} bytes; only "
                                      f"{end - offset} remain")
        values.append(bytes(data[offset:offset + length]))
        offset += length
    if offset != end:
        raise InvalidRequestError(f"input {echo(name)}: BYTES raw contents hold {end - offset} bytes after the "
                                  f"{count} elements of the shape")
    array = np.empty(count, dtype=object)
    array[:] = values
    return array


def serialize_bytes(array: np.ndarray) -> bytes:
    """BYTES raw form: each element (bytes, or str as UTF-8) preceded by its 4-byte little-endian length."""
    parts = []
    for value in np.asarray(array, dtype=object).reshape(-1):
        raw = value if isinstance(value, bytes) else str(value).encode()
        parts.append(_LENGTH.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def from_contents(name: str, datatype: str, shape, contents, max_bytes: int) -> np.ndarray:
    """Decode typed `InferTensorContents` for input `name` into an array of `shape`.

    Raises:
        InvalidRequestError: unknown datatype, FP16 (raw only), values in another datatype's field, a value
            count that disagrees with the shape, a value out of the datatype's range.
        ResourceExhaustedError: see `element_count`.
    """
    dtype = numpy_dtype(datatype, name)
    count = element_count(name, shape, datatype, max_bytes)
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidRequestError(f"input {echo(name)}: {datatype} has no typed contents field; send it in "
                                  "raw_input_contents")
    stray = [f for f in _ALL_CONTENTS_FIELDS if f != field and len(getattr(contents, f))]
    if stray:
        raise InvalidRequestError(f"input {echo(name)}: datatype {datatype} carries its values in contents.{field}; "
                                  f"got contents.{stray[0]}")
    values = getattr(contents, field)
    if len(values) != count:
        raise InvalidRequestError(f"input {echo(name)}: shape {[int(d) for d in shape]} needs {count} values, got "
                                  f"{len(values)} in contents.{field}")
    dims = tuple(int(d) for d in shape)
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(dims)
    wide = np.array(values, dtype=np.float64 if dtype.kind == "f" else np.int64 if dtype.kind in "ib"
                    else np.uint64)
    if dtype.kind in "iu" and wide.size:
        _check_int_range(name, datatype, dtype, int(wide.min()), int(wide.max()))
    return wide.astype(dtype).reshape(dims)


def _check_int_range(name: str, datatype: str, dtype: np.dtype, low: int, high: int) -> None:
    info = np.iinfo(dtype)
    if low < info.min or high > info.max:
        bad = low if low < info.min else high
        raise InvalidRequestError(f"input {echo(name)}: value {bad} is out of range for {datatype} "
                                  f"[{info.min}, {info.max}]")


def fill_contents(contents, array: np.ndarray) -> None:
    """Write `array`'s values, flattened row-major, into the typed field of an empty `InferTensorContents`.

    Raises:
        UnimplementedError: FP16 (and any dtype without a typed field); callers send those raw.
    """
    datatype = datatype_for(array.dtype)
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise UnimplementedError(f"{datatype} has no typed contents field (raw contents only)")
    flat = np.asarray(array).reshape(-1)
    if datatype == "BYTES":
        getattr(contents, field).extend(v if isinstance(v, bytes) else str(v).encode() for v in flat)
    else:
        getattr(contents, field).extend(flat.tolist())


def to_raw(array: np.ndarray) -> bytes:
    """Raw V2 form of an output: row-major little-endian values, or length-prefixed BYTES elements."""
    array = np.asarray(array)
    if datatype_for(array.dtype) == "BYTES":
        return serialize_bytes(array)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def from_json(name: str, datatype: str, shape, data, max_bytes: int) -> np.ndarray:
    """Decode a REST input's JSON `data` (flat or nested lists, row-major) into an array of `shape`.

    BOOL takes JSON true/false; integer datatypes JSON integers within range; FP* JSON numbers that stay
    finite in the datatype; BYTES JSON strings (sent as UTF-8).

    Raises:
        InvalidRequestError: a value of the wrong JSON type or out of range (named with its flat index), a
            count that disagrees with the shape, data nested too deeply.  ResourceExhaustedError: see
            `element_count`.
    """
    dtype = numpy_dtype(datatype, name)
    count = element_count(name, shape, datatype, max_bytes)
    flat, kinds = _flatten(name, data)
    if len(flat) != count:
        raise InvalidRequestError(f"input {echo(name)}: shape {[int(d) for d in shape]} needs {count} values, got "
                                  f"{len(flat)} in 'data'")
    if len(flat) != len(data):  # nested: the nesting must be the shape, not a ragged or partial one
        _check_nesting(name, data, [int(d) for d in shape])
    dims = tuple(int(d) for d in shape)
    kind = dtype.kind
    if kind == "O":
        _expect(name, datatype, flat, kinds, _STRING, "a string")
        array = np.empty(count, dtype=object)
        try:
            array[:] = [v.encode() for v in flat]
        except UnicodeEncodeError as err:
            raise InvalidRequestError(f"input {echo(name)}: BYTES value is not valid text ({err.reason} at "
                                      f"position {err.start})") from None
        return array.reshape(dims)
    if kind == "b":
        _expect(name, datatype, flat, kinds, _BOOL, "true or false")
        return np.array(flat, dtype=np.bool_).reshape(dims)
    if kind in "iu":
        _expect(name, datatype, flat, kinds, _INT, "an integer")
        if flat:
            _check_int_range(name, datatype, dtype, min(flat), max(flat))
        return np.array(flat, dtype=dtype).reshape(dims)
    _expect(name, datatype, flat, kinds, _NUMBER, "a number")
    try:
        wide = np.array(flat, dtype=np.float64)
    except OverflowError as err:  # a JSON integer beyond any float
        index = next((i for i, v in enumerate(flat) if type(v) is int and abs(v) > 2**1023), 0)
        raise InvalidRequestError(f"input {echo(name)}: value {clip(str(flat[index]), 40)} at index {index} is out of "
                                  f"range for {datatype}: outside its finite range") from err
    with np.errstate(over="ignore"):
        array = wide.astype(dtype)
    bad = first_out_of_range(flat, array)  # 1e309, or 1e39 for FP32; the Infinity token stays accepted
    if bad is not None:
        raise InvalidRequestError(f"input {echo(name)}: value {bad[1]} at index {bad[0]} is out of range for "
                                  f"{datatype}: outside its finite range (write Infinity to mean infinity)")
    return array.reshape(dims)


def _flatten(name: str, data) -> tuple[list, set]:
    """`data`'s values flattened row-major, and the set of their types (gathered by C, `map`: no Python test per
    value); nested lists are walked iteratively (nesting depth costs no Python stack).
    """
    if not isinstance(data, list):
        raise InvalidRequestError(f"input {echo(name)}: 'data' must be a JSON array, got {json_kind(data)}")
    kinds = set(map(type, data))
    if not any(issubclass(kind, list) for kind in kinds):
        return data, kinds
    flat: list = []
    kinds = set()
    stack = [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                found = set(map(type, value))
                if any(issubclass(kind, list) for kind in found):
                    stack.append(iter(value))
                    break
                flat.extend(value)  # a list of values: all of them at once, in order
                kinds |= found
                continue
            flat.append(value)
            kinds.add(type(value))
        else:
            stack.pop()
    return flat, kinds


def _check_nesting(name: str, data: list, shape: list[int]) -> None:
    """Nested `data` must nest exactly as `shape` (lists of length shape[d] at depth d, values below);
    raises InvalidRequestError naming the depth otherwise. Level by level: no Python recursion.
    """
    level = [data]
    for depth, dim in enumerate(shape):
        following = []
        for item in level:
            if not isinstance(item, list) or len(item) != dim:
                got = f"{len(item)} values" if isinstance(item, list) else "a single value"
                raise InvalidRequestError(f"input {echo(name)}: nested 'data' does not follow shape {shape}: at depth "
                                          f"{depth} a list of {dim} is needed, got {got}")
            following.extend(item)
        level = following
    if any(isinstance(item, list) for item in level):
        raise InvalidRequestError(f"input {echo(name)}: nested 'data' is deeper than shape {shape}")


def _expect(name: str, datatype: str, flat: list, kinds: set, allowed: frozenset, wanted: str) -> None:
    """Every value of `flat` (`kinds`: their types, from `_flatten`) is of a type in `allowed`; else
    InvalidRequestError naming the first that is not.
    """
    if kinds <= allowed:
        return
    for index, value in enumerate(flat):
        if type(value) not in allowed:
            shown = echo_json(value, 40)  # as JSON writes it (true, null), not Python's repr
            raise InvalidRequestError(f"input {echo(name)}: {datatype} value at index {index} must be {wanted}, got "
                                      f"{shown} ({json_kind(value)})")


def to_json(name: str, array: np.ndarray) -> list:
    """An output's values flattened row-major as JSON values (BYTES as UTF-8 strings).

    Raises:
        InvalidRequestError: a BYTES output holds bytes that are not UTF-8 (ask for it with binary_data).
    """
    flat = np.asarray(array).reshape(-1)
    if flat.dtype.kind not in "OSU":
        return flat.tolist()
    try:
        return [v.decode() if isinstance(v, bytes) else str(v) for v in flat]
    except UnicodeDecodeError as err:
        raise InvalidRequestError(f"output {echo(name)} holds bytes that are not UTF-8 and cannot be JSON strings; "
                                  "request it with parameters {\"binary_data\": true}") from err
