"""Publishing into and serving from a bucket on a real S3-compatible server (moto, over HTTP on loopback).

A version is published in checked steps with its manifest last; a server serving `s3://…` mirrors complete
versions into its cache after checking every file. Under a client loop, partial uploads (no manifest),
corrupt versions (a wrong hash, a missing object), a deleted version and a new good version follow each other:
no request fails, and no partial or corrupt version is ever served.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tfship.core.errors import ConfigError
from tfship.core.locations import BucketUrl, parse_location
from tfship.pipeline.orchestration.bucket_publish import remove_stale
from tfship.pipeline.orchestration.publish import publish_version
from tfship.serving.launcher import ServerProcess
from tfship.serving.storage.filesystem import open_filesystem
from tfship.serving.tfs.client import PredictClient

X = np.random.default_rng(0).random((2, 8, 8, 1), dtype=np.float32)


def _publish(folder: Path, repository: BucketUrl) -> int:
    return publish_version(folder, repository, "digits", {"status": "test"}).version


def _served_versions(client: PredictClient) -> list[int]:
    return sorted(s.version for s in client.model_status("digits") if s.state.name == "AVAILABLE")


def _wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.3)


def test_unsupported_schemes_are_refused_by_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for text in ("gs://bucket/models", "hdfs://nn/models", "http://host/models", "file:///models"):
        with pytest.raises(ConfigError, match=r"--repository: .* uses the URL scheme \w+://, which tfship does not"):
            parse_location(text, "--repository")
    with pytest.raises(ConfigError, match="a local path is expected here"):
        parse_location("s3://bucket/data.npz", "--data", buckets=False)
    assert parse_location("s3://b/models/", "--repository") == "s3://b/models"
    assert not any(tmp_path.iterdir())  # nothing named "s3:" or "gs:" was created


def test_publish_writes_manifest_last_and_cleans_killed_publishes(version_folders, bucket, s3_env) -> None:
    repository = BucketUrl(f"s3://{bucket}/models")
    fs = open_filesystem(repository)
    base = f"{bucket}/models/digits"
    fs.pipe_file(f"{base}/.staging-{'otherhost'}-99999999-dead/saved_model.pb", b"partial")  # a killed upload
    fs.pipe_file(f"{base}/7/.claim-{__import__('socket').gethostname()}-99999999-dead", b"")  # claimed, died
    fs.pipe_file(f"{base}/7/saved_model.pb", b"half")
    version = _publish(version_folders[0], repository)
    names = {p.rsplit("/", 1)[-1] for p in fs.ls(base, detail=False, refresh=True)}
    assert "7" not in names and names >= {str(version)}  # the dead publisher's unfinished version was removed
    assert version == 1
    manifest = json.loads(fs.cat_file(f"{base}/1/manifest.json"))
    listed = {row["path"] for row in manifest["files"]}
    stored = {p.removeprefix(f"{base}/1/") for p in fs.find(f"{base}/1")} - {"manifest.json"}
    assert listed == stored and "saved_model.pb" in listed and manifest["version"] == 1
    assert not any(".claim" in n for n in fs.ls(f"{base}/1", detail=False))
    assert _publish(version_folders[1], repository) == 2
    # another host's staging prefix is younger than the stale age: kept (its publisher may be alive)
    assert remove_stale(fs, base) == [] and any(".staging-otherhost" in n for n in fs.ls(base, detail=False))


@pytest.mark.slow
def test_serving_from_a_bucket_never_serves_a_partial_or_corrupt_version(version_folders, bucket, s3_env,
                                                                        tmp_path: Path) -> None:
    repository = BucketUrl(f"s3://{bucket}/models")
    fs = open_filesystem(repository)
    base = f"{bucket}/models/digits"
    first = _publish(version_folders[0], repository)
    env = {**s3_env, "TFSHIP_MODEL_CACHE_DIR": str(tmp_path / "cache")}
    with ServerProcess(repository, "digits", "onnx", ["--file-system-poll-wait-seconds", "0.5", "--rest-port", "-1"],
                       env=env, startup_timeout_s=120) as server:
        client = PredictClient(server.grpc_target)
        baseline = client.predict("digits", {"image": X})
        failures, answers, stop = [], [], threading.Event()

        def load() -> None:
            own = PredictClient(server.grpc_target)
            while not stop.is_set():
                try:
                    answers.append(own.predict("digits", {"image": X})["logits"][0, 0])
                except Exception as err:  # noqa: BLE001 - every failure is counted and reported
                    failures.append(repr(err))

        worker = threading.Thread(target=load)
        worker.start()
        try:
            # 1. an upload without its manifest is never served
            fs.put(str(version_folders[1]), f"{base}/{first + 1}", recursive=True)
            time.sleep(2)
            assert _served_versions(client) == [first]
            # 2. a manifest whose hash does not match one object: refused, the old version keeps serving
            good = json.loads(fs.cat_file(f"{base}/{first}/manifest.json"))
            bad = {**good, "version": first + 1}
            bad["files"] = [dict(r, sha256="0" * 64) if r["path"] == "saved_model.pb" else r for r in good["files"]]
            fs.pipe_file(f"{base}/{first + 1}/manifest.json", json.dumps(bad).encode())
            time.sleep(2)
            assert _served_versions(client) == [first]
            # 3. a manifest listing an object that is missing: refused too
            missing = {**good, "files": [*good["files"], {"path": "gone.bin", "sha256": "0" * 64, "size_bytes": 1}]}
            fs.pipe_file(f"{base}/{first + 2}/manifest.json", json.dumps(missing).encode())
            time.sleep(2)
            assert _served_versions(client) == [first]
            # 4. a good publish is served, then deleting it brings the previous one back
            good_version = _publish(version_folders[1], repository)
            _wait_for(lambda: _served_versions(client) == [good_version])
            changed = client.predict("digits", {"image": X})["logits"]
            assert not np.allclose(changed, baseline["logits"])  # bias 1: really the new version
            fs.rm(f"{base}/{good_version}", recursive=True)
            _wait_for(lambda: _served_versions(client) == [first])
        finally:
            stop.set()
            worker.join(timeout=30)
    assert failures == [] and len(answers) > 20
    cache = tmp_path / "cache"
    cached = [p.name for d in cache.iterdir() for p in d.iterdir()]
    assert cached == [str(first)], cached  # bounded: only the served version, no partial folder left
