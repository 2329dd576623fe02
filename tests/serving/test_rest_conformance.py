"""tfship's REST API against TF Serving's documentation (g3doc/api_rest.md) and its handler's tests.

Driven the way TF Serving's docs drive it: plain `requests` with JSON bodies. Each expected body or
message below is TF Serving's (http_rest_api_handler_test.cc, json_tensor.cc, api_rest.md); REST
answers for the digits model are compared with the same server's gRPC answers. Deliberate tfship
differences are named where they occur (messages carry extra context after TF Serving's text).
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import requests
from conftest import MODEL
from typed_models import TABLE, build_typed_model

from tfship.core import protocol
from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs.client import RemoteError

TYPED = "typed"


@pytest.fixture(scope="module")
def typed_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("typed-rest")
    build_typed_model(repo / TYPED / "1", converted=False)
    with ServerProcess(repo, TYPED, backend="saved_model", extra_args=("--file-system-poll-wait-seconds", "0")) as s:
        yield s


def _post(server, path: str, body) -> requests.Response:
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    return requests.post(server.rest_url + path, data=data, timeout=30)


def _error(response: requests.Response, status: int) -> str:
    """The error text of a TF Serving-shaped error body (exactly one key, `error`)."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()
    assert list(body) == ["error"] and isinstance(body["error"], str), body
    return body["error"]


