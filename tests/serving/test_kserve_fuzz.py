"""Property-based fuzzing (hypothesis) of the Open Inference Protocol decoders on the session's real server.

Every generated V2 request, gRPC or REST, must be answered OK or with INVALID_ARGUMENT / NOT_FOUND /
RESOURCE_EXHAUSTED (HTTP 400 / 404 / 413 / 429 with `{"error": ...}`) — never INTERNAL, UNKNOWN or an HTTP
5xx for anything a client sent — and the server keeps serving. About 600 requests; a few seconds.
These drive one backend on the small dense digits model; test_backend_faults.py runs the same property over
every backend (saved_model default and lenient, onnx, tflite) with a convolution-and-pooling CNN and a recommender.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import pytest
from conftest import MODEL
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfship.core import kserve_protocol as kp
from tfship.serving.kserve.codec import CONTENTS_FIELD, DATATYPES

CLIENT_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                database=None)
DATATYPE_NAMES = [*DATATYPES, "BF16", "FP8", "", "fp32"]
NAMES = st.sampled_from(["image", "x", "", "logits", "imagé"])


def _shapes():
    small = st.integers(0, 9)
    wild = st.sampled_from([-1, -(2**40), 2**31 - 1, 2**31, 2**40, 2**62, 2**63 - 1])
    return (st.lists(st.one_of(small, small, small, wild), max_size=6) | st.just([1, 8, 8, 1])
            | st.just([1] * 70))


def _json_values():
    scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.just(10**400)
               | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=5))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(
        st.sampled_from(["b64", "name", "data"]), inner, max_size=2), max_leaves=70)


@st.composite
def rest_bodies(draw) -> dict:
    def tensor():
        item = {"name": draw(NAMES), "datatype": draw(st.sampled_from(DATATYPE_NAMES)), "shape": draw(_shapes())}
        if draw(st.booleans()):
            item["data"] = draw(st.lists(st.floats(0, 1, width=32), min_size=64, max_size=64) | _json_values())
        if draw(st.booleans()):
            item["parameters"] = draw(st.just({"binary_data_size": 4}) | _json_values())
        return item

    body = {"inputs": [tensor() for _ in range(draw(st.integers(0, 2)))]}
    for key, values in (("outputs", st.lists(st.fixed_dictionaries({"name": NAMES}), max_size=3) | _json_values()),
                        ("parameters", st.dictionaries(st.sampled_from(["binary_data_output", "timeout",
                                                                        "signature_name", "sequence_id"]),
                                                       _json_values(), max_size=2)),
                        ("id", st.text(max_size=3) | st.integers())):
        if draw(st.booleans()):
            body[key] = draw(values)
    return body


def _post(url: str, data: bytes, headers: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {}
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@FUZZ
@given(body=rest_bodies() | _json_values(), tail=st.binary(max_size=12), split=st.booleans(),
       path=st.sampled_from([f"/v2/models/{MODEL}/infer", f"/v2/models/{MODEL}/versions/1/infer",
                             f"/v2/models/{MODEL}/versions/x9/infer", "/v2/models/nope/infer"]))
def test_rest_v2_answers_every_body_with_a_client_status(server, body, tail, split, path):
    text = json.dumps(body).encode()
    headers = {"Inference-Header-Content-Length": str(len(text))} if split else {}
    status, answer = _post(server.rest_url + path, text + (tail if split else b""), headers)
    assert status == 200 or (status in (400, 404, 413, 429) and isinstance(answer.get("error"), str)), (status, answer)


@st.composite
def grpc_requests(draw):
    request = kp.ModelInferRequest(model_name=draw(st.sampled_from([MODEL, MODEL, "nope", ""])),
                                   model_version=draw(st.sampled_from(["", "1", "2", "x", "99"])))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 2))):
        datatype = draw(st.sampled_from(DATATYPE_NAMES))
        tensor = request.inputs.add(name=draw(NAMES), datatype=datatype, shape=draw(_shapes()))
        if raw:
            request.raw_input_contents.append(draw(st.binary(max_size=300) | st.just(b"\0" * 256)))
        else:
            field = draw(st.sampled_from(sorted(set(CONTENTS_FIELD.values()))))
            values = {"bool_contents": st.booleans(), "bytes_contents": st.binary(max_size=4),
                      "fp32_contents": st.floats(width=32), "fp64_contents": st.floats(),
                      "int_contents": st.integers(-(2**31), 2**31 - 1), "int64_contents": st.integers(-(2**63), 2**63 - 1),
                      "uint_contents": st.integers(0, 2**32 - 1), "uint64_contents": st.integers(0, 2**64 - 1)}[field]
            getattr(tensor.contents, field).extend(draw(st.lists(values, max_size=70)))
    for name in draw(st.lists(NAMES, max_size=2)):
        output = request.outputs.add(name=name)
        if draw(st.booleans()):
            output.parameters["binary_data"].bool_param = draw(st.booleans())
    for key in draw(st.lists(st.sampled_from(["timeout", "signature_name", "binary_data_output"]), max_size=2)):
        parameter = request.parameters[key]
        choice = draw(st.integers(0, 2))
        if choice == 0:
            parameter.int64_param = draw(st.integers(-5, 10**7))
        elif choice == 1:
            parameter.string_param = draw(st.sampled_from(["scale", "serving_default", "", "x"]))
        else:
            parameter.bool_param = draw(st.booleans())
    return request


@pytest.fixture(scope="module")
def model_infer(server):
    channel = grpc.insecure_channel(server.grpc_target)
    yield channel.unary_unary(f"/{kp.SERVICE}/ModelInfer", request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=kp.ModelInferResponse.FromString)
    channel.close()


@FUZZ
@given(request=grpc_requests())
def test_grpc_v2_answers_every_request_with_a_client_status(model_infer, request):
    try:
        model_infer(request, timeout=30)
    except grpc.RpcError as err:
        assert err.code() in CLIENT_CODES, (err.code(), err.details())


def test_server_still_serves_after_fuzzing(server, model_infer):
    request = kp.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="image", datatype="FP32", shape=[1, 8, 8, 1]).contents.fp32_contents.extend([0.5] * 64)
    assert [o.name for o in model_infer(request, timeout=30).outputs] != []
    assert urllib.request.urlopen(f"{server.rest_url}/v2/health/ready", timeout=30).status == 200
