"""The Open Inference Protocol (KServe V2) against a real server, driven by the real `tritonclient` (gRPC and HTTP).

The session server (conftest `server`) serves digits versions 1 and 2 from the SavedModel with labels
`stable` -> 1 and `canary` -> 2; answers are compared with the SavedModel called directly.
"""

from __future__ import annotations

import gzip
import json
import re
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from conftest import MODEL, saved_model_outputs
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tfship.serving.settings import ServerSettings

EXTENSIONS = ["binary_tensor_data", "model_configuration"]
DIGITS_METADATA = {
    "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 8, 8, 1]}],
    "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]},
                {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]},
                {"name": "class_id", "datatype": "INT64", "shape": [-1]}],
}


@pytest.fixture(scope="module")
def grpc_client(server):
    client = tgrpc.InferenceServerClient(server.grpc_target)
    yield client
    client.close()


@pytest.fixture(scope="module")
def http_client(server):
    client = thttp.InferenceServerClient(server.rest_url.removeprefix("http://"))
    yield client
    client.close()


def _by_name(tensors: list[dict]) -> list[dict]:
    return sorted(tensors, key=lambda t: t["name"])


def _grpc_input(module, array: np.ndarray, name: str = "image", datatype: str = "FP32", **kwargs):
    tensor = module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, **kwargs)
    return tensor


def _assert_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def _int_shapes(tensors: list[dict]) -> list[dict]:
    """MessageToJson writes int64 dims as strings."""
    return [{**t, "shape": [int(d) for d in t["shape"]]} for t in tensors]


def test_grpc_health_and_metadata(grpc_client):
    assert grpc_client.is_server_live() and grpc_client.is_server_ready()
    for version in ("", "1", "2", "stable", "canary"):
        assert grpc_client.is_model_ready(MODEL, version), version
    assert grpc_client.get_server_metadata(as_json=True)["name"] == "tfship"
    assert grpc_client.get_server_metadata(as_json=True)["extensions"] == EXTENSIONS
    meta = grpc_client.get_model_metadata(MODEL, as_json=True)
    assert (meta["name"], meta["versions"], meta["platform"]) == (MODEL, ["1", "2"], "tensorflow_savedmodel")
    assert _by_name(_int_shapes(meta["inputs"])) == _by_name(DIGITS_METADATA["inputs"])
    assert _by_name(_int_shapes(meta["outputs"])) == _by_name(DIGITS_METADATA["outputs"])
    with pytest.raises(InferenceServerException) as err:
        grpc_client.is_model_ready("nope")
    assert err.value.status() == "StatusCode.NOT_FOUND" and "nope" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        grpc_client.get_model_metadata(MODEL, "7")
    assert err.value.status() == "StatusCode.NOT_FOUND"
    assert err.value.message() == f"Could not find version 7 of model {MODEL}" or "Specific(digits, 7)" in \
        err.value.message()


def test_http_health_and_metadata(http_client, server):
    assert http_client.is_server_live() and http_client.is_server_ready()
    assert http_client.is_model_ready(MODEL) and http_client.is_model_ready(MODEL, "stable")
    assert not http_client.is_model_ready("nope")
    assert http_client.get_server_metadata()["extensions"] == EXTENSIONS
    meta = http_client.get_model_metadata(MODEL, "1")
    assert (meta["name"], meta["versions"], meta["platform"]) == (MODEL, ["1", "2"], "tensorflow_savedmodel")
    assert _by_name(meta["inputs"]) == _by_name(DIGITS_METADATA["inputs"])
    assert _by_name(meta["outputs"]) == _by_name(DIGITS_METADATA["outputs"])
    assert _http(f"{server.rest_url}/v2/health/live") == (200, {"live": True})
    assert _http(f"{server.rest_url}/v2/health/ready") == (200, {"ready": True})
    assert _http(f"{server.rest_url}/v2/models/{MODEL}/versions/2/ready") == (200, {"name": MODEL, "ready": True})
    status, body = _http(f"{server.rest_url}/v2/models/nope")
    assert status == 404 and body["error"].startswith("Servable not found for request: Latest(nope)")


