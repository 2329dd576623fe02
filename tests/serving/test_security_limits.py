"""Bearer-token auth, TLS/mTLS, per-request limits, Prometheus metrics and JSON logs on real servers."""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import MODEL

from tfship.core import protocol
from tfship.core.errors import ConfigError, PermissionDeniedError, UnauthenticatedError
from tfship.serving.launcher import ServerProcess, ServerStartError
from tfship.serving.operations.security import AccessPolicy, read_token_file
from tfship.serving.settings import ServerSettings
from tfship.serving.tfs.client import PredictClient, RemoteError


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
    metrics = urllib.request.Request(limited_server.metrics_url + "/metrics", headers={"Authorization": "Bearer alpha"})
    text = urllib.request.urlopen(metrics, timeout=10).read().decode()
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


def _https(certs: Path, client_cert: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    if client_cert:
        context.load_cert_chain(certs / "client.pem", certs / "client.key")
    return context


def _get(url: str, context: ssl.SSLContext | None = None, body: dict | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10, context=context) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_mutual_tls_on_every_port(repository, certs):
    """mTLS covers gRPC, REST (HTTPS) and metrics (HTTPS), all three on: no port answers without a client cert."""
    ca = (certs / "ca.pem").read_bytes()
    client_creds = grpc.ssl_channel_credentials(ca, (certs / "client.key").read_bytes(),
                                                (certs / "client.pem").read_bytes())
    with ServerProcess(repository, MODEL, backend="tflite", credentials=client_creds,
                       extra_args=("--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
                                   "--tls-client-ca", str(certs / "ca.pem"))) as server:
        assert server.rest_url.startswith("https://") and server.metrics_url.startswith("https://")
        with PredictClient(server.grpc_target, credentials=client_creds) as client:
            assert client.predict(MODEL, _x(1))["class_id"].shape == (1,)
        with PredictClient(server.grpc_target, timeout_s=5, credentials=grpc.ssl_channel_credentials(ca)) as no_cert:
            with pytest.raises(RemoteError) as err:
                no_cert.predict(MODEL, _x(1), convert_dtypes=False)
            assert err.value.grpc_code == "UNAVAILABLE"  # handshake refused without a client certificate
        with PredictClient(server.grpc_target, timeout_s=5) as plaintext, pytest.raises(RemoteError):
            plaintext.health()
        predict = f"{server.rest_url}/v1/models/{MODEL}:predict"
        status, body = _get(predict, _https(certs), {"instances": _x(2)["image"].tolist()})
        assert status == 200 and len(json.loads(body)["predictions"]) == 2
        rest_metrics = f"{server.rest_url}/monitoring/prometheus/metrics"
        for url in (f"{server.rest_url}/v1/models/{MODEL}", rest_metrics, f"{server.metrics_url}/metrics"):
            status, body = _get(url, _https(certs))
            assert status == 200, url
            with pytest.raises((OSError, http.client.HTTPException)):  # HTTPS without a client certificate
                _get(url, _https(certs, client_cert=False))
            with pytest.raises((OSError, http.client.HTTPException)):  # plain HTTP to the TLS port
                _get(url.replace("https://", "http://"))
        assert b"tfship_requests_total" in _get(rest_metrics, _https(certs))[1]


def test_tokens_cover_rest_and_metrics_ports(repository, tmp_path):
    """The inference token guards REST and both metrics endpoints; admin calls need the admin token."""
    tokens = tmp_path / "tokens"
    tokens.write_text("# inference tokens\n\n  reader-1  \n# reader-2 is commented out\nreader-3\n")
    admin = tmp_path / "admin"
    admin.write_text("operator-1\n")
    with ServerProcess(repository, MODEL, backend="tflite",
                       extra_args=("--auth-token-file", str(tokens), "--admin-token-file", str(admin))) as server:
        for url in (f"{server.rest_url}/v1/models/{MODEL}", f"{server.rest_url}/monitoring/prometheus/metrics",
                    f"{server.metrics_url}/metrics"):
            assert _get(url)[0] == 401, url
            for token, code in (("reader-1", 200), ("reader-3", 200), ("operator-1", 200), ("reader-2", 401),
                                ("# reader-2 is commented out", 401)):
                request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
                try:
                    got = urllib.request.urlopen(request, timeout=10).status
                except urllib.error.HTTPError as err:
                    got = err.code
                assert got == code, (url, token)
        config = protocol.ModelServerConfig()
        for token, code in ((None, "UNAUTHENTICATED"), ("reader-1", "PERMISSION_DENIED")):
            with PredictClient(server.grpc_target, token=token) as client, pytest.raises(RemoteError) as err:
                client.reload_config(config)
            assert err.value.grpc_code == code
        with PredictClient(server.grpc_target, token="reader-1") as client:
            assert client.predict(MODEL, _x(1))["class_id"].shape == (1,)  # the refused reload changed nothing


def test_admin_calls_off_by_default(server, client):
    """Without admin tokens or --enable-admin-api, HandleReloadConfigRequest cannot unload the models."""
    with pytest.raises(RemoteError) as err:
        client.reload_config(protocol.ModelServerConfig())
    assert err.value.grpc_code == "PERMISSION_DENIED" and "--admin-token-file" in err.value.details
    assert client.model_status(MODEL)  # still served


@pytest.mark.parametrize("content", ["", "   \n\t\n", "# only a comment\n\n"])
def test_empty_token_file_refuses_to_start(repository, tmp_path, content):
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(content)
    with pytest.raises(ConfigError, match=f"--auth-token-file {tokens} holds no token"):
        read_token_file(tokens, "--auth-token-file")
    if content:  # one real start is enough to prove the server refuses (exit 2, file named)
        return
    result = subprocess.run([sys.executable, "-m", "tfship.serving", "serve", "--repository", str(repository),
                             "--model-name", MODEL, "--backend", "tflite", "--port", "0", "--rest-port", "-1",
                             "--auth-token-file", str(tokens)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and str(tokens) in result.stderr and "holds no token" in result.stderr


def test_token_file_format(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("# comment\n\nalpha\n  beta  \r\n#gamma\n")
    assert read_token_file(tokens, "--auth-token-file") == {"alpha", "beta"}
    tokens.write_text("alpha\nbad token\n")
    with pytest.raises(ConfigError, match="line 2: a token may not contain whitespace"):
        read_token_file(tokens, "--auth-token-file")
    with pytest.raises(ConfigError, match="cannot read --admin-token-file"):
        read_token_file(tmp_path / "missing", "--admin-token-file")


def test_access_policy_rights():
    open_policy = AccessPolicy()
    open_policy.check("")  # no tokens: inference open
    with pytest.raises(PermissionDeniedError):
        open_policy.check("", admin=True)  # admin off unless enabled
    AccessPolicy(admin_enabled=True).check("", admin=True)
    policy = AccessPolicy(frozenset({"reader"}), frozenset({"operator"}), admin_enabled=True)
    policy.check("Bearer reader")
    policy.check("Bearer operator")
    policy.check("Bearer operator", admin=True)
    with pytest.raises(PermissionDeniedError):
        policy.check("Bearer reader", admin=True)
    for header in ("", "Bearer ", "Bearer other", "reader", "Basic reader"):
        with pytest.raises(UnauthenticatedError):
            policy.check(header)


def test_unsafe_admin_settings_refused(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("same\n")
    settings = ServerSettings(repository=tmp_path, model_name="m", auth_token_file=tokens, enable_admin_api=True)
    with pytest.raises(ConfigError, match="--enable-admin-api"):
        settings.access_policy()
    settings = ServerSettings(repository=tmp_path, model_name="m", auth_token_file=tokens, admin_token_file=tokens)
    with pytest.raises(ConfigError, match="both in the inference and the admin"):
        settings.access_policy()


def test_grpc_port_in_use_refused_unless_reuse_port(repository, server):
    """A second server on a taken gRPC port exits 2 naming the port; --reuse-port shares it on purpose."""
    port = server.grpc_target.rsplit(":", 1)[1]
    with pytest.raises(ServerStartError, match=f"--port {port}"):
        with ServerProcess(repository, MODEL, backend="tflite", startup_timeout_s=60,
                           extra_args=("--port", port, "--rest-port", "-1", "--metrics-port", "-1")):
            pass


def test_unknown_model_names_share_one_metrics_label(server):
    """QA: 20,000 unknown names made /metrics 72 MB and stalled Predict; they now share `__unknown__`."""
    channel = grpc.insecure_channel(server.grpc_target)
    predict = channel.unary_unary(f"/{protocol.PREDICTION_SERVICE}/Predict")
    request = protocol.PredictRequest()
    futures = []
    for i in range(300):
        request.model_spec.name = f"attacker-{i}"
        futures.append(predict.future(request.SerializeToString(), timeout=30))
    codes = set()
    for future in futures:
        try:
            future.result()
        except grpc.RpcError as err:
            codes.add(err.code().name)
    channel.close()
    assert codes == {"NOT_FOUND"}
    text = urllib.request.urlopen(server.metrics_url + "/metrics", timeout=10).read().decode()
    assert 'model="__unknown__"' in text and "attacker-" not in text
