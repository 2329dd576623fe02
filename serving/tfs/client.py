"""A TF Serving gRPC client that needs neither TensorFlow nor generated stubs.

It sends standard `tensorflow.serving.PredictRequest`s (wire-identical to tensorflow_serving's), so
it works against tfship and real TF Serving alike. Errors come back as `RemoteError` carrying the
server's gRPC status code name.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Self

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tfship.core import protocol
from tfship.core.contract import Signature
from tfship.core.errors import ErrorStatus, TfshipError, UnavailableError
from tfship.core.saved_model import from_signature_def
from tfship.serving.dataplane.tensors import from_tensor_proto, to_tensor_proto
from tfship.serving.dataplane.types import VersionState, VersionStatus


class RemoteError(TfshipError):
    """The server answered with a non-OK status; `grpc_code` is that status' name (e.g. `NOT_FOUND`)."""

    def __init__(self, code: grpc.StatusCode, details: str | None) -> None:
        super().__init__(f"{code.name}: {details}")
        self.status = ErrorStatus(code.name)
        self.details = details


class PredictClient:
    """Blocking client for PredictionService, ModelService and grpc.health.v1.

    Args:
        target: `host:port`.
        timeout_s: per-call deadline, seconds.
        credentials: `grpc.ssl_channel_credentials(...)` for TLS; None = plaintext.
        token: bearer token sent as `authorization: Bearer <token>`.
    """

    def __init__(self, target: str, timeout_s: float = 30.0, credentials: grpc.ChannelCredentials | None = None,
                 token: str | None = None, max_message_bytes: int = 64 << 20) -> None:
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes)]
        self._channel = (grpc.secure_channel(target, credentials, options) if credentials
                         else grpc.insecure_channel(target, options))
        self._timeout_s = timeout_s
        self._max_bytes = max(max_message_bytes, 64 << 20)  # decoded outputs are bounded like requests
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._signatures: dict[tuple[str, int | None], dict[str, Signature]] = {}

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def call(self, service: str, method: str, request, timeout_s: float | None = None):
        """Invoke any unary TF Serving method by name (e.g. `PredictionService`, `Predict`); raises `RemoteError`."""
        methods = protocol.PREDICTION_METHODS if service == protocol.PREDICTION_SERVICE else protocol.MODEL_METHODS
        response_cls = methods[method][1]
        stub = self._channel.unary_unary(protocol.method_path(service, method),
                                         request_serializer=type(request).SerializeToString,
                                         response_deserializer=response_cls.FromString)
        try:
            return stub(request, timeout=timeout_s or self._timeout_s, metadata=self._metadata)
        except grpc.RpcError as err:
            raise RemoteError(err.code(), err.details()) from err

    def metadata(self, model_name: str, version: int | None = None) -> dict[str, Signature]:
        """Signatures of the model (GetModelMetadata `signature_def`), by signature name."""
        request = protocol.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = model_name
        if version is not None:
            request.model_spec.version.value = version
        response = self.call(protocol.PREDICTION_SERVICE, "GetModelMetadata", request)
        defs = protocol.SignatureDefMap()
        response.metadata["signature_def"].Unpack(defs)
        signatures = {k: from_signature_def(k, v) for k, v in defs.signature_def.items()}
        self._signatures[(model_name, version)] = signatures
        return signatures

    def predict(self, model_name: str, inputs: Mapping[str, np.ndarray], signature_name: str = "serving_default",
                version: int | None = None, version_label: str | None = None,
                output_filter: list[str] | None = None, convert_dtypes: bool = True) -> dict[str, np.ndarray]:
        """Predict. `inputs`: alias -> array (batch on dim 0); returns alias -> array.

        With `convert_dtypes`, arrays are cast to the signature's dtypes first (from GetModelMetadata,
        cached per model/version). Raises `RemoteError` with the server's status.
        """
        if convert_dtypes:
            inputs = self._convert(model_name, version, signature_name, inputs)
        request = protocol.PredictRequest(output_filter=list(output_filter or ()))
        request.model_spec.name = model_name
        request.model_spec.signature_name = signature_name
        if version is not None:
            request.model_spec.version.value = version
        elif version_label is not None:
            request.model_spec.version_label = version_label
        for key, array in inputs.items():
            request.inputs[key].CopyFrom(to_tensor_proto(np.asarray(array)))
        response = self.call(protocol.PREDICTION_SERVICE, "Predict", request)
        return {key: from_tensor_proto(tensor, key, self._max_bytes) for key, tensor in response.outputs.items()}

    def _convert(self, model_name, version, signature_name, inputs):
        signatures = self._signatures.get((model_name, version)) or self.metadata(model_name, version)
        signature = signatures.get(signature_name)
        if signature is None:
            return dict(inputs)
        out = {}
        for key, array in inputs.items():
            spec = signature.inputs.get(key)
            array = np.asarray(array)
            out[key] = array if spec is None or spec.dtype == "string" else array.astype(spec.dtype, copy=False)
        return out

    def model_status(self, model_name: str, version: int | None = None,
                     version_label: str | None = None) -> list[VersionStatus]:
        """GetModelStatus: state and error of each version (or one version/label)."""
        request = protocol.GetModelStatusRequest()
        request.model_spec.name = model_name
        if version is not None:
            request.model_spec.version.value = version
        elif version_label is not None:
            request.model_spec.version_label = version_label
        response = self.call(protocol.MODEL_SERVICE, "GetModelStatus", request)
        return [VersionStatus(s.version, VersionState(s.state),
                              protocol.ERROR_CODE.values_by_number[s.status.error_code].name,
                              s.status.error_message) for s in response.model_version_status]

    def reload_config(self, config) -> None:
        """HandleReloadConfigRequest with a `tensorflow.serving.ModelServerConfig` message."""
        request = protocol.ReloadConfigRequest()
        request.config.CopyFrom(config)
        response = self.call(protocol.MODEL_SERVICE, "HandleReloadConfigRequest", request)
        if response.status.error_code:
            raise RemoteError(grpc.StatusCode.UNKNOWN, response.status.error_message)

    def health(self, service: str = "") -> str:
        """grpc.health.v1 Check: `SERVING`, `NOT_SERVING`, ...; raises `RemoteError` (e.g. UNAVAILABLE)."""
        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=self._timeout_s)  # pyright: ignore[reportAttributeAccessIssue]  # typeshed's HealthStub stub lacks the methods __init__ sets
        except grpc.RpcError as err:
            raise RemoteError(err.code(), err.details()) from err
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def wait_until_serving(self, timeout_s: float = 60.0, service: str = "") -> None:
        """Block until health says SERVING for `service` ("" = whole server), using the Watch stream.

        Raises `UnavailableError` if it is not SERVING within `timeout_s` seconds.
        """
        deadline = time.monotonic() + timeout_s
        stub = health_pb2_grpc.HealthStub(self._channel)
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                for response in stub.Watch(health_pb2.HealthCheckRequest(service=service),  # pyright: ignore[reportAttributeAccessIssue]  # typeshed's HealthStub stub lacks the methods __init__ sets
                                           timeout=max(deadline - time.monotonic(), 0.01), wait_for_ready=True):
                    last = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
                    if response.status == health_pb2.HealthCheckResponse.SERVING:
                        return
            except grpc.RpcError as err:
                last = f"{err.code().name}: {err.details()}"
                if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    break
        raise UnavailableError(f"server not SERVING for {service!r} within {timeout_s}s (last: {last})")
