"""Nothing a client sends is echoed back unbounded: every client-chosen name, label or list quoted in an error is
cut where the message is built, and the whole message (gRPC status, REST error body, request-log line) is capped.

Each example is sent at 10 KB, 100 KB and 1 MB on a real server; the answer must carry the status the field
itself calls for (a 20,000-character model name is NOT_FOUND, not RESOURCE_EXHAUSTED "metadata size exceeds hard
limit") and a message of at most `core.echo.MESSAGE_BYTES` bytes.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
from conftest import MODEL
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfship.core import kserve_protocol as kp
from tfship.core import protocol
from tfship.core.echo import MESSAGE_BYTES, cap_message, clip, echo, echo_json, echo_list
from tfship.serving.launcher import ServerProcess

SIZES = [10_000, 100_000, 1_000_000]
FLOAT = protocol.DATA_TYPE.values_by_name["DT_FLOAT"].number
LOG_LINE_BYTES = 4096  # a request-log line, whatever the request named


@pytest.fixture(scope="module")
def echo_server(repository):
    with ServerProcess(repository, MODEL, backend="tflite",
                       extra_args=("--request-log-sampling-rate", "1", "--file-system-poll-wait-seconds", "0")) as s:
        yield s


@pytest.fixture(scope="module")
def channel(echo_server):
    with grpc.insecure_channel(echo_server.grpc_target) as channel:
        yield channel


def _image_tensor(tensor) -> None:
    tensor.dtype = FLOAT
    for size in (1, 8, 8, 1):
        tensor.tensor_shape.dim.add().size = size
    tensor.tensor_content = np.zeros((1, 8, 8, 1), np.float32).tobytes()


def _predict(model=MODEL, signature="", label="", inputs=("image",), output_filter=()):
    request = protocol.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    if label:
        request.model_spec.version_label = label
    for name in inputs:
        _image_tensor(request.inputs[name])
    request.output_filter.extend(output_filter)
    return request


def _infer(model=MODEL, version="", input_name="image", datatype="FP32", output=""):
    request = kp.ModelInferRequest(model_name=model, model_version=version)
    tensor = request.inputs.add(name=input_name, datatype=datatype, shape=[1, 8, 8, 1])
    tensor.contents.fp32_contents.extend([0.0] * 64)
    if output:
        request.outputs.add(name=output)
    return request


def _big(size: int) -> str:
    return "n" * size


def _many(size: int) -> list[str]:  # about `size` characters of distinct unexpected names
    return [f"x{i:07d}" for i in range(size // 8)]


GRPC_CASES = {  # field: (service, method, request from a client-chosen name, status the field calls for)
    "model_spec.name": (protocol.PREDICTION_SERVICE, "Predict", lambda t: _predict(model=t), "NOT_FOUND"),
    "signature_name": (protocol.PREDICTION_SERVICE, "Predict", lambda t: _predict(signature=t), "INVALID_ARGUMENT"),
    "version_label": (protocol.PREDICTION_SERVICE, "Predict", lambda t: _predict(label=t), "INVALID_ARGUMENT"),
    "input name": (protocol.PREDICTION_SERVICE, "Predict", lambda t: _predict(inputs=("image", t)),
                   "INVALID_ARGUMENT"),
    "many input names": (protocol.PREDICTION_SERVICE, "Predict",
                         lambda t: _predict(inputs=("image", *_many(len(t)))), "INVALID_ARGUMENT"),
    "output_filter": (protocol.PREDICTION_SERVICE, "Predict", lambda t: _predict(output_filter=[t]),
                      "INVALID_ARGUMENT"),
    "many output_filter names": (protocol.PREDICTION_SERVICE, "Predict",
                                 lambda t: _predict(output_filter=_many(len(t))), "INVALID_ARGUMENT"),
    "metadata_field": (protocol.PREDICTION_SERVICE, "GetModelMetadata",
                       lambda t: protocol.GetModelMetadataRequest(model_spec={"name": MODEL}, metadata_field=[t]),
                       "INVALID_ARGUMENT"),
    "status model name": (protocol.MODEL_SERVICE, "GetModelStatus",
                          lambda t: protocol.GetModelStatusRequest(model_spec={"name": t}), "NOT_FOUND"),
    "V2 model_name": (kp.SERVICE, "ModelInfer", lambda t: _infer(model=t), "NOT_FOUND"),
    "V2 model_version": (kp.SERVICE, "ModelInfer", lambda t: _infer(version="v" + t), "INVALID_ARGUMENT"),
    "V2 input name": (kp.SERVICE, "ModelInfer", lambda t: _infer(input_name=t), "INVALID_ARGUMENT"),
    "V2 datatype": (kp.SERVICE, "ModelInfer", lambda t: _infer(datatype=t), "INVALID_ARGUMENT"),
    "V2 output name": (kp.SERVICE, "ModelInfer", lambda t: _infer(output=t), "INVALID_ARGUMENT"),
    "V2 metadata name": (kp.SERVICE, "ModelMetadata", lambda t: kp.ModelMetadataRequest(name=t), "NOT_FOUND"),
}


def _grpc_status(channel, service: str, method: str, request) -> tuple[str, str]:
    call = channel.unary_unary(f"/{service}/{method}", request_serializer=lambda m: m.SerializeToString())
    try:
        call(request, timeout=30)
        return "OK", ""
    except grpc.RpcError as err:
        return err.code().name, err.details() or ""


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", list(GRPC_CASES))
def test_grpc_answers_the_field_status_with_a_bounded_message(channel, case, size):
    service, method, build, expected = GRPC_CASES[case]
    status, details = _grpc_status(channel, service, method, build(_big(size)))
    assert status == expected, (case, size, details[:300])
    assert len(details.encode()) <= MESSAGE_BYTES, (case, size, len(details))


UTF8_NAMES = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=8)


@given(case=st.sampled_from(sorted(GRPC_CASES)), piece=UTF8_NAMES, size=st.sampled_from(SIZES))
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
def test_grpc_fuzzed_names_keep_the_status_and_a_bounded_message(channel, case, piece, size):
    """Any UTF-8 name (percent-encoded by gRPC: up to 3x its bytes) repeated to about `size` characters."""
    service, method, build, expected = GRPC_CASES[case]
    status, details = _grpc_status(channel, service, method, build((piece * (size // len(piece) + 1))[:size]))
    assert status == expected, (case, size, details[:300])
    assert len(details.encode()) <= MESSAGE_BYTES, (case, size, len(details))


def _undecodable_predict_extra():  # the declared input, plus an extra one whose 3 bytes cannot fill float32[4]
    request = _predict()
    extra = request.inputs["extra"]
    extra.dtype = FLOAT
    extra.tensor_shape.dim.add().size = 4
    extra.tensor_content = b"\0" * 3
    return request


def _undecodable_infer_extra():  # the same over the Open Inference Protocol: 3 values for a [4] FP32 input
    request = _infer()
    request.inputs.add(name="extra", datatype="FP32", shape=[4]).contents.fp32_contents.extend([0.0] * 3)
    return request


@pytest.mark.parametrize("service, method, build", [
    (protocol.PREDICTION_SERVICE, "Predict", _undecodable_predict_extra),
    (kp.SERVICE, "ModelInfer", _undecodable_infer_extra),
], ids=["Predict", "ModelInfer"])
def test_unexpected_inputs_are_refused_by_name_before_any_value_is_decoded(channel, service, method, build):
    """TF Serving's order (predict_util.cc: VerifyRequestInputsSize before TensorFromProto): an input the signature
    does not have is refused by its name, so its values are never decoded (125,000 of them in a 37 MB request
    took 3.5 s to decode before the refusal, and ran past a 30 s deadline on a loaded host)."""
    status, details = _grpc_status(channel, service, method, build())
    assert status == "INVALID_ARGUMENT"
    assert "unexpected input(s) ['extra']" in details, details


@pytest.mark.parametrize("size", SIZES)
def test_grpc_health_service_name_is_not_found_bounded(channel, size):
    with pytest.raises(grpc.RpcError) as err:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=_big(size)), timeout=30)
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    assert len(err.value.details().encode()) <= MESSAGE_BYTES


def _post(url: str, body: dict | bytes) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


IMAGE = np.zeros((8, 8, 1)).tolist()


def _v2(name="image", datatype="FP32", output=None, version=None):
    body = {"inputs": [{"name": name, "datatype": datatype, "shape": [1, 8, 8, 1], "data": [0.0] * 64}]}
    if output is not None:
        body["outputs"] = [{"name": output}]
    return body


REST_CASES = {
    "signature_name": (":predict", lambda n: {"signature_name": _big(n), "instances": [IMAGE]}, 400),
    # TF Serving ignores `inputs` keys the signature does not name; the missing `image` is refused, naming the
    # ignored key in a bounded hint
    "input name (columnar)": (":predict", lambda n: {"inputs": {_big(n): [1.0]}}, 400),
    "row keys": (":predict", lambda n: {"instances": [{"image": IMAGE}, {_big(n): IMAGE}]}, 400),
    "many row keys": (":predict", lambda n: {"instances": [{k: 1.0 for k in _many(n)}]}, 400),
    "output_filter": (":predict", lambda n: {"instances": [IMAGE], "output_filter": [_big(n)]}, 400),
    "bare deep array": (":predict", lambda n: ("[" * (n // 1000) + "]" * (n // 1000)).encode(), 400),
    "V2 input name": ("/infer", lambda n: _v2(name=_big(n)), 400),
    "V2 datatype": ("/infer", lambda n: _v2(datatype=_big(n)), 400),
    "V2 output name": ("/infer", lambda n: _v2(output=_big(n)), 400),
    "V2 signature parameter": ("/infer", lambda n: {**_v2(), "parameters": {"signature_name": _big(n)}}, 400),
}


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("case", list(REST_CASES))
def test_rest_error_bodies_are_bounded(echo_server, case, size):
    route, build, expected = REST_CASES[case]
    url = (f"{echo_server.rest_url}/v1/models/{MODEL}{route}" if route == ":predict"
           else f"{echo_server.rest_url}/v2/models/{MODEL}{route}")
    status, body = _post(url, build(size))
    assert status == expected, (case, size, body[:300])
    assert len(body) <= MESSAGE_BYTES + 64, (case, size, len(body))
    assert "error" in json.loads(body)


@pytest.mark.parametrize("size", [4_000])  # aiohttp refuses request lines above 8,190 bytes itself
def test_rest_model_name_in_the_path_is_bounded(echo_server, size):
    for url in (f"{echo_server.rest_url}/v1/models/{_big(size)}:predict",
                f"{echo_server.rest_url}/v2/models/{_big(size)}/infer"):
        status, body = _post(url, {"instances": [IMAGE]} if ":predict" in url else _v2())
        assert status == 404, body[:300]
        assert len(body) <= 1024, len(body)


def test_request_log_lines_stay_bounded(echo_server, channel):
    _grpc_status(channel, protocol.PREDICTION_SERVICE, "Predict", _predict(model=_big(1_000_000)))
    _post(f"{echo_server.rest_url}/v1/models/{_big(4_000)}:predict", {"instances": [IMAGE]})
    lines = echo_server._stderr_path.read_text(errors="replace").splitlines()
    requests = [line for line in lines if '"protocol"' in line]
    assert requests and all(len(line.encode()) <= LOG_LINE_BYTES for line in requests), \
        max(len(line) for line in lines)
    assert any('"model": "__unknown__"' in line for line in requests)


# ------------------------------------------------------------------------------------ the helpers themselves
NAMES = st.text(st.characters(codec="utf-8"), max_size=50).map(lambda s: s * 1 or "x")


@given(text=NAMES, repeat=st.sampled_from([1, 200, 20_000]))
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
def test_echo_helpers_are_bounded(text, repeat):
    value = text * repeat
    assert len(clip(value)) <= 200 + 20
    assert len(echo(value)) <= 10 * 200 + 40  # repr may escape a character as \\U0001xxxx
    assert len(echo_list([value] * repeat)) <= 5 * (10 * 200 + 42) + 30
    assert len(cap_message(value).encode()) <= MESSAGE_BYTES
    assert len(echo_json({value: [value] * 3})) <= 200


def test_echo_marks_what_it_cut():
    assert clip("abc") == "abc" and echo("abc") == "'abc'"
    assert clip("a" * 300) == "a" * 200 + "… (300 chars)"
    assert echo_list(["a", "b", "c", "d", "e", "f", "g"]) == "['a', 'b', 'c', 'd', 'e'] and 2 more"
    assert echo_json([[[[1]]]]) == "[[[[1]]]]"
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    assert echo_json(deep, 256) == "[" * 256