def test_model_config_over_grpc_and_http(grpc_client, http_client):
    """Triton's model configuration (tfship's subset): batch dimension left out, max_batch_size the row limit."""
    rows = ServerSettings.model_fields["max_batch_per_request"].default  # the session server's row limit
    want = {"name": MODEL, "platform": "tensorflow_savedmodel", "backend": "saved_model", "max_batch_size": rows,
            "input": [{"name": "image", "data_type": "TYPE_FP32", "dims": [8, 8, 1]}],
            "output": [{"name": "class_id", "data_type": "TYPE_INT64", "dims": []},
                       {"name": "logits", "data_type": "TYPE_FP32", "dims": [10]},
                       {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [10]}]}
    config = grpc_client.get_model_config(MODEL, "1", as_json=True)["config"]
    config["input"] = [{**t, "dims": [int(d) for d in t["dims"]]} for t in config["input"]]
    config["output"] = sorted(({**t, "dims": [int(d) for d in t.get("dims", [])]} for t in config["output"]),
                              key=lambda t: t["name"])
    assert config == want
    config = http_client.get_model_config(MODEL)
    assert {**config, "output": sorted(config["output"], key=lambda t: t["name"])} == want


@pytest.mark.parametrize(("version", "served"), [("", 2), ("1", 1), ("stable", 1), ("canary", 2)])
def test_grpc_infer_raw_matches_saved_model(grpc_client, repository, images, version, served):
    result = grpc_client.infer(MODEL, [_grpc_input(tgrpc, images)], model_version=version, request_id="r-1")
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == (MODEL, str(served), "r-1")
    assert len(response.raw_output_contents) == 3  # binary, as Triton answers
    want = saved_model_outputs(repository / MODEL / str(served), {"image": images})
    _assert_equal({o.name: result.as_numpy(o.name) for o in response.outputs},
                  {k: want[k] for k in ("logits", "probabilities", "class_id")})


def test_grpc_output_selection_keeps_requested_order(grpc_client, repository, images):
    outputs = [tgrpc.InferRequestedOutput("class_id"), tgrpc.InferRequestedOutput("logits")]
    result = grpc_client.infer(MODEL, [_grpc_input(tgrpc, images)], outputs=outputs)
    assert [o.name for o in result.get_response().outputs] == ["class_id", "logits"]
    want = saved_model_outputs(repository / MODEL / "2", {"image": images})
    _assert_equal({"class_id": result.as_numpy("class_id"), "logits": result.as_numpy("logits")},
                  {"class_id": want["class_id"], "logits": want["logits"]})


def test_grpc_typed_contents_answer_typed_unless_binary_asked(server, repository, images):
    want = saved_model_outputs(repository / MODEL / "2", {"image": images})
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name=MODEL)
        tensor = request.inputs.add(name="image", datatype="FP32", shape=images.shape)
        tensor.contents.fp32_contents.extend(images.reshape(-1).tolist())
        request.outputs.add(name="probabilities")
        request.outputs.add(name="class_id")
        response = stub.ModelInfer(request, timeout=30)
        assert not response.raw_output_contents
        probabilities, class_id = response.outputs
        assert (probabilities.datatype, list(probabilities.shape)) == ("FP32", [5, 10])
        np.testing.assert_array_equal(np.array(probabilities.contents.fp32_contents, np.float32).reshape(5, 10),
                                      want["probabilities"])
        assert (class_id.datatype, list(class_id.contents.int64_contents)) == ("INT64", want["class_id"].tolist())
        request.parameters["binary_data_output"].bool_param = True
        response = stub.ModelInfer(request, timeout=30)
        assert len(response.raw_output_contents) == 2 and not response.outputs[1].contents.int64_contents
        np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[1], "<i8"), want["class_id"])


