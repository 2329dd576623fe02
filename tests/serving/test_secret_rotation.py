"""Secrets rotate without a restart: token files and the TLS certificate/key are re-read when they change.

Unit level (`SecretWatcher` on real files): an edit in place, an atomic replace and a Kubernetes-style `..data`
symlink swap are each taken into use; empty or invalid new content keeps the running set and logs an error;
a world-readable token file or key is warned about. End to end: a running server stops accepting a revoked token
and starts accepting its replacement, and serves a new certificate on both the REST and the gRPC port; with
mutual TLS, a client CA taken out of `--tls-client-ca` is refused on both ports from the next handshake on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import MODEL

from tfship.core.errors import ConfigError, UnauthenticatedError
from tfship.serving.launcher import ServerProcess
from tfship.serving.operations.security import (
    SECRETS_POLL_S,
    LivePolicy,
    LiveTls,
    SecretWatcher,
    access_policy,
    ssl_context,
    tls_material,
    warn_readable_secrets,
)


def _settings(**files) -> SimpleNamespace:
    fields = {"auth_token_file": None, "auth_token_env": None, "admin_token_file": None, "admin_token_env": None,
              "enable_admin_api": False, "tls_cert": None, "tls_key": None, "tls_client_ca": None}
    return SimpleNamespace(**{**fields, **files})


def _accepts(policy: LivePolicy, token: str) -> bool:
    try:
        policy.check(f"Bearer {token}")
        return True
    except UnauthenticatedError:
        return False


def _kubernetes_secret(folder: Path, version: int, text: str) -> Path:
    """A Secret volume as the kubelet writes it: `tokens -> ..data/tokens`, `..data -> ..<version>` swapped
    atomically (rename of a new link over the old)."""
    data = folder / f"..{version}"
    data.mkdir()
    (data / "tokens").write_text(text)
    link = folder / "..data_tmp"
    link.symlink_to(data.name)
    os.replace(link, folder / "..data")
    if not (folder / "tokens").is_symlink():
        (folder / "tokens").symlink_to("..data/tokens")
    return folder / "tokens"


def test_edit_replace_and_symlink_swap_are_taken_into_use(tmp_path, caplog):
    path = tmp_path / "tokens"
    path.write_text("old-token\n")
    settings = _settings(auth_token_file=path)
    policy = LivePolicy(access_policy(settings))
    watcher = SecretWatcher(settings, policy)
    assert watcher.watching and not watcher.check_once()

    path.write_text("edited-token\n")  # in place (size differs, so the change shows whatever the mtime resolution)
    assert watcher.check_once()
    assert _accepts(policy, "edited-token") and not _accepts(policy, "old-token")

    staged = tmp_path / "tokens.new"
    staged.write_text("replaced-token\n")
    os.replace(staged, path)  # atomic replace: a new inode
    assert watcher.check_once() and _accepts(policy, "replaced-token") and not _accepts(policy, "edited-token")

    secret = tmp_path / "secret"
    secret.mkdir()
    mounted = _kubernetes_secret(secret, 1, "k8s-one\n")
    settings = _settings(auth_token_file=mounted)
    policy = LivePolicy(access_policy(settings))
    watcher = SecretWatcher(settings, policy)
    _kubernetes_secret(secret, 2, "k8s-two\n")
    assert watcher.check_once() and _accepts(policy, "k8s-two") and not _accepts(policy, "k8s-one")

    with caplog.at_level(logging.ERROR):
        _kubernetes_secret(secret, 3, "\n# emptied\n")  # empty: would turn authentication off
        assert not watcher.check_once()
    assert _accepts(policy, "k8s-two") and "the running tokens stay" in caplog.text and "holds no token" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        _kubernetes_secret(secret, 4, "two words\n")
        assert not watcher.check_once()
    assert _accepts(policy, "k8s-two") and "whitespace" in caplog.text


def test_world_readable_token_file_and_key_are_warned_about(tmp_path, caplog):
    tokens, key = tmp_path / "tokens", tmp_path / "server.key"
    tokens.write_text("t\n")
    key.write_text("k")
    tokens.chmod(0o644)
    key.chmod(0o600)
    with caplog.at_level(logging.WARNING):
        assert warn_readable_secrets(_settings(auth_token_file=tokens, tls_key=key)) == [tokens]
    assert "readable by every user" in caplog.text and str(tokens) in caplog.text


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """A CA and two server certificates for 127.0.0.1 (`one`, `two`), signed by it."""
    folder = tmp_path_factory.mktemp("rotation-certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=rotation-ca", cwd=folder)
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("one", "two"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                 f"/CN={name}", cwd=folder)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext", cwd=folder)
    return folder


def _served_certificate(port: int, ca: Path, alpn: str | None = None) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    if alpn:
        context.set_alpn_protocols([alpn])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)


def _der(pem: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.read_text())


def _status(url: str, token: str, ca: Path) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10, context=ssl.create_default_context(cafile=str(ca))) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def _eventually(check, timeout_s: float = 10 * SECRETS_POLL_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()


@pytest.mark.slow
def test_running_server_rotates_tokens_and_certificate(repository, tmp_path, certs):
    secret = tmp_path / "secret"
    secret.mkdir()
    tokens = _kubernetes_secret(secret, 1, "first\n")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes((certs / "one.pem").read_bytes())
    key.write_bytes((certs / "one.key").read_bytes())
    key.chmod(0o600)
    import grpc

    credentials = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
    with ServerProcess(repository, MODEL, backend="tflite", credentials=credentials,
                       extra_args=("--auth-token-file", str(tokens), "--tls-cert", str(cert), "--tls-key", str(key),
                                   "--file-system-poll-wait-seconds", "0")) as server:
        url, ca = f"{server.rest_url}/v1/models/{MODEL}", certs / "ca.pem"
        assert _status(url, "first", ca) == 200
        _kubernetes_secret(secret, 2, "second\n")
        assert _eventually(lambda: _status(url, "first", ca) == 401)
        assert _status(url, "second", ca) == 200

        assert _served_certificate(server.ports["rest"], ca) == _der(certs / "one.pem")
        for source, target in ((certs / "two.key", key), (certs / "two.pem", cert)):
            staged = target.with_suffix(".new")
            staged.write_bytes(source.read_bytes())
            os.replace(staged, target)
        assert _eventually(lambda: _served_certificate(server.ports["rest"], ca) == _der(certs / "two.pem"))
        assert _eventually(lambda: _served_certificate(server.ports["grpc"], ca, "h2") == _der(certs / "two.pem"))

        cert.write_text("not a certificate")  # invalid: the running certificate stays
        time.sleep(3 * SECRETS_POLL_S)
        assert _served_certificate(server.ports["rest"], ca) == _der(certs / "two.pem")
        assert "the running certificate stays" in server.stderr_tail(200)


@pytest.fixture(scope="module")
def client_cas(certs) -> Path:
    """Two client CAs (`ca-a`, `ca-b`) and one client certificate signed by each (`client-a`, `client-b`)."""
    folder = certs / "clients"
    folder.mkdir()
    for name in ("a", "b"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"ca-{name}.key", "-out",
                 f"ca-{name}.pem", "-days", "2", "-subj", f"/CN=client-ca-{name}", cwd=folder)
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"client-{name}.key", "-out",
                 f"client-{name}.csr", "-subj", f"/CN=client-{name}", cwd=folder)
        _openssl("x509", "-req", "-in", f"client-{name}.csr", "-CA", f"ca-{name}.pem", "-CAkey", f"ca-{name}.key",
                 "-CAcreateserial", "-out", f"client-{name}.pem", "-days", "2", cwd=folder)
    return folder


def _rest_status_as(url: str, ca: Path, client: Path, name: str) -> int | str:
    """HTTP status of a GET to `url` made with client certificate `name`, or the TLS/connection error's name."""
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(client / f"client-{name}.pem", client / f"client-{name}.key")
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, ssl.SSLError, ConnectionError) as err:
        return type(getattr(err, "reason", err)).__name__


