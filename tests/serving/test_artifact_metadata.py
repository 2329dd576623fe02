"""Metadata names the published artifact that answers under `tfship serve --artifact NAME`, in keys TF Serving's
and the Open Inference Protocol's clients do not read: `artifact` beside `model_spec` / `metadata` in REST
`/v1/models/M/metadata` and in each REST model status entry, `parameters` in V2 model metadata, and gRPC
GetModelMetadata's `metadata["artifact"]` (a Struct) when the request asks for that field beside `signature_def`. Without `--artifact`, both answers keep exactly
their protocol's keys. A real server on free ports, a real ONNX version with the manifest the publish stage writes.
"""

from __future__ import annotations

import hashlib
import json
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2

sys.path.insert(0, str(Path(__file__).resolve().parent))

import shadow_models

from tfship.core import protocol
from tfship.serving.launcher import ServerProcess

MODEL = "lin"


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """`<repo>/lin/1/model.onnx` with a manifest publishing it as artifact `onnx` (files: size and sha256)."""
    return shadow_models.write_published_onnx(tmp_path_factory.mktemp("artifact"), MODEL)


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.loads(answer.read())


def _grpc_metadata(target: str, *fields: str) -> protocol.GetModelMetadataResponse:
    request = protocol.GetModelMetadataRequest(metadata_field=list(fields))
    request.model_spec.name = MODEL
    with grpc.insecure_channel(target) as channel:
        return channel.unary_unary("/tensorflow.serving.PredictionService/GetModelMetadata",
                                   request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=protocol.GetModelMetadataResponse.FromString)(
            request, timeout=30)


def test_metadata_names_the_artifact_that_answers(repo: Path) -> None:
    digest = hashlib.sha256((repo / MODEL / "1" / "model.onnx").read_bytes()).hexdigest()
    named = {"name": "onnx", "backend": "onnx", "file": "model.onnx", "sha256": digest}
    with ServerProcess(repo, MODEL, extra_args=("--artifact", "onnx", "--metrics-port", "-1")) as server:
        v1 = _get(f"{server.rest_url}/v1/models/{MODEL}/metadata")
        status = _get(f"{server.rest_url}/v1/models/{MODEL}")
        v2 = _get(f"{server.rest_url}/v2/models/{MODEL}")
        asked = _grpc_metadata(server.grpc_target, "signature_def", "artifact")
        plain = _grpc_metadata(server.grpc_target, "signature_def")
    assert v1["artifact"] == named
    assert status["model_version_status"] == [{"version": "1", "state": "AVAILABLE", "artifact": named,
                                               "status": {"error_code": "OK", "error_message": ""}}]
    struct = struct_pb2.Struct()
    assert asked.metadata["artifact"].Unpack(struct) and dict(struct) == named
    assert sorted(plain.metadata) == ["signature_def"]  # TF Serving's request gets TF Serving's answer
    assert v1["model_spec"]["version"] == "1" and "serving_default" in v1["metadata"]["signature_def"]["signature_def"]
    assert v2["parameters"] == {"artifact": "onnx", "artifact_backend": "onnx", "artifact_file": "model.onnx",
                                "artifact_sha256": digest}
    assert v2["platform"] == "onnxruntime_onnx" and v2["versions"] == ["1"]


def test_without_artifact_the_metadata_keeps_the_protocols_keys(repo: Path) -> None:
    with ServerProcess(repo, MODEL, extra_args=("--metrics-port", "-1")) as server:
        v1 = _get(f"{server.rest_url}/v1/models/{MODEL}/metadata")
        status = _get(f"{server.rest_url}/v1/models/{MODEL}")
        v2 = _get(f"{server.rest_url}/v2/models/{MODEL}")
        asked = _grpc_metadata(server.grpc_target, "signature_def", "artifact")
        with pytest.raises(grpc.RpcError) as refused:
            _grpc_metadata(server.grpc_target, "artifact")
    assert sorted(v1) == ["metadata", "model_spec"]  # TF Serving's GetModelMetadata JSON, nothing added
    assert sorted(status["model_version_status"][0]) == ["state", "status", "version"]
    assert sorted(asked.metadata) == ["signature_def"]  # no artifact chosen: no artifact key
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "metadata_field must be ['signature_def']" in refused.value.details()
    assert sorted(v2) == ["inputs", "name", "outputs", "platform", "versions"]
