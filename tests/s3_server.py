"""Fixtures (imported by the conftest files that need them): a real S3-compatible server (moto's server mode) on loopback, and the environment that points clients at it.

Every test talks to it over HTTP through the same clients a deployment uses (s3fs/botocore reading
`AWS_ENDPOINT_URL`); nothing is patched.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

from tfship.core.processes import die_with_parent_command


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory) -> str:
    """`http://127.0.0.1:<port>` of a moto S3 server started for this session (stopped by PID after it)."""
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(die_with_parent_command([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                                         "-p", str(port)]), stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"moto server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture()
def s3_env(s3_endpoint: str, monkeypatch) -> dict[str, str]:
    """AWS_* variables for the test server, set in this process and returned for child processes."""
    values = {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
              "AWS_DEFAULT_REGION": "us-east-1"}
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return {**os.environ, **values}


@pytest.fixture()
def bucket(s3_env) -> str:
    """A fresh bucket's name."""
    from tfship.core.locations import BucketUrl
    from tfship.serving.storage.filesystem import open_filesystem

    name = f"models-{uuid.uuid4().hex[:10]}"
    open_filesystem(BucketUrl(f"s3://{name}")).mkdir(name)
    return name


