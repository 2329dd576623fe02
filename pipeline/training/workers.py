"""`tfship train --workers N`: the multi-worker recipe as one command, on this machine.

Starts N `tfship train` processes with `train.strategy = "multi_worker"`, each with its own `TF_CONFIG`
(`{"cluster": {"worker": [127.0.0.1:p0, ...]}, "task": {"type": "worker", "index": i}}`) on free loopback
ports. Worker 0 is the chief: it trains into `run.runs_dir` as a plain `tfship train` would (its run folder
holds `model.keras` for `tfship export`); the other workers write their (required, then discarded)
checkpoints into a temporary folder (`tfship-train-workers-*`, `core.scratch`), and their output goes to log
files there, whose tail is printed when a worker fails. The folder is removed when the launcher ends; one left
by a launcher killed with SIGKILL is removed when the next `tfship` command starts.

Lifetime: children are started with `PR_SET_PDEATHSIG` (Linux), so they die with the launcher even when it
is killed with SIGKILL; SIGINT / SIGTERM to the launcher are passed on. When one worker exits non-zero
the others would wait forever in their collectives, so they are stopped (SIGTERM, then SIGKILL after
`STOP_GRACE_S`). Exit code: the worst child's (0 only when every worker exited 0; a child killed by a
signal counts as 128 + signal number, as a shell reports it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tfship.core.errors import ConfigError
from tfship.core.processes import die_with_parent_command
from tfship.core.scratch import remove_orphaned_scratch, scratch_folder

STOP_GRACE_S = 10.0
POLL_S = 0.2
_LOG_TAIL = 3000


@dataclass(frozen=True)
class WorkerResult:
    """One worker's end: its index, exit code (128 + signal when killed) and log file (None for the chief)."""

    index: int
    exit_code: int
    log: Path | None


def free_loopback_ports(count: int) -> list[int]:
    """`count` distinct TCP ports the kernel reports free on 127.0.0.1 (bound together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def tf_config(ports: list[int], index: int) -> str:
    """The `TF_CONFIG` JSON of worker `index` in a loopback cluster of `ports`."""
    return json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _stop(processes: list[subprocess.Popen]) -> None:
    for proc in processes:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in processes:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def launch_workers(count: int, train_args: list[str], runs_dir: Path) -> list[WorkerResult]:
    """Run `count` multi-worker `tfship train` processes until all end; see the module docstring.

    Args:
        count: number of workers (>= 1).
        train_args: the `tfship train` arguments for every worker (config, overrides), without
            `--workers` and `--runs-dir`.
        runs_dir: the chief's runs folder (`run.runs_dir`).

    Returns:
        One `WorkerResult` per worker, in index order.

    Raises:
        ConfigError: `count` < 1.
    """
    if count < 1:
        raise ConfigError(f"--workers {count}: expected at least 1 worker")
    ports = free_loopback_ports(count)
    remove_orphaned_scratch()  # a SIGKILLed launcher's worker logs and runs (core.scratch)
    with scratch_folder("train-workers") as scratch:
        processes, logs = [], []
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def forward(signum, _frame):
            _stop(processes)
            raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)

        try:
            for sig in handlers:
                signal.signal(sig, forward)
            for index in range(count):
                folder = runs_dir if index == 0 else Path(scratch) / f"worker{index}" / "runs"
                command = [sys.executable, "-m", "tfship.pipeline.cli", "train", *train_args,
                           "--set", "train.strategy=multi_worker", "--runs-dir", str(folder)]
                env = {**os.environ, "TF_CONFIG": tf_config(ports, index)}
                log = None if index == 0 else Path(scratch) / f"worker{index}.log"
                output = None if log is None else log.open("wb")
                try:
                    guarded = die_with_parent_command(command, signal.SIGTERM)
                    processes.append(subprocess.Popen(guarded, env=env, stdin=subprocess.DEVNULL, stdout=output,
                                                      stderr=None if output is None else subprocess.STDOUT))
                finally:
                    if output is not None:
                        output.close()
                logs.append(log)
            _wait_all(processes)
        finally:
            _stop(processes)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        results = [WorkerResult(i, _exit_code(p.returncode), logs[i]) for i, p in enumerate(processes)]
        for result in results:
            if result.exit_code != 0 and result.log is not None:
                tail = result.log.read_text(errors="replace")[-_LOG_TAIL:]
                print(f"--- worker {result.index} exited with {result.exit_code}; log tail:\n{tail}", file=sys.stderr)
        return [WorkerResult(r.index, r.exit_code, None) for r in results]


def _wait_all(processes: list[subprocess.Popen]) -> None:
    """Wait until every process ended; when one fails, stop the others (they would block in collectives)."""
    while True:
        codes = [p.poll() for p in processes]
        if all(code is not None for code in codes):
            return
        if any(code not in (None, 0) for code in codes):
            _stop(processes)
            return
        time.sleep(POLL_S)


def worst_exit_code(results: list[WorkerResult]) -> int:
    """0 when every worker exited 0, else the largest exit code."""
    return max((r.exit_code for r in results), default=0)
