"""Start `python -m tfship.serving` as a subprocess on free loopback ports and wait until it is SERVING.

Used by the tests and by the pipeline's serve-check stage. Ports are chosen by the server (port 0)
and reported through `--port-file`; readiness is grpc.health.v1 saying SERVING, never a sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import grpc

from tfship.core.errors import TfshipError, UnavailableError
from tfship.core.locations import BucketUrl
from tfship.core.processes import die_with_parent_command
from tfship.core.scratch import make_scratch, remove_scratch
from tfship.serving.tfs.client import PredictClient


class ServerStartError(UnavailableError):
    """The server exited or did not become SERVING in time; the message ends with its stderr tail."""


class ServerProcess:
    """Context manager running a tfship model server.

    Args:
        repository: model repository (`<repository>/<model_name>/<version>/`).
        model_name: model to serve.
        backend: `auto`, `saved_model`, `onnx` or `tflite`.
        extra_args: more `serve` flags (later flags win, e.g. `("--rest-port", "-1")`).
        startup_timeout_s: seconds to wait for SERVING.
        python: interpreter to run (default: this one), e.g. a TensorFlow-free venv's.
        credentials: `grpc.ssl_channel_credentials(...)` for the health check when the server uses TLS.
        module: the module run with `python -m` (`tfship.serving`, or one that registers more backends first and
            then runs serving's CLI, e.g. `bench.serve.identity`).
        installed: run the tfship installed in `python`'s environment (no PYTHONPATH, working directory
            outside the source tree) instead of this source tree.

    Attributes (after `__enter__`): `grpc_target` (`127.0.0.1:port`), `rest_url`, `metrics_url`
    (`http://127.0.0.1:port`, `https://` with `--tls-cert`; None when that transport is off), `ports` (dict
    from the port file).

    Raises:
        ServerStartError: the process died or was not SERVING within `startup_timeout_s`.
    """

    def __init__(self, repository: Path | BucketUrl, model_name: str, backend: str = "auto",
                 extra_args: Sequence[str] = (), startup_timeout_s: float = 120.0, python: str | None = None,
                 env: dict[str, str] | None = None, stop_timeout_s: float = 30.0,
                 credentials: grpc.ChannelCredentials | None = None, module: str = "tfship.serving",
                 installed: bool = False) -> None:
        self.repository = repository if isinstance(repository, BucketUrl) else Path(repository)  # or s3://
        self.model_name = model_name
        self.backend = backend
        self.extra_args = list(extra_args)
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.python = python or sys.executable
        self.env = env
        self.credentials = credentials
        self.module = module
        self.installed = installed
        self.process: subprocess.Popen | None = None
        self.ports: dict[str, int | None] = {}
        self.grpc_target = ""
        self.rest_url: str | None = None
        self.metrics_url: str | None = None
        self.returncode: int | None = None
        self._dir = make_scratch("serve")  # core.scratch: removed by stop(), at exit, or by the next start
        self._stderr_path = self._dir / "stderr.log"

    def command(self) -> list[str]:
        """The command line started."""
        return [self.python, "-m", self.module, "serve", "--repository", str(self.repository),
                "--model-name", self.model_name, "--backend", self.backend, "--host", "127.0.0.1",
                "--port", "0", "--rest-port", "0", "--metrics-port", "0",
                "--port-file", str(self._dir / "ports.json"), *self.extra_args]

    def stderr_tail(self, lines: int = 40) -> str:
        """Last `lines` lines the server wrote to stderr."""
        try:
            return "\n".join(self._stderr_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> Self:
        env = dict(os.environ if self.env is None else self.env)
        root = Path(__file__).resolve().parent.parent
        if self.installed:
            env.pop("PYTHONPATH", None)
        elif (root / "tfship" / "__init__.py").is_file():  # this source tree (an installed copy needs no path)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        with open(self._stderr_path, "wb") as stderr:
            guarded = die_with_parent_command(self.command(), signal.SIGKILL)  # never an orphan
            self.process = subprocess.Popen(guarded, stdout=stderr, stderr=subprocess.STDOUT, env=env,
                                            cwd=self._dir if self.installed else None)
        try:
            self._wait_ready(self.process)
        except BaseException:
            self.stop()
            raise
        return self

    def _fail(self, why: str) -> ServerStartError:
        return ServerStartError(f"model server {why}; command: {' '.join(self.command())}\n"
                                f"--- server output (tail) ---\n{self.stderr_tail()}")

    def _wait_ready(self, process: subprocess.Popen) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        port_file = self._dir / "ports.json"
        while not port_file.exists():  # written atomically once the models are loaded and the ports bound
            if process.poll() is not None:
                raise self._fail(f"exited with code {process.returncode} before binding its ports (models "
                                 "load first)")
            if time.monotonic() > deadline:
                raise self._fail(f"did not load its models and bind its ports within {self.startup_timeout_s}s")
            time.sleep(0.05)
        self.ports = json.loads(port_file.read_text())
        self.grpc_target = f"127.0.0.1:{self.ports['grpc']}"
        scheme = "https" if "--tls-cert" in self.extra_args else "http"  # every port follows the same TLS policy
        self.rest_url = f"{scheme}://127.0.0.1:{self.ports['rest']}" if self.ports.get("rest") else None
        self.metrics_url = f"{scheme}://127.0.0.1:{self.ports['metrics']}" if self.ports.get("metrics") else None
        with PredictClient(self.grpc_target, timeout_s=5.0, credentials=self.credentials) as client:
            while True:
                remaining = deadline - time.monotonic()
                if process.poll() is not None:
                    raise self._fail(f"exited with code {process.returncode} while loading models")
                if remaining <= 0:
                    raise self._fail(f"was not SERVING within {self.startup_timeout_s}s")
                try:
                    client.wait_until_serving(min(remaining, 2.0))
                    return
                except TfshipError:
                    continue  # re-check that the process is alive, then keep watching health

    def stop(self) -> int | None:
        """SIGTERM the server and wait (SIGKILL after `stop_timeout_s`); returns its exit code."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process:
            self.returncode = self.process.returncode
        return self.returncode

    def __exit__(self, *exc) -> None:
        self.stop()
        remove_scratch(self._dir)
