"""TF Serving protobuf messages <-> the data plane's types (`serving.dataplane.types`)."""

from __future__ import annotations

import time

from tfship.core import protocol
from tfship.core.echo import echo_list
from tfship.core.errors import InvalidRequestError
from tfship.core.saved_model import to_signature_def
from tfship.serving.dataplane.tensors import DEFAULT_MAX_TENSOR_BYTES, fill_tensor_proto, from_tensor_proto
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
                    max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES) -> InferenceRequest:
    """`PredictRequest` -> `InferenceRequest`; `time_remaining` (seconds) becomes a monotonic deadline.

    Each input decodes to at most `max_tensor_bytes` (see `serving.dataplane.tensors.from_tensor_proto`).
    """
    spec = proto.model_spec
    model = model_ref(spec)
    inputs = {key: from_tensor_proto(tensor, key, max_tensor_bytes) for key, tensor in proto.inputs.items()}
    deadline = None if time_remaining is None else time.monotonic() + time_remaining
    return InferenceRequest(
        model=model,
        inputs=inputs,
        signature_name=spec.signature_name or "serving_default",
        output_filter=tuple(proto.output_filter),
        deadline=deadline,
    )


def predict_response(response: InferenceResponse):
    """`InferenceResponse` -> `PredictResponse` (model_spec names the version that served it)."""
    proto = protocol.PredictResponse()
    spec = proto.model_spec
    spec.name = response.model_name
    spec.version.value = response.version
    spec.signature_name = response.signature_name
    outputs = proto.outputs
    for key, array in response.outputs.items():
        fill_tensor_proto(outputs[key], array)  # in place: no intermediate message, no CopyFrom
    return proto


def metadata_request(proto) -> ModelRef:
    """`GetModelMetadataRequest` -> `ModelRef`; only `signature_def` metadata exists (as in TF Serving)."""
    fields = list(proto.metadata_field)
    if fields != ["signature_def"]:
        raise InvalidRequestError(f"metadata_field must be ['signature_def'], got {echo_list(fields)}")
    return model_ref(proto.model_spec)


def metadata_response(metadata: ModelMetadata):
    """`ModelMetadata` -> `GetModelMetadataResponse` with `metadata["signature_def"]` = Any(SignatureDefMap)."""
    proto = protocol.GetModelMetadataResponse()
    proto.model_spec.name = metadata.model_name
    proto.model_spec.version.value = metadata.version
    defs = protocol.SignatureDefMap()
    for name, signature in metadata.signatures.items():
        defs.signature_def[name].CopyFrom(to_signature_def(signature))
    proto.metadata["signature_def"].Pack(defs)
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