def test_http_infer_binary_json_and_compressed(http_client, repository, images):
    want = saved_model_outputs(repository / MODEL / "2", {"image": images})
    for binary_in in (True, False):
        for binary_out in (True, False):
            outputs = [thttp.InferRequestedOutput(n, binary_data=binary_out) for n in ("probabilities", "class_id")]
            result = http_client.infer(MODEL, [_grpc_input(thttp, images, binary_data=binary_in)], outputs=outputs,
                                       request_id="42")
            response = result.get_response()
            assert (response["model_version"], response["id"]) == ("2", "42")
            assert [("data" in o, "parameters" in o) for o in response["outputs"]] == [
                (not binary_out, binary_out)] * 2
            _assert_equal({n: result.as_numpy(n) for n in ("probabilities", "class_id")},
                          {"probabilities": want["probabilities"], "class_id": want["class_id"]})
    result = http_client.infer(MODEL, [_grpc_input(thttp, images)], model_version="stable",
                               request_compression_algorithm="gzip", response_compression_algorithm="gzip")
    np.testing.assert_array_equal(result.as_numpy("logits"),
                                  saved_model_outputs(repository / MODEL / "1", {"image": images})["logits"])


def test_http_json_body_as_the_protocol_documents(server, repository):
    """A hand-written V2 JSON request (nested data, id, one output) and the exact response body."""
    image = np.linspace(0, 1, 64, dtype=np.float32).reshape(1, 8, 8, 1)
    body = {"id": "7", "inputs": [{"name": "image", "shape": [1, 8, 8, 1], "datatype": "FP32",
                                   "data": image.tolist()}],
            "outputs": [{"name": "class_id"}]}
    status, answer = _http(f"{server.rest_url}/v2/models/{MODEL}/versions/1/infer", body)
    want = saved_model_outputs(repository / MODEL / "1", {"image": image})["class_id"]
    assert status == 200
    assert answer == {"model_name": MODEL, "model_version": "1", "id": "7",
                      "outputs": [{"name": "class_id", "datatype": "INT64", "shape": [1], "data": want.tolist()}]}


def test_large_json_body_is_decoded_right(http_client, repository):
    """A JSON body above 1 MiB (1024 rows), which the server parses and decodes in a thread."""
    rows = np.random.default_rng(1).random((1024, 8, 8, 1), dtype=np.float32)
    result = http_client.infer(MODEL, [_grpc_input(thttp, rows, binary_data=False)],
                               outputs=[thttp.InferRequestedOutput("class_id", binary_data=False)])
    want = saved_model_outputs(repository / MODEL / "2", {"image": rows})["class_id"]
    np.testing.assert_array_equal(result.as_numpy("class_id"), want)


def test_signature_parameter_selects_another_signature(grpc_client, http_client, repository):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = saved_model_outputs(repository / MODEL / "2", {"x": x}, "scale")["y"]
    result = grpc_client.infer(MODEL, [_grpc_input(tgrpc, x, name="x")], parameters={"signature_name": "scale"})
    np.testing.assert_array_equal(result.as_numpy("y"), want)
    result = http_client.infer(MODEL, [_grpc_input(thttp, x, name="x")], parameters={"signature_name": "scale"})
    np.testing.assert_array_equal(result.as_numpy("y"), want)


