"""SIGTERM/SIGHUP drain under load, bounded shutdown with half-sent REST bodies, slow REST clients timed out."""

from __future__ import annotations

import re
import signal
import socket
import time
import urllib.request

import grpc
import numpy as np
import pytest
from conftest import MODEL

from tfship.core import protocol
from tfship.serving.dataplane.tensors import to_tensor_proto
from tfship.serving.launcher import ServerProcess


def _request(rows: int = 1) -> bytes:
    request = protocol.PredictRequest()
    request.model_spec.name = MODEL
    request.inputs["image"].CopyFrom(to_tensor_proto(np.zeros((rows, 8, 8, 1), np.float32)))
    return request.SerializeToString()


def _wait_admitted(metrics_url: str, calls: list, timeout_s: float = 10.0) -> bool:
    """Every call answered already or waiting in the batch queue (metric `tfship_batch_queue_depth`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = urllib.request.urlopen(metrics_url + "/metrics", timeout=5).read().decode()
        queued = sum(float(v) for v in re.findall(r"^tfship_batch_queue_depth\{[^}]*\} (\S+)$", text, re.M))
        if queued + sum(call.done() for call in calls) >= len(calls):
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def slow_batching(tmp_path):
    """Batches wait up to 1.5 s for company: requests are in flight when the signal arrives."""
    params = tmp_path / "batching.txt"
    params.write_text("max_batch_size { value: 512 }\nbatch_timeout_micros { value: 1500000 }\n"
                      "max_enqueued_batches { value: 100 }\n")
    return params


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_under_load_answers_every_request(repository, slow_batching, sig):
    """48 requests sent before the signal: each is served or UNAVAILABLE (never CANCELLED); exit 0 in time."""
    with ServerProcess(repository, MODEL, backend="tflite",
                       extra_args=("--batching-parameters-file", str(slow_batching), "--grace-period-s", "8",
                                   "--rest-port", "-1")) as server:
        channel = grpc.insecure_channel(server.grpc_target)
        predict = channel.unary_unary(f"/{protocol.PREDICTION_SERVICE}/Predict")
        body = _request()
        calls = [predict.future(body, timeout=30) for _ in range(48)]
        assert _wait_admitted(server.metrics_url, calls)  # all 48 reached the server (queued, or answered)
        started = time.monotonic()
        server.process.send_signal(sig)
        late = [predict.future(body, timeout=30) for _ in range(8)]  # sent during the drain
        codes = []
        for call in calls + late:
            try:
                call.result()
                codes.append("OK")
            except grpc.RpcError as err:
                codes.append(err.code().name)
        exit_code = server.process.wait(20)
        elapsed = time.monotonic() - started
        channel.close()
    assert set(codes[:48]) == {"OK"}, codes  # admitted before the signal: served
    assert set(codes[48:]) <= {"OK", "UNAVAILABLE"}, codes
    assert exit_code == 0 and elapsed < 8 + 3, (exit_code, elapsed)


def _raw_http(port: int, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.sendall(data)
    return sock


def test_half_sent_rest_body_never_outlives_the_grace_period(repository):
    with ServerProcess(repository, MODEL, backend="tflite", extra_args=("--grace-period-s", "2")) as server:
        sock = _raw_http(server.ports["rest"], f"POST /v1/models/{MODEL}:predict HTTP/1.1\r\nHost: x\r\n"
                                                "Content-Length: 100000\r\n\r\n{\"instances\": [".encode())
        time.sleep(0.3)  # the handler is now waiting for the rest of the body
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        exit_code = server.process.wait(30)
        elapsed = time.monotonic() - started
        sock.close()
    assert exit_code == 0 and elapsed < 2 + 1.5, elapsed  # grace, plus the interpreter's exit on a busy machine


def test_slow_rest_clients_are_timed_out(repository):
    """Partial headers: the connection is closed; a stalled body: HTTP 408 naming the flag."""
    with ServerProcess(repository, MODEL, backend="tflite", extra_args=("--rest-api-timeout-in-ms", "700")) as server:
        port = server.ports["rest"]
        started = time.monotonic()
        headers_only = _raw_http(port, b"GET /v1/models/digits HTTP/1.1\r\nHost: x\r\n")
        assert headers_only.recv(1000) == b""  # closed by the server
        assert time.monotonic() - started < 5
        stalled = _raw_http(port, f"POST /v1/models/{MODEL}:predict HTTP/1.1\r\nHost: x\r\n"
                                  "Content-Length: 1000\r\n\r\n{\"inst".encode())
        answer = stalled.recv(4000).decode()
        assert answer.startswith("HTTP/1.1 408") and "--rest-api-timeout-in-ms" in answer, answer
        assert time.monotonic() - started < 10
        for sock in (headers_only, stalled):
            sock.close()
        assert server.process.poll() is None
