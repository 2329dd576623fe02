"""Bearer-token auth, TLS/mTLS, per-request limits, Prometheus metrics and JSON logs on real servers."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import MODEL

from serving.client import PredictClient, RemoteError
from serving.launcher import ServerProcess


@pytest.fixture(scope="module")
def limited_server(repository):
    """tflite server with auth (token from env), batch and message limits, JSON logs."""
    env = {**__import__("os").environ, "TFSHIP_TEST_TOKENS": "alpha,beta"}
    with ServerProcess(repository, MODEL, backend="tflite", env=env,
                       extra_args=("--auth-token-env", "TFSHIP_TEST_TOKENS", "--max-batch-per-request", "4",
                                   "--max-message-bytes", "65536", "--json-logs")) as server:
        yield server


def _x(rows: int) -> dict[str, np.ndarray]:
    return {"image": np.zeros((rows, 8, 8, 1), np.float32)}


def test_bearer_token_required_on_grpc_and_rest(limited_server):
    with PredictClient(limited_server.grpc_target) as anonymous:
        with pytest.raises(RemoteError) as err:
            anonymous.predict(MODEL, _x(1), convert_dtypes=False)
        assert err.value.grpc_code == "UNAUTHENTICATED"
        assert anonymous.health() == "SERVING"  # probes stay open
    with PredictClient(limited_server.grpc_target, token="wrong") as wrong, \
            pytest.raises(RemoteError, match="UNAUTHENTICATED"):
        wrong.metadata(MODEL)
    with PredictClient(limited_server.grpc_target, token="beta") as client:
        assert client.predict(MODEL, _x(2))["class_id"].shape == (2,)
    url = f"{limited_server.rest_url}/v1/models/{MODEL}"
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(url, timeout=10)
    assert http.value.code == 401 and "bearer" in json.loads(http.value.read())["error"]
    request = urllib.request.Request(url, headers={"Authorization": "Bearer alpha"})
    assert urllib.request.urlopen(request, timeout=10).status == 200


def test_limits(limited_server):
    with PredictClient(limited_server.grpc_target, token="alpha") as client:
        with pytest.raises(RemoteError) as err:
            client.predict(MODEL, _x(5))
        assert err.value.grpc_code == "INVALID_ARGUMENT" and "per-request limit of 4" in err.value.details
        with pytest.raises(RemoteError) as err:
            client.predict(MODEL, _x(300))  # 300*64*4 bytes > 64 KiB
        assert err.value.grpc_code == "RESOURCE_EXHAUSTED"
        with pytest.raises(RemoteError) as err:
            client.predict("../../etc", _x(1), convert_dtypes=False)
        assert err.value.grpc_code == "NOT_FOUND"
        assert client.predict(MODEL, _x(4))["logits"].shape == (4, 10)


def test_metrics_and_json_logs(limited_server):
    with PredictClient(limited_server.grpc_target, token="alpha") as client:
        client.predict(MODEL, _x(1))
        with pytest.raises(RemoteError):
            client.predict(MODEL, _x(1), signature_name="nope")
    text = urllib.request.urlopen(limited_server.metrics_url + "/metrics", timeout=10).read().decode()
    assert 'tfship_requests_total{method="predict",model="digits",status="INVALID_ARGUMENT",version="2"}' in text
    assert "tfship_request_latency_seconds_bucket" in text
    assert 'tfship_model_load_events_total{event="loaded",model="digits"} 1.0' in text
    logs = [line for line in limited_server.stderr_tail(200).splitlines() if line.startswith("{")]
    assert logs and all(json.loads(line)["level"] for line in logs)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """A CA, a server cert for 127.0.0.1 and a client cert, all signed by the CA (openssl CLI)."""
    d = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=tfship-test-ca", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    return d


def test_mutual_tls(repository, certs):
    ca = (certs / "ca.pem").read_bytes()
    client_creds = grpc.ssl_channel_credentials(ca, (certs / "client.key").read_bytes(),
                                                (certs / "client.pem").read_bytes())
    with ServerProcess(repository, MODEL, backend="tflite", credentials=client_creds,
                       extra_args=("--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
                                   "--tls-client-ca", str(certs / "ca.pem"), "--rest-port", "-1")) as server:
        with PredictClient(server.grpc_target, credentials=client_creds) as client:
            assert client.predict(MODEL, _x(1))["class_id"].shape == (1,)
        with PredictClient(server.grpc_target, timeout_s=5, credentials=grpc.ssl_channel_credentials(ca)) as no_cert:
            with pytest.raises(RemoteError) as err:
                no_cert.predict(MODEL, _x(1), convert_dtypes=False)
            assert err.value.grpc_code == "UNAVAILABLE"  # handshake refused without a client certificate
        with PredictClient(server.grpc_target, timeout_s=5) as plaintext, pytest.raises(RemoteError):
            plaintext.health()
