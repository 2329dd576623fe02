"""Client input never answers INTERNAL / 500, on every backend, for a convolution-and-pooling model and a
recommender (tests/serving/backend_models.py), over TF Serving's and the Open Inference Protocol's gRPC and REST.

The regression (issue 32): the SavedModel backend lets the graph judge shapes, as TF Serving does, and
TensorFlow's oneDNN pooling kernel fails on some rank-4 inputs of the wrong dimensions with `AbortedError: could
not create a descriptor for a pooling forward propagation primitive`, answered INTERNAL (gRPC `[2,2,2,8]`,
`[8,1,7,2]`) or 500 (REST `{"instances": [[[[100000000000000000000]]]]}`, a `[1,1,1,1]` image). The rule
(serving.dataplane.contract): an input sent at its declared rank that contradicts a fixed dimension is refused
before the model on every backend, naming the declared shape; with `--lenient-fixed-dimensions` (TF Serving's
own leniency) it reaches the graph, and a graph failure on an input that does not conform to the signature is
INVALID_ARGUMENT naming the input, the declared shape and what was sent (`contract.judged`).

The property-based part (hypothesis, fixed seed, a few hundred requests per server) runs against the
saved_model (default and lenient), onnx and tflite backends.
"""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
import requests
from backend_models import HISTORY, ITEMS, write_repository
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfship.core import kserve_protocol as kp
from tfship.core import protocol
from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs.client import PredictClient, RemoteError

SERVERS = {"saved_model": ("saved_model", ()), "lenient": ("saved_model", ("--lenient-fixed-dimensions",)),
           "onnx": ("onnx", ()), "tflite": ("tflite", ())}
CLIENT_STATUSES = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED"}
# the shapes QA's fuzz round found answered INTERNAL on the SavedModel backend, and REST's [1,1,1,1]
FAULTY_IMAGES = [(2, 2, 2, 8), (1, 2, 8, 8), (8, 1, 7, 2), (1, 1, 1, 1)]
DECLARED = {"cnn": ("image", np.float32, (8, 8, 1)), "recommender": ("history", np.int64, (HISTORY,))}
FUZZ = settings(max_examples=90, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                database=None)


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("backend-models")
    return root, write_repository(root)


@pytest.fixture(scope="module", params=list(SERVERS))
def served(request, repository):
    root, config = repository
    backend, extra = SERVERS[request.param]
    with ServerProcess(root, "cnn", backend=backend, extra_args=("--model-config-file", str(config), *extra)) as server:
        server.kind = request.param
        yield server


def _grpc_status(server, model: str, inputs: dict) -> tuple[str, str]:
    with PredictClient(server.grpc_target, timeout_s=60) as client:
        try:
            client.predict(model, inputs)
            return "OK", ""
        except RemoteError as err:
            return err.grpc_code, str(err)


@pytest.mark.parametrize("shape", FAULTY_IMAGES)
def test_wrong_image_dimensions_are_invalid_argument_naming_the_declared_shape(served, shape):
    """QA's gRPC shapes: INVALID_ARGUMENT naming `image`, the declared `[?,8,8,1]` and what was sent; never
    INTERNAL. Refused before the model by default; on the lenient server the graph's own failure (oneDNN's
    AbortedError or TensorFlow's InvalidArgumentError) is classified by `contract.judged`.
    """
    status, message = _grpc_status(served, "cnn", {"image": np.ones(shape, np.float32)})
    assert status == "INVALID_ARGUMENT", (served.kind, shape, status, message)
    sent = ",".join(map(str, shape))
    assert "'image'" in message and f"[{sent}]" in message, message
    if served.kind != "lenient" or "declared" in message:
        assert "float32[?,8,8,1]" in message, message
    assert len(message) < 2100
    assert _grpc_status(served, "cnn", {"image": np.ones((2, 8, 8, 1), np.float32)}) == ("OK", "")