GRPC_ERRORS = [
    # (model, version, input array, datatype, outputs, parameters, status, message regex)
    (MODEL, "", np.zeros((2, 8, 8, 1), np.float64), "FP64", None, None, "INVALID_ARGUMENT",
     (r"^input 'image': datatype FP64 does not match the model's FP32 \(signature 'serving_default': "
      r"float32\[\?,8,8,1\]\)$")),
    (MODEL, "", np.zeros((2, 7, 8, 1), np.float32), "FP32", None, None, "INVALID_ARGUMENT",
     r"input 'image'.*dimension 1 must be 8.*float32\[\?,8,8,1\].*float32\[2,7,8,1\]"),
    ("nope", "", np.zeros((1, 8, 8, 1), np.float32), "FP32", None, None, "NOT_FOUND",
     r"^Servable not found for request: Latest\(nope\); served models: \['digits'\]$"),
    (MODEL, "9", np.zeros((1, 8, 8, 1), np.float32), "FP32", None, None, "NOT_FOUND",
     r"Specific\(digits, 9\).*available versions: \[1, 2\]"),
    (MODEL, "gold", np.zeros((1, 8, 8, 1), np.float32), "FP32", None, None, "INVALID_ARGUMENT",  # TF Serving's
     r"^Unrecognized servable version label: gold \(model 'digits'; labels: \['canary', 'stable'\]\)$"),
    (MODEL, "", np.zeros((1, 8, 8, 1), np.float32), "FP32", ["scores"], None, "INVALID_ARGUMENT",
     r"^requested output 'scores' is not an output of signature 'serving_default'; outputs: "),
    (MODEL, "", np.zeros((1, 8, 8, 1), np.float32), "FP32", None, {"signature_name": "train"}, "INVALID_ARGUMENT",
     (r"^signature 'train' not found; available: \[.*'scale', 'serving_default'\] \(choose one with the "
      r"request parameter 'signature_name'\)$")),
    (MODEL, "", np.zeros((0, 8, 8, 1), np.float32), "FP32", None, None, "INVALID_ARGUMENT", r"batch of 0 rows"),
]


@pytest.mark.parametrize(("model", "version", "array", "datatype", "outputs", "params", "code", "message"),
                         GRPC_ERRORS)
def test_grpc_errors_then_still_serving(grpc_client, images, model, version, array, datatype, outputs, params,
                                        code, message):
    requested = [tgrpc.InferRequestedOutput(n) for n in outputs] if outputs else None
    with pytest.raises(InferenceServerException) as err:
        grpc_client.infer(model, [_grpc_input(tgrpc, array, datatype=datatype)], model_version=version,
                          outputs=requested, parameters=params)
    assert err.value.status() == f"StatusCode.{code}"
    assert re.search(message, err.value.message()), err.value.message()
    assert grpc_client.infer(MODEL, [_grpc_input(tgrpc, images)]).as_numpy("class_id").shape == (5,)


def test_grpc_malformed_raw_and_oversized_requests(server, grpc_client):
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name=MODEL)
        request.inputs.add(name="image", datatype="FP32", shape=[1, 8, 8, 1])
        request.raw_input_contents.append(b"\0" * 255)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == "input 'image': shape [1, 8, 8, 1] of FP32 needs 256 bytes of raw contents, got 255"
        request.inputs[0].shape[0] = 1 << 30  # a few bytes claiming a huge tensor: refused before allocating
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-message-bytes" in err.value.details()
        request.raw_input_contents.append(b"")
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(request, timeout=30)
        assert err.value.details() == ("raw_input_contents has 2 entries for 1 inputs; send one per input, in the "
                                       "order of 'inputs'")
    with pytest.raises(InferenceServerException) as err:
        grpc_client.infer(MODEL, [_grpc_input(tgrpc, np.zeros((1, 8, 8, 1), np.float32))], sequence_id=4)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and "sequence batching is not supported" in \
        err.value.message()
    assert grpc_client.is_server_ready()


