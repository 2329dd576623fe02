"""TF Serving protobuf messages <-> the data plane's types (`serving.dataplane.types`).

Predict answers carry TF Serving's default encoding: each output in its typed field (`float_val`,
`int64_val`, `string_val`, ...), so `response.outputs["y"].float_val` reads the values as with TF Serving;
`--enable_serialization_as_tensor_content` switches to raw little-endian bytes in `tensor_content`
(strings stay in `string_val` either way). Both decode alike with `tf.make_ndarray`. The cost of each is
measured by `make bench-serve` (docs/benchmarks.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from google.protobuf import struct_pb2

from tfship.core import protocol
from tfship.core.contract import DEFAULT_SIGNATURE
from tfship.core.echo import echo_list
from tfship.core.errors import InvalidRequestError, ResourceExhaustedError
from tfship.core.saved_model import to_signature_def
from tfship.serving.dataplane.tensors import (
    DEFAULT_MAX_TENSOR_BYTES,
    data_type,
    declared_bytes,
    decode_declared,
    fill_tensor_proto,
    from_tensor_proto,
)
from tfship.serving.dataplane.types import InferenceRequest, InferenceResponse, ModelMetadata, ModelRef, VersionStatus


def model_ref(spec) -> ModelRef:
    """`tensorflow.serving.ModelSpec` -> `ModelRef` (version and version_label are a oneof).

    Raises:
        InvalidRequestError: empty `model_spec.name` (the same answer from every RPC).
    """
    name = spec.name
    if not name:
        raise InvalidRequestError("model_spec.name is required")
    choice = spec.WhichOneof("version_choice")
    if choice is None:
        return ModelRef(name)
    return ModelRef(
        name=name,
        version=spec.version.value if choice == "version" else None,
        label=spec.version_label if choice == "version_label" else None,
    )


def predict_request(proto, time_remaining: float | None = None,
                    max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES, max_total_bytes: int = 0) -> InferenceRequest:
    """`PredictRequest` -> `InferenceRequest`; `time_remaining` (seconds) becomes a monotonic deadline.

    Each input decodes to at most `max_tensor_bytes` (see `serving.dataplane.tensors.from_tensor_proto`), and all
    of them together, as their `tensor_shape`s declare, to at most `max_total_bytes` (--max-request-memory-bytes;
    0 = unlimited), judged before any is decoded: one value fills a whole shape, so 20 inputs of one `float_val`
    each, in a 559-byte request, used to allocate 1.3 GB before the unexpected names were refused.

    Raises:
        InvalidRequestError: an input that does not decode (`from_tensor_proto`).
        ResourceExhaustedError: an input above `max_tensor_bytes`, or all of them above `max_total_bytes`.
    """
    check_declared_total(proto, declared_input_bytes(proto, max_tensor_bytes), max_total_bytes)
    spec = proto.model_spec
    model = model_ref(spec)
    inputs = {key: from_tensor_proto(tensor, key, max_tensor_bytes) for key, tensor in proto.inputs.items()}
    deadline = None if time_remaining is None else time.monotonic() + time_remaining
    return InferenceRequest(
        model=model,
        inputs=inputs,
        signature_name=spec.signature_name or DEFAULT_SIGNATURE,
        output_filter=tuple(proto.output_filter),
        deadline=deadline,
    )


def judged_predict_request(proto, model: ModelRef, judged: Sequence[tuple], time_remaining: float | None,
                           ) -> InferenceRequest:
    """`predict_request` of a `PredictRequest` whose inputs' declarations the caller judged already
    (`PredictionServicer`: `judged` holds `(alias, TensorProto, dims)` of each input, the map walked once, dims as
    `tensors.judge_declared` read them, and the total was judged), for `model` (`model_ref` of its spec): each
    input decoded once (`tensor_content` of the declared size is an `np.frombuffer` view, no copy).

    Raises:
        InvalidRequestError: an input whose values do not decode (`tensors.decode_declared`).
    """
    inputs = {key: decode_declared(tensor, key, dims) for key, tensor, dims in judged}
    return InferenceRequest(model=model, inputs=inputs, signature_name=proto.model_spec.signature_name or
                            DEFAULT_SIGNATURE, output_filter=tuple(proto.output_filter),
                            deadline=None if time_remaining is None else time.monotonic() + time_remaining)


def declared_input_bytes(proto, max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES) -> int:
    """What a `PredictRequest`'s inputs fill, in bytes, from their declared dtypes and shapes alone (each judged
    as `from_tensor_proto` judges it before reading any value).

    Raises:
        InvalidRequestError: an unsupported dtype or a bad shape.  ResourceExhaustedError: an input above
            `max_tensor_bytes`.
    """
    return sum(declared_bytes(tensor, name, max_tensor_bytes) for name, tensor in proto.inputs.items())


def check_declared_total(proto, declared: int, max_total_bytes: int) -> None:
    """Refuse a `PredictRequest` whose inputs declare `declared` bytes in all (`declared_input_bytes`), above
    `max_total_bytes` (--max-request-memory-bytes; 0 = unlimited), before any is filled: inputs the signature
    does not have count too (`admission.check_declared` judges the signature's own, with its outputs).

    Raises:
        ResourceExhaustedError: naming the inputs' count, their bytes and the flag.
    """
    if max_total_bytes and declared > max_total_bytes:
        raise ResourceExhaustedError(f"the request's {len(proto.inputs)} input(s) declare {declared} bytes in all "
                                     f"(their tensor_shape), above --max-request-memory-bytes {max_total_bytes}; "
                                     "send fewer rows or fewer inputs")


# numpy dtype -> (TensorProto typed field, view giving the values that field holds), as TensorFlow's
# Tensor::AsProtoField writes them: narrow ints in int_val, float16 as its bits in half_val, complex numbers
# as (real, imaginary) pairs.
_TYPED_FIELDS = {
    np.dtype(np.float32): ("float_val", None), np.dtype(np.float64): ("double_val", None),
    np.dtype(np.float16): ("half_val", np.uint16), np.dtype(np.int8): ("int_val", None),
    np.dtype(np.int16): ("int_val", None), np.dtype(np.int32): ("int_val", None),
    np.dtype(np.uint8): ("int_val", None), np.dtype(np.uint16): ("int_val", None),
    np.dtype(np.int64): ("int64_val", None), np.dtype(np.uint32): ("uint32_val", None),
    np.dtype(np.uint64): ("uint64_val", None), np.dtype(np.bool_): ("bool_val", None),
    np.dtype(np.complex64): ("scomplex_val", np.float32), np.dtype(np.complex128): ("dcomplex_val", np.float64),
}


# Typed fields of fixed-width values, which protobuf writes packed: their wire bytes are the values' own
# little-endian bytes, so they are filled by parsing `tag + length + bytes` (no Python float per value).
_PACKED = {np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.complex64), np.dtype(np.complex128)}


def _packed_field(field: str, payload: bytes) -> bytes:
    """Wire bytes of a packed repeated field of `protocol.TensorProto` holding `payload`."""
    number = protocol.TensorProto.DESCRIPTOR.fields_by_name[field].number
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def fill_typed_fields(proto, array: np.ndarray) -> None:
    """Encode `array` into an empty `TensorProto` in place, values in the dtype's typed field (TF Serving's
    default answer encoding); strings go to `string_val`, exactly as `fill_tensor_proto` writes them.

    Raises:
        InvalidRequestError: a dtype with no TensorFlow DataType (as `fill_tensor_proto`).
    """
    array = np.asarray(array)
    native = array.dtype.newbyteorder("=") if array.dtype.byteorder == ">" else array.dtype
    found = _TYPED_FIELDS.get(native)
    if found is None:  # strings (and anything `fill_tensor_proto` refuses with its own message)
        fill_tensor_proto(proto, array)
        return
    proto.dtype = data_type(native)
    dims = proto.tensor_shape.dim
    for size in array.shape:
        dims.add().size = size
    field, view = found
    if native in _PACKED:
        if array.size:
            proto.MergeFromString(_packed_field(field, np.ascontiguousarray(array, dtype=native.newbyteorder("<"))
                                                .tobytes()))
        return
    flat = np.ascontiguousarray(array, dtype=native).reshape(-1)
    getattr(proto, field).extend((flat.view(view) if view is not None else flat).tolist())


def predict_response(response: InferenceResponse, tensor_content: bool = False):
    """`InferenceResponse` -> `PredictResponse` (model_spec names the version that served it).

    Outputs go in the typed fields (TF Serving's default), or in `tensor_content` with `tensor_content`
    (--enable_serialization_as_tensor_content).
    """
    proto = protocol.PredictResponse()
    spec = proto.model_spec
    spec.name = response.model_name
    spec.version.value = response.version
    spec.signature_name = response.signature_name
    outputs = proto.outputs
    fill = fill_tensor_proto if tensor_content else fill_typed_fields
    for key, array in response.outputs.items():
        fill(outputs[key], array)  # in place: no intermediate message, no CopyFrom
    return proto


ARTIFACT_FIELD = "artifact"  # tfship's metadata field: the published artifact that answers (`--artifact`)
VERIFICATION_FIELD = "verification"  # tfship's metadata field under --verify-key: the verified version's record


def metadata_request(proto) -> ModelRef:
    """`GetModelMetadataRequest` -> `ModelRef`; `metadata_field` must hold `signature_def` (TF Serving's only
    field), and may also hold tfship's `artifact` (`metadata_response`).

    Raises:
        InvalidRequestError: other fields, or `signature_def` missing or repeated; no model name.
    """
    fields = list(proto.metadata_field)
    if sorted(fields) not in (["signature_def"], [ARTIFACT_FIELD, "signature_def"]):
        raise InvalidRequestError(f"metadata_field must be ['signature_def'] (tfship also answers "
                                  f"['signature_def', '{ARTIFACT_FIELD}']), got {echo_list(fields)}")
    return model_ref(proto.model_spec)


def metadata_response(metadata: ModelMetadata, fields: Sequence[str] = ("signature_def",)):
    """`ModelMetadata` -> `GetModelMetadataResponse` with `metadata["signature_def"]` = Any(SignatureDefMap), and,
    when `fields` asks for `artifact` and the server runs `--artifact`, `metadata["artifact"]` =
    Any(google.protobuf.Struct {name, backend, file, sha256}); without `--artifact` that key is absent.
    Under `--verify-key`, `metadata["verification"]` = Any(Struct {manifest_sha256, key_id, signed_files,
    op_policy}) always: one more key of the map, which TF Serving's clients (they read `signature_def`) pass over.
    """
    proto = protocol.GetModelMetadataResponse()
    proto.model_spec.name = metadata.model_name
    proto.model_spec.version.value = metadata.version
    defs = protocol.SignatureDefMap()
    for name, signature in metadata.signatures.items():
        defs.signature_def[name].CopyFrom(to_signature_def(signature))
    proto.metadata["signature_def"].Pack(defs)
    if ARTIFACT_FIELD in fields and metadata.artifact is not None:
        artifact = metadata.artifact
        proto.metadata[ARTIFACT_FIELD].Pack(struct_pb2.Struct(fields={
            key: struct_pb2.Value(string_value=value) for key, value in (
                ("name", artifact.name), ("backend", artifact.backend), ("file", artifact.file),
                ("sha256", artifact.sha256))}))
    if metadata.verification is not None:
        record = struct_pb2.Struct()
        record.update(dict(metadata.verification))
        proto.metadata[VERIFICATION_FIELD].Pack(record)
    return proto


def status_response(statuses: list[VersionStatus]):
    """`VersionStatus`es -> `GetModelStatusResponse` (error_code numbers follow tensorflow.error.Code)."""
    proto = protocol.GetModelStatusResponse()
    for status in statuses:
        entry = proto.model_version_status.add()
        entry.version = status.version
        entry.state = status.state.value
        codes = protocol.ERROR_CODE.values_by_name
        code = codes.get(status.error_code) or codes["UNKNOWN"]
        entry.status.error_code = code.number
        entry.status.error_message = status.error_message
    return proto