def test_rest_21_digit_literal_in_a_1x1x1x1_image_is_400(served):
    """QA's REST body: 400 naming the input (the literal itself is in float32's range: RapidJSON reads it as a
    double, json_tensor.cc AddValueToTensor takes any Number for DT_FLOAT); the shape [1,1,1,1] is the fault.
    """
    url = f"{served.rest_url}/v1/models/cnn:predict"
    answer = requests.post(url, data='{"instances": [[[[100000000000000000000]]]]}', timeout=60)
    assert answer.status_code == 400, answer.text
    assert "'image'" in answer.json()["error"] and "[1,1,1,1]" in answer.json()["error"], answer.text


@pytest.mark.parametrize("literal", ["1e39", "-1e39", str(10**40), "1" + "0" * 400])
@pytest.mark.parametrize("form", ["instances", "inputs", "v2"])
def test_number_literals_beyond_float32_are_refused_by_name(served, literal, form):
    """A literal outside float32's finite range is refused on every path (row, columnar, V2, integer literals
    into a float input) naming the input and the literal; an in-range one (1e38) is answered.
    """
    def post(text: str):
        if form == "v2":
            data = ",".join([text] * 64)
            body = f'{{"inputs": [{{"name": "image", "datatype": "FP32", "shape": [1,8,8,1], "data": [{data}]}}]}}'
            return requests.post(f"{served.rest_url}/v2/models/cnn/infer", data=body, timeout=60)
        plane = "[" + ",".join(["[" + ",".join([f"[{text}]"] * 8) + "]"] * 8) + "]"  # one 8x8x1 image
        return requests.post(f"{served.rest_url}/v1/models/cnn:predict", data=f'{{"{form}": [{plane}]}}', timeout=60)

    refused = post(literal)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert "image" in error and "finite range" in error and "value " in error, error
    assert post("1e38").status_code == 200


def test_fixed_dimension_contradicted_at_the_declared_rank(served):
    """A `[-1, 20]` history sent as `[B, 30]` or `[B, 10]`: refused naming the declared shape on every backend by
    default; the lenient server feeds it to the graph, whose mean pooling answers (TF Serving's behaviour).
    """
    for width in (30, 10):
        status, message = _grpc_status(served, "recommender", {"history": np.ones((2, width), np.int64)})
        if served.kind == "lenient":
            assert status == "OK", message
        else:
            assert status == "INVALID_ARGUMENT" and "int64[?,20]" in message and f"[2,{width}]" in message, message
    assert _grpc_status(served, "recommender", {"history": np.ones((2, HISTORY), np.int64)}) == ("OK", "")


# ------------------------------------------------------------------------------------------ property-based
def _shape(model: str):
    declared = DECLARED[model][2]
    near = st.lists(st.integers(0, 9), min_size=len(declared) + 1, max_size=len(declared) + 1)
    return near | st.lists(st.integers(0, 9), max_size=5) | st.builds(lambda b: [b, *declared], st.integers(0, 6))


@st.composite
def tensors(draw, model: str):
    """(model, alias, array): mostly the declared alias and dtype, shapes near the declared rank."""
    alias, dtype, _ = DECLARED[model]
    shape = tuple(draw(_shape(model)))
    size = int(np.prod(shape))
    dtype = draw(st.sampled_from([dtype, dtype, dtype, np.float64, np.int32]))
    if np.dtype(dtype).kind == "f":
        values = draw(st.sampled_from([0.5, -3.0, 1e20, float("nan"), float("inf")]))
    else:
        values = draw(st.sampled_from([0, 1, ITEMS - 1, ITEMS, -1, 2**31 - 1]))
    return model, draw(st.sampled_from([alias, alias, alias, "x"])), np.full(size, values, dtype).reshape(shape)


