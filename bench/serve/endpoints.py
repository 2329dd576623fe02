"""The servers `make bench-serve` measures, each a child process pinned to the server core.

* `TfshipEndpoint`: `python -m tfship.serving serve` (gRPC + REST) for one model/backend/batching setting;
* `ReferenceEndpoint`: one of the reference servers of this package (`bare_server`, `ort_server`,
  `bare_rest`), which print `READY <port>` on stdout once listening (no sleeps, no polling).

All are context managers; `pids` (for CPU accounting) and `metrics_urls` feed the load generator.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc

from bench.serve.models import ROOT

PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"
THREAD_FLAGS = ("--intra-op-threads", "1", "--inter-op-threads", "1")


BATCH_FLAGS = ("--batch-thread-nice", "5")


def child_env() -> dict[str, str]:
    """This environment with the repository root first on PYTHONPATH and TensorFlow's C++ logs off."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


class TfshipEndpoint:
    """A tfship server for `model` on `backend`; gRPC on `grpc_target`, REST `:predict` at `rest_url(model)`.

    Args:
        repo: model repository.  batching_file: TF Serving batching parameters file, None = no batching.
        cpu: core to pin the server to (None: not pinned).  extra: more `serve` flags.
    """

    def __init__(self, repo: Path, model: str, backend: str, batching_file: Path | None, cpu: int | None,
                 extra: tuple[str, ...] = ()) -> None:
        from tfship.serving.launcher import ServerProcess

        args = ["--file-system-poll-wait-seconds", "0", *THREAD_FLAGS, *extra]
        if batching_file:  # the batch thread yields the pinned core to the event loop: batches fill (issue 43)
            args += ["--batching-parameters-file", str(batching_file), *BATCH_FLAGS]
        self.model, self.cpu = model, cpu
        # `python -m bench.serve.identity`: serving's CLI with the benchmark-only `identity` backend registered.
        self._server = ServerProcess(repo, model, backend, args, env=child_env(), module="bench.serve.identity")

    def __enter__(self) -> TfshipEndpoint:
        before = os.sched_getaffinity(0)
        if self.cpu is not None:  # the child inherits the affinity
            os.sched_setaffinity(0, {self.cpu})
        try:
            self._server.__enter__()
        finally:
            os.sched_setaffinity(0, before)
        return self

    def __exit__(self, *exc) -> None:
        self._server.__exit__(*exc)

    @property
    def grpc_target(self) -> str:
        return self._server.grpc_target

    @property
    def pids(self) -> list[int]:
        workers = self._server.ports.get("workers") or []
        return [w["pid"] for w in workers] or [self._server.process.pid]

    @property
    def metrics_urls(self) -> list[str]:
        workers = self._server.ports.get("workers") or []
        if workers:
            return [f"http://127.0.0.1:{w['metrics']}" for w in workers if w.get("metrics")]
        return [self._server.metrics_url] if self._server.metrics_url else []

    def rest_url(self) -> str:
        return f"{self._server.rest_url}/v1/models/{self.model}:predict"


class ReferenceEndpoint:
    """`python -m bench.serve.<module> <args> --cpu <cpu>`, ready when it prints `READY <port>`.

    Raises:
        RuntimeError: the server exited or stayed silent for `startup_s` seconds (its stderr tail included).
    """

    def __init__(self, module: str, args: list[str], cpu: int | None, startup_s: float = 120.0) -> None:
        self.module, self.args, self.cpu, self.startup_s = module, args, cpu, startup_s
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.metrics_urls: list[str] = []

    def __enter__(self) -> ReferenceEndpoint:
        cmd = [sys.executable, "-m", f"bench.serve.{self.module}", *self.args]
        if self.cpu is not None:
            cmd.append(f"--cpu={self.cpu}")
        self.process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env())
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], max(deadline - time.monotonic(), 0))
            line = self.process.stdout.readline().decode() if ready else ""
            if line.startswith("READY "):
                self.port = int(line.split()[1])
                return self
            if self.process.poll() is not None or not line:
                break
        self.__exit__(None, None, None)
        raise RuntimeError(f"{self.module} did not start: {self.process.stderr.read().decode()[-1500:]}")

    def __exit__(self, *exc) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pids(self) -> list[int]:
        return [self.process.pid]

    def rest_url(self, model: str = "m") -> str:
        return f"http://127.0.0.1:{self.port}/v1/models/{model}:predict"


def grpc_reply(target: str, request: bytes) -> bytes:
    """One raw `Predict` call: the serialised response bytes (to prebuild a reference's reply)."""
    with grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
        return channel.unary_unary(PREDICT_METHOD)(request, timeout=60)


def rest_reply(url: str, body: bytes) -> bytes:
    """One REST `:predict` POST: the response body (raises on a non-200 answer)."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def rest_bodies(alias: str, row: list) -> dict[str, bytes]:
    """TF Serving REST request bodies for one row: `row` (`instances`) and `columnar` (`inputs`) format."""
    return {
        "row": json.dumps({"instances": [row]}).encode(),
        "columnar": json.dumps({"inputs": {alias: [row]}}).encode(),
    }