def _grpc_status_as(target: str, ca: Path, client: Path, name: str) -> str:
    """Status name of a GetModelStatus over a new gRPC channel with client certificate `name`."""
    import grpc

    from tfship.core import protocol

    credentials = grpc.ssl_channel_credentials((ca).read_bytes(), (client / f"client-{name}.key").read_bytes(),
                                               (client / f"client-{name}.pem").read_bytes())
    request = protocol.GetModelStatusRequest()
    request.model_spec.name = MODEL
    with grpc.secure_channel(target, credentials) as channel:
        call = channel.unary_unary("/tensorflow.serving.ModelService/GetModelStatus",
                                   request_serializer=lambda m: m.SerializeToString())
        try:
            call(request, timeout=10)
            return "OK"
        except grpc.RpcError as err:
            return err.code().name


@pytest.mark.slow
def test_running_server_stops_trusting_a_removed_client_ca(repository, tmp_path, certs, client_cas):
    cert, key, client_ca = tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "client-ca.pem"
    cert.write_bytes((certs / "one.pem").read_bytes())
    key.write_bytes((certs / "one.key").read_bytes())
    key.chmod(0o600)
    client_ca.write_bytes((client_cas / "ca-a.pem").read_bytes())
    ca = certs / "ca.pem"
    import grpc

    credentials = grpc.ssl_channel_credentials(ca.read_bytes(), (client_cas / "client-a.key").read_bytes(),
                                               (client_cas / "client-a.pem").read_bytes())
    with ServerProcess(repository, MODEL, backend="tflite", credentials=credentials,
                       extra_args=("--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(client_ca),
                                   "--file-system-poll-wait-seconds", "0")) as server:
        url = f"{server.rest_url}/v1/models/{MODEL}"
        assert _rest_status_as(url, ca, client_cas, "a") == 200
        assert _grpc_status_as(server.grpc_target, ca, client_cas, "a") == "OK"
        assert _rest_status_as(url, ca, client_cas, "b") != 200  # not trusted yet
        assert _grpc_status_as(server.grpc_target, ca, client_cas, "b") == "UNAVAILABLE"

        staged = client_ca.with_suffix(".new")  # CA a is taken out, CA b put in (an atomic replace)
        staged.write_bytes((client_cas / "ca-b.pem").read_bytes())
        os.replace(staged, client_ca)
        assert _eventually(lambda: _rest_status_as(url, ca, client_cas, "b") == 200)
        assert _rest_status_as(url, ca, client_cas, "a") != 200
        assert _eventually(lambda: _grpc_status_as(server.grpc_target, ca, client_cas, "b") == "OK")
        assert _grpc_status_as(server.grpc_target, ca, client_cas, "a") == "UNAVAILABLE"


