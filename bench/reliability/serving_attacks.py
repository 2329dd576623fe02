"""Attacks on a running server: load with hot swaps and corrupt versions, SIGTERM under load, every port
under TLS/mTLS/tokens, metrics cardinality, memory per request, a second server on a taken port."""

from __future__ import annotations

import json
import random
import shutil
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import requests

from bench.reliability.common import MODEL, Row, copy_version, images, rss_mb, wait_admitted
from tfship.core import protocol
from tfship.core.errors import TfshipError
from tfship.serving.dataplane.tensors import to_tensor_proto
from tfship.serving.launcher import ServerProcess, ServerStartError
from tfship.serving.tfs.client import PredictClient, RemoteError


def _expected_logits(source: Path, versions: int) -> dict[int, np.ndarray]:
    """Each version's logits for the probe input, from a server that serves them all."""
    out = {}
    for version in range(1, versions + 1):
        repo = source.parent / f"probe-{version}"
        shutil.rmtree(repo, ignore_errors=True)
        (repo / MODEL).mkdir(parents=True)
        copy_version(source, version, repo, 1)
        with ServerProcess(repo, MODEL, backend="onnx", extra_args=("--rest-port", "-1")) as server, \
                PredictClient(server.grpc_target) as client:
            out[version] = client.predict(MODEL, images(4))["logits"]
        shutil.rmtree(repo, ignore_errors=True)
    return out


def _counted(loop: Callable[[int], None], row: Row, lock: threading.Lock) -> Callable[[int], None]:
    """`loop` whose crash is a failure of the row, named in it, not a silent end of its checks."""
    def run(seed: int) -> None:
        try:
            loop(seed)
        except Exception as err:  # noqa: BLE001 - any crash is the row's failure, named in it
            with lock:
                row.check(False, f"{loop.__name__} crashed: {err!r}"[:300])
    return run


def _publish_versions_for(source: Path, repo: Path, seconds: float) -> int:
    """Publish versions 2, 3, ... into `repo` every 0.7 s for `seconds` (source versions 1-3 in turn, every third
    corrupt); returns the last version number."""
    version, deadline = 1, time.monotonic() + seconds
    while time.monotonic() < deadline:
        version += 1
        copy_version(source, (version - 1) % 3 + 1, repo, version, corrupt=version % 3 == 0)
        time.sleep(0.7)
    return version


def hot_swap_under_load(source: Path, work: Path, seconds: float) -> Row:
    """8 gRPC and 4 REST clients Predict without pause while new versions (valid, and corrupt) are published
    every 0.7 s. Every answer must be OK and equal one complete version's output; corrupt versions are never
    served. (REST requests hold versions from the REST thread, gRPC ones from the main loop.)"""
    row = Row("hot_swap_load", "Predict load during hot swaps with corrupt versions appearing")
    expected = _expected_logits(source, 3)
    repo = work / "hotswap"
    shutil.rmtree(repo, ignore_errors=True)
    (repo / MODEL).mkdir(parents=True)
    copy_version(source, 1, repo, 1)
    stop = threading.Event()
    lock = threading.Lock()
    with ServerProcess(repo, MODEL, backend="onnx",
                       extra_args=("--file-system-poll-wait-seconds", "0.2")) as server:

        def rest_loop(seed: int) -> None:
            body = json.dumps({"instances": images(4)["image"].tolist()}).encode()
            url = f"{server.rest_url}/v1/models/{MODEL}:predict"
            with requests.Session() as session:
                while not stop.is_set():
                    answer = session.post(url, data=body, timeout=30)
                    if answer.status_code == 200:
                        rows = answer.json()["predictions"]  # one object per row: the model has two outputs
                        logits = np.array([r["logits"] for r in rows] if isinstance(rows[0], dict) else rows,
                                          np.float32)
                        ok = any(np.allclose(logits, e, atol=1e-5) for e in expected.values())
                        why = "a REST answer equal to no complete version"
                    else:
                        ok, why = False, f"REST predict failed: {answer.status_code} {answer.text[:200]}"
                    with lock:
                        row.check(ok, why)

        def client_loop(seed: int) -> None:
            with PredictClient(server.grpc_target, timeout_s=30) as client:
                while not stop.is_set():
                    try:
                        logits = client.predict(MODEL, images(4))["logits"]
                        ok = any(np.allclose(logits, e, atol=1e-5) for e in expected.values())
                        why = "an answer equal to no complete version"
                    except TfshipError as err:
                        ok, why = False, f"Predict failed: {err}"
                    with lock:
                        row.check(ok, why)

        threads = ([threading.Thread(target=_counted(client_loop, row, lock), args=(i,)) for i in range(8)]
                   + [threading.Thread(target=_counted(rest_loop, row, lock), args=(i,)) for i in range(4)])
        for thread in threads:
            thread.start()
        version = _publish_versions_for(source, repo, seconds)
        stop.set()
        for thread in threads:
            thread.join()
    row.notes = (f"{version - 1} versions published, every third corrupt; 8 gRPC + 4 REST clients, batch 4, onnx "
                 "backend")
    return row


