"""The machine a benchmark ran on, shared by every benchmark's report (`bench.serve`, `bench.pipeline`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def uptime() -> str:
    """`uptime`'s line (load averages), '' where it cannot run."""
    try:
        return subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def host_info() -> dict:
    """CPU count, affinity, 1-minute load average (a busy machine makes every figure noisy), git commit."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    return {"cpus": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0)), "loadavg_1m": os.getloadavg()[0],
            "git_commit": commit}
