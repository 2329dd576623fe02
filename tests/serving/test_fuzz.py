"""Property-based fuzzing (hypothesis) of the gRPC and REST decoders and the data plane, on real servers.

Every generated request must be answered with a documented status: OK for a valid request (outputs of the
right shape), otherwise INVALID_ARGUMENT / NOT_FOUND / RESOURCE_EXHAUSTED (HTTP 4xx) — never INTERNAL,
UNKNOWN or an HTTP 5xx for anything a client sent — and the server keeps serving afterwards.
About 3,000 requests in all; a few tens of seconds.
These drive one backend on the small dense digits model; test_backend_faults.py runs the same property over
every backend (saved_model default and lenient, onnx, tflite) with a convolution-and-pooling CNN and a recommender.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
from conftest import MODEL
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfship.core import protocol
from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs.client import PredictClient

CLIENT_STATUSES = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED"}


def fuzz(examples: int) -> settings:
    """Fixed seed (reproducible in CI), no example database, no per-example deadline."""
    return settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck),
                    derandomize=True, database=None)


DTYPES = [v.number for v in protocol.DATA_TYPE.values] + [-1, 1000, 2**31 - 1]
MAX_MESSAGE = 1 << 20


@pytest.fixture(scope="module")
def fuzz_server(repository):
    """tflite backend with batching (the Batched path), small message limit, 64 rows per request at most."""
    with ServerProcess(repository, MODEL, backend="tflite",
                       extra_args=("--enable-batching", "--max-message-bytes", str(MAX_MESSAGE),
                                   "--max-batch-per-request", "64", "--file-system-poll-wait-seconds", "0")) as server:
        yield server


@pytest.fixture(scope="module")
def raw_predict(fuzz_server):
    channel = grpc.insecure_channel(fuzz_server.grpc_target)
    yield channel.unary_unary(f"/{protocol.PREDICTION_SERVICE}/Predict")
    channel.close()


def _dims():
    small = st.integers(0, 9)
    wild = st.sampled_from([-1, -(2**40), 2**31 - 1, 2**31, 2**40, 2**62, 2**63 - 1])
    return st.lists(st.one_of(small, small, small, wild), max_size=6) | st.just([1] * 70) | st.just([0] + [2**31 - 1] * 8)


@st.composite
def tensor_protos(draw):
    """Any TensorProto: every dtype (and unknown ones), wild shapes, every value field, random bytes."""
    proto = protocol.TensorProto()
    proto.dtype = draw(st.sampled_from(DTYPES))
    proto.tensor_shape.unknown_rank = draw(st.booleans()) and draw(st.booleans()) and draw(st.booleans())
    for size in draw(_dims()):
        proto.tensor_shape.dim.add().size = size
    kind = draw(st.sampled_from(["content", "float", "double", "int", "int64", "half", "scomplex", "dcomplex",
                                 "string", "bool", "uint32", "uint64", "none"]))
    i32 = st.integers(-(2**31), 2**31 - 1)
    values = {
        "float": ("float_val", st.floats(width=32)), "double": ("double_val", st.floats()), "int": ("int_val", i32),
        "int64": ("int64_val", st.integers(-(2**63), 2**63 - 1)), "half": ("half_val", i32),
        "scomplex": ("scomplex_val", st.floats(width=32)), "dcomplex": ("dcomplex_val", st.floats()),
        "string": ("string_val", st.binary(max_size=8)), "bool": ("bool_val", st.booleans()),
        "uint32": ("uint32_val", st.integers(0, 2**32 - 1)), "uint64": ("uint64_val", st.integers(0, 2**64 - 1)),
    }
    if kind == "content":
        proto.tensor_content = draw(st.binary(max_size=600))
    elif kind in values:
        field, strategy = values[kind]
        getattr(proto, field).extend(draw(st.lists(strategy, max_size=70)))
    return proto


@st.composite
def predict_requests(draw):
    request = protocol.PredictRequest()
    request.model_spec.name = draw(st.sampled_from([MODEL, MODEL, MODEL, "", "nosuch", "../x"]) | st.text(max_size=8))
    request.model_spec.signature_name = draw(st.sampled_from(["", "serving_default", "nope"]))
    version = draw(st.none() | st.sampled_from([0, 1, 2, 3, -1, 2**63 - 1]))
    if version is not None:
        request.model_spec.version.value = version
    for key in draw(st.lists(st.sampled_from(["image", "image", "x", ""]), max_size=3, unique=True)):
        request.inputs[key].CopyFrom(draw(tensor_protos()))
    request.output_filter.extend(draw(st.lists(st.sampled_from(["logits", "probabilities", "class_id", "zz"]),
                                               max_size=3)))
    return request


def _status(call) -> str:
    try:
        call()
        return "OK"
    except grpc.RpcError as err:
        return err.code().name


@given(request=predict_requests())
@fuzz(1200)
def test_grpc_predict_fuzz_never_internal(raw_predict, request):
    status = _status(lambda: raw_predict(request.SerializeToString(), timeout=30))
    assert status in CLIENT_STATUSES, (status, request)


@given(data=st.binary(max_size=300))
@fuzz(300)
def test_grpc_undecodable_bytes_never_internal(raw_predict, data):
    status = _status(lambda: raw_predict(data, timeout=30))
    assert status in CLIENT_STATUSES, (status, data)


@given(rows=st.integers(1, 64), via=st.sampled_from(["content", "float_val", "broadcast"]))
@fuzz(200)
def test_grpc_valid_requests_are_served(raw_predict, rows, via):
    images = np.random.default_rng(rows).random((rows, 8, 8, 1), dtype=np.float32)
    request = protocol.PredictRequest()
    request.model_spec.name = MODEL
    tensor = request.inputs["image"]
    tensor.dtype = protocol.DATA_TYPE.values_by_name["DT_FLOAT"].number
    for size in images.shape:
        tensor.tensor_shape.dim.add().size = size
    if via == "content":
        tensor.tensor_content = images.tobytes()
    else:
        tensor.float_val.extend(images.reshape(-1).tolist() if via == "float_val" else [0.5])
    response = protocol.PredictResponse.FromString(raw_predict(request.SerializeToString(), timeout=30))
    assert [d.size for d in response.outputs["logits"].tensor_shape.dim] == [rows, 10]


# ------------------------------------------------------------------------------------------------ REST
def _post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


JSON_LEAVES = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=5)
ANY_JSON = st.recursive(JSON_LEAVES, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=30)


@st.composite
def rest_bodies(draw):
    """(body, expected): bodies shaped like predict requests, mostly wrong somewhere, plus arbitrary JSON and
    non-JSON bytes. `expected` is True (valid: 200), False (invalid: 4xx) or None (not asserted beyond < 500)."""
    choice = draw(st.sampled_from(["any", "bytes", "instances", "inputs", "keys"]))
    if choice == "any":
        return json.dumps(draw(ANY_JSON)).encode(), None
    if choice == "bytes":
        return draw(st.binary(max_size=200)), None
    rows = draw(st.integers(0, 5))
    shape = draw(st.sampled_from([(8, 8, 1), (8, 8, 1), (8, 8), (8, 8, 2), (1,), ()]))
    leaf = draw(st.sampled_from([1.5, 2, "x", None, True, {"b64": "AA=="}, [1.0], 1e40]))
    row = np.full(shape, 0.25).tolist() if shape else 0.25
    value = [row] * rows
    odd = rows and draw(st.booleans())
    if odd:
        value = json.loads(json.dumps(value).replace("0.25", json.dumps(leaf), 1))  # one odd value somewhere
    valid = rows > 0 and shape == (8, 8, 1) and (not odd or leaf in (1.5, 2))
    if odd and leaf == 1e40 and valid is False:
        valid = None  # beyond float32: TF Serving's own answer is not pinned here
    if choice == "keys":
        second = draw(st.sampled_from(["image", "x"]))
        return json.dumps({"instances": [{"image": r, second: r} for r in value]}).encode(), valid and second == "image"
    key = "instances" if choice == "instances" else "inputs"
    extra = draw(st.sampled_from([{}, {"signature_name": "nope"}, {"signature_name": 3}, {"output_filter": [1]},
                                  {"output_filter": "zz"}, {"inputs": 1}]))
    if odd and leaf == 1e40:
        valid = None
    return json.dumps({key: value, **extra}).encode(), (valid and not extra) if valid is not None else None


VALID_PATHS = (f"/v1/models/{MODEL}:predict", f"/v1/models/{MODEL}/versions/2:predict")


@given(case=rest_bodies(), path=st.sampled_from([*VALID_PATHS, f"/v1/models/{MODEL}/versions/99:predict",
                                                 "/v1/models/nosuch:predict", f"/v1/models/{MODEL}/labels/x:predict"]))
@fuzz(1000)
def test_rest_predict_fuzz_never_5xx(fuzz_server, case, path):
    """Never a 5xx; a valid body on a valid path is 200 with predictions, an invalid one a 4xx naming why."""
    body, valid = case
    status, answer = _post(fuzz_server.rest_url + path, body)
    assert status < 500, (status, answer, body[:300])
    if status != 200:
        assert 400 <= status < 500 and answer.get("error"), (status, answer)
    else:
        logits = np.asarray(answer["predictions"] if "predictions" in answer else answer["outputs"], dtype=object)
        assert logits.size, answer
    if valid is not None and path in VALID_PATHS:
        assert (status == 200) is valid, (status, answer, body[:300])
    elif path not in VALID_PATHS:
        assert 400 <= status < 500, (status, answer)


def test_server_still_serves_after_fuzz(fuzz_server):
    with PredictClient(fuzz_server.grpc_target) as client:
        assert client.predict(MODEL, {"image": np.zeros((3, 8, 8, 1), np.float32)})["logits"].shape == (3, 10)


def _proto(dtype: str, shape: list[int], field: str | None = None, values=()) -> protocol.TensorProto:
    proto = protocol.TensorProto(dtype=protocol.DATA_TYPE.values_by_name[dtype].number)
    for size in shape:
        proto.tensor_shape.dim.add().size = size
    if field:
        getattr(proto, field).extend(values)
    return proto


@pytest.mark.parametrize(("proto", "message"), [
    (_proto("DT_INT8", [1], "int_val", [1000]), "int_val value 1000 is out of range for DT_INT8"),
    (_proto("DT_UINT8", [2], "int_val", [3, -1]), "int_val value -1 is out of range for DT_UINT8"),
    (_proto("DT_INT16", [1], "int_val", [40000]), "out of range for DT_INT16"),
    (_proto("DT_UINT16", [1], "int_val", [70000]), "out of range for DT_UINT16"),
    (_proto("DT_HALF", [1], "half_val", [70000]), "half_val value 70000 is out of range"),
    (_proto("DT_COMPLEX64", [1], "scomplex_val", [1.0, 2.0, 3.0]), "must be even"),
    (_proto("DT_COMPLEX128", [1], "dcomplex_val", [1.0]), "must be even"),
    (_proto("DT_FLOAT", [1] * 70), "rank 70"),
    (_proto("DT_FLOAT", [0] + [2**31 - 1] * 8), "overflows int64"),
    (_proto("DT_FLOAT", [-3]), "invalid dim -3"),
])
def test_malformed_tensors_are_invalid_argument_before_numpy(proto, message):
    """The attacks QA found answered INTERNAL: each is now INVALID_ARGUMENT naming the input and the value."""
    from tfship.core.errors import InvalidRequestError
    from tfship.serving.dataplane.tensors import from_tensor_proto

    with pytest.raises(InvalidRequestError, match=message) as err:
        from_tensor_proto(proto, "image")
    assert "'image'" in str(err.value)


def test_in_range_narrow_values_decode():
    from tfship.serving.dataplane.tensors import from_tensor_proto

    assert from_tensor_proto(_proto("DT_INT8", [2], "int_val", [-128, 127])).tolist() == [-128, 127]
    assert from_tensor_proto(_proto("DT_HALF", [1], "half_val", [0x3C00])).tolist() == [1.0]
    assert from_tensor_proto(_proto("DT_COMPLEX64", [1], "scomplex_val", [1.0, 2.0])).tolist() == [1 + 2j]