def _request_bytes() -> bytes:
    request = protocol.PredictRequest()
    request.model_spec.name = MODEL
    request.inputs["image"].CopyFrom(to_tensor_proto(images(1)["image"]))
    return request.SerializeToString()


def sigterm_under_load(source: Path, tries: int, batching: Path) -> Row:
    """48 requests waiting in batch queues, SIGTERM (or SIGHUP), 8 more during the drain: the first 48
    answered OK, the rest OK or UNAVAILABLE, none CANCELLED; exit 0 within the grace period (5 s) + 2 s."""
    row = Row("sigterm_under_load", "SIGTERM/SIGHUP with requests in flight")
    body = _request_bytes()
    for attempt in range(tries):
        sig = signal.SIGHUP if attempt % 3 == 2 else signal.SIGTERM
        with ServerProcess(source, MODEL, backend="onnx",
                           extra_args=("--batching-parameters-file", str(batching), "--grace-period-s", "5",
                                       "--rest-port", "-1", "--file-system-poll-wait-seconds", "0")) as server:
            channel = grpc.insecure_channel(server.grpc_target)
            predict = channel.unary_unary(f"/{protocol.PREDICTION_SERVICE}/Predict")
            calls = [predict.future(body, timeout=30) for _ in range(48)]
            admitted = wait_admitted(server.metrics_url, calls)  # all 48 reached the server before the signal
            time.sleep(random.uniform(0.0, 0.5))
            started = time.monotonic()
            server.process.send_signal(sig)
            late = [predict.future(body, timeout=30) for _ in range(8)]
            codes = [_code(call) for call in calls + late]
            exit_code = server.process.wait(30)
            elapsed = time.monotonic() - started
            channel.close()
        row.check(admitted, f"{sig.name}: the 48 requests did not all reach the server within 10 s")
        row.check(set(codes[:48]) == {"OK"}, f"{sig.name}: admitted requests answered {sorted(set(codes[:48]))}")
        row.check(set(codes[48:]) <= {"OK", "UNAVAILABLE"}, f"{sig.name}: late requests got {set(codes[48:])}")
        row.check(exit_code == 0 and elapsed <= 7, f"{sig.name}: exit {exit_code} after {elapsed:.1f}s")
    row.notes = "batch queue holds requests 1.5 s; grace 5 s"
    return row


def _code(call) -> str:
    try:
        call.result()
        return "OK"
    except grpc.RpcError as err:
        return err.code().name


def _http(url: str, context: ssl.SSLContext | None = None, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10,
                                    context=context) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0  # refused at the TLS/TCP level


def ports_under_tls(source: Path, certs: Path, tokens: Path, admin: Path) -> Row:
    """Every port (gRPC, REST, metrics) with mTLS + inference and admin tokens: each probe that lacks a
    client certificate, a token or the admin right is refused; the right credentials work."""
    row = Row("tls_mtls_tokens", "probes on every port under TLS/mTLS/tokens")
    ca = (certs / "ca.pem").read_bytes()
    full = grpc.ssl_channel_credentials(ca, (certs / "client.key").read_bytes(), (certs / "client.pem").read_bytes())
    good_tls = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    good_tls.load_cert_chain(certs / "client.pem", certs / "client.key")
    no_cert = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    with ServerProcess(source, MODEL, backend="onnx", credentials=full,
                       extra_args=("--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
                                   "--tls-client-ca", str(certs / "ca.pem"), "--auth-token-file", str(tokens),
                                   "--admin-token-file", str(admin))) as server:
        urls = [f"{server.rest_url}/v1/models/{MODEL}", f"{server.rest_url}/monitoring/prometheus/metrics",
                f"{server.metrics_url}/metrics", f"{server.metrics_url}/monitoring/prometheus/metrics"]
        for url in urls:
            row.check(_http(url.replace("https:", "http:")) in (0, 400), f"plain HTTP answered on {url}")
            row.check(_http(url, no_cert, "reader") == 0, f"no client certificate accepted on {url}")
            row.check(_http(url, good_tls) == 401, f"no token accepted on {url}")
            row.check(_http(url, good_tls, "wrong") == 401, f"wrong token accepted on {url}")
            row.check(_http(url, good_tls, "reader") == 200, f"valid credentials refused on {url}")
        for credentials, token, expect in ((None, "reader", "UNAVAILABLE"),
                                           (grpc.ssl_channel_credentials(ca), "reader", "UNAVAILABLE"),
                                           (full, None, "UNAUTHENTICATED"), (full, "wrong", "UNAUTHENTICATED")):
            with PredictClient(server.grpc_target, timeout_s=5, credentials=credentials, token=token) as client:
                row.check(_remote_code(lambda c=client: c.predict(MODEL, images(1))) == expect,
                          f"gRPC Predict with {token!r} and {'no ' if credentials is None else ''}TLS not {expect}")
        with PredictClient(server.grpc_target, credentials=full, token="reader") as client:
            row.check(_remote_code(lambda: client.reload_config(protocol.ModelServerConfig())) == "PERMISSION_DENIED",
                      "an inference token reloaded the config")
            row.check(_remote_code(lambda: client.predict(MODEL, images(1))) == "OK", "valid gRPC Predict refused")
    row.notes = "4 HTTP endpoints x 5 probes, gRPC x 6 probes; admin token separate from inference tokens"
    return row