def _valid(model: str, alias: str, array: np.ndarray) -> bool:
    name, dtype, tail = DECLARED[model]
    in_range = model != "recommender" or bool(((array >= 0) & (array < ITEMS)).all())
    return (alias == name and array.dtype == dtype and array.shape[1:] == tail and array.ndim == len(tail) + 1
            and array.shape[0] > 0 and in_range and bool(np.isfinite(array).all()))


CASES = st.sampled_from(["cnn", "recommender"]).flatmap(tensors)


@FUZZ
@given(case=CASES)
def test_grpc_predict_fuzz_never_internal(served, case):
    model, alias, array = case
    status, message = _grpc_status(served, model, {alias: array})
    assert status in CLIENT_STATUSES, (served.kind, model, alias, array.dtype, array.shape, status, message)
    if _valid(model, alias, array):
        assert status == "OK", (served.kind, model, array.shape, message)


@FUZZ
@given(case=CASES, form=st.sampled_from(["instances", "inputs", "named"]))
def test_rest_predict_fuzz_never_5xx(served, case, form):
    model, alias, array = case
    value = array.tolist()
    body = {"instances": value} if form == "instances" else {"inputs": value if form == "inputs" else {alias: value}}
    answer = requests.post(f"{served.rest_url}/v1/models/{model}:predict", data=json.dumps(body), timeout=60)
    assert answer.status_code < 500, (served.kind, model, array.shape, answer.text)
    assert answer.status_code == 200 or "error" in answer.json(), answer.text


V2_TYPES = {np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64", np.dtype(np.int64): "INT64",
            np.dtype(np.int32): "INT32"}


@FUZZ
@given(case=CASES)
def test_v2_rest_fuzz_never_5xx(served, case):
    model, alias, array = case
    body = {"inputs": [{"name": alias, "datatype": V2_TYPES[array.dtype], "shape": list(array.shape),
                        "data": array.reshape(-1).tolist()}]}
    answer = requests.post(f"{served.rest_url}/v2/models/{model}/infer", data=json.dumps(body), timeout=60)
    assert answer.status_code < 500, (served.kind, model, array.shape, answer.text)
    if _valid(model, alias, array):
        assert answer.status_code == 200, answer.text


@FUZZ
@given(case=CASES)
def test_v2_grpc_fuzz_never_internal(served, case):
    model, alias, array = case
    request = kp.ModelInferRequest(model_name=model)
    request.inputs.add(name=alias, datatype=V2_TYPES[array.dtype], shape=list(array.shape))
    request.raw_input_contents.append(array.tobytes())
    with grpc.insecure_channel(served.grpc_target) as channel:
        infer = channel.unary_unary(f"/{kp.SERVICE}/ModelInfer", request_serializer=lambda m: m.SerializeToString(),
                                    response_deserializer=kp.ModelInferResponse.FromString)
        try:
            infer(request, timeout=60)
            status = "OK"
        except grpc.RpcError as err:
            status = err.code().name
    assert status in CLIENT_STATUSES, (served.kind, model, array.shape, status)
    if _valid(model, alias, array):
        assert status == "OK"


def test_grpc_raw_tensor_protos_of_any_rank_4_shape(served):
    """A TensorProto built by hand (tensor_content), QA's exact three shapes, through the raw gRPC method."""
    with grpc.insecure_channel(served.grpc_target) as channel:
        predict = channel.unary_unary(f"/{protocol.PREDICTION_SERVICE}/Predict")
        for shape in FAULTY_IMAGES[:3]:
            request = protocol.PredictRequest()
            request.model_spec.name = "cnn"
            tensor = request.inputs["image"]
            tensor.dtype = protocol.DATA_TYPE.values_by_name["DT_FLOAT"].number
            for size in shape:
                tensor.tensor_shape.dim.add().size = size
            tensor.tensor_content = np.ones(shape, np.float32).tobytes()
            with pytest.raises(grpc.RpcError) as refused:
                predict(request.SerializeToString(), timeout=60)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
