"""Every PredictionService/ModelService RPC, health, reflection and error status against a real server."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from conftest import MODEL, saved_model_outputs
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tfship.core import protocol
from tfship.serving.dataplane.types import VersionState
from tfship.serving.tfs.client import RemoteError


def _assert_outputs_equal(got, want):
    assert set(got) == set(want)
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_predict_latest_equals_saved_model(client, repository, images):
    got = client.predict(MODEL, {"image": images})
    _assert_outputs_equal(got, saved_model_outputs(repository / MODEL / "2", {"image": images}))


@pytest.mark.parametrize(("selector", "version"), [({"version": 1}, 1), ({"version": 2}, 2),
                                                    ({"version_label": "stable"}, 1),
                                                    ({"version_label": "canary"}, 2)])
def test_predict_version_and_label(client, repository, images, selector, version):
    got = client.predict(MODEL, {"image": images}, **selector)
    _assert_outputs_equal(got, saved_model_outputs(repository / MODEL / str(version), {"image": images}))


def test_predict_other_signature_and_output_filter(client, repository):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = client.predict(MODEL, {"x": x}, signature_name="scale", version=1)
    _assert_outputs_equal(got, saved_model_outputs(repository / MODEL / "1", {"x": x}, "scale"))
    filtered = client.predict(MODEL, {"image": np.zeros((1, 8, 8, 1))}, output_filter=["class_id"])
    assert list(filtered) == ["class_id"] and filtered["class_id"].dtype == np.int64


def test_predict_response_names_served_version(client):
    request = protocol.PredictRequest()
    request.model_spec.name = MODEL
    request.model_spec.version_label = "stable"
    from tfship.serving.dataplane.tensors import to_tensor_proto

    request.inputs["image"].CopyFrom(to_tensor_proto(np.zeros((1, 8, 8, 1), np.float32)))
    response = client.call(protocol.PREDICTION_SERVICE, "Predict", request)
    assert response.model_spec.name == MODEL and response.model_spec.version.value == 1
    assert response.model_spec.signature_name == "serving_default"


def test_get_model_metadata_is_signature_def_map(client, repository):
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow_serving.apis import get_model_metadata_pb2

    request = protocol.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = MODEL
    request.model_spec.version.value = 1
    raw = client.call(protocol.PREDICTION_SERVICE, "GetModelMetadata", request).SerializeToString()
    response = get_model_metadata_pb2.GetModelMetadataResponse.FromString(raw)  # TF Serving's own classes
    assert response.model_spec.version.value == 1
    defs = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(defs)
    saved = saved_model_pb2.SavedModel.FromString((repository / MODEL / "1" / "saved_model.pb").read_bytes())
    assert dict(defs.signature_def) == dict(saved.meta_graphs[0].signature_def)
    contract = client.metadata(MODEL)["serving_default"]
    assert contract.inputs["image"].dtype == "float32" and contract.inputs["image"].shape == (None, 8, 8, 1)
    assert contract.outputs["class_id"].dtype == "int64"


@pytest.mark.parametrize(("method", "message"), [
    ("Classify", "Expected one or two output Tensors, found 3."),  # serving_default: image -> 3 outputs
    ("Regress", "Expected one output Tensor."),
    ("MultiInference", "MultiInferenceRequest has no tasks"),
])
def test_example_methods_refuse_a_signature_without_their_shape(client, method, message, images):
    request = protocol.PREDICTION_METHODS[method][0]()
    if method != "MultiInference":
        request.model_spec.name = MODEL
    with pytest.raises(RemoteError) as err:
        client.call(protocol.PREDICTION_SERVICE, method, request)
    assert err.value.grpc_code == "INVALID_ARGUMENT" and err.value.details.startswith(message)
    assert client.predict(MODEL, {"image": images})["class_id"].shape == (5,)


def test_get_model_status(client):
    statuses = client.model_status(MODEL)
    assert [(s.version, s.state, s.error_code) for s in statuses] == [
        (1, VersionState.AVAILABLE, "OK"), (2, VersionState.AVAILABLE, "OK")]
    assert [s.version for s in client.model_status(MODEL, version_label="canary")] == [2]
    with pytest.raises(RemoteError) as err:
        client.model_status("nope")
    assert err.value.grpc_code == "NOT_FOUND"


def test_health_overall_and_per_model(server):
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", MODEL):
            assert stub.Check(health_pb2.HealthCheckRequest(service=service)).status == \
                health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as err:
            stub.Check(health_pb2.HealthCheckRequest(service="unknown-model"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_and_describes_services(server):
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        requests = [reflection_pb2.ServerReflectionRequest(list_services=""),
                    reflection_pb2.ServerReflectionRequest(file_containing_symbol=protocol.PREDICTION_SERVICE)]
        responses = list(stub.ServerReflectionInfo(iter(requests)))
    names = {s.name for s in responses[0].list_services_response.service}
    assert {protocol.PREDICTION_SERVICE, protocol.MODEL_SERVICE, "grpc.health.v1.Health"} <= names
    assert responses[1].file_descriptor_response.file_descriptor_proto


GOOD = np.zeros((2, 8, 8, 1), np.float32)
ERROR_CASES = {
    "unknown model": ({"model_name": "nope", "inputs": {"image": GOOD}}, "NOT_FOUND", "nope"),
    "unknown version": ({"model_name": MODEL, "inputs": {"image": GOOD}, "version": 7}, "NOT_FOUND", "7"),
    "unknown label": ({"model_name": MODEL, "inputs": {"image": GOOD}, "version_label": "gold"}, "INVALID_ARGUMENT",
                      "Unrecognized servable version label: gold"),
    "unknown signature": ({"model_name": MODEL, "inputs": {"image": GOOD}, "signature_name": "nope"},
                          "INVALID_ARGUMENT", "nope"),
    "missing input": ({"model_name": MODEL, "inputs": {}}, "INVALID_ARGUMENT", "missing input(s) ['image']"),
    "extra input": ({"model_name": MODEL, "inputs": {"image": GOOD, "mask": GOOD}}, "INVALID_ARGUMENT",
                    "unexpected input(s) ['mask']"),
    "wrong dtype": ({"model_name": MODEL, "inputs": {"image": GOOD.astype(np.float64)}}, "INVALID_ARGUMENT",
                    "expected dtype float32 (float32[?,8,8,1]), received float64[2,8,8,1]"),
    # SavedModel backend: as TF Serving, the model judges shapes (fed by name); what it refuses is INVALID_ARGUMENT
    "shape the model refuses": ({"model_name": MODEL, "inputs": {"image": np.zeros((2, 8, 7, 1), np.float32)}},
                                "INVALID_ARGUMENT", "dimension 2 must be 8 (declared shape float32[?,8,8,1])"),
    "unknown output_filter": ({"model_name": MODEL, "inputs": {"image": GOOD}, "output_filter": ["nope"]},
                              "INVALID_ARGUMENT", "nope"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_error_status_then_still_serving(client, repository, images, case):
    kwargs, code, fragment = ERROR_CASES[case]
    with pytest.raises(RemoteError) as err:
        client.predict(convert_dtypes=False, **kwargs)
    assert err.value.grpc_code == code, err.value
    assert fragment in err.value.details
    got = client.predict(MODEL, {"image": images}, version=1)
    _assert_outputs_equal(got, saved_model_outputs(repository / MODEL / "1", {"image": images}))


def test_client_converts_dtypes_from_metadata(client):
    got = client.predict(MODEL, {"image": np.zeros((1, 8, 8, 1), np.float64)})
    assert got["logits"].shape == (1, 10)
