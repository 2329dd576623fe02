"""`--num-processes N`: a parent that runs N server processes on the same ports (SO_REUSEPORT).

One Python process serves one core at most (the event loop and the GIL). gRPC binds with
SO_REUSEPORT by default on Linux, and workers bind REST with `--reuse-port`, so the kernel spreads
connections over the workers. The parent picks the ports (a free one for port 0), starts the workers
with the same settings, writes `--port-file` once every worker has loaded its models (`grpc`, `rest`,
the first worker's `metrics`, plus `workers`: each worker's pid and metrics port), forwards
SIGTERM/SIGINT, and exits 0 when every worker drained and exited 0. A worker that dies on its own
stops the others and the parent exits 1.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from serving.settings import ServerSettings

log = logging.getLogger(__name__)
POLL_S = 0.1


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def worker_args(settings: ServerSettings) -> list[str]:
    """`serve` flags shared by the workers: the parent's settings with fixed ports and one process each."""
    fixed = {
        "num_processes": 1,
        "reuse_port": True,
        "port": settings.port or _free_port(settings.host),
        "rest_port": settings.rest_port if settings.rest_port != 0 else _free_port(settings.host),
        "metrics_port": 0 if settings.metrics_port >= 0 else -1,  # one scrape target per worker
        "port_file": None,  # each worker gets its own
    }
    args: list[str] = []
    for name, value in {**settings.model_dump(), **fixed}.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            args += [flag] if value else []
        elif value is not None:
            args += [flag, str(value)]
    return args


def _entry_module() -> str:
    """The module this process was started with (`python -m X`), so each worker registers the same backends.

    `serving` when started otherwise (the `tfship` console script).
    """
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = spec.name.removesuffix(".__main__") if spec is not None else ""
    return name or "serving"


def run_workers(settings: ServerSettings) -> int:
    """Run `settings.num_processes` workers until SIGTERM/SIGINT; returns the exit code."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    with tempfile.TemporaryDirectory(prefix="tfship-workers-") as tmp:
        files = [Path(tmp) / f"worker-{i}.json" for i in range(settings.num_processes)]
        base = worker_args(settings)
        procs = [subprocess.Popen([sys.executable, "-m", _entry_module(), "serve", *base, "--port-file", str(f)])
                 for f in files]
        log.info("started %d workers: %s", len(procs), [p.pid for p in procs])
        failed = _supervise(settings, procs, files, stop)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [_wait(proc, settings.grace_period_s + 30) for proc in procs]
    log.info("workers exited: %s", codes)
    return 1 if failed or any(codes) else 0


def _supervise(settings: ServerSettings, procs: list[subprocess.Popen], files: list[Path],
               stop: threading.Event) -> bool:
    """Wait for SIGTERM (returns False) or a worker exiting on its own (returns True); writes the port file."""
    reported = False
    while not stop.wait(POLL_S):
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            log.error("worker %d exited with %s; stopping the others", dead[0].pid, dead[0].returncode)
            return True
        if not reported and all(_ready(f) for f in files):
            reported = True
            _report(settings, procs, files)
    return False


def _ready(port_file: Path) -> bool:
    try:
        return bool(json.loads(port_file.read_text()).get("ready"))
    except (OSError, ValueError):
        return False


def _report(settings: ServerSettings, procs: list[subprocess.Popen], files: list[Path]) -> None:
    ports = [json.loads(f.read_text()) for f in files]
    merged = {**ports[0], "workers": [{"pid": p.pid, "metrics": w.get("metrics")} for p, w in zip(procs, ports)]}
    log.info("listening: %s", merged)
    if settings.port_file:
        tmp = settings.port_file.with_name(settings.port_file.name + ".tmp")
        tmp.write_text(json.dumps(merged))
        os.replace(tmp, settings.port_file)


def _wait(proc: subprocess.Popen, timeout_s: float) -> int:
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


