"""Run a child process to completion and learn its peak resident memory (Linux: exact, from the kernel).

`run_measured(command, timeout_s)` starts `command` with its output in a temporary file, waits for it with
`os.wait4`, and returns its exit status, output and `ru_maxrss`: the kernel's high-water mark of the
child's resident set, so no short spike is missed, unlike sampling `/proc`. A child that runs past
`timeout_s` is killed with SIGKILL (its whole process group when `new_session`). Descendants that the
child itself waited for are included in the figure (getrusage's RUSAGE_CHILDREN rule); the converters
run here start none.

`available_memory_bytes()` is the kernel's estimate of memory a new process can use without swapping
(`MemAvailable` in /proc/meminfo), or None where there is no /proc.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_POLL_S = 0.05


@dataclass(frozen=True)
class ChildRun:
    """A finished child: `returncode` (negative: killed by that signal), `output` (stdout and stderr
    interleaved, bytes), `peak_rss_bytes` (0 when the platform does not report it) and `timed_out`.
    """

    returncode: int
    output: bytes
    peak_rss_bytes: int
    timed_out: bool
    seconds: float


def _maxrss_bytes(usage) -> int:
    return int(usage.ru_maxrss) * 1024  # Linux reports kibibytes


def run_measured(command: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None,
                 cwd: Path | str | None = None, new_session: bool = False) -> ChildRun:
    """Run `command` until it exits or `timeout_s` seconds pass; see the module docstring.

    Raises:
        OSError: the program cannot be started.
    """
    started = time.monotonic()
    with tempfile.TemporaryFile() as sink:
        process = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                   env=None if env is None else dict(env), cwd=cwd, start_new_session=new_session)
        timed_out, usage, status = False, None, 0
        deadline = started + max(0.0, timeout_s)
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid == process.pid:
                break
            if time.monotonic() >= deadline:
                timed_out = True
                try:
                    (os.killpg if new_session else os.kill)(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _, status, usage = os.wait4(process.pid, 0)
                break
            time.sleep(_POLL_S)
        process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        sink.seek(0)
        output = sink.read()
    return ChildRun(process.returncode, output, _maxrss_bytes(usage), timed_out, time.monotonic() - started)


def available_memory_bytes() -> int | None:
    """`MemAvailable` from /proc/meminfo in bytes; None when it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


__all__ = ["ChildRun", "available_memory_bytes", "run_measured"]
