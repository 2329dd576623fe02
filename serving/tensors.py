"""numpy <-> `tensorflow.TensorProto`, following `tf.make_tensor_proto` / `tf.make_ndarray` (no TensorFlow).

Numeric arrays travel in `tensor_content` (little-endian bytes), strings in `string_val`; decoding
also accepts the typed `*_val` fields, with a single value broadcast to the whole shape as
TensorFlow does.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import InvalidRequestError
from serving import protocol

# DataType enum name -> numpy dtype; DT_STRING maps to object arrays of bytes.
_DT_TO_NUMPY: dict[str, np.dtype] = {
    "DT_FLOAT": np.dtype(np.float32), "DT_DOUBLE": np.dtype(np.float64), "DT_HALF": np.dtype(np.float16),
    "DT_INT8": np.dtype(np.int8), "DT_INT16": np.dtype(np.int16), "DT_INT32": np.dtype(np.int32),
    "DT_INT64": np.dtype(np.int64), "DT_UINT8": np.dtype(np.uint8), "DT_UINT16": np.dtype(np.uint16),
    "DT_UINT32": np.dtype(np.uint32), "DT_UINT64": np.dtype(np.uint64), "DT_BOOL": np.dtype(np.bool_),
    "DT_COMPLEX64": np.dtype(np.complex64), "DT_COMPLEX128": np.dtype(np.complex128),
    "DT_STRING": np.dtype(object),
}
_NUMPY_TO_DT = {dtype: name for name, dtype in _DT_TO_NUMPY.items()}

# Typed value field per DataType name (TensorProto field that `tf.make_tensor_proto` would fill).
_VAL_FIELD = {
    "DT_FLOAT": "float_val", "DT_DOUBLE": "double_val", "DT_HALF": "half_val", "DT_INT8": "int_val",
    "DT_INT16": "int_val", "DT_INT32": "int_val", "DT_UINT8": "int_val", "DT_UINT16": "int_val",
    "DT_INT64": "int64_val", "DT_UINT32": "uint32_val", "DT_UINT64": "uint64_val", "DT_BOOL": "bool_val",
    "DT_COMPLEX64": "scomplex_val", "DT_COMPLEX128": "dcomplex_val", "DT_STRING": "string_val",
}


def dtype_name(dtype: np.dtype | str) -> str:
    """Canonical short name of a numpy dtype (`float32`, `int64`, `string` for bytes/str/object)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return "string"
    return dtype.name


def numpy_dtype(dt_enum: int) -> np.dtype:
    """numpy dtype for a `tensorflow.DataType` value; raises `InvalidRequestError` if unsupported."""
    name = protocol.DATA_TYPE.values_by_number[dt_enum].name if dt_enum in protocol.DATA_TYPE.values_by_number \
        else str(dt_enum)
    if name not in _DT_TO_NUMPY:
        raise InvalidRequestError(f"tensor dtype {name} is not supported; supported: {sorted(_DT_TO_NUMPY)}")
    return _DT_TO_NUMPY[name]


def data_type(dtype: np.dtype | str) -> int:
    """`tensorflow.DataType` value for a numpy dtype (bytes/str/object -> DT_STRING)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return protocol.DATA_TYPE.values_by_name["DT_STRING"].number
    if dtype.newbyteorder("=") not in _NUMPY_TO_DT:
        raise InvalidRequestError(f"numpy dtype {dtype} has no TensorFlow DataType")
    return protocol.DATA_TYPE.values_by_name[_NUMPY_TO_DT[dtype.newbyteorder("=")]].number


def to_tensor_proto(array: np.ndarray):
    """Encode an array as a `tensorflow.TensorProto` (shape kept; string arrays as `string_val`)."""
    array = np.asarray(array)
    proto = protocol.TensorProto(dtype=data_type(array.dtype))
    for size in array.shape:
        proto.tensor_shape.dim.add(size=int(size))
    if array.dtype.kind in "OSU":
        proto.string_val.extend(v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1))
    else:
        proto.tensor_content = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return proto


def from_tensor_proto(proto, name: str = "tensor") -> np.ndarray:
    """Decode a `tensorflow.TensorProto` into a numpy array.

    Raises:
        InvalidRequestError: unsupported dtype, or content whose size disagrees with the shape
            (the message names `name`).
    """
    dtype = numpy_dtype(proto.dtype)
    if proto.tensor_shape.unknown_rank:
        raise InvalidRequestError(f"input {name!r}: tensor_shape has unknown rank; send a concrete shape")
    shape = tuple(int(d.size) for d in proto.tensor_shape.dim)
    count = int(np.prod(shape, dtype=np.int64))
    dt_name = protocol.DATA_TYPE.values_by_number[proto.dtype].name
    if proto.tensor_content and dtype != np.dtype(object):
        flat = np.frombuffer(proto.tensor_content, dtype=dtype.newbyteorder("<"))
    else:
        flat = _typed_values(proto, dt_name, dtype)
    if flat.size == 1 and count != 1:
        flat = np.full(count, flat[0], dtype=dtype)
    elif flat.size == 0 and count > 0:
        flat = np.zeros(count, dtype=dtype) if dtype != np.dtype(object) else np.full(count, b"", dtype=object)
    if flat.size != count:
        raise InvalidRequestError(f"input {name!r}: shape {list(shape)} needs {count} values, got {flat.size}")
    return flat.astype(dtype.newbyteorder("="), copy=False).reshape(shape)


def _typed_values(proto, dt_name: str, dtype: np.dtype) -> np.ndarray:
    values = getattr(proto, _VAL_FIELD[dt_name])
    if dt_name == "DT_STRING":
        return np.array(list(values), dtype=object)
    if dt_name == "DT_HALF":
        return np.array(list(values), dtype=np.uint16).view(np.float16)
    if dt_name in ("DT_COMPLEX64", "DT_COMPLEX128"):
        pairs = np.array(list(values), dtype=np.float64).reshape(-1, 2)
        return (pairs[:, 0] + 1j * pairs[:, 1]).astype(dtype)
    return np.array(list(values), dtype=dtype)
