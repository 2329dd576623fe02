"""A warm converter child: imports one worker module once, then runs its jobs one after another.

Run by `core.warm_children` as `python -m tfship.core.warm_server MODULE JOBS_FD REPLIES_FD`. Each job is one
line of JSON on JOBS_FD, `{"argv": [...]}`, run as `MODULE.main(argv)` (the same entry point `python -m MODULE
*argv` would call); each reply is one line on REPLIES_FD, `{"rc": exit status, "peak_rss_bytes": ...}`, where
the peak is the kernel's high-water mark of this process's resident set during that job (reset before each job
by writing 5 to /proc/self/clear_refs, proc(5); without it, the process's lifetime peak: an upper bound). The
job's own output goes to stdout and stderr, which the parent keeps in a file. End of input on JOBS_FD ends
the process. A job that kills the process (a segfault, `os.abort()`) or hangs is the parent's to see: it
finds the replies pipe closed or its deadline passed, and starts a fresh child for the next job.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from pathlib import Path


def reset_peak_rss() -> None:
    """Reset this process's VmHWM to its current resident set (Linux >= 4.0; a no-op elsewhere)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_rss_bytes() -> int:
    """This process's VmHWM in bytes (0 when /proc cannot be read)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def run_job(entry, argv: list[str]) -> int:
    """`entry(argv)` as `python -m` would end: its return value or `SystemExit` code; 1 after an exception."""
    try:
        code = entry(argv)
    except SystemExit as done:
        code = done.code
    except BaseException:  # noqa: BLE001 - the job failed; the parent reports its output tail
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def serve(module_name: str, jobs_fd: int, replies_fd: int) -> None:
    """Run the jobs read from `jobs_fd` until it closes, replying on `replies_fd` (see the module docstring)."""
    entry = importlib.import_module(module_name).main
    with os.fdopen(jobs_fd, "rb") as jobs, os.fdopen(replies_fd, "wb", buffering=0) as replies:
        for line in jobs:
            reset_peak_rss()
            code = run_job(entry, list(json.loads(line)["argv"]))
            replies.write((json.dumps({"rc": code, "peak_rss_bytes": peak_rss_bytes()}) + "\n").encode())


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