def _remote_code(call) -> str:
    try:
        call()
        return "OK"
    except RemoteError as err:
        return err.grpc_code


def metrics_cardinality(source: Path, names: int) -> Row:
    """`names` Predicts naming unknown models: the scrape stays small (one shared label value) and a Predict
    during scrapes is not stalled (p100 < 0.5 s)."""
    row = Row("metrics_cardinality", "unknown model names vs /metrics size and Predict latency")
    with ServerProcess(source, MODEL, backend="onnx", extra_args=("--rest-port", "-1")) as server, \
            PredictClient(server.grpc_target, timeout_s=10) as client:
        channel = grpc.insecure_channel(server.grpc_target)
        predict = channel.unary_unary(f"/{protocol.PREDICTION_SERVICE}/Predict")
        body = protocol.PredictRequest.FromString(_request_bytes())
        codes: set[str] = set()
        for start in range(0, names, 100):  # 100 in flight at a time
            futures = []
            for i in range(start, min(start + 100, names)):
                body.model_spec.name = f"attacker-{i}-{random.getrandbits(32)}"
                futures.append(predict.future(body.SerializeToString(), timeout=30))
            codes |= {_code(f) for f in futures}
        row.check(codes == {"NOT_FOUND"}, f"unknown models answered {codes}")
        text = urllib.request.urlopen(server.metrics_url + "/metrics", timeout=30).read().decode()
        row.check(len(text) < 64_000, f"/metrics is {len(text)} bytes after {names} unknown names")
        row.check(text.count("attacker-") == 0, "unknown names appear as label values")
        worst = 0.0
        for _ in range(20):
            scrape = threading.Thread(target=lambda: urllib.request.urlopen(server.metrics_url + "/metrics").read())
            scrape.start()
            started = time.monotonic()
            client.predict(MODEL, images(1))
            worst = max(worst, time.monotonic() - started)
            scrape.join()
        row.check(worst < 0.5, f"a Predict took {worst:.2f}s during scrapes")
        channel.close()
    row.notes = f"{names} unknown names; /metrics {len(text)} bytes; worst Predict during scrape {worst * 1000:.0f} ms"
    return row


def memory_per_request(source: Path, rounds: int) -> Row:
    """Four concurrent requests at the default row limit (1024), `rounds` times, on the SavedModel backend:
    RSS after the answers within 150 MiB of before; 1025 rows and an oversized memory estimate refused."""
    row = Row("memory_per_request", "RSS before/after max-size requests; oversize refused")
    with ServerProcess(source, MODEL, backend="saved_model", extra_args=("--rest-port", "-1")) as server, \
            PredictClient(server.grpc_target, timeout_s=60) as client:
        client.predict(MODEL, images(1))
        before = rss_mb(server.process.pid)
        big = images(1024)
        with ThreadPoolExecutor(4) as pool:
            for _ in range(rounds):
                shapes = list(pool.map(lambda _: client.predict(MODEL, big)["logits"].shape, range(4)))
                row.check(shapes == [(1024, 10)] * 4, f"max-size requests answered {shapes}")
        after = rss_mb(server.process.pid)
        row.check(after - before < 150, f"RSS grew {after - before:.0f} MiB ({before:.0f} -> {after:.0f})")
        row.check(_remote_code(lambda: client.predict(MODEL, images(1025))) == "INVALID_ARGUMENT",
                  "1025 rows not refused")
        row.check(_remote_code(lambda: client.predict(MODEL, images(65536))) in ("INVALID_ARGUMENT",
                                                                                 "RESOURCE_EXHAUSTED"),
                  "65,536 rows (QA's 1 GB request) not refused")
    row.notes = (f"RSS {before:.0f} -> {after:.0f} MiB after {rounds * 4} requests of 1024 rows (the test "
                 "suite's small model; the digits CNN: README)")
    return row


def port_sharing(source: Path) -> Row:
    """A second server on a taken gRPC port refuses to start naming the port (no silent sharing)."""
    row = Row("grpc_port_sharing", "second server on a gRPC port in use")
    with ServerProcess(source, MODEL, backend="onnx", extra_args=("--rest-port", "-1")) as server:
        port = server.grpc_target.rsplit(":", 1)[1]
        for _ in range(2):
            try:
                with ServerProcess(source, MODEL, backend="onnx",
                                   extra_args=("--port", port, "--rest-port", "-1", "--metrics-port", "-1")):
                    row.check(False, "a second server started on the same gRPC port")
            except ServerStartError as err:
                row.check(f"--port {port}" in str(err), f"refusal does not name the port: {str(err)[:200]}")
    return row


def make_certs(folder: Path) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (openssl)."""
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=tfship-reliability-ca")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}")
        (folder / f"{name}.ext").write_text(ext + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return folder


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2))
