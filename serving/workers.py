"""`--num-processes N`: a parent that runs N server processes on the same ports (SO_REUSEPORT).

One Python process serves one core at most (the event loop and the GIL). gRPC binds with
SO_REUSEPORT by default on Linux, and workers bind REST with `--reuse-port`, so the kernel spreads
connections over the workers. The parent picks the ports (a free one for port 0), starts the workers
with the same settings, writes `--port-file` once every worker has loaded its models (`grpc`, `rest`,
the first worker's `metrics`, plus `workers`: each worker's pid and metrics port), forwards
SIGTERM/SIGINT/SIGHUP, and exits 0 when every worker drained and exited 0. A parent killed with SIGKILL
leaves its temp folder behind; the next start removes every such folder whose parent is gone. A worker
that dies on its own after start-up is restarted (the port file is rewritten with its new pid once it is
ready); more than `MAX_RESTARTS` restarts within `RESTART_WINDOW_S` seconds is a crash loop: the others
are stopped and the parent exits 1, as it does when a worker dies before all were ready. Workers die with
the parent, even when it is killed with SIGKILL (`core.processes.die_with_parent_command`): none is left
holding the ports.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tfship.core.errors import TfshipError
from tfship.core.processes import die_with_parent_command
from tfship.core.scratch import remove_orphaned_scratch, scratch_folder
from tfship.serving.affinity import WORKER_INDEX_ENV, process_cpus
from tfship.serving.settings import ServerSettings

log = logging.getLogger(__name__)
POLL_S = 0.1
MAX_RESTARTS = 5  # worker restarts allowed within RESTART_WINDOW_S before the parent gives up (crash loop)
RESTART_WINDOW_S = 60
WORK_KIND = "workers"  # the parent's temp folder, tfship-workers-* (settings and the workers' port files)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def worker_settings(settings: ServerSettings) -> ServerSettings:
    """The parent's settings for each worker: fixed ports (shared with SO_REUSEPORT), one process each, and the
    backend's thread counts left at 0 (the backend's default: every core, in each worker) set to the worker's
    share of the process' CPU set (`--num-processes auto`: one core each, 1 thread).
    """
    cpus = len(process_cpus() or ()) or os.cpu_count() or 1
    share = max(1, cpus // settings.num_processes)
    return settings.model_copy(update={
        "intra_op_threads": settings.intra_op_threads or share,
        "inter_op_threads": settings.inter_op_threads or share,
        "num_processes": 1,
        "reuse_port": True,
        "port": settings.port or _free_port(settings.host),
        "rest_port": settings.rest_port if settings.rest_port != 0 else _free_port(settings.host),
        "metrics_port": 0 if settings.metrics_port >= 0 else -1,  # one scrape target per worker
        "port_file": None,  # each worker gets its own
    })


def run_workers(settings: ServerSettings) -> int:
    """Run `settings.num_processes` workers until SIGTERM/SIGINT/SIGHUP; returns the exit code."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    remove_orphaned_scratch()  # a SIGKILLed parent's folder (core.scratch)
    with scratch_folder(WORK_KIND) as tmp:
        files = [Path(tmp) / f"worker-{i}.json" for i in range(settings.num_processes)]
        base = Path(tmp) / "settings.json"  # every resolved setting, exactly (no flag round trip)
        base.write_text(worker_settings(settings).model_dump_json())
        procs = [_start_worker(base, f, i) for i, f in enumerate(files)]
        log.info("started %d workers: %s", len(procs), [p.pid for p in procs])
        failed = _supervise(settings, procs, files, base, stop)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [_wait(proc, settings.grace_period_s + 30) for proc in procs]
    log.info("workers exited: %s", codes)
    return 1 if failed or any(codes) else 0


def _start_worker(settings_file: Path, port_file: Path, index: int) -> subprocess.Popen:
    """Worker `index`; it gets SIGTERM (and drains) if this parent dies, even by SIGKILL. Its transport threads
    share core number `index` of the CPU set (`serving.affinity`), so N workers use N different cores.
    """
    port_file.unlink(missing_ok=True)
    command = [sys.executable, "-m", "tfship.serving.workers", str(settings_file), str(port_file)]
    return subprocess.Popen(die_with_parent_command(command, signal.SIGTERM),
                            env={**os.environ, WORKER_INDEX_ENV: str(index)})


def _supervise(settings: ServerSettings, procs: list[subprocess.Popen], files: list[Path], base: Path,
               stop: threading.Event) -> bool:
    """Until SIGTERM (returns False): restart workers that die on their own; returns True when a worker died
    before all were ready (a start-up problem) or crashed more than `MAX_RESTARTS` times in `RESTART_WINDOW_S`
    seconds (a crash loop). Writes the port file once all are ready, and again after each restart.
    """
    reported = False
    restarts: list[float] = []
    pending = False  # a restarted worker is not ready yet
    while not stop.wait(POLL_S):
        for index, proc in enumerate(procs):
            if proc.poll() is None:
                continue
            if not reported:
                log.error("worker %d exited with %s before every worker was ready; stopping the others", proc.pid,
                          proc.returncode)
                return True
            now = time.monotonic()
            restarts = [t for t in restarts if now - t < RESTART_WINDOW_S] + [now]
            if len(restarts) > MAX_RESTARTS:
                log.error("worker %d exited with %s: %d restarts within %ds, a crash loop; stopping", proc.pid,
                          proc.returncode, len(restarts) - 1, RESTART_WINDOW_S)
                return True
            procs[index] = _start_worker(base, files[index], index)
            pending = True
            log.warning("worker %d exited with %s; restarted as %d", proc.pid, proc.returncode, procs[index].pid)
        if (not reported or pending) and all(_ready(f) for f in files):
            reported, pending = True, False
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


def worker_main(argv: list[str]) -> int:
    """`python -m tfship.serving.workers SETTINGS_JSON PORT_FILE`: one worker (started by `run_workers`)."""
    from tfship.serving.operations import logs
    from tfship.serving.server import serve_process

    settings = ServerSettings.model_validate_json(Path(argv[0]).read_text())
    settings = settings.model_copy(update={"port_file": Path(argv[1])})
    logs.configure(settings.json_logs)
    try:
        return serve_process(settings)
    except TfshipError as err:  # as `tfship serve` answers: the message, exit 2
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
