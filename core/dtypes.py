"""Dtype names shared by every floor: numpy dtypes, `tensorflow.DataType` values and contract names.

A contract dtype name is TensorFlow's `tf.DType.name` (`float32`, `int64`, `string`, `bfloat16`,
`resource`, ...): the numpy name for every dtype numpy holds, TF's lower-case name otherwise. The
DataType numbers are those of tensorflow/core/framework/types.proto (stable, part of the wire format);
no TensorFlow or protobuf import is needed here.
"""

from __future__ import annotations

import numpy as np

# tensorflow.DataType enum (types.proto), without the *_REF variants.
DATA_TYPE_NUMBERS: dict[str, int] = {
    "DT_INVALID": 0, "DT_FLOAT": 1, "DT_DOUBLE": 2, "DT_INT32": 3, "DT_UINT8": 4, "DT_INT16": 5, "DT_INT8": 6,
    "DT_STRING": 7, "DT_COMPLEX64": 8, "DT_INT64": 9, "DT_BOOL": 10, "DT_QINT8": 11, "DT_QUINT8": 12,
    "DT_QINT32": 13, "DT_BFLOAT16": 14, "DT_QINT16": 15, "DT_QUINT16": 16, "DT_UINT16": 17, "DT_COMPLEX128": 18,
    "DT_HALF": 19, "DT_RESOURCE": 20, "DT_VARIANT": 21, "DT_UINT32": 22, "DT_UINT64": 23,
    "DT_FLOAT8_E5M2": 24, "DT_FLOAT8_E4M3FN": 25, "DT_FLOAT8_E4M3FNUZ": 26, "DT_FLOAT8_E4M3B11FNUZ": 27,
    "DT_FLOAT8_E5M2FNUZ": 28, "DT_INT4": 29, "DT_UINT4": 30, "DT_INT2": 31, "DT_UINT2": 32, "DT_FLOAT4_E2M1FN": 33,
}
DATA_TYPE_NAMES: dict[int, str] = {number: name for name, number in DATA_TYPE_NUMBERS.items()}

# DataType name -> numpy dtype; DT_STRING maps to object arrays of bytes (as `tf.make_ndarray` returns).
DT_TO_NUMPY: dict[str, np.dtype] = {
    "DT_FLOAT": np.dtype(np.float32), "DT_DOUBLE": np.dtype(np.float64), "DT_HALF": np.dtype(np.float16),
    "DT_INT8": np.dtype(np.int8), "DT_INT16": np.dtype(np.int16), "DT_INT32": np.dtype(np.int32),
    "DT_INT64": np.dtype(np.int64), "DT_UINT8": np.dtype(np.uint8), "DT_UINT16": np.dtype(np.uint16),
    "DT_UINT32": np.dtype(np.uint32), "DT_UINT64": np.dtype(np.uint64), "DT_BOOL": np.dtype(np.bool_),
    "DT_COMPLEX64": np.dtype(np.complex64), "DT_COMPLEX128": np.dtype(np.complex128),
    "DT_STRING": np.dtype(object),
}
NUMPY_TO_DT: dict[np.dtype, str] = {dtype: name for name, dtype in DT_TO_NUMPY.items()}

_NAMES: dict = {}  # dtype (or its spelling) -> contract name, computed once per spelling


def dtype_name(dtype: np.dtype | str) -> str:
    """Contract name of a numpy dtype (`float32`, `int64`, `string` for bytes/str/object arrays)."""
    name = _NAMES.get(dtype)
    if name is None:
        resolved = np.dtype(dtype)
        name = "string" if resolved.kind in "OSU" else resolved.name
        _NAMES[dtype] = name
    return name


def dtype_name_of_data_type(number: int) -> str:
    """Contract name of a `tensorflow.DataType` value, as `tf.as_dtype(number).name` spells it.

    DataTypes numpy holds get the numpy name (DT_FLOAT -> `float32`, DT_STRING -> `string`); the others
    TensorFlow's (DT_BFLOAT16 -> `bfloat16`, DT_RESOURCE -> `resource`); an unknown number `invalid`.
    """
    enum_name = DATA_TYPE_NAMES.get(number, "DT_INVALID")
    if enum_name in DT_TO_NUMPY:
        return dtype_name(DT_TO_NUMPY[enum_name])
    return enum_name.removeprefix("DT_").lower()


def data_type_of_dtype_name(name: str) -> int:
    """`tensorflow.DataType` value of a contract dtype name (inverse of `dtype_name_of_data_type`).

    Raises:
        ValueError: the name is neither a numpy dtype TF Serving carries nor a TensorFlow dtype name.
    """
    if name == "string":
        return DATA_TYPE_NUMBERS["DT_STRING"]
    try:
        resolved = np.dtype(name)
    except TypeError:
        resolved = None
    if resolved is not None and resolved in NUMPY_TO_DT:
        return DATA_TYPE_NUMBERS[NUMPY_TO_DT[resolved]]
    enum_name = "DT_" + name.upper()
    if enum_name not in DATA_TYPE_NUMBERS:
        raise ValueError(f"dtype {name!r} has no tensorflow.DataType")
    return DATA_TYPE_NUMBERS[enum_name]
