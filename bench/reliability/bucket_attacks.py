"""`make reliability`'s bucket row: serve from an S3 bucket under load while versions are published, left
partial (no manifest), corrupted (a wrong hash), deleted and promoted.

A moto S3 server runs on loopback (real HTTP, the clients a deployment uses). 8 clients Predict without pause;
every answer must be OK and equal one complete version's output, and the served versions must only ever be
complete, verified ones.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench.reliability.common import MODEL, Row, images
from tfship.core.errors import TfshipError
from tfship.core.locations import BucketUrl
from tfship.core.manifest import VersionManifest
from tfship.core.processes import die_with_parent_command
from tfship.pipeline.orchestration.promote import promote
from tfship.pipeline.orchestration.publish import publish_version
from tfship.serving.launcher import ServerProcess
from tfship.serving.storage.filesystem import open_filesystem
from tfship.serving.tfs.client import PredictClient


def _moto(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(die_with_parent_command([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                                     str(port)]), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("moto S3 server did not start")


def _free_port() -> int:
    """A TCP port free on loopback now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _churn_versions(fs, repository: BucketUrl, versions: list[Path], rounds: int) -> list[int]:
    """`rounds` cycles on the bucket: a partial upload (no manifest), its manifest corrupted (wrong hashes), it
    deleted, a complete version published and promoted to canary, the oldest of three deleted. Returns the
    complete versions left, oldest first (version 1 must already be published)."""
    base = f"reliability/models/{MODEL}"
    published = [1]
    for cycle in range(rounds):
        folder = versions[(cycle + 1) % 3]
        number = max(published) + 1
        fs.put(str(folder), f"{base}/{number}", recursive=True)  # partial: no manifest
        time.sleep(0.8)
        good = VersionManifest.from_json(fs.cat_file(f"{base}/{published[-1]}/manifest.json")).to_json()
        bad = {**good, "files": [dict(r, sha256="0" * 64) for r in good["files"]]}
        fs.pipe_file(f"{base}/{number}/manifest.json", json.dumps(bad).encode())  # corrupt
        time.sleep(0.8)
        fs.rm(f"{base}/{number}", recursive=True)
        published.append(publish_version(folder, repository, MODEL, {"status": "reliability"}).version)
        promote(repository, MODEL, published[-1], "canary")
        time.sleep(1.0)
        if len(published) > 2:
            fs.rm(f"{base}/{published.pop(0)}", recursive=True)  # a served version deleted
    return published


def bucket_under_load(source: Path, work: Path, rounds: int) -> Row:
    """See the module docstring; `rounds` cycles of publish / partial / corrupt / promote / delete."""
    row = Row("bucket_load", "Predict load while a bucket gets versions published, partial, corrupt, deleted")
    port = _free_port()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update(env)
    server_env = {**os.environ, "TFSHIP_MODEL_CACHE_DIR": str(work / "bucket-cache")}
    moto = _moto(port)
    try:
        repository = BucketUrl("s3://reliability/models")
        fs = open_filesystem(repository)
        fs.mkdir("reliability")
        versions = [source / MODEL / str(v) for v in (1, 2, 3)]
        expected = [_offline_logits(folder) for folder in versions]
        publish_version(versions[0], repository, MODEL, {"status": "reliability"})
        stop, lock = threading.Event(), threading.Lock()
        args = ("--rest-port", "-1", "--file-system-poll-wait-seconds", "0.3")
        with ServerProcess(repository, MODEL, "onnx", args, env=server_env, startup_timeout_s=120) as server:

            def client_loop() -> None:
                with PredictClient(server.grpc_target, timeout_s=30) as client:
                    while not stop.is_set():
                        try:
                            logits = client.predict(MODEL, images(4))["logits"]
                            ok, why = any(np.allclose(logits, e, atol=1e-5) for e in expected), "unknown answer"
                        except TfshipError as err:
                            ok, why = False, f"Predict failed: {err}"
                        with lock:
                            row.check(ok, why)

            threads = [threading.Thread(target=client_loop) for _ in range(8)]
            for thread in threads:
                thread.start()
            published = _churn_versions(fs, repository, versions, rounds)
            stop.set()
            for thread in threads:
                thread.join()
            served = {s.version for s in PredictClient(server.grpc_target).model_status(MODEL)
                      if s.state.name == "AVAILABLE"}
            row.check(served <= set(published), f"served {sorted(served)}, complete {published}")
        row.notes = (f"{rounds} cycles: partial upload, corrupt manifest, delete, publish, promote canary, delete "
                     f"the oldest; 8 clients, batch 4, onnx backend, moto S3 on loopback")
    finally:
        moto.terminate()
        moto.wait(timeout=10)
    return row


def _offline_logits(folder: Path) -> np.ndarray:
    from tfship.serving.runtimes import REGISTRY, RuntimeOptions

    runtime = REGISTRY.create("onnx", folder, RuntimeOptions(use_gpu=False))
    runtime.load()
    return runtime.predict(images(4))["logits"]
