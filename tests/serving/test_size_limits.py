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


def _raw(server, path: str, headers: dict[str, str], body: bytes = b"", read_s: float = 10.0) -> list[bytes]:
    """Send a request's head (and `body`, if any) on a raw socket; return the status lines received within
    `read_s` seconds (an interim `100 Continue` is its own line). A server that waits for a body it will refuse
    anyway times the socket out here."""
    import socket
    from urllib.parse import urlsplit

    host, port = urlsplit(server.rest_url).hostname, urlsplit(server.rest_url).port
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection((host, port), timeout=read_s) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{head}\r\n".encode() + body)
        received = b""
        while b"\r\n\r\n" not in received.split(b"100 Continue\r\n\r\n")[-1]:
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
    return [line for line in received.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")] + [received]


@pytest.mark.parametrize("path", [f"/v1/models/{MODEL}:predict", f"/v1/models/{MODEL}:classify",
                                  f"/v2/models/{MODEL}/infer"])
@pytest.mark.parametrize("expect", [False, True])
def test_declared_body_above_the_limit_is_refused_before_it_is_sent(small_server, path, expect):
    """Content-Length above --max-message-bytes: 413 at once, with no body sent; with `Expect: 100-continue` the
    413 comes instead of `100 Continue`. A body within the limit still gets its `100 Continue` and its answer."""
    headers = {"Content-Type": "application/json", "Content-Length": str(LIMIT * 1000)}
    *status, whole = _raw(small_server, path, {**headers, **({"Expect": "100-continue"} if expect else {})})
    assert status == [b"HTTP/1.1 413 Request Entity Too Large"], whole
    assert f"request body of {LIMIT * 1000} bytes exceeds --max-message-bytes {LIMIT} bytes".encode() in whole
    if expect and path.endswith(":predict"):
        body = json.dumps({"instances": _ids(2).tolist()}).encode()
        *status, whole = _raw(small_server, path, {"Content-Length": str(len(body)), "Expect": "100-continue"}, body)
        assert status == [b"HTTP/1.1 100 Continue", b"HTTP/1.1 200 OK"], whole


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_body_above_the_limit_names_its_decompressed_size(small_server, encoding):
    """A compressed body within the limit that decompresses past it: 413 saying the decompressed body exceeds."""
    import gzip
    import zlib

    text = json.dumps({"instances": _ids(200).tolist()}).encode()
    assert len(text) > LIMIT
    body = gzip.compress(text) if encoding == "gzip" else zlib.compress(text)
    assert len(body) < LIMIT
    response = requests.post(f"{small_server.rest_url}/v1/models/{MODEL}:predict", data=body, timeout=30,
                             headers={"Content-Encoding": encoding})
    assert response.status_code == 413
    assert response.json() == {"error": f"decompressed request body exceeds --max-message-bytes {LIMIT} bytes "
                                        f"(Content-Encoding: {encoding}, {len(body)} bytes as sent)"}
