"""numpy <-> `tensorflow.TensorProto`, following `tf.make_tensor_proto` / `tf.make_ndarray` (no TensorFlow).

Numeric arrays travel in `tensor_content` (little-endian bytes), strings in `string_val`; decoding
also accepts the typed `*_val` fields, with a single value broadcast to the whole shape as
TensorFlow does.
"""

from __future__ import annotations

import math

import numpy as np

from tfship.core import protocol
from tfship.core.dtypes import DT_TO_NUMPY as _DT_TO_NUMPY
from tfship.core.dtypes import NUMPY_TO_DT as _NUMPY_TO_DT
from tfship.core.dtypes import dtype_name
from tfship.core.echo import echo
from tfship.core.errors import InvalidRequestError, ResourceExhaustedError

# Typed value field per DataType name (TensorProto field that `tf.make_tensor_proto` would fill).
_VAL_FIELD = {
    "DT_FLOAT": "float_val", "DT_DOUBLE": "double_val", "DT_HALF": "half_val", "DT_INT8": "int_val",
    "DT_INT16": "int_val", "DT_INT32": "int_val", "DT_UINT8": "int_val", "DT_UINT16": "int_val",
    "DT_INT64": "int64_val", "DT_UINT32": "uint32_val", "DT_UINT64": "uint64_val", "DT_BOOL": "bool_val",
    "DT_COMPLEX64": "scomplex_val", "DT_COMPLEX128": "dcomplex_val", "DT_STRING": "string_val",
}


# Decoded size limit when the caller gives none (the server passes --max-message-bytes): a few bytes of
# `float_val` with a large shape expand ("fill with the last value") to shape x itemsize bytes.
DEFAULT_MAX_TENSOR_BYTES = 64 << 20
MAX_DIM = (1 << 31) - 1
MAX_RANK = 64  # numpy's own limit; TensorFlow's is higher, but no served model comes near either
_INT64_LIMIT = 1 << 63
# Range of the values a typed field may hold for a narrower dtype (`int_val` carries int8..uint16 and the
# bits of DT_HALF in `half_val`, as `tf.make_tensor_proto` writes them).
_NARROW_RANGE = {"DT_INT8": (-128, 127), "DT_UINT8": (0, 255), "DT_INT16": (-32768, 32767),
                 "DT_UINT16": (0, 65535), "DT_HALF": (0, 65535)}

# Per-dtype answers, computed once (np.dtype construction and enum lookups cost more than the request).
_DATA_TYPES: dict = {}
_FROM_ENUM: dict[int, tuple[np.dtype, np.dtype, str]] = {}  # enum -> (dtype, little-endian dtype, DT name)


def numpy_dtype(dt_enum: int) -> np.dtype:
    """Numpy dtype for a `tensorflow.DataType` value; raises `InvalidRequestError` if unsupported."""
    return _from_enum(dt_enum)[0]


def _from_enum(dt_enum: int) -> tuple[np.dtype, np.dtype, str]:
    found = _FROM_ENUM.get(dt_enum)
    if found is None:
        name = protocol.DATA_TYPE.values_by_number[dt_enum].name if dt_enum in protocol.DATA_TYPE.values_by_number \
            else str(dt_enum)
        if name not in _DT_TO_NUMPY:
            raise InvalidRequestError(f"tensor dtype {name} is not supported; supported: {sorted(_DT_TO_NUMPY)}")
        dtype = _DT_TO_NUMPY[name]
        found = _FROM_ENUM[dt_enum] = (dtype, dtype.newbyteorder("<"), name)
    return found


def data_type(dtype: np.dtype | str) -> int:
    """`tensorflow.DataType` value for a numpy dtype (bytes/str/object -> DT_STRING)."""
    number = _DATA_TYPES.get(dtype)
    if number is None:
        resolved = np.dtype(dtype)
        if resolved.kind in "OSU":
            number = protocol.DATA_TYPE.values_by_name["DT_STRING"].number
        elif resolved.newbyteorder("=") not in _NUMPY_TO_DT:
            raise InvalidRequestError(f"numpy dtype {resolved} has no TensorFlow DataType")
        else:
            number = protocol.DATA_TYPE.values_by_name[_NUMPY_TO_DT[resolved.newbyteorder("=")]].number
        _DATA_TYPES[dtype] = number
    return number


def to_tensor_proto(array: np.ndarray):
    """Encode an array as a `tensorflow.TensorProto` (shape kept; string arrays as `string_val`)."""
    proto = protocol.TensorProto()
    fill_tensor_proto(proto, array)
    return proto


