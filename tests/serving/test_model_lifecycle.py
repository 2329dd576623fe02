"""ModelService and the model manager: polling for versions, failed loads, reload config, SIGTERM."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import MODEL
from google.protobuf import text_format

from tfship.core import protocol
from tfship.serving.dataplane.types import VersionState
from tfship.serving.launcher import ServerProcess, ServerStartError
from tfship.serving.tfs.client import PredictClient, RemoteError


def _copy_version(repository: Path, source: int, target_root: Path, target: int) -> None:
    staging = target_root / MODEL / f".staging-{target}"
    shutil.copytree(repository / MODEL / str(source), staging)
    staging.rename(target_root / MODEL / str(target))  # versions appear atomically, as publishers should


def _wait_for(client: PredictClient, want: dict[int, VersionState], timeout_s: float = 60.0):
    """Poll GetModelStatus until the states match `want` (a state change, not server readiness)."""
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = {s.version: s for s in client.model_status(MODEL)}
        if all(v in statuses and statuses[v].state is state for v, state in want.items()):
            return statuses
        if time.monotonic() > deadline:
            raise AssertionError(f"wanted {want}, have {statuses}")
        time.sleep(0.1)


def test_versions_appear_fail_and_reload(repository, tmp_path, images):
    repo = tmp_path / "repo"
    (repo / MODEL).mkdir(parents=True)
    _copy_version(repository, 1, repo, 1)
    with ServerProcess(repo, MODEL, backend="tflite",
                       extra_args=("--file-system-poll-wait-seconds", "0.2", "--enable-admin-api")) as server, \
            PredictClient(server.grpc_target) as client:
        first = client.predict(MODEL, {"image": images})
        # a new version is loaded, then the old one unloaded (policy latest 1)
        _copy_version(repository, 2, repo, 2)
        statuses = _wait_for(client, {2: VersionState.AVAILABLE, 1: VersionState.END})
        assert statuses[1].error_code == "OK"
        second = client.predict(MODEL, {"image": images})
        assert not np.array_equal(first["logits"], second["logits"])
        with pytest.raises(RemoteError) as err:
            client.predict(MODEL, {"image": images}, version=1)
        assert err.value.grpc_code == "NOT_FOUND"

        # a broken version is reported and the previous one keeps serving
        broken = repo / MODEL / ".staging-3"
        shutil.copytree(repository / MODEL / "2", broken)
        (broken / "model.tflite").write_bytes(b"not a flatbuffer")
        broken.rename(repo / MODEL / "3")
        statuses = _wait_for(client, {3: VersionState.END})
        assert statuses[3].error_code != "OK" and "model.tflite" in statuses[3].error_message
        assert statuses[2].state is VersionState.AVAILABLE
        np.testing.assert_array_equal(client.predict(MODEL, {"image": images})["logits"], second["logits"])

        # HandleReloadConfigRequest: serve version 1 only, with a label
        config = text_format.Parse(f"""model_config_list {{ config {{
            name: "{MODEL}" base_path: "{repo / MODEL}" model_platform: "tensorflow"
            model_version_policy {{ specific {{ versions: 1 }} }}
            version_labels {{ key: "stable" value: 1 }} }} }}""", protocol.ModelServerConfig())
        client.reload_config(config)
        _wait_for(client, {1: VersionState.AVAILABLE, 2: VersionState.END})
        np.testing.assert_array_equal(client.predict(MODEL, {"image": images}, version_label="stable")["logits"],
                                      first["logits"])
        bad = text_format.Parse('model_config_list { config { name: "../x" base_path: "/m" } }',
                                protocol.ModelServerConfig())
        with pytest.raises(RemoteError) as err:
            client.reload_config(bad)
        assert err.value.grpc_code == "INVALID_ARGUMENT" and "invalid model name '../x'" in err.value.details
        assert client.model_status(MODEL)[0].state is VersionState.AVAILABLE  # old config still served
    assert server.returncode == 0  # SIGTERM drains and exits 0


def test_launcher_reports_startup_failure_with_stderr(tmp_path):
    (tmp_path / MODEL / "1").mkdir(parents=True)
    with pytest.raises(ServerStartError) as err, ServerProcess(tmp_path, MODEL, backend="onnx", startup_timeout_s=60):
        pass
    message = str(err.value)
    assert "exited with code 1" in message and "model.onnx" in message


def test_invalid_model_name_is_refused(tmp_path):
    with pytest.raises(ServerStartError) as err, ServerProcess(tmp_path, "../etc", backend="onnx",
                                                               startup_timeout_s=60):
        pass
    assert "invalid model name '../etc'" in str(err.value)
