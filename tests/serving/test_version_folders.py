"""Version folders parsed as TF Serving does, and a repository poller that no entry can stop."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest
from conftest import MODEL

from tfship.serving.dataplane.version_folders import MAX_VERSION, version_of
from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs.client import PredictClient


@pytest.mark.parametrize(("name", "version"), [
    ("1", 1), ("0001", 1), ("42", 42), (str(MAX_VERSION), MAX_VERSION), (str(MAX_VERSION + 1), None),
    ("99999999999999999999", None), ("0", None), ("000", None), ("v2", None), (".tmp3", None),
    (".staging-4", None), ("²", None), ("\uff11", None), ("\u0661", None), ("-1", None), ("+1", None), ("1 ", None),
    ("", None),
])
def test_version_of_follows_tf_serving(name, version):
    assert version_of(name) == version


def _wait_version(client: PredictClient, version: int, images, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = {s.version: s for s in client.model_status(MODEL)}
        if version in statuses and statuses[version].state.name == "AVAILABLE":
            return client.predict(MODEL, {"image": images})
        assert time.monotonic() < deadline, f"version {version} never AVAILABLE: {statuses}"
        time.sleep(0.1)


def test_odd_folder_names_are_ignored_and_poller_keeps_going(repository, tmp_path, images):
    """`0001/` serves version 1; `²`, `v2`, `.tmp3`, fullwidth digits and numbers above 2^63-1 never stop the
    server, at start or while it polls; a version published afterwards is loaded."""
    base = tmp_path / MODEL
    shutil.copytree(repository / MODEL / "1", base / "0001")
    for odd in ("²", "v2", ".tmp3", "\uff12", str(MAX_VERSION + 1), "0"):
        (base / odd).mkdir()
    with ServerProcess(tmp_path, MODEL, backend="tflite",
                       extra_args=("--file-system-poll-wait-seconds", "0.1", "--rest-port", "-1")) as server, \
            PredictClient(server.grpc_target) as client:
        first = client.predict(MODEL, {"image": images})
        assert [s.version for s in client.model_status(MODEL)] == [1]
        for odd in ("³", "99999999999999999999999", ".staging-7", "\uff13"):  # appear while polling
            (base / odd).mkdir()
        assert client.predict(MODEL, {"image": images})["logits"].tolist() == first["logits"].tolist()
        # published after the odd folders: loading it proves the polls over them went on
        shutil.copytree(repository / MODEL / "2", base / ".staging-2")
        (base / ".staging-2").rename(base / "2")
        second = _wait_version(client, 2, images)
        assert not np.array_equal(first["logits"], second["logits"])
        assert server.process.poll() is None