def fill_tensor_proto(proto, array: np.ndarray) -> None:
    """Encode `array` into an empty `TensorProto` in place (e.g. `response.outputs[key]`, no copy)."""
    array = np.asarray(array)
    proto.dtype = data_type(array.dtype)
    dims = proto.tensor_shape.dim
    for size in array.shape:
        dims.add().size = size
    if array.dtype.kind in "OSU":
        proto.string_val.extend(v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1))
    elif array.dtype.byteorder == ">":
        proto.tensor_content = array.astype(array.dtype.newbyteorder("<")).tobytes()
    else:
        proto.tensor_content = array.tobytes()  # C order, little-endian (native on every supported host)


def declared_bytes(proto, name: str = "tensor", max_bytes: int = DEFAULT_MAX_TENSOR_BYTES) -> int:
    """Bytes `from_tensor_proto` allocates for a `tensorflow.TensorProto`, from its declared dtype and
    `tensor_shape` alone, checked as `from_tensor_proto` checks them before reading any value. One value, or
    none, fills the whole shape, so a few wire bytes can declare `max_bytes`.

    The count of typed `*_val` values is checked here too (0, 1 or the shape's element count), so a request
    whose values disagree with its shape is refused before any of them is converted (a 60 MB Predict declaring
    1,000 rows but carrying 15M values took 4.9 s of decoding to be refused).

    Raises:
        InvalidRequestError: unsupported dtype, unknown rank, a negative or absurd dim, or a count of typed
            values that fits no shape (names `name`).
        ResourceExhaustedError: the decoded array would exceed `max_bytes`.
    """
    return judge_declared(proto, name, max_bytes)[0]


def judge_declared(proto, name: str = "tensor", max_bytes: int = DEFAULT_MAX_TENSOR_BYTES) -> tuple[int, list[int]]:
    """`declared_bytes` and the declared dims (`tensor_shape`, read once: `decode_declared` takes them back).

    Raises:
        As `declared_bytes`.
    """
    dtype, _little, dt_name = _from_enum(proto.dtype)
    if proto.tensor_shape.unknown_rank:
        raise InvalidRequestError(f"input {echo(name)}: tensor_shape has unknown rank; send a concrete shape")
    shape = [d.size for d in proto.tensor_shape.dim]
    count = math.prod(shape)
    if count * dtype.itemsize > max_bytes or (shape and (min(shape) < 0 or max(shape) > MAX_DIM
                                                         or len(shape) > MAX_RANK)):
        check_shape(name, shape, dtype.itemsize, max_bytes, "tensor_shape", dtype_name(dtype))
    if dt_name in _VAL_FIELD:
        listed = len(getattr(proto, _VAL_FIELD[dt_name]))  # O(1): no value is read
        if dt_name in ("DT_COMPLEX64", "DT_COMPLEX128"):
            listed = listed // 2 if listed % 2 == 0 else 1  # an odd count is refused, worded, when decoded
        # typed values count only without tensor_content (read last: reading a bytes field copies it)
        if listed not in (0, 1, count) and not proto.tensor_content:
            raise InvalidRequestError(f"input {echo(name)}: shape {shape} needs {count} values, got {listed}")
    return count * dtype.itemsize, shape


def from_tensor_proto(proto, name: str = "tensor", max_bytes: int = DEFAULT_MAX_TENSOR_BYTES) -> np.ndarray:
    """Decode a `tensorflow.TensorProto` into a numpy array.

    The shape is checked before anything is allocated: every dim in [0, 2^31), and the decoded array
    (elements x itemsize) at most `max_bytes`.

    Raises:
        InvalidRequestError: unsupported dtype, a negative or absurd dim, or content whose size disagrees
            with the shape (the message names `name`).
        ResourceExhaustedError: the decoded array would exceed `max_bytes`.
    """
    declared_bytes(proto, name, max_bytes)
    return decode_declared(proto, name)


