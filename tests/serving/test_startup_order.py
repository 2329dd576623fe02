"""Start-up order, as TF Serving's: models load before the ports open, so the first client to connect finds them up.

A client polls the ports with bare TCP connects while the server starts; the moment a port accepts, it asks
health (grpc.health.v1, REST status) and the model's status, with no retry: every answer must already be
SERVING / AVAILABLE.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from conftest import MODEL

from tfship.serving.tfs.client import PredictClient

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_accepting(port: int, process: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Return the moment 127.0.0.1:`port` accepts a TCP connection (polled every 5 ms)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "the server exited during start-up"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.005)
    raise AssertionError(f"port {port} never accepted")


def test_first_connection_finds_the_model_available(repository):
    grpc_port, rest_port = _free_port(), _free_port()
    command = [sys.executable, "-m", "tfship.serving", "serve", "--repository", str(repository), "--model-name",
               MODEL, "--backend", "tflite", "--host", "127.0.0.1", "--port", str(grpc_port), "--rest-port",
               str(rest_port), "--metrics-port", "-1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_accepting(grpc_port, process)
        with PredictClient(f"127.0.0.1:{grpc_port}", timeout_s=10) as client:
            assert client.health() == "SERVING"
            assert client.health(MODEL) == "SERVING"
            assert [s.state.name for s in client.model_status(MODEL)] == ["AVAILABLE"]
        _wait_accepting(rest_port, process)
        with urllib.request.urlopen(f"http://127.0.0.1:{rest_port}/v1/models/{MODEL}", timeout=10) as answer:
            status = json.load(answer)
        assert [v["state"] for v in status["model_version_status"]] == ["AVAILABLE"]
        with urllib.request.urlopen(f"http://127.0.0.1:{rest_port}/v2/health/ready", timeout=10) as answer:
            assert json.load(answer) == {"ready": True}
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