def _http(url: str, body: dict | bytes | None = None, headers: dict | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET",
                                     headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _image_input(**overrides) -> dict:
    return {"name": "image", "shape": [1, 8, 8, 1], "datatype": "FP32", "data": [0.5] * 64, **overrides}


HTTP_ERRORS = [
    ("digits", b"{not json", None, 400, r"^inference request JSON does not parse"),
    ("nope", {"inputs": [_image_input()]}, None, 404, r"^Servable not found for request: Latest\(nope\)"),
    ("digits", {"inputs": [_image_input(datatype="INT32", data=[1] * 64)]}, None, 400,
     r"^input 'image': datatype INT32 does not match the model's FP32"),
    ("digits", {"inputs": [_image_input(data=[0.5] * 63)]}, None, 400,
     r"^input 'image': shape \[1, 8, 8, 1\] needs 64 values, got 63 in 'data'$"),
    ("digits", {"inputs": [_image_input(data=[0.5] * 63 + ["x"])]}, None, 400,
     r"^input 'image': FP32 value at index 63 must be a number, got \"x\" \(string\)$"),
    ("digits", {"inputs": [_image_input(shape=[1, 64], data=[0.5] * 64)]}, None, 400,
     r"input 'image'.*expected rank 4"),
    ("digits", {"inputs": [{"name": "image", "shape": [1, 8, 8, 1], "datatype": "FP32"}]}, None, 400,
     r"^input 'image' needs 'data' or parameters.binary_data_size$"),
    ("digits", {"inputs": "image"}, None, 400, r"^'inputs' must be a JSON array, got string$"),
    ("digits", {}, None, 400, r"^'inputs' must be a JSON array, got null$"),  # not Python's NoneType
    ("digits", {"inputs": [None]}, None, 400, r"^inputs\[0\] must be a JSON object, got null$"),
    ("digits", {"inputs": [_image_input()], "outputs": [{"name": "scores"}]}, None, 400,
     r"^requested output 'scores' is not an output of signature 'serving_default'"),
    ("digits", json.dumps({"inputs": [_image_input(data=None, parameters={"binary_data_size": 256})]}).encode()
     + b"\0" * 100, "binary", 400, r"^input 'image': binary_data_size 256 does not fit the 100 bytes of binary"),
    # shown as JSON writes it, cut short: not Python's repr ('abc', True), nor a 10,000-item list up to the 2 KiB cap
    ("digits", json.dumps({"inputs": [_image_input(data=None, parameters={"binary_data_size": "abc"})]}).encode()
     + b"\0" * 256, "binary", 400, r'^input \'image\': binary_data_size "abc" does not fit the 256 bytes of binary'),
    ("digits", json.dumps({"inputs": [_image_input(data=None, parameters={"binary_data_size": [1] * 10000})]}).encode()
     + b"\0" * 256, "binary", 400, r"^input 'image': binary_data_size \[1,1,1,.{0,40} does not fit the 256 bytes"),
    ("digits", json.dumps({"inputs": [_image_input()]}).encode() + b"\0" * 8, "binary", 400,
     r"^8 bytes of binary data follow the inputs' binary_data_size"),
]


@pytest.mark.parametrize(("model", "body", "mode", "status", "message"), HTTP_ERRORS)
def test_http_errors_are_json_with_status(server, model, body, mode, status, message):
    headers = {}
    if mode == "binary":
        header = body.split(b"}]}", 1)[0] + b"}]}"
        headers = {"Inference-Header-Content-Length": str(len(header))}
    got_status, answer = _http(f"{server.rest_url}/v2/models/{model}/infer", body, headers)
    assert got_status == status and set(answer) == {"error"}
    assert re.search(message, answer["error"]), answer["error"]
    assert _http(f"{server.rest_url}/v2/health/ready") == (200, {"ready": True})


def test_http_gzip_request_body(server, repository):
    image = np.full((1, 8, 8, 1), 0.25, np.float32)
    body = gzip.compress(json.dumps({"inputs": [_image_input(data=[0.25] * 64)]}).encode())
    status, answer = _http(f"{server.rest_url}/v2/models/{MODEL}/infer", body, {"Content-Encoding": "gzip"})
    want = saved_model_outputs(repository / MODEL / "2", {"image": image})
    assert status == 200
    assert {o["name"]: o["data"] for o in answer["outputs"]}["class_id"] == want["class_id"].tolist()


def test_v2_requests_are_counted_in_the_same_metrics(server, grpc_client, http_client, images):
    def served() -> float:
        with urllib.request.urlopen(f"{server.metrics_url}/metrics", timeout=30) as response:
            text = response.read().decode()
        pattern = rf'tfship_requests_total\{{method="predict",model="{MODEL}",status="OK",version="2"\}} (\S+)'
        found = re.search(pattern, text)
        return float(found.group(1)) if found else 0.0

    before = served()
    grpc_client.infer(MODEL, [_grpc_input(tgrpc, images)])
    http_client.infer(MODEL, [_grpc_input(thttp, images)])
    assert served() == before + 2
