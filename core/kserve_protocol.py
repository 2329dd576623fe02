"""Open Inference Protocol (KServe V2) gRPC messages without TensorFlow or protoc.

`protos/open_inference.desc` (built from `protos/open_inference.proto`, see
`core.protos.build_open_inference`) is added to tfship's private descriptor pool
(`core.protocol.POOL`), so the messages never clash with a client library's generated modules
(e.g. tritonclient's `grpc_service.proto`) loaded in the same process, and server reflection lists the
service beside TF Serving's. Wire-compatible with Triton's `inference.GRPCInferenceService`.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2

from tfship.core import protocol

DESCRIPTOR_SET = Path(__file__).resolve().parent / "protos" / "open_inference.desc"
SERVICE = "inference.GRPCInferenceService"


def _add_to_pool() -> None:
    files = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes())
    for file_proto in files.file:
        try:
            protocol.POOL.FindFileByName(file_proto.name)
        except KeyError:
            protocol.POOL.Add(file_proto)


_add_to_pool()
_I = "inference."
ServerLiveRequest = protocol.message_class(_I + "ServerLiveRequest")
ServerLiveResponse = protocol.message_class(_I + "ServerLiveResponse")
ServerReadyRequest = protocol.message_class(_I + "ServerReadyRequest")
ServerReadyResponse = protocol.message_class(_I + "ServerReadyResponse")
ModelReadyRequest = protocol.message_class(_I + "ModelReadyRequest")
ModelReadyResponse = protocol.message_class(_I + "ModelReadyResponse")
ServerMetadataRequest = protocol.message_class(_I + "ServerMetadataRequest")
ServerMetadataResponse = protocol.message_class(_I + "ServerMetadataResponse")
ModelMetadataRequest = protocol.message_class(_I + "ModelMetadataRequest")
ModelMetadataResponse = protocol.message_class(_I + "ModelMetadataResponse")
ModelInferRequest = protocol.message_class(_I + "ModelInferRequest")
ModelInferResponse = protocol.message_class(_I + "ModelInferResponse")
InferTensorContents = protocol.message_class(_I + "InferTensorContents")
InferParameter = protocol.message_class(_I + "InferParameter")
ModelConfigRequest = protocol.message_class(_I + "ModelConfigRequest")
ModelConfigResponse = protocol.message_class(_I + "ModelConfigResponse")

# method name -> (request class, response class): the protocol's six RPCs and Triton's ModelConfig.
METHODS: dict[str, tuple[type, type]] = {
    "ServerLive": (ServerLiveRequest, ServerLiveResponse),
    "ServerReady": (ServerReadyRequest, ServerReadyResponse),
    "ModelReady": (ModelReadyRequest, ModelReadyResponse),
    "ServerMetadata": (ServerMetadataRequest, ServerMetadataResponse),
    "ModelMetadata": (ModelMetadataRequest, ModelMetadataResponse),
    "ModelInfer": (ModelInferRequest, ModelInferResponse),
    "ModelConfig": (ModelConfigRequest, ModelConfigResponse),
}
