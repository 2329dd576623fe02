"""--max-message-bytes on requests and responses, gRPC and REST: refused by name with both sizes, no traceback.

The typed model's embedding answers 48 bytes of float32 per row of 3 int32 ids (12 bytes), so a small
request can ask for a large response. The server runs with the smallest limit, 1024 bytes.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import requests
from typed_models import TABLE, build_typed_model

from tfship.core import protocol
from tfship.serving.dataplane.tensors import to_tensor_proto
from tfship.serving.dataplane.types import InferenceResponse
from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs import converters, json_write, rest_json
from tfship.serving.tfs.client import PredictClient, RemoteError

MODEL = "typed"
LIMIT = 1024


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("small")
    build_typed_model(repo / MODEL / "1", converted=False)
    with ServerProcess(repo, MODEL, backend="saved_model",
                       extra_args=("--max-message-bytes", str(LIMIT), "--file-system-poll-wait-seconds", "0")) as s:
        yield s


def _ids(rows: int) -> np.ndarray:
    return (np.arange(rows * 3, dtype=np.int32) % 10).reshape(rows, 3)


def _grpc_error(server, ids: np.ndarray) -> RemoteError:
    with PredictClient(server.grpc_target, timeout_s=30) as client:
        with pytest.raises(RemoteError) as caught:
            client.predict(MODEL, {"ids": ids})
        assert client.predict(MODEL, {"ids": _ids(2)})["vectors"].shape == (2, 3, 4)  # still serving
    return caught.value


def test_grpc_request_above_the_limit(small_server):
    ids = _ids(100)
    request = protocol.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = MODEL, "serving_default"
    request.inputs["ids"].CopyFrom(to_tensor_proto(ids))
    error = _grpc_error(small_server, ids)
    assert error.grpc_code == "RESOURCE_EXHAUSTED"
    assert error.details == f"request of {request.ByteSize()} bytes exceeds --max-message-bytes {LIMIT} bytes"


@pytest.mark.parametrize("rows", [60, 21])
def test_grpc_response_above_the_limit_is_refused_before_sending(small_server, rows):
    error = _grpc_error(small_server, _ids(rows))
    assert error.grpc_code == "RESOURCE_EXHAUSTED"
    if rows * 48 > LIMIT:  # the raw output bytes alone are too many: refused by the data plane
        size, qualifier = rows * 48, "at least "
    else:  # the raw bytes fit but the encoded PredictResponse does not: refused by the gRPC transport
        vectors = TABLE[_ids(rows)]
        size = converters.predict_response(InferenceResponse(MODEL, 1, "serving_default",
                                                             {"vectors": vectors})).ByteSize()
        qualifier = ""
        assert rows * 48 <= LIMIT < size
    assert error.details == (f"response of {qualifier}{size} bytes exceeds --max-message-bytes {LIMIT} bytes; ask "
                             "for fewer rows or fewer outputs (output_filter)")
    assert "Traceback" not in small_server.stderr_tail(200)


@pytest.mark.parametrize("rows", [60, 20])
def test_rest_response_above_the_limit(small_server, rows):
    response = requests.post(f"{small_server.rest_url}/v1/models/{MODEL}:predict",
                             data=json.dumps({"instances": _ids(rows).tolist()}), timeout=30)
    assert response.status_code == 429
    if rows * 48 > LIMIT:
        message = f"response of at least {rows * 48} bytes exceeds --max-message-bytes {LIMIT} bytes"
    else:
        body = rest_json.response_json({"vectors": TABLE[_ids(rows)]}, rows=True, batch=rows)
        size = len(json_write.dumps(body))
        assert rows * 48 <= LIMIT < size
        message = f"response of {size} bytes (JSON) exceeds --max-message-bytes {LIMIT}"
    assert response.json()["error"].startswith(message), response.json()
    assert "Traceback" not in small_server.stderr_tail(200)


def test_rest_request_above_the_limit(small_server):
    body = json.dumps({"instances": _ids(200).tolist()})
    response = requests.post(f"{small_server.rest_url}/v1/models/{MODEL}:predict", data=body, timeout=30)
    assert response.status_code == 413
    assert response.json() == {"error": f"request body of {len(body)} bytes exceeds --max-message-bytes {LIMIT} bytes"}
    ok = requests.post(f"{small_server.rest_url}/v1/models/{MODEL}:predict",
                       data=json.dumps({"instances": _ids(2).tolist()}), timeout=30)
    assert ok.status_code == 200 and len(ok.json()["predictions"]) == 2
