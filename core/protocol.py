"""TF Serving API messages without TensorFlow: built at runtime from a committed descriptor set.

`protos/tf_serving_api.desc` holds the FileDescriptorProtos of `tensorflow_serving/apis/*`,
`tensorflow_serving/config/model_server_config.proto`, `tensorflow/core/protobuf/saved_model.proto`
and everything they import (regenerate with `python -m tfship.core.protos.build_descriptors`). The
classes live in a private `DescriptorPool`, so they never clash with TensorFlow's generated modules
loaded in the same process, and they are wire-compatible with `tensorflow_serving.apis.*_pb2`.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

DESCRIPTOR_SET = Path(__file__).resolve().parent / "protos" / "tf_serving_api.desc"

PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"


def _load_pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    files = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes())
    for file_proto in files.file:
        pool.Add(file_proto)
    return pool


POOL = _load_pool()


def message_class(full_name: str) -> type:
    """The message class for a fully qualified proto name, e.g. `tensorflow.serving.PredictRequest`."""
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(full_name))


def method_path(service: str, method: str) -> str:
    """GRPC full method name, e.g. `/tensorflow.serving.PredictionService/Predict`."""
    return f"/{service}/{method}"


_S = "tensorflow.serving."
PredictRequest = message_class(_S + "PredictRequest")
PredictResponse = message_class(_S + "PredictResponse")
GetModelMetadataRequest = message_class(_S + "GetModelMetadataRequest")
GetModelMetadataResponse = message_class(_S + "GetModelMetadataResponse")
SignatureDefMap = message_class(_S + "SignatureDefMap")
ClassificationRequest = message_class(_S + "ClassificationRequest")
ClassificationResponse = message_class(_S + "ClassificationResponse")
RegressionRequest = message_class(_S + "RegressionRequest")
RegressionResponse = message_class(_S + "RegressionResponse")
MultiInferenceRequest = message_class(_S + "MultiInferenceRequest")
MultiInferenceResponse = message_class(_S + "MultiInferenceResponse")
GetModelStatusRequest = message_class(_S + "GetModelStatusRequest")
GetModelStatusResponse = message_class(_S + "GetModelStatusResponse")
ModelVersionStatus = message_class(_S + "ModelVersionStatus")
ReloadConfigRequest = message_class(_S + "ReloadConfigRequest")
ReloadConfigResponse = message_class(_S + "ReloadConfigResponse")
ModelServerConfig = message_class(_S + "ModelServerConfig")
PredictionLog = message_class(_S + "PredictionLog")
TensorProto = message_class("tensorflow.TensorProto")
SignatureDef = message_class("tensorflow.SignatureDef")
SavedModel = message_class("tensorflow.SavedModel")

DATA_TYPE = POOL.FindEnumTypeByName("tensorflow.DataType")
VERSION_STATE = POOL.FindEnumTypeByName("tensorflow.serving.ModelVersionStatus.State")
ERROR_CODE = POOL.FindEnumTypeByName("tensorflow.error.Code")

# method name -> (request class, response class), per service; used by server and client alike.
PREDICTION_METHODS: dict[str, tuple[type, type]] = {
    "Predict": (PredictRequest, PredictResponse),
    "GetModelMetadata": (GetModelMetadataRequest, GetModelMetadataResponse),
    "Classify": (ClassificationRequest, ClassificationResponse),
    "Regress": (RegressionRequest, RegressionResponse),
    "MultiInference": (MultiInferenceRequest, MultiInferenceResponse),
}
MODEL_METHODS: dict[str, tuple[type, type]] = {
    "GetModelStatus": (GetModelStatusRequest, GetModelStatusResponse),
    "HandleReloadConfigRequest": (ReloadConfigRequest, ReloadConfigResponse),
}