def test_model_status_body_is_tf_servings(server, client):
    response = requests.get(f"{server.rest_url}/v1/models/{MODEL}", timeout=30)
    assert response.status_code == 200
    ok = {"error_code": "OK", "error_message": ""}
    assert response.json() == {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": ok}, {"version": "2", "state": "AVAILABLE", "status": ok}]}
    grpc_statuses = client.model_status(MODEL)
    assert [(str(s.version), s.state.name) for s in grpc_statuses] == [("1", "AVAILABLE"), ("2", "AVAILABLE")]
    labelled = requests.get(f"{server.rest_url}/v1/models/{MODEL}/labels/canary", timeout=30).json()
    assert labelled == {"model_version_status": [{"version": "2", "state": "AVAILABLE", "status": ok}]}


def test_metadata_body_is_tf_servings(server, client):
    body = requests.get(f"{server.rest_url}/v1/models/{MODEL}/metadata", timeout=30).json()
    assert list(body) == ["model_spec", "metadata"]
    assert body["model_spec"] == {"name": MODEL, "signature_name": "", "version": "2"}
    assert list(body["metadata"]) == ["signature_def"] and list(body["metadata"]["signature_def"]) == ["signature_def"]
    defs = body["metadata"]["signature_def"]["signature_def"]
    default = defs["serving_default"]
    assert set(default) == {"inputs", "outputs", "method_name", "defaults"}
    assert default["method_name"] == "tensorflow/serving/predict" and default["defaults"] == {}
    dims = [{"size": size, "name": ""} for size in ("-1", "8", "8", "1")]
    assert default["inputs"]["image"] == {"dtype": "DT_FLOAT", "tensor_shape": {"dim": dims, "unknown_rank": False},
                                          "name": "serving_default_image:0"}
    assert default["outputs"]["class_id"]["dtype"] == "DT_INT64"
    contract = client.metadata(MODEL)  # the gRPC answer names the same signatures, inputs and outputs
    assert set(defs) == set(contract)
    for name, signature in contract.items():
        assert set(defs[name]["inputs"]) == set(signature.inputs)
        assert set(defs[name]["outputs"]) == set(signature.outputs)


def test_predict_row_and_columnar_match_grpc(server, client, images):
    want = client.predict(MODEL, {"image": images})
    response = _post(server, f"/v1/models/{MODEL}:predict", {"instances": images.tolist()})
    assert response.status_code == 200 and list(response.json()) == ["predictions"]
    rows = response.json()["predictions"]
    assert len(rows) == len(images) and all(set(r) == set(want) for r in rows)
    for name, values in want.items():
        got = np.array([r[name] for r in rows], dtype=values.dtype)
        np.testing.assert_array_equal(got, values)  # floats written so they read back exactly in float32
    response = _post(server, f"/v1/models/{MODEL}:predict", {"inputs": {"image": images.tolist()}})
    assert list(response.json()) == ["outputs"]
    for name, values in want.items():
        np.testing.assert_array_equal(np.array(response.json()["outputs"][name], dtype=values.dtype), values)
    one = _post(server, f"/v1/models/{MODEL}:predict", {"inputs": images.tolist(), "output_filter": ["class_id"]})
    assert one.json() == {"outputs": want["class_id"].tolist()}  # one output: its name is dropped


def test_floats_are_written_as_short_decimals(server):
    # `scale` of version 1 doubles x: float32(0.1) * 2 is float32(0.2), written `0.2` as TF Serving does.
    response = _post(server, f"/v1/models/{MODEL}/versions/1:predict",
                     {"signature_name": "scale", "instances": [[0.1, 1.5, 4]]})
    assert response.status_code == 200
    assert response.text.replace(" ", "").replace("\n", "") == '{"predictions":[[0.2,3.0,8.0]]}'


@pytest.mark.parametrize(("body", "status", "message"), [
    (b"", 400, "JSON Parse error: The document is empty"),
    (b"instances = [1, 2]", 400, "JSON Parse error: Expecting value at offset: 0"),
    (b"[1, 2]", 400, "JSON Value: [1,2] Is not object"),
    ({"signature_name": 100}, 400,
     "JSON Value: 100 not formatted correctly. 'signature_name' key must be a string value."),
    ({"instances": ["x", "y"]}, 400, "input 'image': JSON Value: \"x\" Type: String is not of expected type: float"),
    ({"instances": [], "inputs": []}, 400, 'JSON Value: {"instances":[],"inputs":[]} Not formatted correctly '
                                           "expecting only one of 'inputs' or 'instances' keys to exist"),
    ({"instances": []}, 400, "JSON Value: [] No values in 'instances' array"),
    ({"instances": 5}, 400, "JSON Value: 5 Expecting 'instances' to be an list/array"),
    ({"signature_name": "serving_default"}, 400, "Missing 'inputs' or 'instances' key"),
    ({"signature_name": "nope", "instances": [1]}, 400, 'Serving signature name: "nope" not found in signature def'),
])
def test_predict_request_errors_use_tf_servings_words(server, body, status, message):
    text = _error(_post(server, f"/v1/models/{MODEL}:predict", body), status)
    assert text.startswith(message), text


@pytest.mark.parametrize(("method", "path", "status", "message"), [
    ("GET", "/v1/foo", 400, "Malformed request: GET /v1/foo"),
    ("POST", "/v1/foo", 400, "Malformed request: POST /v1/foo"),
    ("GET", f"/v1/models/{MODEL}:predict", 400, f"Malformed request: GET /v1/models/{MODEL}:predict"),
    ("POST", f"/v1/models/{MODEL}/metadata", 400, f"Malformed request: POST /v1/models/{MODEL}/metadata"),
    ("POST", "/v1/models/foo:predict", 404, "Servable not found for request: Latest(foo)"),
    ("POST", f"/v1/models/{MODEL}/versions/99:predict", 404, f"Servable not found for request: Specific({MODEL}, 99)"),
    ("POST", f"/v1/models/{MODEL}/labels/gold:predict", 400, "Unrecognized servable version label: gold"),
    ("GET", f"/v1/models/{MODEL}/labels/gold", 400, "Unrecognized servable version label: gold"),
])
def test_paths_models_versions_and_labels(server, method, path, status, message):
    response = requests.request(method, server.rest_url + path, data=json.dumps({"instances": [1]}), timeout=30)
    assert _error(response, status).startswith(message)


def test_classify_and_regress_errors(server, client):
    # No method-name check by default (TF Serving's --enable_signature_method_name_check=false): the
    # signature's shape is what refuses it (serving_default has three outputs).
    text = _error(_post(server, f"/v1/models/{MODEL}:classify", {"examples": [{"x": 1.0}]}), 400)
    assert text.startswith("Expected one or two output Tensors, found 3.")
    text = _error(_post(server, f"/v1/models/{MODEL}:regress", {"signature_name": "scale"}), 400)
    assert text == ('JSON Value: {"signature_name":"scale"} When method is regress, key \'examples\' is expected '
                    "and was not found")
    text = _error(_post(server, f"/v1/models/{MODEL}:classify", {"signature_name": "nope", "examples": [{}]}), 400)
    assert text == "No signature was found with the name: nope; available: ['scale', 'serving_default']"
    assert _error(_post(server, "/v1/models/foo:regress", {"examples": [{}]}), 404).startswith("Servable not found")
    # gRPC answers the same checks with the same words.
    request = protocol.ClassificationRequest()
    request.model_spec.name = MODEL
    request.model_spec.signature_name = "nope"
    with pytest.raises(RemoteError) as caught:
        client.call(protocol.PREDICTION_SERVICE, "Classify", request)
    assert caught.value.grpc_code == "INVALID_ARGUMENT"
    assert caught.value.details.startswith("No signature was found with the name: nope")


@pytest.mark.parametrize(("signature", "body", "message"), [
    # The examples, then a second instance of each kind.
    ("serving_default", {"instances": [[1.7, 2.2, 3.9]]},
     "input 'ids': JSON Value: 1.7 Type: Number is not of expected type: int32"),
    ("serving_default", {"instances": [[1, 2, 3000000000]]},
     "input 'ids': JSON Value: 3000000000 Type: Number is not of expected type: int32"),
    ("serving_default", {"inputs": {"ids": [[1, True, 2]]}},
     "input 'ids': JSON Value: true Type: True is not of expected type: int32"),
    ("serving_default", {"instances": [[1, 2, -2147483649]]},
     "input 'ids': JSON Value: -2147483649 Type: Number is not of expected type: int32"),
    ("flags", {"instances": ["false"]}, "input 'flag': JSON Value: \"false\" Type: String is not of expected type: bool"),
    ("flags", {"inputs": [1, 0]}, "input 'flag': JSON Value: 1 Type: Number is not of expected type: bool"),
    ("mixed", {"instances": [{"x": [None, 1.0], "text": "a"}]},
     "input 'x': JSON Value: null Type: Null is not of expected type: float"),
    ("mixed", {"inputs": {"x": [["1.5", 1.0]], "text": ["a"]}},
     "input 'x': JSON Value: \"1.5\" Type: String is not of expected type: float"),
    ("mixed", {"inputs": {"x": [[1.0, 2.0]], "text": [5]}},
     "input 'text': JSON Value: 5 Type: Number is not of expected type: string"),
    ("mixed", {"inputs": {"x": [[1.0, 2.0]], "text": [{"b64": "!!"}]}}, "input 'text': Unable to base64 decode"),
    ("mixed", {"inputs": {"x": [[1.0, 2.0]], "text": [{"b64": "YQ==", "more": 1}]}},
     "input 'text': JSON Value: {\"b64\":\"YQ==\",\"more\":1} not formatted correctly for base64 data"),
    ("mixed", {"inputs": {"x": [[1.0, 2.0], [3.0]], "text": ["a", "b"]}},
     "input 'x': Encountered list at unexpected size: 1 at level: 1 expected size: 2"),
    ("mixed", {"instances": [{"x": [1.0, 2.0], "text": "a"}, {"x": [1.0, 2.0]}]},
     "Failed to process element: 1 of 'instances' list. JSON object: {\"x\":[1.0,2.0]} keys must be equal to: "
     "text,x"),
])
def test_values_are_checked_against_the_signature_dtype(typed_server, signature, body, message):
    response = _post(typed_server, f"/v1/models/{TYPED}:predict", {"signature_name": signature, **body})
    assert _error(response, 400) == message


def test_typed_values_that_fit_are_served(typed_server):
    response = _post(typed_server, f"/v1/models/{TYPED}:predict", {"instances": [[0, 9, 3], [1, 1, 1]]})
    assert list(response.json()) == ["predictions"]
    np.testing.assert_array_equal(np.array(response.json()["predictions"], np.float32), TABLE[[[0, 9, 3], [1, 1, 1]]])
    assert response.json()["predictions"][0][0] == [0.0, 0.1, 0.2, 0.3]  # float32 written as short decimals
    response = _post(typed_server, f"/v1/models/{TYPED}:predict", {"signature_name": "flags", "inputs": [True, False]})
    assert response.json() == {"outputs": {"negated": [False, True], "count": 1}}


def test_row_format_needs_every_output_to_share_the_batch(typed_server):
    text = _error(_post(typed_server, f"/v1/models/{TYPED}:predict",
                        {"signature_name": "flags", "instances": [True, False, True]}), 400)
    assert text.startswith("Tensor name: count has no shape information")
    rows = [{"x": [1.0, 2.0], "text": "a"}, {"x": [3.0, 4.0], "text": "b"}, {"x": [5.0, 6.0], "text": "c"}]
    text = _error(_post(typed_server, f"/v1/models/{TYPED}:predict", {"signature_name": "mixed", "instances": rows}),
                  400)
    assert text.startswith("Tensor name: first has inconsistent batch size: 1 expecting: 3")
    # Filtering the odd outputs away (or the columnar format) serves the request.
    response = _post(typed_server, f"/v1/models/{TYPED}:predict",
                     {"signature_name": "mixed", "instances": rows, "output_filter": ["y", "echo"]})
    assert response.json() == {"predictions": [{"y": [2.0, 4.0], "echo": "a"}, {"y": [6.0, 8.0], "echo": "b"},
                                               {"y": [10.0, 12.0], "echo": "c"}]}


def test_binary_strings_use_b64_for_bytes_names(typed_server):
    raw = b"\xff\x00\x01"
    body = {"signature_name": "mixed",
            "inputs": {"x": [[1.0, 2.0], [3.0, 4.0]], "text": [{"b64": base64.b64encode(raw).decode()}, "plain"]}}
    outputs = _post(typed_server, f"/v1/models/{TYPED}:predict", body).json()["outputs"]
    assert outputs["text_bytes"] == [{"b64": base64.b64encode(raw).decode()}, {"b64": "cGxhaW4="}]
    assert outputs["echo"] == [{"b64": base64.b64encode(raw).decode()}, "plain"]  # non-UTF-8 only: tfship's choice
    assert outputs["first"] == [[1.0, 2.0]] and outputs["y"] == [[2.0, 4.0], [6.0, 8.0]]


@pytest.mark.parametrize("body", [
    b"\xff\xfe", b"{", b"null", b'"text"', b'{"instances": {"b64": 1}}', b'{"instances": [[[[[]]]]]}',
    b'{"inputs": {"ids": [[1, 2, 3]], "extra": 1}}', b'{"inputs": null}', b'{"instances": [null]}',
    b'{"instances": [[1, 2, 3]], "output_filter": ["nope"]}', b'{"instances": [[1e999, 0, 0]]}',
    b'{"instances": [[1, 2, 3]], "signature_name": ""}', b'{"instances": [{"ids": [1, 2, 3]}, [1, 2, 3]]}',
])
def test_nothing_a_client_sends_is_a_500(typed_server, body):
    response = _post(typed_server, f"/v1/models/{TYPED}:predict", body)
    assert 400 <= response.status_code < 500 or response.status_code == 200, (response.status_code, response.text)
    assert response.status_code == 200 or list(response.json()) == ["error"]
    assert _post(typed_server, f"/v1/models/{TYPED}:predict", {"instances": [[0, 1, 2]]}).status_code == 200
