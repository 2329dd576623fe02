"""A Predict answer written straight to its wire bytes: no `PredictResponse` built and then serialised.

`predict_response_bytes(response, tensor_content)` returns the bytes `converters.predict_response(response,
tensor_content).SerializeToString()` returns (same fields, same values, same length: `--max-message-bytes` is
judged on it), written by concatenation: each output's `TensorProto` is its `dtype`, its `tensor_shape` and its
values as one little-endian buffer (`tensor_content`, or the packed `float_val` / `double_val` / `scomplex_val` /
`dcomplex_val` field, whose wire bytes are the values' own), so no value passes through Python one by one. Outputs
of other dtypes in the typed fields (ints as varints, strings) are built by `converters` and serialised, as before.

Wire format (protobuf): PredictResponse {map<string, TensorProto> outputs = 1; ModelSpec model_spec = 2},
ModelSpec {string name = 1; Int64Value version = 2; string signature_name = 3}, TensorProto {DataType dtype = 1;
TensorShapeProto tensor_shape = 2; bytes tensor_content = 4; repeated float float_val = 5 (packed); ...}.
"""

from __future__ import annotations

import numpy as np

from tfship.core import protocol
from tfship.serving.dataplane.tensors import data_type, fill_tensor_proto
from tfship.serving.dataplane.types import InferenceResponse
from tfship.serving.tfs.converters import fill_typed_fields

_SMALL = [bytes((i,)) for i in range(128)]
_CONTENT_TAG = b"\x22"  # TensorProto.tensor_content: field 4, length-delimited
# dtype -> TensorProto field number of its packed typed field, whose wire bytes are the little-endian values
_PACKED_FIELD = {np.dtype(np.float32): "float_val", np.dtype(np.float64): "double_val",
                 np.dtype(np.complex64): "scomplex_val", np.dtype(np.complex128): "dcomplex_val"}
_PACKED_TAG = {dtype: bytes((protocol.TensorProto.DESCRIPTOR.fields_by_name[name].number << 3 | 2,))
               for dtype, name in _PACKED_FIELD.items()}
_HEADS: dict = {}  # (dtype, shape, tensor_content) -> the TensorProto's bytes before its values' bytes
_ENTRIES: dict = {}  # (output name, TensorProto length) -> the outputs map entry's bytes before the TensorProto
_SPECS: dict = {}  # (name, version, signature) -> the PredictResponse's model_spec field bytes
_MEMO_ENTRIES = 1024  # each memo is emptied when it holds this many


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative int below 2**64 (a negative int64: its two's complement)."""
    if 0 <= value < 128:
        return _SMALL[value]
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + varint(len(payload)) + payload


def _remember(memo: dict, key, value: bytes) -> bytes:
    if len(memo) >= _MEMO_ENTRIES:
        memo.clear()
    memo[key] = value
    return value


def _head(dtype: np.dtype, shape: tuple[int, ...], tag: bytes) -> bytes:
    """`dtype`, `tensor_shape` (none for a scalar; a 0 dim is an empty `dim`) and, when the array has values,
    the values' field tag and length, of a TensorProto (memoised: they depend on the dtype and shape alone).
    """
    head = b"\x08" + varint(data_type(dtype))
    if shape:
        dims = b"".join(_field(b"\x12", b"\x08" + varint(size) if size else b"") for size in shape)
        head += _field(b"\x12", dims)
    count = int(np.prod(shape)) if shape else 1
    return _remember(_HEADS, (dtype, shape, tag), head + tag + varint(count * dtype.itemsize) if count else head)


def tensor_bytes(array: np.ndarray, tensor_content: bool) -> bytes | None:
    """The serialised TensorProto of `array` (`fill_tensor_proto` with `tensor_content`, else
    `converters.fill_typed_fields`), or None for a dtype written field by field (strings, ints in typed fields,
    half, bool, dtypes with no TensorFlow DataType: the caller builds those with protobuf).
    """
    array = np.asarray(array)
    dtype = array.dtype
    native = dtype.newbyteorder("=") if dtype.byteorder == ">" else dtype
    if tensor_content:
        if native.kind not in "biufc" or native.byteorder == ">":
            return None
        tag = _CONTENT_TAG
    else:
        tag = _PACKED_TAG.get(native)
        if tag is None:
            return None
    shape = array.shape
    head = _HEADS.get((native, shape, tag))
    if head is None:
        try:
            head = _head(native, shape, tag)
        except Exception:  # noqa: BLE001 - no DataType: `converters` raises its own error for it
            return None
    if not array.size:
        return head
    if dtype.byteorder == ">" or not array.flags.c_contiguous:
        array = np.ascontiguousarray(array, dtype=native.newbyteorder("<"))
    return head + array.tobytes()


def _spec(name: str, version: int, signature_name: str) -> bytes:
    body = _field(b"\x0a", name.encode()) if name else b""
    body += _field(b"\x12", b"\x08" + varint(version) if version else b"")  # Int64Value: present, even 0
    body += _field(b"\x1a", signature_name.encode()) if signature_name else b""
    return _remember(_SPECS, (name, version, signature_name), _field(b"\x12", body))


def _entry(key: str, size: int) -> bytes:
    """The outputs map entry of `key` up to its TensorProto of `size` bytes (field 1: key; field 2: value)."""
    name = _field(b"\x0a", key.encode())
    inner = len(name) + 1 + len(varint(size)) + size
    return _remember(_ENTRIES, (key, size), b"\x0a" + varint(inner) + name + b"\x12" + varint(size))


def predict_response_bytes(response: InferenceResponse, tensor_content: bool = False) -> bytes:
    """`converters.predict_response(response, tensor_content).SerializeToString()`, written directly.

    Raises:
        InvalidRequestError: an output dtype with no TensorFlow DataType (as `converters.predict_response`).
    """
    parts = []
    for key, array in response.outputs.items():
        value = tensor_bytes(array, tensor_content)
        if value is None:
            proto = protocol.TensorProto()
            (fill_tensor_proto if tensor_content else fill_typed_fields)(proto, array)
            value = proto.SerializeToString()
        parts.append(_ENTRIES.get((key, len(value))) or _entry(key, len(value)))
        parts.append(value)
    spec = (response.model_name, response.version, response.signature_name)
    parts.append(_SPECS.get(spec) or _spec(*spec))
    return b"".join(parts)
