"""Signed versions (issue 40): `publish_version(..., signing_key=)` signs a version (`model.sig`, OpenSSF
model-signing, EC key) and a real server run with `--verify-key` serves it, and refuses, with a one-line reason in
the model status and the log naming what it found: an unsigned version; a changed, an added, a removed file, a
symlink, a hard link; version 1 copied into `7/`; model A's version under model B; on hot reload the old version
keeps serving; from the S3 test server a tampered version (file and manifest rewritten to agree) is refused on
the verified local copy. The metadata (gRPC GetModelMetadata through TF Serving's own client stubs, REST, V2 REST)
carries the manifest digest, the signer's key id and the op-policy verdict."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.op_policy_models import save_module
from tests.s3_server import bucket, s3_endpoint, s3_env  # noqa: F401  (the S3 server's fixtures)
from tests.signing_keys import ec_key_pair
from tfship.serving.dataplane.types import VersionState
from tfship.serving.launcher import ServerProcess
from tfship.serving.tfs.client import PredictClient

X = np.ones((2, 4), np.float32)
REFUSALS = {  # model: what its version 2 is, and what the refusal must say
    "unsigned": "unsigned version (no model.sig)",
    "changed": "tampered version: changed 'saved_model.pb'",
    "added": "tampered version: added 'extra.txt'",
    "removed": "tampered version: removed 'variables/variables.index'",
    "symlink": "a symlink: 'variables/variables.index' -> ",
    "hardlink": "a hardlink: 'saved_model.pb' has 2 names",
    "moved": "substituted version: signed as model 'moved' version 1, served as model 'moved' version 7",
    "other": "substituted version: signed as model 'good' version 1, served as model 'other' version 2",
    "foreign_key": "model.sig was not made with the key sha256:",
}


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("signed_versions")
    return save_module("plain", root / "plain", root / "marker")


def _publish(candidate: Path, repository, name: str, key: Path | None) -> Path:
    from tfship.pipeline.orchestration.publish import publish_version

    return publish_version(candidate, repository, name, {"status": "test"}, signing_key=key).version_dir


def _wait_for(client: PredictClient, model: str, want: dict[int, VersionState], timeout_s: float = 90.0):
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = {s.version: s for s in client.model_status(model)}
        if all(v in statuses and statuses[v].state is state for v, state in want.items()):
            return statuses
        if time.monotonic() > deadline:
            raise AssertionError(f"{model}: wanted {want}, have {statuses}")
        time.sleep(0.2)


def _config(path: Path, bases: dict[str, str], latest: tuple[str, ...] = ()) -> Path:
    path.write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{name}" base_path: "{base}" model_platform: "tensorflow" model_version_policy '
        f'{{ {"latest { num_versions: 1 }" if name in latest else "all {}"} }} }}\n'
        for name, base in bases.items()) + "}\n")
    return path


def _tamper(repository: Path, plain: Path, key: Path, other_key: Path, tmp_path: Path) -> None:
    """Each refused model: a good signed version 1 and the version the REFUSALS table describes."""
    for name in REFUSALS:
        _publish(plain, repository, name, key)
    bad = {name: repository / name / "2" for name in REFUSALS}
    shutil.copytree(plain, bad["unsigned"])
    for name in ("changed", "added", "removed", "symlink", "hardlink"):
        _publish(plain, repository, name, key)
    _publish(plain, repository, "foreign_key", other_key)
    with (bad["changed"] / "saved_model.pb").open("ab") as handle:
        handle.write(b"\0")
    (bad["added"] / "extra.txt").write_text("not signed")
    (bad["removed"] / "variables" / "variables.index").unlink()
    index = bad["symlink"] / "variables" / "variables.index"
    shutil.copy(index, tmp_path / "elsewhere.index")
    index.unlink()
    index.symlink_to(tmp_path / "elsewhere.index")
    os.link(bad["hardlink"] / "saved_model.pb", tmp_path / "second-name.pb")
    shutil.copytree(repository / "moved" / "1", repository / "moved" / "7")
    shutil.copytree(repository / "good" / "1", bad["other"])


def test_signed_versions_serve_and_every_substitution_is_refused(plain, tmp_path):
    import grpc
    from google.protobuf import struct_pb2
    from tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

    key, public, key_id = ec_key_pair(tmp_path)
    other_key, _, _ = ec_key_pair(tmp_path, "other")
    repository = tmp_path / "repo"
    _publish(plain, repository, "good", key)
    _tamper(repository, plain, key, other_key, tmp_path)
    config = _config(tmp_path / "models.config", {n: str(repository / n) for n in ("good", *REFUSALS)}, ("good",))
    with ServerProcess(repository, "good", extra_args=("--model-config-file", str(config), "--verify-key",
                                                       str(public), "--file-system-poll-wait-seconds", "0.2")) \
            as server, PredictClient(server.grpc_target, timeout_s=30) as client:
        assert client.predict("good", {"x": X})["y"].shape == (2, 2)
        for name, reason in REFUSALS.items():
            bad = 7 if name == "moved" else 2
            status = _wait_for(client, name, {1: VersionState.AVAILABLE, bad: VersionState.END})[bad]
            message = status.error_message
            assert status.error_code == "FAILED_PRECONDITION" and "\n" not in message, message
            assert message.startswith(f"{repository / name / str(bad)}: signature check failed: "), message
            assert reason in message, message
            assert client.predict(name, {"x": X}, version=1)["y"].shape == (2, 2)  # its signed version serves

        # hot reload: a new signed version is verified and served; a tampered one after it keeps it serving
        v2 = _publish(plain, repository, "good", key)
        _wait_for(client, "good", {2: VersionState.AVAILABLE})
        staging = repository / "good" / ".staging-3"
        shutil.copytree(v2, staging)
        (staging / "extra.txt").write_text("slipped in")
        staging.rename(repository / "good" / "3")
        status = _wait_for(client, "good", {2: VersionState.AVAILABLE, 3: VersionState.END})[3]
        assert "tampered version: added 'extra.txt'" in status.error_message, status.error_message
        assert client.predict("good", {"x": X})["y"].shape == (2, 2)

        # the verification record: gRPC (TF Serving's own stubs), REST, V2 REST
        digest = hashlib.sha256((v2 / "manifest.json").read_bytes()).hexdigest()
        with grpc.insecure_channel(server.grpc_target) as channel:
            request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
            request.model_spec.name = "good"
            answer = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(request, timeout=30)
        assert answer.model_spec.version.value == 2 and answer.metadata["signature_def"].Unpack(
            get_model_metadata_pb2.SignatureDefMap())
        record = struct_pb2.Struct()
        assert answer.metadata["verification"].Unpack(record)
        assert dict(record) == {"manifest_sha256": digest, "key_id": key_id, "signed_files": record["signed_files"],
                                "op_policy": "passed"}, dict(record)
        files = {p for p in v2.rglob("*") if p.is_file() and p.name != "model.sig"}
        assert record["signed_files"] == len(files)
        rest = requests.get(f"{server.rest_url}/v1/models/good/metadata", timeout=30).json()
        assert rest["verification"] == {"manifest_sha256": digest, "key_id": key_id, "signed_files": len(files),
                                        "op_policy": "passed"}, rest
        assert "signature_def" in rest["metadata"]
        v2_rest = requests.get(f"{server.rest_url}/v2/models/good", timeout=30).json()
        assert v2_rest["parameters"] == {"signature_manifest_sha256": digest, "signature_key_id": key_id,
                                         "signature_signed_files": len(files), "op_policy": "passed"}, v2_rest
        log = server.stderr_tail(600)
    assert "failed to load unsigned version 2" in log and "unsigned version (no model.sig)" in log


def test_a_bucket_version_rewritten_with_its_manifest_is_refused_on_the_local_copy(plain, bucket, s3_env,  # noqa: F811
                                                                                   tmp_path):
    from tfship.core.locations import BucketUrl
    from tfship.serving.storage.filesystem import open_filesystem

    key, public, _ = ec_key_pair(tmp_path)
    repository = BucketUrl(f"s3://{bucket}/models")
    _publish(plain, repository, "digits", key)
    _publish(plain, repository, "digits", key)
    fs, base = open_filesystem(repository), f"{bucket}/models/digits/2"
    assert fs.exists(f"{base}/model.sig")
    forged = fs.cat_file(f"{base}/saved_model.pb") + b"\0"  # a changed file, its manifest rewritten to agree
    fs.pipe_file(f"{base}/saved_model.pb", forged)
    manifest = json.loads(fs.cat_file(f"{base}/manifest.json"))
    for row in manifest["files"]:
        if row["path"] == "saved_model.pb":
            row.update(sha256=hashlib.sha256(forged).hexdigest(), size_bytes=len(forged))
    fs.pipe_file(f"{base}/manifest.json", json.dumps(manifest).encode())
    config = _config(tmp_path / "bucket.config", {"digits": f"{repository}/digits"})
    with ServerProcess(repository, "digits", env={**s3_env, "TFSHIP_MODEL_CACHE_DIR": str(tmp_path / "cache"),
                                                  "TFSHIP_SERVING_VERIFY_KEY": str(public)},
                       extra_args=("--file-system-poll-wait-seconds", "0", "--model-config-file", str(config))) \
            as server, PredictClient(server.grpc_target, timeout_s=30) as client:
        statuses = _wait_for(client, "digits", {1: VersionState.AVAILABLE, 2: VersionState.END})
        message = statuses[2].error_message
        assert "signature check failed: tampered version: changed 'manifest.json', 'saved_model.pb'" in message, \
            message
        assert str(tmp_path / "cache") in message  # the verified local copy is the one judged, and served
        assert client.predict("digits", {"x": X})["y"].shape == (2, 2)


def test_a_key_that_cannot_verify_stops_the_server_at_start(tmp_path):
    import subprocess
    import sys

    (tmp_path / "m" / "1").mkdir(parents=True)
    not_a_key = tmp_path / "pub.pem"
    not_a_key.write_text("-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n")
    private, _, _ = ec_key_pair(tmp_path)
    for key, reason in ((not_a_key, "--verify-key: verify key"), (private, "--verify-key: verify key"),
                        (tmp_path / "missing.pem", "missing.pem")):
        done = subprocess.run([sys.executable, "-m", "tfship.serving", "--repository", str(tmp_path),
                               "--model-name", "m", "--port", "0", "--rest-port", "-1", "--verify-key", str(key)],
                              capture_output=True, text=True, timeout=120, env={**os.environ})
        assert done.returncode != 0 and reason in done.stderr, (key, done.returncode, done.stderr[-2000:])