def decode_declared(proto, name: str = "tensor", dims: list[int] | None = None) -> np.ndarray:
    """`from_tensor_proto` of a `TensorProto` whose declaration `declared_bytes` already judged (the Predict path
    judges every input's declaration before any is decoded, so it is not judged twice); `dims`: its declared dims
    as `judge_declared` read them (None: read here). `tensor_content` of the declared size is one `np.frombuffer`
    view (no copy); typed `*_val` fields are converted in bulk.

    Raises:
        InvalidRequestError: content whose size disagrees with the shape, values out of the dtype's range.
    """
    dtype, little, dt_name = _from_enum(proto.dtype)
    shape = tuple(dims if dims is not None else [d.size for d in proto.tensor_shape.dim])
    count = math.prod(shape)
    if not count and math.prod(d for d in shape if d) * dtype.itemsize >= _INT64_LIMIT:
        raise InvalidRequestError(f"input {echo(name)}: tensor_shape {list(shape)}: the product of its dims "
                                  "overflows int64")
    content = proto.tensor_content
    if content and dtype.kind != "O":
        if len(content) == count * dtype.itemsize and little.isnative:  # the common case: one view, no copy
            return np.frombuffer(content, dtype=dtype).reshape(shape)
        if len(content) % dtype.itemsize:
            raise InvalidRequestError(f"input {echo(name)}: tensor_content has {len(content)} bytes, not a multiple of "
                                      f"the {dtype_name(dtype)} item size {dtype.itemsize}")
        flat = np.frombuffer(content, dtype=little)
    else:
        flat = _typed_values(proto, dt_name, dtype, name)
    if flat.size == 1 and count != 1:
        flat = np.full(count, flat[0], dtype=dtype)
    elif flat.size == 0 and count > 0:
        flat = np.zeros(count, dtype=dtype) if dtype != np.dtype(object) else np.full(count, b"", dtype=object)
    if flat.size != count:
        raise InvalidRequestError(f"input {echo(name)}: shape {list(shape)} needs {count} values, got {flat.size}")
    return flat.astype(dtype.newbyteorder("="), copy=False).reshape(shape)


def check_shape(name: str, shape, itemsize: int, max_bytes: int, field: str = "tensor_shape",
                dtype_label: str = "") -> int:
    """The one shape guard of both APIs' decoders: rank at most `MAX_RANK`, every dim in [0, `MAX_DIM`] and
    elements x `itemsize` at most `max_bytes`; returns the element count.

    Args:
        field: what the message calls the shape (`tensor_shape` for TF Serving, `shape` for Open Inference).
        dtype_label: the dtype as the request spelled it (`float32`, `FP32`), for the size message.

    Raises:
        InvalidRequestError: too many dims, or a negative or absurd dim (the message names `name`).
        ResourceExhaustedError: the decoded tensor would exceed `max_bytes` (--max-message-bytes).
    """
    dims = [int(d) for d in shape]
    if len(dims) > MAX_RANK:
        raise InvalidRequestError(f"input {echo(name)}: {field} has rank {len(dims)}; at most {MAX_RANK} dims")
    bad = [d for d in dims if d < 0 or d > MAX_DIM]
    if bad:
        raise InvalidRequestError(f"input {echo(name)}: {field} {dims} has invalid dim {bad[0]}; "
                                  f"every dim must be in [0, {MAX_DIM}]")
    count = math.prod(dims)
    if count * itemsize > max_bytes:
        raise ResourceExhaustedError(f"input {echo(name)}: {field} {dims} of {dtype_label} decodes to "
                                     f"{count * itemsize} bytes, above the limit of {max_bytes} bytes "
                                     "(--max-message-bytes)")
    return count


def _typed_values(proto, dt_name: str, dtype: np.dtype, name: str) -> np.ndarray:
    """The typed `*_val` field as a flat array; values that do not fit the dtype are refused, never wrapped."""
    field = _VAL_FIELD[dt_name]
    values = getattr(proto, field)
    if dt_name == "DT_STRING":
        return np.array(list(values), dtype=object)
    if dt_name in _NARROW_RANGE:
        raw = np.array(list(values), dtype=np.int64)
        low, high = _NARROW_RANGE[dt_name]
        if raw.size and (raw.min() < low or raw.max() > high):
            bad = int(raw[(raw < low) | (raw > high)][0])
            what = "the bits of a float16 (as tf.make_tensor_proto writes them)" if dt_name == "DT_HALF" else dt_name
            raise InvalidRequestError(f"input {echo(name)}: {field} value {bad} is out of range for {what}: "
                                      f"expected an integer in [{low}, {high}]")
        return raw.astype(np.uint16).view(np.float16) if dt_name == "DT_HALF" else raw.astype(dtype)
    if dt_name in ("DT_COMPLEX64", "DT_COMPLEX128"):
        if len(values) % 2:
            raise InvalidRequestError(f"input {echo(name)}: {field} holds {len(values)} numbers; complex values "
                                      "come as (real, imaginary) pairs, so the count must be even")
        pairs = np.array(list(values), dtype=np.float64).reshape(-1, 2)
        return (pairs[:, 0] + 1j * pairs[:, 1]).astype(dtype)
    return np.array(list(values), dtype=dtype)