GARBLED_PEM = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"


def test_a_garbled_client_ca_is_refused_naming_the_flag_and_keeps_the_running_set(tmp_path, certs, client_cas,
                                                                                   caplog):
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_text(GARBLED_PEM)  # a PEM block whose body is no certificate: passes the marker check
    settings = _settings(tls_cert=certs / "one.pem", tls_key=certs / "one.key", tls_client_ca=client_ca)
    with pytest.raises(ConfigError, match="--tls-client-ca .*client-ca.pem"):
        ssl_context(tls_material(settings))  # at start: refused, naming the flag and the file

    client_ca.write_bytes((client_cas / "ca-a.pem").read_bytes())
    material = tls_material(settings)
    live = LiveTls(material, ssl_context(material))
    watcher = SecretWatcher(settings, LivePolicy(access_policy(settings)), live)
    staged = tmp_path / "client-ca.new"
    staged.write_text(GARBLED_PEM)
    os.replace(staged, client_ca)
    with caplog.at_level(logging.ERROR):
        assert not watcher.check_once()  # refused while running: logged, nothing raised out of the watcher
    assert live.material.client_ca == (client_cas / "ca-a.pem").read_bytes()
    assert "the running certificate stays" in caplog.text and "--tls-client-ca" in caplog.text


def test_the_watch_outlives_a_check_that_fails_unforeseen(tmp_path, monkeypatch, caplog):
    path = tmp_path / "tokens"
    path.write_text("first\n")
    settings = _settings(auth_token_file=path)
    policy = LivePolicy(access_policy(settings))
    watcher = SecretWatcher(settings, policy)
    failures = iter([MemoryError("injected"), None])  # the first check fails as no ConfigError would
    real_check = watcher.check_once

    def check_once():
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real_check()

    monkeypatch.setattr(watcher, "check_once", check_once)

    async def run() -> None:
        task = asyncio.create_task(watcher.watch_forever(0.05))
        path.write_text("second\n")
        for _ in range(100):  # the second check, after the failed one, takes the new token
            await asyncio.sleep(0.05)
            if _accepts(policy, "second"):
                break
        task.cancel()

    with caplog.at_level(logging.ERROR):
        asyncio.run(run())
    assert _accepts(policy, "second") and not _accepts(policy, "first")
    assert "checking the token and TLS files failed" in caplog.text and "MemoryError: injected" in caplog.text
