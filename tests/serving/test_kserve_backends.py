"""tritonclient (gRPC and HTTP) on every backend, with batching and bearer tokens, and against `make serve`.

The SavedModel backend is covered by `test_kserve_api.py` (the session server); here the ONNX backend
runs with dynamic batching on and the TFLite backend behind bearer tokens, each compared with the
SavedModel called directly. Then the server started with the command line `make serve` runs, a TensorFlow-free server, and V2 over
mutual TLS.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from conftest import MODEL, saved_model_outputs
from tritonclient.utils import InferenceServerException

from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs.client import PredictClient

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "oip-test-token"
PLATFORMS = {"onnx": "onnxruntime_onnx", "tflite": "tensorflow_tflite"}


def _input(module, array: np.ndarray, binary: bool = True):
    tensor = module.InferInput("image", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, **({} if module is tgrpc else {"binary_data": binary}))
    return tensor


def _assert_close(result, want: dict[str, np.ndarray]) -> None:
    np.testing.assert_allclose(result.as_numpy("logits"), want["logits"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.as_numpy("probabilities"), want["probabilities"], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(result.as_numpy("class_id"), want["class_id"])


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        found = re.search(rf"^{re.escape(name)} (\S+)$", response.read().decode(), re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _clients(server):
    return (tgrpc.InferenceServerClient(server.grpc_target),
            thttp.InferenceServerClient(server.rest_url.removeprefix("http://")))


def test_onnx_backend_with_batching_and_row_limit(repository, images):
    rows = images[:4]
    want = saved_model_outputs(repository / MODEL / "2", {"image": rows})
    with ServerProcess(repository, MODEL, backend="onnx",
                       extra_args=("--enable-batching", "--max-batch-per-request", "4")) as server:
        grpc_client, http_client = _clients(server)
        try:
            batches = f'tfship_batch_size_count{{model="{MODEL}"}}'
            before = _metric(server.metrics_url, batches)
            assert grpc_client.get_model_metadata(MODEL, as_json=True)["platform"] == PLATFORMS["onnx"]
            assert http_client.get_model_metadata(MODEL)["platform"] == PLATFORMS["onnx"]
            assert grpc_client.is_model_ready(MODEL) and http_client.is_server_ready()
            _assert_close(grpc_client.infer(MODEL, [_input(tgrpc, rows)]), want)
            _assert_close(http_client.infer(MODEL, [_input(thttp, rows, binary=False)]), want)
            assert _metric(server.metrics_url, batches) == before + 2  # both went through the batcher
            with pytest.raises(InferenceServerException) as err:
                grpc_client.infer(MODEL, [_input(tgrpc, images)])
            assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert "batch of 5 rows exceeds the per-request limit of 4" in err.value.message()
            with pytest.raises(InferenceServerException) as err:
                http_client.infer(MODEL, [_input(thttp, images)])
            assert err.value.status() == "400" and "batch of 5 rows exceeds" in err.value.message()
        finally:
            grpc_client.close()
            http_client.close()


def test_tflite_backend_behind_bearer_tokens(repository, images):
    want = saved_model_outputs(repository / MODEL / "2", {"image": images})
    env = {**os.environ, "TFSHIP_OIP_TOKENS": TOKEN}
    with ServerProcess(repository, MODEL, backend="tflite", env=env,
                       extra_args=("--auth-token-env", "TFSHIP_OIP_TOKENS")) as server:
        grpc_client, http_client = _clients(server)
        try:
            grpc_auth, http_auth = {"authorization": f"Bearer {TOKEN}"}, {"Authorization": f"Bearer {TOKEN}"}
            assert grpc_client.get_model_metadata(MODEL, headers=grpc_auth, as_json=True)["platform"] == \
                PLATFORMS["tflite"]
            _assert_close(grpc_client.infer(MODEL, [_input(tgrpc, images)], headers=grpc_auth), want)
            _assert_close(http_client.infer(MODEL, [_input(thttp, images)], headers=http_auth), want)
            with pytest.raises(InferenceServerException) as err:
                grpc_client.infer(MODEL, [_input(tgrpc, images)])
            assert err.value.status() == "StatusCode.UNAUTHENTICATED" and "bearer token" in err.value.message()
            with pytest.raises(InferenceServerException) as err:
                http_client.infer(MODEL, [_input(thttp, images)], headers={"Authorization": "Bearer wrong"})
            assert err.value.status() == "401" and "bearer token" in err.value.message()
            assert not http_client.is_server_ready()  # a probe without the token is refused (401) too
        finally:
            grpc_client.close()
            http_client.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _make_serve_command(repository: Path, grpc_port: int, rest_port: int) -> list[str]:
    """The command `make serve` runs (read from the Makefile with `make -n`, setup assumed done)."""
    dry = subprocess.run(["make", "-s", "-n", "-o", ".venv/.tfship-installed", "serve", f"REPOSITORY={repository}",
                          f"MODEL_NAME={MODEL}", f"GRPC_PORT={grpc_port}", f"REST_PORT={rest_port}"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    lines = [line for line in dry.stdout.splitlines() if " serve " in line]
    assert len(lines) == 1, dry.stdout
    command = shlex.split(lines[0])
    assert command[0] == ".venv/bin/tfship", command
    return [str(Path(sys.executable).with_name("tfship")), *command[1:]]  # this environment's tfship


@pytest.mark.slow
def test_tritonclient_against_make_serve(repository, images):
    grpc_port, rest_port = _free_port(), _free_port()
    command = _make_serve_command(repository, grpc_port, rest_port)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with PredictClient(f"127.0.0.1:{grpc_port}", timeout_s=10) as health:
            health.wait_until_serving(120)
        want = saved_model_outputs(repository / MODEL / "2", {"image": images})
        grpc_client = tgrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        http_client = thttp.InferenceServerClient(f"127.0.0.1:{rest_port}")
        try:
            assert grpc_client.is_server_ready() and http_client.is_server_ready()
            for module, client in ((tgrpc, grpc_client), (thttp, http_client)):
                result = client.infer(MODEL, [_input(module, images)])
                for name in ("logits", "probabilities", "class_id"):
                    np.testing.assert_array_equal(result.as_numpy(name), want[name], err_msg=name)
        finally:
            grpc_client.close()
            http_client.close()
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C, as a `make serve` user stops it
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr.decode(errors="replace")[-2000:]


@pytest.mark.slow
def test_tensorflow_free_server_speaks_v2(repository, images):
    """The edge install (no TensorFlow) serves V2 too: messages come from the committed descriptor."""
    from edge_venv import ensure_edge_venv

    rows = images[:2]
    want = saved_model_outputs(repository / MODEL / "2", {"image": rows})
    with ServerProcess(repository, MODEL, backend="tflite", python=str(ensure_edge_venv())) as server:
        grpc_client, http_client = _clients(server)
        try:
            assert grpc_client.get_model_metadata(MODEL, as_json=True)["platform"] == PLATFORMS["tflite"]
            _assert_close(grpc_client.infer(MODEL, [_input(tgrpc, rows)]), want)
            _assert_close(http_client.infer(MODEL, [_input(thttp, rows)]), want)
        finally:
            grpc_client.close()
            http_client.close()


def _certificates(folder: Path) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed (openssl CLI)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=oip-test-ca")
    for name, extension in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}")
        (folder / f"{name}.ext").write_text(extension + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return folder


def test_v2_over_mutual_tls(repository, images, tmp_path):
    """With --tls-cert/--tls-client-ca, tritonclient reaches V2 over TLS with a client certificate, not without."""
    certs = _certificates(tmp_path)
    ca, key, chain = ((certs / n).read_bytes() for n in ("ca.pem", "client.key", "client.pem"))
    rows = images[:2]
    want = saved_model_outputs(repository / MODEL / "2", {"image": rows})
    with ServerProcess(repository, MODEL, backend="tflite", credentials=grpc.ssl_channel_credentials(ca, key, chain),
                       extra_args=("--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
                                   "--tls-client-ca", str(certs / "ca.pem"))) as server:
        assert server.rest_url.startswith("https://")
        grpc_client = tgrpc.InferenceServerClient(server.grpc_target, ssl=True, root_certificates=str(certs / "ca.pem"),
                                                   private_key=str(certs / "client.key"),
                                                   certificate_chain=str(certs / "client.pem"))
        http_client = thttp.InferenceServerClient(
            server.rest_url.removeprefix("https://"), ssl=True,
            ssl_options={"ca_certs": str(certs / "ca.pem"), "certfile": str(certs / "client.pem"),
                         "keyfile": str(certs / "client.key")})
        no_cert = tgrpc.InferenceServerClient(server.grpc_target, ssl=True, root_certificates=str(certs / "ca.pem"))
        try:
            _assert_close(grpc_client.infer(MODEL, [_input(tgrpc, rows)]), want)
            _assert_close(http_client.infer(MODEL, [_input(thttp, rows)]), want)
            with pytest.raises(InferenceServerException) as err:
                no_cert.is_server_live(client_timeout=10)
            assert err.value.status() == "StatusCode.UNAVAILABLE"  # handshake refused without a client certificate
        finally:
            for client in (grpc_client, http_client, no_cert):
                client.close()
